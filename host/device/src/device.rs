//! The virtio-vsock device itself, whatever bus reaches it.
//!
//! A virtio device is the same state machine on every transport (virtio
//! 1.2 §2 and §3.1): the driver reads the device's features and accepts a
//! subset, moves the device status through ACKNOWLEDGE, DRIVER,
//! FEATURES_OK and DRIVER_OK, sets up each queue's rings, and resets the
//! device by writing status 0. The device answers with used buffers and
//! two kinds of notification: a used-buffer notification per queue and a
//! configuration-change notification. Only the way those steps travel
//! differs per bus:
//!
//! | bus | steps arrive as | notifications leave as |
//! |---|---|---|
//! | virtio-mmio (`pier boot`, `pier run`) | register writes, decoded by [`crate::mmio`] | `InterruptStatus` bits and one interrupt line |
//! | vhost-user (`pier vhost-user`) | the frontend's SET_FEATURES and SET_VRING_* messages | one call eventfd per queue |
//!
//! [`VsockDevice`] is the part that does not differ: features, status and
//! the driver session it starts, the config space (`le64 guest_cid`), the
//! three queues over guest memory, the TRANSPORT_RESET event, and the
//! decision to notify. A bus gives it guest memory (vm-memory's
//! [`GuestAddressSpace`], so KVM guest RAM, a frontend's shared memfd and
//! an in-process DMA region all fit) and a [`Notify`], and sits in front
//! of it as a thin face.
//!
//! Several threads reach one device: the device loop for its rounds, and
//! the bus (a vCPU thread's MMIO exits, vhost-user's control thread). So a
//! running device is shared behind a lock; [`SharedDevice`] is what the
//! device loop needs of that lock, whichever face wraps the device.

use std::fmt;
use std::ops::DerefMut;
use std::sync::{Mutex, MutexGuard};

use pier_stack::wire::HEADER_LEN;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace};

use crate::queues::{
    DEFAULT_MAX_PAYLOAD, DeviceQueue, DrainStats, EVENT_TRANSPORT_RESET, QueueError, RxPayload,
    TxLending, TxPacket,
};
use crate::ring_trace::{QueueTrace, RingTrace};

/// Feature bits a vsock device may offer (the caller picks a subset).
///
/// The vsock and transport bits the driver negotiates are the spec's, in
/// [`pier_stack::virtio`], so the two sides cannot disagree on a bit; only
/// what the device alone offers is defined here.
pub mod features {
    use pier_stack::virtio::VsockFeatures;

    /// Stream sockets. Implied when no socket-type bit is negotiated.
    pub const STREAM: u64 = VsockFeatures::STREAM.bits();
    /// Seqpacket sockets.
    pub const SEQPACKET: u64 = VsockFeatures::SEQPACKET.bits();
    /// The device does not imply STREAM when it is not negotiated.
    pub const NO_IMPLIED_STREAM: u64 = VsockFeatures::NO_IMPLIED_STREAM.bits();
    /// Datagram sockets: an extension of pier's (virtio 1.2 does not
    /// define bit 3, and Linux's driver does not take it), offered to every
    /// driver and carried only for drivers that negotiate it.
    pub const DGRAM: u64 = VsockFeatures::DGRAM.bits();
    /// Indirect descriptor tables. Do not offer this to a virtio-drivers
    /// driver on the in-process transport: its indirect tables live on the
    /// heap, outside the DMA region.
    pub const INDIRECT_DESC: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
    /// `used_event`/`avail_event` notification suppression.
    pub const EVENT_IDX: u64 = VsockFeatures::EVENT_IDX.bits();
    /// A modern (non-legacy) device; required by virtio-mmio version 2.
    pub const VERSION_1: u64 = VsockFeatures::VERSION_1.bits();
}

/// The device status bits (virtio 1.2 §2.1), the same on every transport.
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u32 = 2;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u32 = 4;
    /// The driver accepted the features it wrote; the device may refuse
    /// by leaving the bit clear.
    pub const FEATURES_OK: u32 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub const NEEDS_RESET: u32 = 64;
    /// The driver gave up on the device.
    pub const FAILED: u32 = 128;
}

