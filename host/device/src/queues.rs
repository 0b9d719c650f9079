//! Split virtqueues as the device sees them.
//!
//! The driver owns the descriptor table and the available ring, and the
//! device must treat everything it reads from them as hostile: a descriptor
//! may point outside guest memory, chain into itself, or claim a length that
//! overflows. This module turns "whatever the driver published" into either a
//! packet or a precise [`QueueError`], never a panic and never unbounded work.
//!
//! Ring bookkeeping (available/used indices, `avail_event`/`used_event` and
//! the wrap-safe EVENT_IDX arithmetic) is delegated to virtio-queue's
//! [`Queue`], which rust-vmm devices already trust. Descriptor chains are
//! walked here rather than with virtio-queue's `DescriptorChain` iterator,
//! because that iterator ends silently on a loop, a bad index or a length
//! overflow, and a device has to tell those apart from a clean end of chain.
//!
//! Layout is free: the 44-byte vsock header may be split over several
//! descriptors, share one with the payload, or sit alone in front of a
//! payload scattered over many. The header is interpreted only as far as
//! transport framing needs (its `len` field says how many payload bytes
//! follow); all protocol meaning is left to the caller.
//!
//! Buffers are reused: a TX header is copied into a per-queue scratch
//! buffer before it is parsed (so a guest that rewrites it meanwhile cannot
//! make the device see two different headers), and the segment list of a
//! chain lives in a vector sized once for the queue. On a bus whose guest
//! memory no virtual machine can write (the in-process bus, where
//! pier-driver is the only writer), the payload, which the device never
//! parses, is lent in place to [`DeviceQueue::drain_tx`]'s callback when it
//! lies in one guest buffer ([`TxLending::InPlace`]); the chain goes back
//! to the driver only once the callback returned, so a guest → host byte
//! is copied once on the device side (into the host socket), not twice.
//! Guest memory of a real VM is never lent as a `&[u8]`, which would
//! promise a stability the guest need not keep: its payload is handed on
//! where it lies as a [`GuestPayload`] ([`TxLending::Shared`]), which the
//! host stack only copies out of and the bridge sends from by address, so
//! a byte is copied once there too, or copied first ([`TxLending::Copied`])
//! where that measured faster (`pier vhost-user`'s Linux guests).
//!
//! The other way, an RX buffer's payload area can be lent to a host read
//! ([`DeviceQueue::fill_rx`]) as raw iovecs, so that the kernel writes a
//! socket's bytes into guest memory itself and the device only writes the
//! header in front: one copy on the device side instead of two, on every
//! bus (the kernel writing guest memory is what QEMU's devices do too).

use std::fmt;
use std::sync::atomic::Ordering;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::volatile_memory::PtrGuard;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use pier_stack::Payload;
use pier_stack::wire::HEADER_LEN;

pub use crate::guest_copy::{GuestPayload, RxPayload};
use crate::guest_copy::{mark_dirty, read_guest, rx_payload, write_guest};
use crate::ring_trace::QueueTrace;

/// Offset of the little-endian `len` field inside the header.
const HDR_LEN_FIELD: usize = 24;

/// Default cap on one TX packet's payload: 64 KiB, the most a virtio-vsock
/// packet carries (vhost drops larger ones; `docs/linux-behaviours.md#packet-size`).
pub const DEFAULT_MAX_PAYLOAD: usize = pier_stack::wire::MAX_PAYLOAD;

pub use pier_stack::virtio::{EVENT_LEN, EVENT_TRANSPORT_RESET};

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const VIRTQ_DESC_F_INDIRECT: u16 = 4;
const DESC_SIZE: u64 = 16;
const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Why a queue operation failed.
///
/// Errors for which [`QueueError::is_fatal`] is false concern one descriptor
/// chain: the device has already handed that chain back to the driver (used
/// length 0) or, for [`QueueError::BufferTooSmall`], left it in place, so the
/// queue keeps working. Fatal errors mean the rings themselves are unusable;
/// a device should then set DEVICE_NEEDS_RESET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The driver has not made the queue ready (or reset it).
    NotReady,
    /// The driver published more available entries than the ring holds.
    AvailIndex,
    /// The available or used ring could not be accessed in guest memory.
    RingAccess,
    /// The available index moves back and forth while the device drains
    /// (the used ring overlaps it, so the device's own writes move it, or
    /// the driver toggles it): no honest driver's ring, and one the device
    /// would otherwise poll for ever.
    RingsOverlap,
    /// A chain head or `next` field names a descriptor outside its table.
    DescriptorIndex(u16),
    /// The chain visits more descriptors than its table holds: a loop.
    ChainTooLong,
    /// A descriptor table entry could not be read from guest memory.
    DescriptorTable(u64),
    /// An indirect descriptor was used without being negotiated, was
    /// nested, combined with NEXT, or had a malformed table length.
    BadIndirect,
    /// The descriptor lengths of the chain add up past `u32::MAX`.
    LengthOverflow,
    /// A descriptor's buffer is not entirely inside guest memory.
    BadAddress {
        /// Guest-physical start of the buffer.
        addr: u64,
        /// Its length in bytes.
        len: u32,
    },
    /// A device-writable buffer in a TX chain, or a device-readable one in
    /// an RX or event chain.
    WrongDirection,
    /// A TX chain holds fewer bytes than a header.
    ShortHeader(u64),
    /// A TX header announces more payload than the device accepts.
    PayloadTooLong {
        /// The header's `len` field.
        len: u32,
        /// The configured cap.
        max: usize,
    },
    /// A TX header announces more payload than its chain carries.
    Truncated {
        /// The header's `len` field.
        declared: u32,
        /// Payload bytes actually present in the chain.
        available: u64,
    },
    /// The next RX (or event) buffer cannot hold the packet. The chain was
    /// left in the ring, so the caller can split the packet and retry.
    BufferTooSmall {
        /// Bytes the packet needs.
        needed: usize,
        /// Device-writable bytes in the chain.
        capacity: u64,
    },
}

