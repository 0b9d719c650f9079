//! One split virtqueue in loom's atomics, and both ends of it.
//!
//! [`Ring`] is the memory the two sides share: the driver area (available
//! ring, NO_INTERRUPT flag, `used_event`), the device area (used ring,
//! NO_NOTIFY flag, `avail_event`), the descriptor table and the buffers,
//! plus the two eventfds of the in-process bus (kick and interrupt) and
//! its kick paths. Every word is a loom atomic, plain memory included (as
//! `Relaxed`), so that loom may hand a load any store that the orderings
//! do not rule out.
//!
//! [`DriverQueue`] is virtio-drivers 0.13's `VirtQueue` step by step,
//! with the orderings of its `add`, `should_notify`, `can_pop`,
//! `pop_used` and `set_dev_notify`; it implements pier-driver's
//! [`RingSignals`], so pier-driver's own handshake decisions
//! ([`pier_driver::handshake`]) run on it unchanged. [`DeviceQueue`] is
//! pier-device's `DeviceQueue` (its `drain_tx` and `take_rx_chain` loops,
//! `needs_interrupt`) over virtio-queue 0.18's `Queue` (`iter`,
//! `add_used`, `enable_notification`, `disable_notification`,
//! `needs_notification`), with their orderings; [`InProcessKicks`] is the
//! in-process bus's way of sending a kick. Both crates are pinned to
//! exactly these versions in the manifests.
//!
//! [`Barrier`] names each fence and each release/acquire pair the
//! handshake rests on; a ring built [`Ring::without`] one of them skips
//! it (a fence) or weakens it to `Relaxed` (an ordering), so the tests can
//! show loom finding what it protects.

use loom::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, Ordering, fence};
use pier_driver::handshake::{HandshakeFence, RingSignals};
use std::sync::Arc;

/// Entries in the model's rings: as many as any scenario publishes, so a
/// slot is never reused and a stale read finds the slot's first value.
/// (Every atomic is one more object for loom to track at each fence.)
pub const SIZE: u16 = 2;
/// Where the indices start: past pier-driver's wrap correction, which
/// kicks for every publication within a ring of the 16-bit wrap and would
/// hide a kick the suppression state wrongly skipped.
pub const START: u16 = 1000;
/// What an avail ring slot, a used element or a buffer holds before
/// anyone writes it; reading it back is reading a stale entry.
const UNWRITTEN: u32 = 0xdead;

const NO_NOTIFY: u16 = 1;
const NO_INTERRUPT: u16 = 1;

/// A fence, or an ordering that acts as one, on the handshake's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// pier-driver's fences ([`HandshakeFence`]).
    Driver(HandshakeFence),
    /// virtio-drivers' `add`: the fence between writing the descriptor and
    /// the ring slot and storing the available index. The store is also
    /// `Release`, which alone orders the same writes.
    AddFence,
    /// `add`'s fence and its `Release` store both: nothing orders the
    /// entry before the index.
    AddFenceAndRelease,
    /// virtio-drivers' `can_pop`: the `Acquire` load of the used index,
    /// before `pop_used` reads the element and the buffer.
    UsedIndexAcquire,
    /// virtio-queue's `enable_notification`: the fence between re-arming
    /// kicks and reading the available index again.
    RearmFence,
    /// virtio-queue's `needs_notification`: the fence between the used
    /// index just stored and reading whether the driver wants an
    /// interrupt.
    InterruptCheckFence,
    /// virtio-queue's `add_used`: the `Release` store of the used index,
    /// after the element and the buffer were written.
    UsedIndexRelease,
    /// virtio-queue's `iter`: the `Acquire` load of the available index,
    /// before the ring slot and the descriptor are read.
    AvailIndexAcquire,
    /// The in-process bus's orderings on its kick paths
    /// ([`InProcessKicks`]), all of them.
    InProcessKickOrderings,
}

/// The memory and eventfds one queue's two sides share.
#[derive(Debug)]
pub struct Ring {
    event_idx: bool,
    without: &'static [Barrier],
    // The driver area, written by the driver.
    avail_flags: AtomicU16,
    avail_idx: AtomicU16,
    avail_ring: [AtomicU32; SIZE as usize],
    used_event: AtomicU16,
    // The device area, written by the device.
    used_flags: AtomicU16,
    used_idx: AtomicU16,
    used_ring: [AtomicU32; SIZE as usize],
    avail_event: AtomicU16,
    /// Per descriptor, what the driver put in it (a token standing for the
    /// buffer's address and length).
    descriptors: [AtomicU32; SIZE as usize],
    /// Per descriptor, what the device wrote into the buffer.
    buffers: [AtomicU32; SIZE as usize],
    /// The queue's kick eventfd (the device loop sleeps on it).
    pub kicks: EventFd,
    /// The interrupt eventfd (the guest sleeps on it).
    pub interrupts: EventFd,
    /// The in-process bus's kicks held back or taken without the eventfd.
    pub bus: InProcessKicks,
}