pub use pier_stack::virtio::{CONFIG_SIZE, NUM_QUEUES, VSOCK_DEVICE_ID};

/// The receive queue's index, as the device's queue array counts (the
/// spec's [`pier_stack::virtio::RX_QUEUE`]).
pub const RX_QUEUE: usize = pier_stack::virtio::RX_QUEUE as usize;
/// The transmit queue's index.
pub const TX_QUEUE: usize = pier_stack::virtio::TX_QUEUE as usize;
/// The event queue's index.
pub const EVENT_QUEUE: usize = pier_stack::virtio::EVENT_QUEUE as usize;

/// Default `VendorID`: "pier" in little-endian.
pub const VENDOR_ID: u32 = u32::from_le_bytes(*b"pier");

/// How a vsock device presents itself.
#[derive(Clone, Debug)]
pub struct VsockConfig {
    /// The guest's context id, read by the driver from config space.
    pub guest_cid: u64,
    /// Offered feature bits (see [`features`]).
    pub features: u64,
    /// The largest queue the device takes (`QueueNumMax` under MMIO): a
    /// power of two, at most 32768.
    pub queue_size: u16,
    /// The vendor id a bus reports (virtio-mmio's `VendorID` register).
    pub vendor_id: u32,
    /// Largest TX payload accepted, in bytes.
    pub max_tx_payload: usize,
    /// Where every queue event is recorded (`--ring-trace`), if anywhere.
    pub ring_trace: Option<RingTrace>,
}

impl Default for VsockConfig {
    fn default() -> Self {
        VsockConfig {
            guest_cid: 3,
            features: features::VERSION_1
                | features::EVENT_IDX
                | features::STREAM
                | features::SEQPACKET
                | features::NO_IMPLIED_STREAM
                | features::DGRAM,
            queue_size: 256,
            vendor_id: VENDOR_ID,
            max_tx_payload: DEFAULT_MAX_PAYLOAD,
            ring_trace: None,
        }
    }
}

/// Where a queue's rings are and where their indices start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueRings {
    /// Entries in the queue (a power of two).
    pub size: u16,
    /// Guest-physical address of the descriptor table.
    pub desc: u64,
    /// Guest-physical address of the available (driver) ring.
    pub avail: u64,
    /// Guest-physical address of the used (device) ring.
    pub used: u64,
    /// The first available-ring entry the device has not taken yet.
    pub next_avail: u16,
    /// The next used-ring entry the device fills.
    pub next_used: u16,
}

/// Where a stopped queue's rings stood ([`VsockDevice::stop_queue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePosition {
    /// The first available-ring entry the device had not taken.
    pub next_avail: u16,
    /// The next used-ring entry the device would have filled.
    pub next_used: u16,
}

/// What a status write meant for the rest of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusChange {
    /// Nothing beyond the status itself changed.
    None,
    /// Status 0: every queue was forgotten, so must be every connection.
    Reset,
    /// The driver set DRIVER_OK: the queues may now be used.
    DriverOk,
    /// The driver gave up on the device (FAILED).
    Failed,
}

/// How the device's notifications reach the driver: the bus's half of
/// interrupt delivery (virtio 1.2 §2.3 and §2.7.10).
///
/// The device decides *whether* to notify (EVENT_IDX, `NO_INTERRUPT`); the
/// bus decides *how*: virtio-mmio sets an `InterruptStatus` bit and raises
/// its one line, vhost-user writes the queue's call eventfd.
pub trait Notify: Send + fmt::Debug {
    /// Queue `queue` has new used buffers the driver asked to hear about.
    fn used_buffer(&mut self, queue: usize);
    /// The config space changed (the guest CID), or the device needs a
    /// reset.
    fn config_changed(&mut self);
}

/// A bus that delivers no notification (tests that poll, and a bus whose
/// interrupt lines come later).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoNotify;