impl QueueError {
    /// Whether the rings themselves are broken (as opposed to one chain).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            QueueError::NotReady
                | QueueError::AvailIndex
                | QueueError::RingAccess
                | QueueError::RingsOverlap
        )
    }
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::NotReady => write!(f, "queue is not ready"),
            QueueError::AvailIndex => write!(f, "available index runs ahead of the ring"),
            QueueError::RingAccess => write!(f, "ring not accessible in guest memory"),
            QueueError::RingsOverlap => {
                write!(f, "available index moves under the device's own writes")
            }
            QueueError::DescriptorIndex(i) => write!(f, "descriptor index {i} out of range"),
            QueueError::ChainTooLong => write!(f, "descriptor chain loops or is too long"),
            QueueError::DescriptorTable(a) => write!(f, "descriptor at {a:#x} unreadable"),
            QueueError::BadIndirect => write!(f, "invalid indirect descriptor"),
            QueueError::LengthOverflow => write!(f, "chain length overflows u32"),
            QueueError::BadAddress { addr, len } => {
                write!(f, "buffer {addr:#x}+{len:#x} outside guest memory")
            }
            QueueError::WrongDirection => write!(f, "descriptor has the wrong direction"),
            QueueError::ShortHeader(n) => write!(f, "chain of {n} bytes is shorter than a header"),
            QueueError::PayloadTooLong { len, max } => {
                write!(f, "payload of {len} bytes exceeds the {max}-byte cap")
            }
            QueueError::Truncated { declared, available } => {
                write!(f, "header announces {declared} payload bytes, chain has {available}")
            }
            QueueError::BufferTooSmall { needed, capacity } => {
                write!(f, "buffer of {capacity} bytes cannot hold {needed}")
            }
        }
    }
}

impl std::error::Error for QueueError {}

/// One TX packet, borrowed from the queue's scratch buffer (and, from
/// [`DeviceQueue::drain_tx`], maybe from the guest's own buffer) until the
/// next call on the queue.
#[derive(Debug)]
pub struct TxPacket<'a> {
    /// The raw 44-byte header, exactly as the driver wrote it.
    pub header: &'a [u8; HEADER_LEN],
    /// The payload: the `len` bytes that follow the header, as bytes
    /// (copied, or lent in place) or left in guest memory
    /// ([`TxLending::Shared`]).
    pub payload: Payload<'a>,
    /// Head descriptor index of the chain: already returned to the driver
    /// by [`DeviceQueue::pop_tx`], returned once the callback is done by
    /// [`DeviceQueue::drain_tx`].
    pub head: u16,
    /// Keeps the guest memory the payload is lent from mapped.
    _lent: Option<PtrGuard>,
}

/// How [`DeviceQueue::drain_tx`] hands a TX payload to its callback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxLending {
    /// Left in guest memory when it lies in one mapped piece, as a
    /// [`GuestPayload`] the callback may only copy out of or send from by
    /// address, the chain returned to the driver only after the callback;
    /// copied into the queue's scratch buffer otherwise. For guest memory
    /// a virtual machine can write at any time (a vCPU, a vhost-user
    /// frontend's guest), where a borrowed `&[u8]` would be a promise of
    /// stability the guest need not keep.
    #[default]
    Shared,
    /// Always copied into the queue's scratch buffer first, so the
    /// callback gets bytes: for callers that want them as a `&[u8]`.
    Copied,
    /// Lent in place when it lies in one guest buffer, the chain returned
    /// to the driver only after the callback: one copy less per guest ->
    /// host byte. Only for memory whose one writer is a driver in this
    /// process that leaves buffers it has published alone until they come
    /// back (pier-driver on the in-process bus).
    InPlace,
}

