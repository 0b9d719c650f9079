//! How the host stack tells the bridge which connection to look at.
//!
//! The stack reports readiness the way it reports it to every other user:
//! a socket that became readable or writable hands back the
//! [`Waker`](std::task::Waker) parked on it, in the caller's
//! [`WakeList`](pier_stack::WakeList). The bridge parks one waker per
//! connection slot whose only job is to put the slot's number on a list;
//! [`Bridge::service`](super::Bridge::service) takes the list and moves data
//! for exactly those connections. So `service` costs nothing per idle
//! connection, and the bridge uses the stack's native, batched wakeup path
//! (one wake per socket per batch, outside any lock) rather than a
//! per-packet hook.
//!
//! Each slot is on the list at most once (a flag says so), so the list is
//! bounded by the number of slots.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

/// Keys of woken slots, in the order they were woken.
#[derive(Debug, Default)]
pub(crate) struct WakeQueue {
    keys: Mutex<Vec<usize>>,
}

impl WakeQueue {
    /// Moves the woken keys into `out` (which must be empty), leaving the
    /// queue with `out`'s old capacity, so draining allocates nothing.
    pub(crate) fn take(&self, out: &mut Vec<usize>) {
        debug_assert!(out.is_empty());
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *keys, out);
    }
}

/// The waker for one key.
#[derive(Debug)]
pub(crate) struct KeyWaker {
    queue: Arc<WakeQueue>,
    key: usize,
    queued: AtomicBool,
}

impl KeyWaker {
    /// A waker for `key`, and the handle to clear its flag with.
    pub(crate) fn new(queue: &Arc<WakeQueue>, key: usize) -> (Arc<KeyWaker>, Waker) {
        let inner =
            Arc::new(KeyWaker { queue: Arc::clone(queue), key, queued: AtomicBool::new(false) });
        let waker = Waker::from(Arc::clone(&inner));
        (inner, waker)
    }

    /// Called when the key is taken off the queue: later wakes queue it again.
    pub(crate) fn clear(&self) {
        self.queued.store(false, Ordering::Release);
    }
}

impl Wake for KeyWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue.keys.lock().unwrap_or_else(PoisonError::into_inner).push(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_queued_once_until_cleared() {
        let queue = Arc::new(WakeQueue::default());
        let (a, wa) = KeyWaker::new(&queue, 7);
        let (_b, wb) = KeyWaker::new(&queue, 9);
        wa.wake_by_ref();
        wa.wake_by_ref();
        wb.wake();
        let mut keys = Vec::new();
        queue.take(&mut keys);
        assert_eq!(keys, [7, 9]);
        keys.clear();
        wa.wake_by_ref();
        queue.take(&mut keys);
        assert!(keys.is_empty(), "7 is still flagged as queued");
        a.clear();
        wa.wake_by_ref();
        queue.take(&mut keys);
        assert_eq!(keys, [7]);
    }
}
