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
        let s = self.app_mut(h)?;
        match interest {
            Interest::Read => s.readers.register(waker),
            Interest::Write => s.writers.register(waker),
        }
        Ok(())
    }

    /// Replaces the socket's native notification path; see [`ReadinessHook`].
    pub fn set_readiness_hook(
        &mut self,
        h: SocketHandle,
        hook: Option<Box<dyn ReadinessHook>>,
    ) -> Result<()> {
        self.app_mut(h)?.hook = hook;
        Ok(())
    }

    /// Records a readiness change. A socket with a replacement hook is told
    /// at once, per packet; everyone else waits for the end of the batch.
    pub(super) fn note(&mut self, h: SocketHandle, wake: Wake) {
        let (read, write) = (wake != Wake::Writable, wake != Wake::Readable);
        let Some(s) = self.sockets.get_mut(h) else { return };
        if let Some(hook) = s.hook.as_mut() {
            if write {
                hook.notify(h, ReadinessEvent::WriteSpace);
            }
            if read {
                hook.notify(h, ReadinessEvent::DataReady);
            }
            return;
        }
        s.wake_read |= read;
        s.wake_write |= write;
        if !s.in_wake_list {
            s.in_wake_list = true;
            self.wake_pending.push(h);
        }
    }

    pub(super) fn drain_wakes(&mut self, wakes: &mut WakeList) {
        let Self { wake_pending, sockets, .. } = self;
        for h in wake_pending.drain(..) {
            let Some(s) = sockets.get_mut(h) else { continue };
            s.in_wake_list = false;
            if mem::take(&mut s.wake_write)
                && let Some(w) = s.writers.take()
            {
                wakes.push_write_space(w);
            }
            if mem::take(&mut s.wake_read)
                && let Some(w) = s.readers.take()
            {
                wakes.push_data_ready(w);
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
        for (_, s) in self.sockets.iter_mut() {
            if let Some(w) = s.writers.take() {
                wakes.push_write_space(w);
            }
            if let Some(w) = s.readers.take() {
                wakes.push_data_ready(w);
            }
        }
    }
}
