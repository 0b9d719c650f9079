//! The running task's budget: how many polls of ready sockets it may make
//! before it must yield, so that a peer that always has data cannot
//! starve the others. The executor refills it before each poll of a task;
//! every socket operation of the reactor takes from it. wit-bindgen's
//! executor (WASI 0.3) knows nothing of it, so there the yield itself
//! refills it: the tasks share one budget, and whichever task meets the
//! empty budget yields once.

use core::task::Context;

use super::local::local;

/// Polls a task may make of sockets that are ready before it must yield.
const BUDGET: u32 = 64;

local! {
    /// The budget of the task being polled, in its own cell so that every
    /// I/O poll can take from it without borrowing the executor.
    static LEFT: u32 = BUDGET;
}

/// Takes one unit of the running task's budget. `false` means the task
/// has used it up: it has been woken again, and should return `Pending`.
pub(crate) fn proceed(cx: &Context<'_>) -> bool {
    LEFT.with(|left| {
        let mut left = left.borrow_mut();
        if *left == 0 {
            if cfg!(all(target_os = "wasi", feature = "wasi-0-3")) {
                *left = BUDGET;
            }
            cx.waker().wake_by_ref();
            return false;
        }
        *left -= 1;
        true
    })
}

/// Gives the task about to be polled its whole budget.
#[cfg(not(all(target_os = "wasi", feature = "wasi-0-3")))]
pub(crate) fn refill() {
    LEFT.with(|left| *left.borrow_mut() = BUDGET);
}
