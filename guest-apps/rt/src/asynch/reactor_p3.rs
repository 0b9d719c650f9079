//! The reactor of an app built for WASI 0.3, which is the component
//! model itself: a socket operation that would block is an operation in
//! flight, and waiting for it is polling it with the task's waker, which
//! the component model wakes when the operation finishes. An `Interest`
//! therefore holds nothing.

use core::task::{Context, Poll};

use super::budget;
use crate::io::{self, ErrorKind};
use crate::platform::RawPoll;

/// One direction of one socket, as the async types name it.
#[derive(Debug)]
pub(crate) struct Interest;

impl Interest {
    pub(crate) fn new() -> Self {
        Self
    }

    /// Tries `op` (a non-blocking socket call); if it would block, waits
    /// on the operation `ready` names and returns `Pending`. A task that
    /// has used up its budget yields here first.
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

    /// Leaves `cx`'s waker with the operation `ready` names; the caller
    /// then returns `Pending`.
    pub(crate) fn wait(&self, cx: &mut Context<'_>, ready: Option<RawPoll>) {
        // SAFETY: the caller borrows the socket `ready` came from for the
        // whole call.
        let done = ready.is_none_or(|r| unsafe { r.poll_ready(cx) }.is_ready());
        if done {
            // It finished meanwhile, or the socket holds what the call
            // needs already: retry.
            cx.waker().wake_by_ref();
        }
    }
}
