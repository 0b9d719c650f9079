//! The reactor: what each waiting task waits for, and the one blocking
//! wait on all of it when no task can run.
//!
//! A socket owns one [`Interest`] per direction: a slot here holding the
//! condition to wait for (the platform's readiness, without its borrow)
//! and the waker of the task that waits. A socket operation that would
//! block arms its slot and returns `Pending`; the executor, once nothing
//! is runnable, calls [`turn`], which hands every armed condition to the
//! platform's wait (`wasi:io/poll` on WASI; on bare metal, pumping the
//! driver and halting until the device's interrupt) and wakes the tasks
//! whose conditions hold. Readiness is level-triggered, so nothing is
//! lost between a failed try and the wait: a condition that became true
//! meanwhile makes the wait return at once.
//!
//! Slots are one-shot: a fired slot is disarmed, and its task re-arms it
//! if it must wait again. A slot is freed when its socket is dropped,
//! before the socket's pollables go, so the platform never waits on a
//! handle that no longer exists. Slots, and the lists built for a wait,
//! are reused: waiting allocates nothing here (the WASI platform builds
//! its list of pollables for each `poll` call it makes).

use alloc::vec::Vec;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use super::budget;
use super::local::local;
use crate::io::{self, ErrorKind};
use crate::platform::contract::Wait as _;
use crate::platform::{RawPoll, Waiting};

#[derive(Default)]
struct Slot {
    key: Option<RawPoll>,
    waker: Option<Waker>,
}

struct Reactor {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Scratch for one wait: the armed conditions, their slots, and the
    /// indices of those that fired.
    keys: Vec<RawPoll>,
    index: Vec<usize>,
    ready: Vec<usize>,
    /// The wakers of the fired slots, woken once the reactor is released.
    wake: Vec<Waker>,
}

local! {
    static REACTOR: Reactor = Reactor {
        slots: Vec::new(),
        free: Vec::new(),
        keys: Vec::new(),
        index: Vec::new(),
        ready: Vec::new(),
        wake: Vec::new(),
    };
}

/// One direction of one socket (its reads, its writes, its accepts) as
/// the reactor knows it. Only the last task to wait is woken, as with
/// tokio's sockets: one reader and one writer at a time per socket.
#[derive(Debug)]
pub(crate) struct Interest {
    slot: usize,
}

impl Interest {
    pub(crate) fn new() -> Self {
        let slot = REACTOR.with(|r| {
            let mut r = r.borrow_mut();
            match r.free.pop() {
                Some(slot) => slot,
                None => {
                    r.slots.push(Slot::default());
                    r.slots.len() - 1
                }
            }
        });
        Self { slot }
    }

    /// Tries `op` (a non-blocking socket call); if it would block, arms
    /// this slot with the condition `ready` names and returns `Pending`.
    /// A task that has used up its budget yields here first.
    pub(crate) fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        ready: impl FnOnce() -> Option<RawPoll>,
        op: impl FnOnce() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        if !budget::proceed(cx) {
            return Poll::Pending;
        }
        match op() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.wait(cx, ready());
                Poll::Pending
            }
            result => Poll::Ready(result),
        }
    }

    /// Arms this slot with `ready` (the condition the caller's next try
    /// needs) for the task of `cx`; the caller then returns `Pending`.
    pub(crate) fn wait(&self, cx: &mut Context<'_>, ready: Option<RawPoll>) {
        match ready {
            Some(key) => self.arm(key, cx.waker()),
            // The socket holds what the call needs already: retry.
            None => cx.waker().wake_by_ref(),
        }
    }

    fn arm(&self, key: RawPoll, waker: &Waker) {
        REACTOR.with(|r| {
            let slot = &mut r.borrow_mut().slots[self.slot];
            slot.key = Some(key);
            match &mut slot.waker {
                Some(w) if w.will_wake(waker) => {}
                w => *w = Some(waker.clone()),
            }
        });
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let waker = REACTOR.with(|r| {
            let mut r = r.borrow_mut();
            r.free.push(self.slot);
            let slot = core::mem::take(&mut r.slots[self.slot]);
            slot.waker
        });
        drop(waker);
    }
}

/// Waits until a condition some task waits on holds, and wakes that
/// task; with `nonblocking`, only looks. Returns `false` when it would
/// have to wait and nothing is armed.
pub(crate) fn turn(nonblocking: bool) -> bool {
    let (result, mut wake) = REACTOR.with(|r| {
        let r = &mut *r.borrow_mut();
        r.keys.clear();
        r.index.clear();
        r.ready.clear();
        for (i, slot) in r.slots.iter().enumerate() {
            if let (Some(key), Some(_)) = (slot.key, &slot.waker) {
                r.keys.push(key);
                r.index.push(i);
            }
        }
        let mut wake = core::mem::take(&mut r.wake);
        if r.keys.is_empty() {
            return (nonblocking, wake);
        }
        let timeout = nonblocking.then_some(Duration::ZERO);
        let keys = &r.keys;
        if let Err(e) = Waiting::wait_any(keys.len(), |i| Some(keys[i]), timeout, &mut r.ready) {
            // The wait itself failed (the device is gone): wake everyone,
            // so each call meets the failure itself.
            crate::eprintln!("pier-rt: async wait failed: {e}");
            r.ready.extend(0..r.keys.len());
        }
        for &i in &r.ready {
            let slot = &mut r.slots[r.index[i]];
            slot.key = None;
            wake.extend(slot.waker.take());
        }
        (true, wake)
    });
    // Woken with the reactor released: a waker may be anything.
    for w in wake.drain(..) {
        w.wake();
    }
    REACTOR.with(|r| r.borrow_mut().wake = wake);
    result
}