/// A TX packet as [`DeviceQueue::read_tx`] read it: whole as bytes, or
/// with its payload left in guest memory, which the caller keeps alive
/// while the packet is handed on.
enum ReadTx<'a> {
    Bytes(TxPacket<'a>),
    InGuest { header: &'a [u8; HEADER_LEN], payload: GuestPayload },
}

/// What [`DeviceQueue::drain_tx`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Packets handed to the callback.
    pub packets: usize,
    /// Malformed chains reported to the callback (and returned to the driver).
    pub bad_chains: usize,
    /// The budget ran out with chains still available. Driver
    /// notifications stay off, so the caller must come back by itself
    /// rather than wait for a kick.
    pub more: bool,
}

impl DrainStats {
    /// Chains handed back to the driver, good or bad: each one it may be
    /// waiting for, so each one calls for a used-buffer interrupt.
    pub fn returned(&self) -> usize {
        self.packets + self.bad_chains
    }
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    addr: u64,
    len: u32,
}

/// A split virtqueue on the device side, with the scratch space its data
/// path reuses.
#[derive(Debug)]
pub struct DeviceQueue {
    queue: Queue,
    /// `next_used` when the device last decided whether to interrupt: an
    /// interrupt is only ever owed for entries used since then.
    used_checked: u16,
    /// The driver has been asked to kick on every new RX buffer (the
    /// device ran out and waits for one). Once a buffer is there, kicks
    /// are turned off again: without EVENT_IDX, a driver that polls would
    /// otherwise kick on every refill, each kick a VM exit and a wakeup
    /// of the device thread for nothing. (With EVENT_IDX, turning them off
    /// is a no-op: `avail_event` already stays behind.)
    kicks_wanted: bool,
    indirect: bool,
    max_payload: usize,
    segs: Vec<Segment>,
    scratch: Vec<u8>,
    /// The ring trace's view of this queue, when `--ring-trace` is on;
    /// each hook is one branch on it.
    trace: Option<QueueTrace>,
}

impl DeviceQueue {
    /// Creates a queue offering `max_size` entries (a power of two, at most
    /// 32768). Returns `None` for an invalid size.
    pub fn new(max_size: u16) -> Option<Self> {
        let queue = Queue::new(max_size).ok()?;
        Some(DeviceQueue {
            queue,
            used_checked: 0,
            kicks_wanted: true,
            indirect: false,
            max_payload: DEFAULT_MAX_PAYLOAD,
            // Direct descriptors plus one indirect table, each at most a queue.
            segs: Vec::with_capacity(2 * usize::from(max_size)),
            scratch: Vec::new(),
            trace: None,
        })
    }

    /// Records this queue's events into a ring trace, or stops (`None`).
    pub(crate) fn set_trace(&mut self, trace: Option<QueueTrace>) {
        self.trace = trace;
    }

    /// The underlying virtio-queue state, for the register file and for
    /// save/restore.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Mutable access to the underlying virtio-queue state.
    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Accept indirect descriptors (VIRTIO_F_INDIRECT_DESC negotiated).
    pub fn set_indirect(&mut self, enabled: bool) {
        self.indirect = enabled;
    }

    /// Caps the payload of one TX packet; larger packets are rejected.
    pub fn set_max_payload(&mut self, max: usize) {
        self.max_payload = max;
    }

    /// The TX payload cap.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Returns the queue to its pre-configuration state (device reset).
    pub fn reset(&mut self) {
        if let Some(t) = &mut self.trace
            && self.queue.ready()
        {
            t.stopped();
        }
        self.queue.reset();
        self.used_checked = 0;
        self.kicks_wanted = true;
        self.indirect = false;
    }

    /// Makes a configured queue live, its rings starting at the given
    /// indices. Where the indices start is the bus's decision: virtio-mmio
    /// and PCI start a new queue at 0, while vhost-user hands them over in
    /// SET_VRING_BASE (a queue resumed after migration, or by a new
    /// backend). Returns `false`, leaving the queue not ready, if its rings
    /// do not lie in `mem`.
    pub fn activate<M: GuestMemory>(
        &mut self,
        mem: &M,
        next_avail: u16,
        next_used: u16,
        event_idx: bool,
        indirect: bool,
    ) -> bool {
        self.queue.set_event_idx(event_idx);
        self.queue.set_next_avail(next_avail);
        self.queue.set_next_used(next_used);
        self.used_checked = next_used;
        self.kicks_wanted = true;
        self.queue.set_ready(true);
        if !self.queue.is_valid(mem) {
            self.queue.set_ready(false);
            return false;
        }
        self.indirect = indirect;
        if let Some(t) = &mut self.trace {
            t.live(&self.queue);
        }
        true
    }

    /// Whether the driver marked the queue ready.
    pub fn is_ready(&self) -> bool {
        self.queue.ready()
    }

    /// Whether the driver has published chains the device has not popped.
    pub fn has_available<M: GuestMemory>(&self, mem: &M) -> Result<bool, QueueError> {
        if !self.queue.ready() {
            return Err(QueueError::NotReady);
        }
        let idx =
            self.queue.avail_idx(mem, Ordering::Acquire).map_err(|_| QueueError::RingAccess)?;
        Ok(idx.0 != self.queue.next_avail())
    }