fn unwritten<const N: usize>() -> [AtomicU32; N] {
    std::array::from_fn(|_| AtomicU32::new(UNWRITTEN))
}

impl Ring {
    /// A ring that leaves out the barriers in `without` (none: a ring as
    /// the real code runs it).
    pub fn without(event_idx: bool, without: &'static [Barrier]) -> Self {
        Ring {
            event_idx,
            without,
            avail_flags: AtomicU16::new(0),
            avail_idx: AtomicU16::new(START),
            avail_ring: unwritten(),
            used_event: AtomicU16::new(START),
            used_flags: AtomicU16::new(0),
            used_idx: AtomicU16::new(START),
            used_ring: unwritten(),
            avail_event: AtomicU16::new(START),
            descriptors: unwritten(),
            buffers: unwritten(),
            kicks: EventFd::new(),
            interrupts: EventFd::new(),
            bus: InProcessKicks::new(!without.contains(&Barrier::InProcessKickOrderings)),
        }
    }

    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    fn has(&self, barrier: Barrier) -> bool {
        !self.without.contains(&barrier)
    }

    fn ordering(&self, barrier: Barrier, ordering: Ordering) -> Ordering {
        if self.has(barrier) { ordering } else { Ordering::Relaxed }
    }

    fn fence_unless_removed(&self, barrier: Barrier) {
        if self.has(barrier) {
            fence(Ordering::SeqCst);
        }
    }
}

/// An eventfd of the in-process bus: a write is a system call, and orders
/// like a read-modify-write of its counter.
#[derive(Debug)]
pub struct EventFd(AtomicU32);

impl EventFd {
    fn new() -> Self {
        EventFd(AtomicU32::new(0))
    }