impl Notify for NoNotify {
    fn used_buffer(&mut self, _queue: usize) {}
    fn config_changed(&mut self) {}
}

/// The state of one virtio-vsock device, bus-neutral; see the [module
/// documentation](self).
#[derive(Debug)]
pub struct VsockDevice<A: GuestAddressSpace> {
    mem: A,
    config: VsockConfig,
    driver_features: u64,
    queues: [DeviceQueue; NUM_QUEUES],
    status: u32,
    config_generation: u32,
    guest_cid: u64,
    notify: Box<dyn Notify>,
    interrupts_raised: u64,
    /// Bumped by every reset and every DRIVER_OK: each value is one driver
    /// session, and whoever keeps state for the driver (the host endpoint's
    /// connections) starts afresh when it changes.
    session: u64,
    /// A TRANSPORT_RESET event that found no event buffer posted. It is
    /// delivered as soon as the driver posts one.
    transport_reset_pending: bool,
    /// Chains a device round may pop from the tx queue before it lets the
    /// lock go (see [`DeviceQueue::drain_tx`]).
    tx_budget: usize,
    /// Whether TX payloads may be lent in place (see [`TxLending`]).
    tx_lending: TxLending,
    /// The driver's status writes and the queues it made live, in order,
    /// for the virtqueue walkthrough to print (testing builds only).
    #[cfg(feature = "testing")]
    lifecycle: Vec<LifecycleEvent>,
}

/// One step of the driver bringing the device up or down, as recorded
/// for [`VsockDevice::lifecycle`] (testing builds only).
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecycleEvent {
    /// The driver wrote `written` to the status register; the device
    /// kept `now` (it clears bits it refuses, such as FEATURES_OK).
    Status { written: u32, now: u32 },
    /// The driver set `QueueReady` and the queue went live.
    QueueLive(usize),
}

/// Most lifecycle events kept: a few driver sessions' worth.
#[cfg(feature = "testing")]
const LIFECYCLE_EVENTS: usize = 256;

impl<A: GuestAddressSpace> VsockDevice<A> {
    /// Creates a device over `mem` that notifies the driver through
    /// `notify`. Returns `None` if `config.queue_size` is not a power of
    /// two in 1..=32768.
    pub fn new(mem: A, config: VsockConfig, notify: Box<dyn Notify>) -> Option<Self> {
        let mk = || {
            let mut q = DeviceQueue::new(config.queue_size)?;
            q.set_max_payload(config.max_tx_payload);
            Some(q)
        };
        let mut queues = [mk()?, mk()?, mk()?];
        for (index, q) in queues.iter_mut().enumerate() {
            q.set_trace(config.ring_trace.clone().map(|t| QueueTrace::new(t, index)));
        }
        Some(VsockDevice {
            tx_budget: usize::from(config.queue_size),
            tx_lending: TxLending::Shared,
            mem,
            guest_cid: config.guest_cid,
            config,
            driver_features: 0,
            queues,
            status: 0,
            config_generation: 0,
            notify,
            interrupts_raised: 0,
            session: 0,
            transport_reset_pending: false,
            #[cfg(feature = "testing")]
            lifecycle: Vec::new(),
        })
    }

