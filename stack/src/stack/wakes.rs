//! Wakes: readiness changes are recorded while the stack works and handed
//! back as a [`WakeList`] once it is done, so the caller wakes tasks after
//! releasing its lock (see [`crate::readiness`]).

use alloc::boxed::Box;
use core::mem;
use core::task::Waker;

use super::Stack;
use crate::error::Result;
use crate::readiness::{Interest, ReadinessEvent, ReadinessHook, WakeList};
use crate::socket::SocketHandle;

/// Which waiters a readiness change concerns: a socket's readers, its
/// writers, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// Something to read (data, a connection to accept): wake readers.
    Readable,
    /// Room to send (credit, a freed send buffer): wake writers.
    Writable,
    /// The connection changed state (established, shut down, reset,
    /// failed): both a receive and a send may now return at once.
    Both,
}

impl Stack {
    /// Parks a waker to be woken when the socket may have become readable
    /// (`Interest::Read`) or writable (`Interest::Write`).
    pub fn register_waker(
        &mut self,
        h: SocketHandle,
        interest: Interest,
        waker: &Waker,
    ) -> Result<()> {
        let w = &mut self.app_entry(h)?.wakers;
        match interest {
            Interest::Read => w.readers.register(waker),
            Interest::Write => w.writers.register(waker),
        }
        Ok(())
    }

    /// Replaces the socket's native notification path; see [`ReadinessHook`].
    pub fn set_readiness_hook(
        &mut self,
        h: SocketHandle,
        hook: Option<Box<dyn ReadinessHook>>,
    ) -> Result<()> {
        self.app_entry(h)?.wakers.hook = hook;
        Ok(())
    }

    /// Records a readiness change. A socket with a replacement hook is told
    /// at once, per packet; everyone else waits for the end of the batch.
    pub(super) fn note(&mut self, h: SocketHandle, wake: Wake) {
        let (read, write) = (wake != Wake::Writable, wake != Wake::Readable);
        let Some(e) = self.sockets.get_mut(h) else { return };
        let w = &mut e.wakers;
        if let Some(hook) = w.hook.as_mut() {
            if write {
                hook.notify(h, ReadinessEvent::WriteSpace);
            }
            if read {
                hook.notify(h, ReadinessEvent::DataReady);
            }
            return;
        }
        w.wake_read |= read;
        w.wake_write |= write;
        if !w.pending {
            w.pending = true;
            self.wake_pending.push(h);
        }
    }

    /// Moves the wakers of every recorded change into `wakes`.
    ///
    /// Runs after every dispatch and batch, most of which changed nothing:
    /// that case is a check inlined into the caller, and only a recorded
    /// change pays for the call.
    #[inline]
    pub(super) fn drain_wakes(&mut self, wakes: &mut WakeList) {
        if !self.wake_pending.is_empty() {
            self.drain_pending_wakes(wakes);
        }
    }

    fn drain_pending_wakes(&mut self, wakes: &mut WakeList) {
        let Self { wake_pending, sockets, .. } = self;
        for h in wake_pending.drain(..) {
            let Some(e) = sockets.get_mut(h) else { continue };
            let w = &mut e.wakers;
            w.pending = false;
            if mem::take(&mut w.wake_write)
                && let Some(waker) = w.writers.take()
            {
                wakes.push_write_space(waker);
            }
            if mem::take(&mut w.wake_read)
                && let Some(waker) = w.readers.take()
            {
                wakes.push_data_ready(waker);
            }
        }
    }

    /// Hands over wakers recorded by socket calls (for example a shutdown
    /// that another task is waiting on).
    pub fn take_wakes(&mut self, wakes: &mut WakeList) {
        self.drain_wakes(wakes);
    }

    /// Hands over every parked waker, ready or not: for a host that is
    /// shutting down and needs each waiting task to run once more and see
    /// that (a task woken without cause just looks and parks again).
    pub fn wake_all(&mut self, wakes: &mut WakeList) {
        self.drain_wakes(wakes);
        for (_, e) in self.sockets.iter_mut() {
            if let Some(waker) = e.wakers.writers.take() {
                wakes.push_write_space(waker);
            }
            if let Some(waker) = e.wakers.readers.take() {
                wakes.push_data_ready(waker);
            }
        }
    }
}
