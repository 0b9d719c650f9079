//! The driver's half of the notification handshake, over any ring.
//!
//! Publishing and consuming ring entries is virtio-drivers' job; deciding
//! whether the other side must be told is this module's. Both decisions
//! are the same store-then-load pattern, run from opposite ends:
//!
//! - **kick**: the driver stores its available index, then loads the
//!   device's suppression state (`avail_event`, or the used ring's
//!   NO_NOTIFY flag), while the device stores that state when it re-arms,
//!   then loads the available index once more;
//! - **interrupt**: the driver stores its wish for an interrupt
//!   (`used_event` as it pops, or clearing the avail ring's NO_INTERRUPT
//!   flag before it sleeps), then loads the used index once more, while
//!   the device stores the used index, then loads that wish.
//!
//! Each side needs a full fence between its store and its load. Without
//! one the load can be satisfied before the store is visible (a StoreLoad
//! reordering, which x86 does too), both sides read the other's old
//! value, and each decides the other will act: the device sleeps with an
//! entry waiting, or the driver sleeps with a used buffer it was never
//! interrupted for.
//!
//! The functions are generic over [`RingSignals`] so that the same code
//! runs on virtio-drivers' [`VirtQueue`] and, in the driver's tests,
//! against a loom model of the rings (`driver/tests/handshake/`), where
//! every interleaving and every reordering the fences allow is tried.

use core::sync::atomic::{Ordering, fence};

use virtio_drivers::Hal;
use virtio_drivers::queue::VirtQueue;

/// Descriptors in each of the rx and tx rings (the wrap correction of
/// [`need_kick`] depends on it).
pub const QUEUE_SIZE: usize = 128;

/// Which full fence of the handshake a [`RingSignals::full_fence`] call
/// is: a model of the ring can then leave one out and show what breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFence {
    /// Between publishing the available index and reading whether the
    /// device wants a kick ([`should_kick`]).
    BeforeKickCheck,
    /// Between the pops of a drain, which moved `used_event`, and looking
    /// at the used index again ([`used_after_drain`]).
    AfterUsedEvent,
    /// Between clearing the NO_INTERRUPT flag and looking at the used
    /// index again ([`used_after_interrupts_on`]).
    AfterInterruptsOn,
}

/// What the handshake reads of one split virtqueue, and its fence.
pub trait RingSignals {
    /// A full (sequentially consistent) fence.
    fn full_fence(&self, which: HandshakeFence);
    /// Whether the device's suppression state asks for a kick for what
    /// has been published (virtio-drivers' `should_notify`).
    fn should_notify(&self) -> bool;
    /// Whether the used index is past the last entry taken.
    fn can_pop(&self) -> bool;
}

impl<H: Hal, const N: usize> RingSignals for VirtQueue<H, N> {
    fn full_fence(&self, _which: HandshakeFence) {
        fence(Ordering::SeqCst);
    }

    fn should_notify(&self) -> bool {
        VirtQueue::should_notify(self)
    }

    fn can_pop(&self) -> bool {
        VirtQueue::can_pop(self)
    }
}

/// Whether the driver must notify the device after publishing buffers.
///
/// virtio-drivers 0.13 answers `avail_idx >= avail_event + 1` without wrap
/// arithmetic, so for the first `QUEUE_SIZE` publications after the 16-bit
/// index wraps it can say no while the device waits. The device's
/// `avail_event` is never more than a ring behind the index, so kicking
/// whenever the index is within a ring of the wrap is always enough, and
/// costs an extra kick in one publication of every 512.
pub fn need_kick(should_notify: bool, published: u16) -> bool {
    should_notify || (published as usize) < QUEUE_SIZE
}

/// Whether to notify the device after publishing on `ring`, whose
/// available index is now `published`.
///
/// The wrap correction ([`need_kick`]) is for EVENT_IDX's index
/// comparison; without EVENT_IDX the device's NO_NOTIFY flag is the whole
/// answer.
///
/// The full fence orders our store of the available index before our load
/// of the device's `avail_event` (or its NO_NOTIFY flag). Without it the
/// load may be satisfied first, see a stale value, and skip a kick that the
/// device, which has just re-armed notifications and gone to sleep, waits
/// for (spec 2.7.13.4). virtio-drivers' `add` fences only before its store.
pub fn should_kick<R: RingSignals>(ring: &R, event_idx: bool, published: u16) -> bool {
    ring.full_fence(HandshakeFence::BeforeKickCheck);
    if event_idx { need_kick(ring.should_notify(), published) } else { ring.should_notify() }
}

/// Whether used entries arrived while the driver was finishing a drain.
///
/// Popping writes `used_event` (with EVENT_IDX), which tells the device
/// when to interrupt next. The device writes the used index, fences, then
/// reads `used_event`; the driver must likewise fence between its
/// `used_event` store and its last read of the used index, or both sides
/// can miss the entry and the driver sleeps with a used buffer waiting.
pub fn used_after_drain<R: RingSignals>(ring: &R) -> bool {
    ring.full_fence(HandshakeFence::AfterUsedEvent);
    ring.can_pop()
}

/// Whether used entries arrived before the device could see that the
/// driver turned interrupts back on (without EVENT_IDX).
///
/// The same pattern as [`used_after_drain`] with the NO_INTERRUPT flag in
/// place of `used_event`: the device fences between storing the used
/// index and reading the flag, so the driver fences between clearing it
/// and reading the used index.
pub fn used_after_interrupts_on<R: RingSignals>(ring: &R) -> bool {
    ring.full_fence(HandshakeFence::AfterInterruptsOn);
    ring.can_pop()
}