    /// The status writes and queue activations so far, oldest first
    /// (the first few hundred), for the virtqueue walkthrough.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn lifecycle(&self) -> &[LifecycleEvent] {
        &self.lifecycle
    }

    #[cfg(feature = "testing")]
    fn record(&mut self, event: LifecycleEvent) {
        if self.lifecycle.len() < LIFECYCLE_EVENTS {
            self.lifecycle.push(event);
        }
    }

    /// Replaces how notifications reach the driver (a bus whose lines are
    /// handed over after the device was made).
    pub fn set_notify(&mut self, notify: Box<dyn Notify>) {
        self.notify = notify;
    }

    /// How many notifications the device has sent so far, of both kinds.
    pub fn interrupts_raised(&self) -> u64 {
        self.interrupts_raised
    }

    /// The guest memory the queues live in.
    pub fn memory(&self) -> &A {
        &self.mem
    }

    /// The ring trace the device records into, if any (for a bus's own
    /// hooks: the kicks it sees).
    pub fn ring_trace(&self) -> Option<&RingTrace> {
        self.config.ring_trace.as_ref()
    }

    /// The configuration the device was created with.
    pub fn config(&self) -> &VsockConfig {
        &self.config
    }

    /// Features offered by the device.
    pub fn device_features(&self) -> u64 {
        self.config.features
    }

    /// The features the driver has written so far, accepted or not.
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// Features the driver accepted; meaningful once FEATURES_OK is set.
    pub fn negotiated_features(&self) -> u64 {
        if self.status & status::FEATURES_OK != 0 { self.driver_features } else { 0 }
    }

    /// The device status.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the driver finished initialisation and may be served: not
    /// before DRIVER_OK, and not once either side gave up (the driver set
    /// FAILED, or the device NEEDS_RESET).
    pub fn driver_ok(&self) -> bool {
        self.status & status::DRIVER_OK != 0
            && self.status & (status::NEEDS_RESET | status::FAILED) == 0
    }

    /// The current driver session: changes on every reset and every
    /// DRIVER_OK. State kept for one driver is stale once it changes.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The current guest CID.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Bumped by every config-space change, so a driver can tell a torn
    /// read of the 64-bit CID (virtio 1.2 §2.5.1).
    pub fn config_generation(&self) -> u32 {
        self.config_generation
    }

    /// Reads the config space (`le64 guest_cid`) at `offset`; bytes past
    /// its end read as zero.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.guest_cid.to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset.checked_add(i as u64);
            *byte = at.and_then(|at| config.get(usize::try_from(at).ok()?)).copied().unwrap_or(0);
        }
    }

    /// One of the three queues.
    pub fn queue(&self, index: usize) -> Option<&DeviceQueue> {
        self.queues.get(index)
    }

    /// One of the three queues, mutably.
    pub fn queue_mut(&mut self, index: usize) -> Option<&mut DeviceQueue> {
        self.queues.get_mut(index)
    }

    /// Runs `f` with a queue and the guest memory it lives in.
    pub fn with_queue<R>(
        &mut self,
        index: usize,
        f: impl FnOnce(&mut DeviceQueue, &A::M) -> R,
    ) -> Option<R> {
        let mem = self.mem.memory();
        let q = self.queues.get_mut(index)?;
        Some(f(q, &*mem))
    }

    /// The driver writes the features it accepts. Taken only between
    /// DRIVER and FEATURES_OK (virtio 1.2 §3.1.1 steps 3-5); ignored
    /// otherwise, as a device must.
    pub fn set_driver_features(&mut self, features: u64) {
        if self.status & status::DRIVER == 0 || self.status & status::FEATURES_OK != 0 {
            return;
        }
        self.driver_features = features;
    }

    /// The driver writes the device status (virtio 1.2 §2.1 and §3.1.1).
    ///
    /// 0 resets the device. Otherwise a driver only ever adds bits;
    /// FEATURES_OK stays clear if the accepted features are not a subset of
    /// the offer or lack VERSION_1; DRIVER_OK needs FEATURES_OK; and
    /// NEEDS_RESET belongs to the device.
    pub fn set_status(&mut self, value: u32) -> StatusChange {
        let old = self.status;
        let change = self.apply_status(value);
        if let Some(trace) = &self.config.ring_trace {
            if value & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
                let accepted = self.status & status::FEATURES_OK != 0;
                trace.features(self.config.features, self.driver_features, accepted);
            }
            trace.status(value, self.status);
        }
        #[cfg(feature = "testing")]
        self.record(LifecycleEvent::Status { written: value, now: self.status });
        change
    }

    fn apply_status(&mut self, value: u32) -> StatusChange {
        if value == 0 {
            self.reset();
            return StatusChange::Reset;
        }
        let old = self.status;
        if (old & !status::NEEDS_RESET) & !value != 0 {
            return StatusChange::None;
        }
        let mut new = (value & !status::NEEDS_RESET) | (old & status::NEEDS_RESET);
        if new & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
            let acceptable = self.driver_features & !self.config.features == 0
                && self.driver_features & features::VERSION_1 != 0;
            if !acceptable {
                new &= !status::FEATURES_OK;
            }
        }
        if new & status::DRIVER_OK != 0 && new & status::FEATURES_OK == 0 {
            new &= !status::DRIVER_OK;
        }
        self.status = new;
        if new & status::FAILED != 0 && old & status::FAILED == 0 {
            StatusChange::Failed
        } else if new & status::DRIVER_OK != 0 && old & status::DRIVER_OK == 0 {
            self.session += 1;
            StatusChange::DriverOk
        } else {
            StatusChange::None
        }
    }

    /// Resets the device: status, features and every queue are forgotten,
    /// and a new driver session begins.
    pub fn reset(&mut self) {
        if let Some(trace) = &self.config.ring_trace {
            trace.reset();
        }
        self.session += 1;
        self.transport_reset_pending = false;
        self.status = 0;
        self.driver_features = 0;
        for q in &mut self.queues {
            q.reset();
        }
    }

    /// Sets up queue `index` with `rings` and makes it live, its indices
    /// starting where `rings` says (0 on virtio-mmio; where the frontend
    /// says under vhost-user), with the ring features negotiated so far.
    /// Returns `false`, leaving the queue stopped, if the queue is live
    /// already, the size is invalid or the rings lie outside guest memory.
    pub fn activate_queue(&mut self, index: usize, rings: QueueRings) -> bool {
        let live = self.try_activate_queue(index, rings);
        #[cfg(feature = "testing")]
        if live {
            self.record(LifecycleEvent::QueueLive(index));
        }
        live
    }

    fn try_activate_queue(&mut self, index: usize, rings: QueueRings) -> bool {
        let event_idx = self.negotiated_features() & features::EVENT_IDX != 0;
        let indirect = self.negotiated_features() & features::INDIRECT_DESC != 0;
        let mem = self.mem.memory();
        let Some(dq) = self.queues.get_mut(index) else {
            return false;
        };
        if dq.is_ready() {
            return false;
        }
        let q = dq.queue_mut();
        let configured = q.try_set_size(rings.size).is_ok()
            && q.try_set_desc_table_address(GuestAddress(rings.desc)).is_ok()
            && q.try_set_avail_ring_address(GuestAddress(rings.avail)).is_ok()
            && q.try_set_used_ring_address(GuestAddress(rings.used)).is_ok();
        configured && dq.activate(&*mem, rings.next_avail, rings.next_used, event_idx, indirect)
    }

    /// Stops queue `index` and forgets its ring positions, so that a new
    /// setup starts afresh. Returns where its rings stood, or `None` if it
    /// was not live.
    pub fn deactivate_queue(&mut self, index: usize) -> Option<QueuePosition> {
        let dq = self.queues.get_mut(index)?;
        let position = dq.is_ready().then(|| QueuePosition {
            next_avail: dq.queue().next_avail(),
            next_used: dq.queue().next_used(),
        });
        dq.reset();
        position
    }

    /// For a bus without registers, whose frontend negotiates on the
    /// driver's behalf (vhost-user's SET_FEATURES, which may come more than
    /// once): takes `features` as the driver's feature writes followed by
    /// FEATURES_OK. Bits the device did not offer are dropped rather than
    /// refused, because such a frontend mixes in bits of its own transport
    /// (vhost-user's PROTOCOL_FEATURES). Returns the bits the device keeps.
    pub fn accept_driver_features(&mut self, features: u64) -> u64 {
        self.driver_features = features & self.config.features;
        self.status |= status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        if let Some(trace) = &self.config.ring_trace {
            trace.features(self.config.features, self.driver_features, true);
        }
        self.driver_features
    }

    /// For a bus without registers: makes queue `index` live (see
    /// [`Self::activate_queue`]), first forgetting any earlier setup of it.
    ///
    /// Once the rx and tx queues are both live, the driver counts as
    /// started (DRIVER_OK, a new session); the event queue is not needed,
    /// because under vhost-user it belongs to the frontend.
    pub fn start_queue(&mut self, index: usize, rings: QueueRings) -> bool {
        self.deactivate_queue(index);
        if !self.activate_queue(index, rings) {
            return false;
        }
        let running = self.queues[RX_QUEUE].is_ready() && self.queues[TX_QUEUE].is_ready();
        if running && self.status & status::DRIVER_OK == 0 {
            self.status |= status::DRIVER_OK;
            self.session += 1;
        }
        true
    }

    /// For a bus without registers: stops queue `index` and returns where
    /// its rings stopped, for the frontend to resume them later (vhost-user's
    /// GET_VRING_BASE), or `None` if it was not live. Stopping the rx or tx
    /// queue ends the driver's session: the host side's connections are
    /// reset, as after a device reset.
    pub fn stop_queue(&mut self, index: usize) -> Option<QueuePosition> {
        let position = self.deactivate_queue(index)?;
        if index != EVENT_QUEUE && self.status & status::DRIVER_OK != 0 {
            self.status &= !status::DRIVER_OK;
            self.session += 1;
        }
        Some(position)
    }

    /// Pops every TX packet (see [`DeviceQueue::drain_tx`]).
    pub fn drain_tx<F>(&mut self, f: F) -> Result<DrainStats, QueueError>
    where
        F: FnMut(Result<TxPacket<'_>, QueueError>),
    {
        if !self.driver_ok() {
            return Err(QueueError::NotReady);
        }
        let mem = self.mem.memory();
        let result = self.queues[TX_QUEUE].drain_tx(&*mem, self.tx_budget, self.tx_lending, f);
        drop(mem);
        self.note_queue_result(&result);
        result
    }

    /// Lets [`Self::drain_tx`] lend TX payloads in place. Only a bus whose
    /// guest memory no virtual machine can write may set
    /// [`TxLending::InPlace`]; see [`TxLending`].
    pub fn set_tx_lending(&mut self, lending: TxLending) {
        self.tx_lending = lending;
    }

    /// Caps how many tx chains one [`Self::drain_tx`] takes (at least 1).
    pub fn set_tx_budget(&mut self, budget: usize) {
        self.tx_budget = budget.max(1);
    }

    /// A fatal queue error means the driver broke its rings: the device
    /// can do nothing more with them, so it says so (DEVICE_NEEDS_RESET
    /// and a config notification) instead of failing quietly for ever.
    fn note_queue_result<T>(&mut self, result: &Result<T, QueueError>) {
        if let Err(e) = result
            && e.is_fatal()
            && *e != QueueError::NotReady
        {
            self.set_needs_reset();
        }
    }

    /// Writes a packet into the next RX buffer (see
    /// [`DeviceQueue::write_rx`]).
    pub fn write_rx(
        &mut self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<Option<u32>, QueueError> {
        self.on_live_queue(RX_QUEUE, |q, mem| q.write_rx(mem, header, payload))
    }

    /// Lends the next RX buffer's payload area to `fill` (see
    /// [`DeviceQueue::fill_rx`]).
    pub fn fill_rx(
        &mut self,
        fill: impl FnOnce(&mut RxPayload<'_>) -> Option<[u8; HEADER_LEN]>,
    ) -> Result<Option<u32>, QueueError> {
        self.on_live_queue(RX_QUEUE, |q, mem| q.fill_rx(mem, fill))
    }

    /// Posts an event (see [`DeviceQueue::post_event`]).
    pub fn post_event(&mut self, id: u32) -> Result<bool, QueueError> {
        self.on_live_queue(EVENT_QUEUE, |q, mem| q.post_event(mem, id))
    }

    /// Runs a data-path operation on a queue of a driver that reached
    /// DRIVER_OK (not ready otherwise), and notes a fatal error it returns.
    fn on_live_queue<T>(
        &mut self,
        index: usize,
        op: impl FnOnce(&mut DeviceQueue, &A::M) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        if !self.driver_ok() {
            return Err(QueueError::NotReady);
        }
        let mem = self.mem.memory();
        let result = op(&mut self.queues[index], &*mem);
        drop(mem);
        self.note_queue_result(&result);
        result
    }

    /// Tells the driver to drop its connections and re-read the CID
    /// (TRANSPORT_RESET). If the driver has no event buffer posted, the
    /// event is kept and delivered by [`Self::deliver_pending_events`] once
    /// it posts one: a lost reset would leave the guest's connections
    /// alive against a host that forgot them.
    pub fn request_transport_reset(&mut self) {
        self.transport_reset_pending = true;
        self.deliver_pending_events();
    }

    /// Whether a TRANSPORT_RESET still waits for an event buffer.
    pub fn transport_reset_pending(&self) -> bool {
        self.transport_reset_pending
    }

    /// Posts a pending TRANSPORT_RESET if an event buffer is there now,
    /// and notifies the driver of it. Cheap when nothing is pending.
    pub fn deliver_pending_events(&mut self) {
        if !self.transport_reset_pending || !self.driver_ok() {
            return;
        }
        if let Ok(true) = self.post_event(EVENT_TRANSPORT_RESET) {
            self.transport_reset_pending = false;
            let _ = self.interrupt_if_needed(EVENT_QUEUE);
        }
    }

    /// Sends a used-buffer notification for `queue` if the driver asked for
    /// one (EVENT_IDX-aware). Returns whether one was sent.
    pub fn interrupt_if_needed(&mut self, queue: usize) -> Result<bool, QueueError> {
        let mem = self.mem.memory();
        let q = self.queues.get_mut(queue).ok_or(QueueError::NotReady)?;
        if !q.needs_interrupt(&*mem)? {
            return Ok(false);
        }
        drop(mem);
        self.interrupts_raised += 1;
        self.notify.used_buffer(queue);
        Ok(true)
    }

    /// Sends a configuration-change notification.
    pub fn notify_config_change(&mut self) {
        self.interrupts_raised += 1;
        self.notify.config_changed();
    }

    /// Counts a notification a face sent on its own line (virtio-mmio's
    /// raw interrupt), so that [`Self::interrupts_raised`] sees every one.
    pub(crate) fn count_interrupt(&mut self) {
        self.interrupts_raised += 1;
    }

    /// Changes the guest CID, as after a migration: bumps the config
    /// generation and notifies a config change. The caller then posts a
    /// TRANSPORT_RESET event.
    pub fn set_guest_cid(&mut self, cid: u64) {
        self.guest_cid = cid;
        self.config_generation = self.config_generation.wrapping_add(1);
        self.notify_config_change();
    }

    /// Marks the device broken (DEVICE_NEEDS_RESET), e.g. after a fatal
    /// queue error, and tells a running driver through a config-change
    /// notification.
    pub fn set_needs_reset(&mut self) {
        self.status |= status::NEEDS_RESET;
        if self.status & status::DRIVER_OK != 0 {
            self.notify_config_change();
        }
    }
}

/// A device that several threads reach, as the device loop needs it: one
/// lock around the device, whatever face (virtio-mmio registers, a
/// vhost-user frontend) also holds it.
pub trait SharedDevice: Send + Sync + 'static {
    /// The guest memory the device's queues live in.
    type Memory: GuestAddressSpace;
    /// The locked device.
    type Guard<'a>: DerefMut<Target = VsockDevice<Self::Memory>>
    where
        Self: 'a;
    /// Locks the device for one part of a round. A poisoned lock is taken
    /// as it is: the device's state stays consistent between calls.
    fn lock_device(&self) -> Self::Guard<'_>;
}

impl<A: GuestAddressSpace + Send + 'static> SharedDevice for Mutex<VsockDevice<A>> {
    type Memory = A;
    type Guard<'a> = MutexGuard<'a, VsockDevice<A>>;

    fn lock_device(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}