    /// Pops the next TX chain, copies the packet out and returns the chain
    /// to the driver. `Ok(None)` means the ring is empty.
    ///
    /// A malformed chain is returned to the driver with used length 0 and
    /// reported as a non-fatal error; the next call continues with the next
    /// chain.
    pub fn pop_tx<M: GuestMemory>(&mut self, mem: &M) -> Result<Option<TxPacket<'_>>, QueueError> {
        let Some(head) = self.pop_head(mem)? else {
            return Ok(None);
        };
        let parsed = self.read_tx(mem, head, TxLending::Copied).map(|_| ());
        if let Some(t) = &mut self.trace
            && parsed.is_ok()
        {
            t.carries(&self.scratch);
        }
        // The device writes nothing into TX buffers, so the used length is 0
        // whether or not the chain made sense.
        self.give_back(mem, head, 0)?;
        parsed?;
        self.copied_tx(head).map(Some)
    }

    /// Pops up to `budget` available TX chains, passing each packet (or
    /// chain error) to `f`, then re-arms driver notifications. Stops early
    /// on a fatal error.
    ///
    /// Re-arming matters with EVENT_IDX: the driver kicks only when its
    /// available index crosses `avail_event`, so the device must move
    /// `avail_event` forward after each drain and re-check for chains that
    /// raced with it.
    ///
    /// The budget keeps a driver that republishes as fast as the device
    /// pops from holding the device (and the register file's lock) for
    /// ever. When it runs out, [`DrainStats::more`] is set and
    /// notifications stay off: the caller must drain again on its own.
    ///
    /// A round that finds nothing to pop yet ends with more available is
    /// a chain published in between, which the next round takes. Two such
    /// rounds in a row mean the index moves back and forth (the used ring
    /// overlaps it, and re-arming writes it): that is
    /// [`QueueError::RingsOverlap`], not a reason to poll for ever.
    pub fn drain_tx<M, F>(
        &mut self,
        mem: &M,
        budget: usize,
        lending: TxLending,
        mut f: F,
    ) -> Result<DrainStats, QueueError>
    where
        M: GuestMemory,
        F: FnMut(Result<TxPacket<'_>, QueueError>),
    {
        let mut stats = DrainStats::default();
        let mut idle_rounds = 0;
        loop {
            self.disable_notification(mem)?;
            let returned = stats.returned();
            loop {
                if stats.returned() >= budget {
                    stats.more = self.has_available(mem)?;
                    if stats.more {
                        return Ok(stats);
                    }
                    break;
                }
                let Some(head) = self.pop_head(mem)? else { break };
                match self.read_tx(mem, head, lending) {
                    Ok(read) => {
                        stats.packets += 1;
                        match read {
                            ReadTx::Bytes(packet) => f(Ok(packet)),
                            ReadTx::InGuest { header, payload } => f(Ok(TxPacket {
                                header,
                                payload: Payload::shared(&payload),
                                head,
                                _lent: None,
                            })),
                        }
                        if let Some(t) = &mut self.trace {
                            t.carries(&self.scratch);
                        }
                    }
                    Err(e) => {
                        stats.bad_chains += 1;
                        f(Err(e));
                    }
                }
                // Only now may the driver reuse the buffers (the payload
                // may have been read in place); the used length is 0
                // whether or not the chain made sense.
                self.give_back(mem, head, 0)?;
            }
            if !self.enable_notification(mem)? {
                return Ok(stats);
            }
            idle_rounds = if stats.returned() == returned { idle_rounds + 1 } else { 0 };
            if idle_rounds == 2 {
                return Err(QueueError::RingsOverlap);
            }
        }
    }

    /// Writes one packet (header, then payload) into the next RX chain and
    /// returns the used length. `Ok(None)` means the driver has posted no RX
    /// buffer; the caller should keep the packet and wait for a kick.
    ///
    /// The header is written verbatim; making its `len` field match the
    /// payload is the caller's job.
    pub fn write_rx<M: GuestMemory>(
        &mut self,
        mem: &M,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<Option<u32>, QueueError> {
        self.write_chain(mem, &[header, payload])
    }

    /// Posts a `struct virtio_vsock_event` with the given id into the event
    /// queue. Returns `false` if the driver has posted no event buffer.
    pub fn post_event<M: GuestMemory>(&mut self, mem: &M, id: u32) -> Result<bool, QueueError> {
        let bytes = id.to_le_bytes();
        Ok(self.write_chain(mem, &[&bytes])?.is_some())
    }

    /// Whether the driver wants an interrupt for the used entries added
    /// since the last call (EVENT_IDX-aware, wrap-safe).
    ///
    /// This has a side effect: after it returns `true` it will not return
    /// `true` again until more entries are used, so call it once per batch
    /// and actually raise the interrupt when it says so.
    ///
    /// It answers `false` when no chain was returned since the last call,
    /// so a caller may ask after every round, whatever the round did.
    pub fn needs_interrupt<M: GuestMemory>(&mut self, mem: &M) -> Result<bool, QueueError> {
        if !self.queue.ready() {
            return Ok(false);
        }
        let used = self.queue.next_used();
        if used == self.used_checked {
            return Ok(false);
        }
        self.used_checked = used;
        let needed = self.queue.needs_notification(mem).map_err(|_| QueueError::RingAccess)?;
        let raise = if !needed || self.queue.event_idx_enabled() {
            needed
        } else {
            // Without EVENT_IDX the driver suppresses interrupts with the
            // avail ring's NO_INTERRUPT flag, which virtio-queue does not
            // look at.
            let flags: u16 = mem
                .load(GuestAddress(self.queue.avail_ring()), Ordering::Acquire)
                .map_err(|_| QueueError::RingAccess)?;
            u16::from_le(flags) & VIRTQ_AVAIL_F_NO_INTERRUPT == 0
        };
        if let Some(t) = &mut self.trace {
            t.interrupt(mem, &self.queue, raise);
        }
        Ok(raise)
    }

    /// Asks the driver to kick on the next available chain. Returns `true`
    /// if chains arrived in the meantime (then process them instead of
    /// waiting for a kick that may never come).
    pub fn enable_notification<M: GuestMemory>(&mut self, mem: &M) -> Result<bool, QueueError> {
        if !self.queue.ready() {
            return Err(QueueError::NotReady);
        }
        let more = self.queue.enable_notification(mem).map_err(|_| QueueError::RingAccess)?;
        if let Some(t) = &mut self.trace {
            t.notifications(mem, &self.queue);
        }
        Ok(more)
    }

    /// Tells the driver that kicks are not needed while the device polls.
    pub fn disable_notification<M: GuestMemory>(&mut self, mem: &M) -> Result<(), QueueError> {
        self.queue.disable_notification(mem).map_err(|_| QueueError::RingAccess)?;
        if let Some(t) = &mut self.trace {
            t.notifications(mem, &self.queue);
        }
        Ok(())
    }

    /// Takes the next head index off the available ring.
    fn pop_head<M: GuestMemory>(&mut self, mem: &M) -> Result<Option<u16>, QueueError> {
        if !self.queue.ready() {
            return Err(QueueError::NotReady);
        }
        let mut iter = self.queue.iter(mem).map_err(|e| match e {
            virtio_queue::Error::InvalidAvailRingIndex => QueueError::AvailIndex,
            virtio_queue::Error::QueueNotReady => QueueError::NotReady,
            _ => QueueError::RingAccess,
        })?;
        let head = iter.next().map(|chain| chain.head_index());
        if let Some(t) = &mut self.trace
            && let Some(head) = head
        {
            t.took(mem, &self.queue, head);
        }
        Ok(head)
    }

    /// Returns a chain to the driver through the used ring.
    fn give_back<M: GuestMemory>(
        &mut self,
        mem: &M,
        head: u16,
        len: u32,
    ) -> Result<(), QueueError> {
        if head >= self.queue.size() {
            // A head outside the table cannot be returned; the driver broke
            // its own ring and loses that entry.
            return Ok(());
        }
        self.queue.add_used(mem, head, len).map_err(|_| QueueError::RingAccess)?;
        if let Some(t) = &mut self.trace {
            t.used(&self.queue, head, len);
        }
        Ok(())
    }

    /// Walks the chain at `head` into `self.segs`, checking every
    /// descriptor. Returns the total byte count.
    fn collect<M: GuestMemory>(
        &mut self,
        mem: &M,
        head: u16,
        writable: bool,
    ) -> Result<u64, QueueError> {
        self.segs.clear();
        let mut table = GuestAddress(self.queue.desc_table());
        let mut table_len = self.queue.size();
        let mut budget = table_len;
        let mut index = head;
        let mut in_indirect = false;
        let mut total: u32 = 0;
        let access = if writable { Permissions::Write } else { Permissions::Read };
        loop {
            if index >= table_len {
                return Err(QueueError::DescriptorIndex(index));
            }
            if budget == 0 {
                return Err(QueueError::ChainTooLong);
            }
            budget -= 1;
            let at = table
                .checked_add(u64::from(index) * DESC_SIZE)
                .ok_or(QueueError::DescriptorTable(table.0))?;
            let desc: Descriptor =
                mem.read_obj(at).map_err(|_| QueueError::DescriptorTable(at.0))?;
            let flags = desc.flags();

            if flags & VIRTQ_DESC_F_INDIRECT != 0 {
                if !self.indirect || in_indirect || flags & VIRTQ_DESC_F_NEXT != 0 {
                    return Err(QueueError::BadIndirect);
                }
                let len = u64::from(desc.len());
                let entries = len / DESC_SIZE;
                if len == 0
                    || !len.is_multiple_of(DESC_SIZE)
                    || entries > u64::from(self.queue.size())
                {
                    return Err(QueueError::BadIndirect);
                }
                if !mem.check_range(desc.addr(), len as usize, Permissions::Read) {
                    return Err(QueueError::BadAddress { addr: desc.addr().0, len: desc.len() });
                }
                table = desc.addr();
                // `entries` is at most the queue size, so it fits in u16.
                table_len = entries as u16;
                budget = table_len;
                index = 0;
                in_indirect = true;
                continue;
            }

            if (flags & VIRTQ_DESC_F_WRITE != 0) != writable {
                return Err(QueueError::WrongDirection);
            }
            total = total.checked_add(desc.len()).ok_or(QueueError::LengthOverflow)?;
            if desc.len() > 0 {
                if !mem.check_range(desc.addr(), desc.len() as usize, access) {
                    return Err(QueueError::BadAddress { addr: desc.addr().0, len: desc.len() });
                }
                self.segs.push(Segment { addr: desc.addr().0, len: desc.len() });
            }
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                return Ok(u64::from(total));
            }
            index = desc.next();
        }
    }

    /// Reads the TX packet at `head`: the header into the scratch buffer,
    /// and the payload after it, unless `lending` lets it stay where it is
    /// and it lies in one mapped guest buffer.
    fn read_tx<'a, M: GuestMemory>(
        &'a mut self,
        mem: &'a M,
        head: u16,
        lending: TxLending,
    ) -> Result<ReadTx<'a>, QueueError> {
        let total = self.collect(mem, head, false)?;
        if total < HEADER_LEN as u64 {
            return Err(QueueError::ShortHeader(total));
        }
        let cap = HEADER_LEN + self.max_payload;
        if self.scratch.len() < cap {
            // Grows once per queue (or when the cap is raised), never per packet.
            self.scratch.resize(cap, 0);
        }
        // The header first: `total` says the segments hold it.
        let (mut seg_idx, mut seg_off) = (0usize, 0usize);
        let mut copied = 0usize;
        let mut want = HEADER_LEN;
        let mut payload_len = None;
        while copied < want {
            let Some(&seg) = self.segs.get(seg_idx) else { break };
            let n = (seg.len as usize - seg_off).min(want - copied);
            let addr = GuestAddress(seg.addr).unchecked_add(seg_off as u64);
            read_guest(mem, addr, &mut self.scratch[copied..copied + n])
                .map_err(|_| QueueError::BadAddress { addr: seg.addr, len: seg.len })?;
            copied += n;
            seg_off += n;
            if seg_off == seg.len as usize {
                seg_idx += 1;
                seg_off = 0;
            }
            if copied == HEADER_LEN && payload_len.is_none() {
                let len = hdr_len_field(&self.scratch);
                if len as usize > self.max_payload {
                    return Err(QueueError::PayloadTooLong { len, max: self.max_payload });
                }
                let available = total - HEADER_LEN as u64;
                if u64::from(len) > available {
                    return Err(QueueError::Truncated { declared: len, available });
                }
                let len = len as usize;
                payload_len = Some(len);
                want = HEADER_LEN + len;
                let in_one_buffer =
                    self.segs.get(seg_idx).is_some_and(|s| s.len as usize - seg_off >= len);
                if lending != TxLending::Copied && len > 0 && in_one_buffer {
                    let seg = self.segs[seg_idx];
                    let addr = GuestAddress(seg.addr).unchecked_add(seg_off as u64);
                    if lending == TxLending::Shared
                        && let Some(payload) = GuestPayload::map(mem, addr, len)
                    {
                        return Ok(ReadTx::InGuest { header: self.header()?, payload });
                    }
                    if lending == TxLending::InPlace
                        && let Some((payload, guard)) = lend_guest_bytes(mem, addr, len)
                    {
                        return self.lent_tx(head, payload, guard).map(ReadTx::Bytes);
                    }
                }
                // Otherwise the payload is copied after the header: it is
                // split, or not mapped in one piece.
            }
        }
        // `total >= HEADER_LEN` guarantees the header was read, and the length
        // check guarantees the payload was too.
        payload_len.ok_or(QueueError::ShortHeader(total))?;
        self.copied_tx(head).map(ReadTx::Bytes)
    }

    /// The header [`Self::read_tx`] copied into the scratch buffer.
    fn header(&self) -> Result<&[u8; HEADER_LEN], QueueError> {
        self.scratch.first_chunk::<HEADER_LEN>().ok_or(QueueError::ShortHeader(0))
    }

    /// The packet whose header is in the scratch buffer and whose payload is
    /// lent from guest memory.
    fn lent_tx<'a>(
        &'a self,
        head: u16,
        payload: &'a [u8],
        guard: PtrGuard,
    ) -> Result<TxPacket<'a>, QueueError> {
        let header = self.header()?;
        Ok(TxPacket { header, payload: Payload::bytes(payload), head, _lent: Some(guard) })
    }

    /// The packet [`Self::read_tx`] copied whole into the scratch buffer.
    fn copied_tx(&self, head: u16) -> Result<TxPacket<'_>, QueueError> {
        let (header, rest) =
            self.scratch.split_first_chunk::<HEADER_LEN>().ok_or(QueueError::ShortHeader(0))?;
        let len = hdr_len_field(header) as usize;
        let payload = rest.get(..len).ok_or(QueueError::ShortHeader(0))?;
        Ok(TxPacket { header, payload: Payload::bytes(payload), head, _lent: None })
    }

    /// Writes `parts` back to back into the next device-writable chain.
    fn write_chain<M: GuestMemory>(
        &mut self,
        mem: &M,
        parts: &[&[u8]],
    ) -> Result<Option<u32>, QueueError> {
        let Some((head, capacity)) = self.take_rx_chain(mem)? else {
            return Ok(None);
        };
        let needed: usize = parts.iter().map(|p| p.len()).sum();
        if capacity < needed as u64 {
            let header = parts.first().map_or(0, |p| p.len());
            return Err(self.too_small(mem, head, header, needed, capacity)?);
        }
        let written = self.write_parts(mem, head, parts, needed, capacity)?;
        if let (Some(t), Some(header)) = (&mut self.trace, parts.first()) {
            t.carries(header);
        }
        // `written <= capacity <= u32::MAX` (chain lengths are checked).
        let used = written as u32;
        self.give_back(mem, head, used)?;
        Ok(Some(used))
    }

    /// Lends the payload area of the next RX chain (what follows its first
    /// [`HEADER_LEN`] bytes) to `fill`, for a packet whose bytes a host read
    /// writes into guest memory itself (see [`RxPayload`]); `fill` returns
    /// the packet's header, whose `len` field says how many bytes it wrote,
    /// and the device writes the header in front of them and returns the
    /// chain with both. `fill` returning `None` leaves the chain in the ring
    /// for the next packet.
    ///
    /// `Ok(None)` means the driver has posted no RX buffer (`fill` was not
    /// called) or `fill` declined; a chain with no room for a header and a
    /// byte is [`QueueError::BufferTooSmall`], as for [`Self::write_rx`].
    pub fn fill_rx<M: GuestMemory>(
        &mut self,
        mem: &M,
        fill: impl FnOnce(&mut RxPayload<'_>) -> Option<[u8; HEADER_LEN]>,
    ) -> Result<Option<u32>, QueueError> {
        let Some((head, capacity)) = self.take_rx_chain(mem)? else {
            return Ok(None);
        };
        if capacity <= HEADER_LEN as u64 {
            return Err(self.too_small(mem, head, HEADER_LEN, HEADER_LEN + 1, capacity)?);
        }
        let header = {
            let mut payload = rx_payload(mem, self.payload_ranges());
            fill(&mut payload)
        };
        let Some(header) = header else {
            self.put_back();
            return Ok(None);
        };
        let len = (hdr_len_field(&header) as usize).min(capacity as usize - HEADER_LEN);
        for (addr, piece) in self.payload_ranges().scan(len, |left, (addr, piece)| {
            let n = piece.min(*left);
            *left -= n;
            (n > 0).then_some((addr, n))
        }) {
            mark_dirty(mem, addr, piece);
        }
        self.write_parts(mem, head, &[&header], HEADER_LEN, capacity)?;
        if let Some(t) = &mut self.trace {
            t.carries(&header);
        }
        let used = (HEADER_LEN + len) as u32;
        self.give_back(mem, head, used)?;
        Ok(Some(used))
    }

    /// The guest ranges of the chain in `self.segs` that follow its first
    /// [`HEADER_LEN`] bytes.
    fn payload_ranges(&self) -> impl Iterator<Item = (GuestAddress, usize)> + '_ {
        let mut skip = HEADER_LEN;
        self.segs.iter().filter_map(move |seg| {
            let start = skip.min(seg.len as usize);
            skip -= start;
            let len = seg.len as usize - start;
            (len > 0).then(|| (GuestAddress(seg.addr).unchecked_add(start as u64), len))
        })
    }

    /// Pops the next device-writable chain and walks it into `self.segs`;
    /// returns its head and its capacity, or `None` when the ring is empty.
    ///
    /// When the ring is empty the device asks to be kicked for the next
    /// buffer before giving up (with EVENT_IDX, by moving `avail_event` to
    /// the index it waits at), then looks once more for buffers that raced
    /// with that. Without this a Linux driver, which kicks only when its
    /// available index crosses `avail_event`, stops kicking after its
    /// first refill and the device waits for ever.
    fn take_rx_chain<M: GuestMemory>(&mut self, mem: &M) -> Result<Option<(u16, u64)>, QueueError> {
        let head = match self.pop_head(mem)? {
            Some(head) => head,
            None => {
                self.kicks_wanted = true;
                if !self.enable_notification(mem)? {
                    return Ok(None);
                }
                match self.pop_head(mem)? {
                    Some(head) => head,
                    None => return Ok(None),
                }
            }
        };
        if self.kicks_wanted {
            self.disable_notification(mem)?;
            self.kicks_wanted = false;
        }
        match self.collect(mem, head, true) {
            Ok(capacity) => Ok(Some((head, capacity))),
            Err(e) => {
                self.give_back(mem, head, 0)?;
                Err(e)
            }
        }
    }

    /// A chain too small for the packet: one that cannot even hold the
    /// first `header` bytes can never be used, so it goes back to the
    /// driver rather than block the ring; otherwise it stays for a smaller
    /// packet. Returns the error to report.
    fn too_small<M: GuestMemory>(
        &mut self,
        mem: &M,
        head: u16,
        header: usize,
        needed: usize,
        capacity: u64,
    ) -> Result<QueueError, QueueError> {
        if capacity < header as u64 {
            self.give_back(mem, head, 0)?;
        } else {
            self.put_back();
        }
        Ok(QueueError::BufferTooSmall { needed, capacity })
    }

    /// Puts the chain just taken back on the ring, for a later packet.
    fn put_back(&mut self) {
        self.queue.go_to_previous_position();
        if let Some(t) = &mut self.trace {
            t.put_back(&self.queue);
        }
    }

    /// Writes `parts` back to back at the start of the chain in
    /// `self.segs`, which holds at least `needed` bytes; returns the bytes
    /// written. On a failure the chain has gone back to the driver with
    /// what was written.
    fn write_parts<M: GuestMemory>(
        &mut self,
        mem: &M,
        head: u16,
        parts: &[&[u8]],
        needed: usize,
        capacity: u64,
    ) -> Result<usize, QueueError> {
        let mut seg_idx = 0usize;
        let mut seg_off = 0usize;
        let mut written = 0usize;
        for part in parts {
            let mut part_off = 0usize;
            while part_off < part.len() {
                // Capacity was checked by the caller, so a segment is always left.
                let Some(seg) = self.segs.get(seg_idx) else {
                    self.give_back(mem, head, written as u32)?;
                    return Err(QueueError::BufferTooSmall { needed, capacity });
                };
                let n = (seg.len as usize - seg_off).min(part.len() - part_off);
                let addr = GuestAddress(seg.addr).unchecked_add(seg_off as u64);
                if write_guest(mem, addr, &part[part_off..part_off + n]).is_err() {
                    let bad = QueueError::BadAddress { addr: seg.addr, len: seg.len };
                    self.give_back(mem, head, written as u32)?;
                    return Err(bad);
                }
                part_off += n;
                seg_off += n;
                written += n;
                if seg_off == seg.len as usize {
                    seg_idx += 1;
                    seg_off = 0;
                }
            }
        }
        Ok(written)
    }
}