    /// The notification: a kick (`Transport::notify`) or an interrupt.
    pub fn signal(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// A sleeper's wakeup: consumes what was signalled; `false` if
    /// nothing was, where the real sleeper would wait until it is.
    pub fn take(&self) -> bool {
        self.0.swap(0, Ordering::SeqCst) > 0
    }

    /// Whether a signal is waiting, which would wake a sleeper.
    pub fn pending(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// `DeviceEvents::inline_guest`: the device loop is not running the
/// guest, is running it, or is running it and was kicked meanwhile.
const GUEST_NOT_INLINE: u8 = 0;
const GUEST_INLINE: u8 = 1;
const GUEST_INLINE_KICKED: u8 = 2;

/// How the in-process bus sends a kick (pier-device's
/// `InProcessTransport::notify`), with its orderings: taken without the
/// eventfd while the device loop runs the guest's interrupt handler
/// (`DeviceEvents::absorb_kick`, `run_guest_inline`), else held back
/// until the guest lock is released (`DeferredKicks`, on under a guest
/// thread), else written to the eventfd.
#[derive(Debug)]
pub struct InProcessKicks {
    /// `false`: every ordering below is `Relaxed`.
    ordered: bool,
    inline_guest: AtomicU8,
    /// Queues kicked and held back, one bit each (one queue here).
    deferred: AtomicU32,
}

impl InProcessKicks {
    fn new(ordered: bool) -> Self {
        InProcessKicks {
            ordered,
            inline_guest: AtomicU8::new(GUEST_NOT_INLINE),
            deferred: AtomicU32::new(0),
        }
    }

    fn ordering(&self, ordering: Ordering) -> Ordering {
        if self.ordered { ordering } else { Ordering::Relaxed }
    }

    /// `DeviceEvents::run_guest_inline`: whether a kick was absorbed
    /// while `handler` ran, so the loop must look at its queues again.
    pub fn run_guest_inline(&self, handler: impl FnOnce()) -> bool {
        self.inline_guest.store(GUEST_INLINE, self.ordering(Ordering::SeqCst));
        handler();
        self.inline_guest.swap(GUEST_NOT_INLINE, self.ordering(Ordering::SeqCst))
            == GUEST_INLINE_KICKED
    }

    /// `DeviceEvents::absorb_kick`.
    fn absorb_kick(&self) -> bool {
        match self.inline_guest.compare_exchange(
            GUEST_INLINE,
            GUEST_INLINE_KICKED,
            self.ordering(Ordering::SeqCst),
            self.ordering(Ordering::SeqCst),
        ) {
            Ok(_) => true,
            Err(state) => state == GUEST_INLINE_KICKED,
        }
    }

    /// `InProcessTransport::notify` under a guest thread, made while
    /// holding the guest lock.
    pub fn notify(&self) {
        if !self.absorb_kick() {
            self.deferred.fetch_or(1, self.ordering(Ordering::AcqRel));
        }
    }

    /// `DeferredKicks::flush`, after the guest lock is released.
    pub fn flush(&self, kicks: &EventFd) {
        if self.deferred.swap(0, self.ordering(Ordering::AcqRel)) != 0 {
            kicks.signal();
        }
    }
}

/// What the `n`-th buffer published carries, from the start of the model.
pub fn token(n: u16) -> u32 {
    0x1000 + u32::from(n)
}

/// What the device writes into the `n`-th buffer it fills.
pub fn payload(n: u16) -> u32 {
    0x2000 + u32::from(n)
}

fn slot(index: u16) -> usize {
    usize::from(index % SIZE)
}

/// The driver's end: virtio-drivers' `VirtQueue`, its indices private.
#[derive(Debug)]
pub struct DriverQueue {
    ring: Arc<Ring>,
    avail_idx: u16,
    last_used_idx: u16,
}

impl DriverQueue {
    pub fn new(ring: Arc<Ring>) -> Self {
        DriverQueue { ring, avail_idx: START, last_used_idx: START }
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The available index, which pier-driver also counts itself
    /// (`rx_published`, `tx_published`).
    pub fn published(&self) -> u16 {
        self.avail_idx
    }

    /// `VirtQueue::add` of one buffer, the `n`-th the model publishes, in
    /// descriptor `n % SIZE` (the model never reuses one).
    pub fn add(&mut self, n: u16) {
        let r = &*self.ring;
        let head = slot(n);
        r.descriptors[head].store(token(n), Ordering::Relaxed);
        r.avail_ring[slot(self.avail_idx)].store(head as u32, Ordering::Relaxed);
        if r.has(Barrier::AddFence) && r.has(Barrier::AddFenceAndRelease) {
            fence(Ordering::SeqCst);
        }
        self.avail_idx = self.avail_idx.wrapping_add(1);
        r.avail_idx
            .store(self.avail_idx, r.ordering(Barrier::AddFenceAndRelease, Ordering::Release));
    }

    /// `VirtQueue::pop_used` of the next used element: checks that the
    /// element and the buffer are what the device wrote for the `n`-th
    /// buffer it returned, then moves `used_event` on (with EVENT_IDX).
    pub fn pop_used(&mut self, n: u16) {
        let r = &*self.ring;
        let used_slot = slot(self.last_used_idx);
        let id = r.used_ring[used_slot].load(Ordering::Relaxed);
        assert_eq!(id, u32::from(n % SIZE), "stale used entry: element {used_slot} read unwritten");
        let data = r.buffers[id as usize].load(Ordering::Relaxed);
        assert_eq!(
            data,
            payload(n),
            "stale used entry: buffer {id} read before the device's write"
        );
        self.last_used_idx = self.last_used_idx.wrapping_add(1);
        if r.event_idx {
            r.used_event.store(self.last_used_idx, Ordering::Release);
        }
    }

    /// `VirtQueue::set_dev_notify` (pier-driver's `set_interrupts`).
    pub fn set_dev_notify(&mut self, enable: bool) {
        if !self.ring.event_idx {
            let flags = if enable { 0 } else { NO_INTERRUPT };
            self.ring.avail_flags.store(flags, Ordering::Release);
        }
    }
}

impl RingSignals for DriverQueue {
    fn full_fence(&self, which: HandshakeFence) {
        self.ring.fence_unless_removed(Barrier::Driver(which));
    }

    fn should_notify(&self) -> bool {
        let r = &*self.ring;
        if r.event_idx {
            let avail_event = r.avail_event.load(Ordering::Acquire);
            self.avail_idx >= avail_event.wrapping_add(1)
        } else {
            r.used_flags.load(Ordering::Acquire) & NO_NOTIFY == 0
        }
    }

    fn can_pop(&self) -> bool {
        let order = self.ring.ordering(Barrier::UsedIndexAcquire, Ordering::Acquire);
        self.last_used_idx != self.ring.used_idx.load(order)
    }
}

/// The device's end: pier-device's `DeviceQueue` over virtio-queue's
/// `Queue`, their indices private.
#[derive(Debug)]
pub struct DeviceQueue {
    ring: Arc<Ring>,
    next_avail: u16,
    next_used: u16,
    /// virtio-queue's count of entries used since `needs_notification`.
    num_added: u16,
    /// pier-device's `next_used` at the last interrupt decision.
    used_checked: u16,
    /// pier-device's "the device waits for an rx buffer".
    kicks_wanted: bool,
    /// Chains popped so far, to check each against what was published.
    popped: u16,
}

impl DeviceQueue {
    pub fn new(ring: Arc<Ring>) -> Self {
        DeviceQueue {
            ring,
            next_avail: START,
            next_used: START,
            num_added: 0,
            used_checked: START,
            kicks_wanted: true,
            popped: 0,
        }
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Chains taken off the available ring so far.
    pub fn popped(&self) -> u16 {
        self.popped
    }

    /// virtio-queue's `disable_notification`: NO_NOTIFY without
    /// EVENT_IDX; with it, nothing (`avail_event` stays behind).
    pub fn disable_notification(&mut self) {
        if !self.ring.event_idx {
            self.ring.used_flags.store(NO_NOTIFY, Ordering::Relaxed);
        }
    }

    /// virtio-queue's `enable_notification`: re-arms kicks, then says
    /// whether chains arrived meanwhile.
    pub fn enable_notification(&mut self) -> bool {
        let r = &*self.ring;
        if r.event_idx {
            r.avail_event.store(self.next_avail, Ordering::Relaxed);
        } else {
            r.used_flags.store(0, Ordering::Relaxed);
        }
        r.fence_unless_removed(Barrier::RearmFence);
        r.avail_idx.load(Ordering::Relaxed) != self.next_avail
    }

    /// pier-device's `pop_head` (a fresh `Queue::iter` and its first
    /// chain): checks the chain's descriptor against what the driver
    /// published.
    pub fn pop_head(&mut self) -> Option<u16> {
        let r = &*self.ring;
        let idx = r.avail_idx.load(r.ordering(Barrier::AvailIndexAcquire, Ordering::Acquire));
        if idx == self.next_avail {
            return None;
        }
        let head = r.avail_ring[slot(self.next_avail)].load(Ordering::Acquire);
        assert_ne!(head, UNWRITTEN, "stale avail entry: ring slot read before the driver's write");
        let descriptor = r.descriptors[head as usize].load(Ordering::Relaxed);
        assert_eq!(
            descriptor,
            token(self.popped),
            "stale avail entry: descriptor {head} read before the driver's write"
        );
        self.next_avail = self.next_avail.wrapping_add(1);
        self.popped += 1;
        Some(head as u16)
    }

    /// virtio-queue's `add_used`, after the device wrote the `n`-th
    /// payload it returns into the buffer (an rx fill; a tx chain's
    /// buffer is written too, harmlessly).
    pub fn add_used(&mut self, head: u16, n: u16) {
        let r = &*self.ring;
        r.buffers[usize::from(head)].store(payload(n), Ordering::Relaxed);
        r.used_ring[slot(self.next_used)].store(u32::from(head), Ordering::Relaxed);
        self.next_used = self.next_used.wrapping_add(1);
        self.num_added = self.num_added.wrapping_add(1);
        r.used_idx.store(self.next_used, r.ordering(Barrier::UsedIndexRelease, Ordering::Release));
    }

    /// virtio-queue's `needs_notification`.
    fn needs_notification(&mut self) -> bool {
        let r = &*self.ring;
        r.fence_unless_removed(Barrier::InterruptCheckFence);
        if r.event_idx {
            let used_event = r.used_event.load(Ordering::Relaxed);
            let old = self.next_used.wrapping_sub(self.num_added);
            self.num_added = 0;
            return self.next_used.wrapping_sub(used_event).wrapping_sub(1)
                < self.next_used.wrapping_sub(old);
        }
        true
    }

    /// pier-device's `needs_interrupt`: only for entries used since the
    /// last decision; without EVENT_IDX, the NO_INTERRUPT flag decides.
    pub fn needs_interrupt(&mut self) -> bool {
        if self.next_used == self.used_checked {
            return false;
        }
        self.used_checked = self.next_used;
        let needed = self.needs_notification();
        if !needed || self.ring.event_idx {
            return needed;
        }
        self.ring.avail_flags.load(Ordering::Acquire) & NO_INTERRUPT == 0
    }

    /// pier-device's `drain_tx` (budget unlimited): every chain the
    /// driver published, each returned at once, then kicks re-armed and
    /// the ring looked at again. Returns the chains taken.
    pub fn drain_tx(&mut self) -> u16 {
        let mut taken = 0;
        loop {
            self.disable_notification();
            while let Some(head) = self.pop_head() {
                let n = self.next_used.wrapping_sub(START);
                self.add_used(head, n);
                taken += 1;
            }
            if !self.enable_notification() {
                return taken;
            }
        }
    }

    /// pier-device's `take_rx_chain`: the next rx buffer, or, when the
    /// ring is empty, kicks re-armed and one more look.
    pub fn take_rx_chain(&mut self) -> Option<u16> {
        let head = match self.pop_head() {
            Some(head) => head,
            None => {
                self.kicks_wanted = true;
                if !self.enable_notification() {
                    return None;
                }
                self.pop_head()?
            }
        };
        if self.kicks_wanted {
            self.disable_notification();
            self.kicks_wanted = false;
        }
        Some(head)
    }
}