/// `len` bytes of guest memory at `addr` as a byte slice, with the guard
/// that keeps them mapped; `None` if they are not one mapped piece.
fn lend_guest_bytes<M: GuestMemory>(
    mem: &M,
    addr: GuestAddress,
    len: usize,
) -> Option<(&[u8], PtrGuard)> {
    let guard = GuestPayload::map(mem, addr, len)?.into_guard();
    // SAFETY: the range is mapped for `len` bytes (vm-memory checked it
    // against its region) and stays mapped while `mem` is borrowed and
    // `guard` lives, which the caller's `TxPacket` ties together. The bytes
    // belong to a chain the driver published and gets back only after the
    // packet is dropped; by the virtio contract it does not write them
    // meanwhile. A guest that breaks it changes only the payload it sends,
    // which the device passes on without parsing, never the header, which
    // was copied before it was read.
    let bytes = unsafe { std::slice::from_raw_parts(guard.as_ptr(), len) };
    Some((bytes, guard))
}

/// Reads the little-endian `len` field of a header at the start of `buf`.
fn hdr_len_field(buf: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[HDR_LEN_FIELD..HDR_LEN_FIELD + 4]);
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    /// A 16-entry queue whose used ring starts at the available ring's
    /// index: re-arming notifications (the used ring's flags) writes the
    /// index, and disabling them writes it back.
    #[test]
    fn a_used_ring_over_the_available_index_is_an_error_not_an_endless_drain() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut q = DeviceQueue::new(16).unwrap();
        let raw = q.queue_mut();
        raw.set_size(16);
        raw.set_desc_table_address(Some(0), Some(0));
        raw.set_avail_ring_address(Some(0x1002), Some(0));
        raw.set_used_ring_address(Some(0x1004), Some(0));
        assert!(q.activate(&mem, 0, 0, false, false), "every ring is in memory");
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ =
                done.send(q.drain_tx(&mem, 64, TxLending::Copied, |_| {}).map(|s| s.returned()));
        });
        // A guard against the hang this was, not a measurement.
        let result = outcome.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(result, Ok(Err(QueueError::RingsOverlap)));
    }
}
