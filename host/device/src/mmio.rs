//! The virtio-mmio (version 2) register file of a vsock device.
//!
//! A driver discovers, configures and resets a virtio device only through
//! these 32-bit registers and the config space behind them, so this is the
//! one place where the device's lifecycle is decided: feature negotiation,
//! queue setup, the reset that must forget every queue, and the interrupt
//! status the driver acknowledges. Everything else in the device reacts to
//! the [`MmioEvent`]s a register write returns.
//!
//! The register file does not care how its accesses arrive. A KVM VMM feeds
//! it MMIO exits; the in-process transport ([`crate::inprocess`]) calls it
//! directly. Nor does it care how guest memory is provided: it is generic
//! over vm-memory's [`GuestAddressSpace`], so a VMM can hand it guest RAM
//! (`Arc<GuestMemoryMmap>`, `GuestMemoryAtomic<..>`) and the in-process
//! transport a region of the process.
//!
//! Accesses are untrusted: a register access of the wrong width or
//! alignment reads as zero and writes are ignored, config-space accesses of
//! any width are clipped to the config space, and no value a driver writes
//! can make the device panic.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard};

use virtio_bindings::virtio_mmio as reg;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace};
use vmm_sys_util::eventfd::EventFd;

use crate::queues::{
    DEFAULT_MAX_PAYLOAD, DeviceQueue, DrainStats, EVENT_TRANSPORT_RESET, HDR_LEN, QueueError,
    TxPacket,
};

/// Feature bits a vsock device may offer (the caller picks a subset).
///
/// The vsock and transport bits the driver negotiates are the driver's own
/// ([`pier_driver::VsockFeatures`]), so the two sides cannot disagree on a
/// bit; only what the device alone offers is defined here.
pub mod features {
    use pier_driver::VsockFeatures;

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

/// `MagicValue`: "virt" in little-endian.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// The virtio-mmio version this register file implements.
pub const MMIO_VERSION: u32 = 2;
/// The virtio device id of a socket (vsock) device.
pub const VSOCK_DEVICE_ID: u32 = 19;
/// Default `VendorID`: "pier" in little-endian.
pub const VENDOR_ID: u32 = u32::from_le_bytes(*b"pier");
/// Offset of the device-specific config space.
pub const CONFIG_OFFSET: u64 = reg::VIRTIO_MMIO_CONFIG as u64;
/// Size of the vsock config space (`le64 guest_cid`).
pub const CONFIG_SIZE: u64 = 8;

/// Index of the receive queue (device to driver).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue (driver to device).
pub const TX_QUEUE: usize = 1;
/// Index of the event queue.
pub const EVENT_QUEUE: usize = 2;
/// Number of queues of a vsock device.
pub const NUM_QUEUES: usize = 3;

/// `InterruptStatus` bit: a queue has new used entries.
pub const INT_VRING: u32 = reg::VIRTIO_MMIO_INT_VRING;
/// `InterruptStatus` bit: the config space changed.
pub const INT_CONFIG: u32 = reg::VIRTIO_MMIO_INT_CONFIG;

const STATUS_ACKNOWLEDGE: u32 = 1;
const STATUS_DRIVER: u32 = 2;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;
const STATUS_NEEDS_RESET: u32 = 64;
const STATUS_FAILED: u32 = 128;

/// How a vsock device presents itself.
#[derive(Clone, Debug)]
pub struct VsockConfig {
    /// The guest's context id, read by the driver from config space.
    pub guest_cid: u64,
    /// Offered feature bits (see [`features`]).
    pub features: u64,
    /// `QueueNumMax` of every queue: a power of two, at most 32768.
    pub queue_size: u16,
    /// The `VendorID` register.
    pub vendor_id: u32,
    /// Largest TX payload accepted, in bytes.
    pub max_tx_payload: usize,
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
        }
    }
}

/// Where a queue's rings are and where their indices start, as a bus
/// without registers hands them over ([`VsockMmio::start_queue`]).
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

/// Where a stopped queue's rings stood ([`VsockMmio::stop_queue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePosition {
    /// The first available-ring entry the device had not taken.
    pub next_avail: u16,
    /// The next used-ring entry the device would have filled.
    pub next_used: u16,
}

/// What a register write means for the rest of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioEvent {
    /// Nothing beyond the register itself changed.
    None,
    /// `QueueNotify`: the driver kicked this queue.
    Notify(u16),
    /// Status 0 was written: every queue was forgotten, so must be every
    /// connection.
    Reset,
    /// The driver set DRIVER_OK: the queues may now be used.
    DriverOk,
    /// The driver gave up on the device (status FAILED).
    Failed,
}

/// Something a register file can be reached through: MMIO exits of a VMM,
/// or the in-process transport.
pub trait MmioBus: Send + Sync {
    /// Reads `data.len()` bytes at `offset` from the start of the device.
    fn mmio_read(&self, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset`, returning what the write means.
    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent;
}

/// Driver-written queue registers, latched until `QueueReady` is set so
/// that half-written 64-bit addresses are never applied.
#[derive(Clone, Copy, Debug, Default)]
struct QueueRegs {
    num: u32,
    desc: u64,
    driver: u64,
    device: u64,
}

/// The register file and queues of one virtio-vsock device.
#[derive(Debug)]
pub struct VsockMmio<A: GuestAddressSpace> {
    mem: A,
    config: VsockConfig,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queue_regs: [QueueRegs; NUM_QUEUES],
    queues: [DeviceQueue; NUM_QUEUES],
    /// `InterruptStatus`, shared with [`MmioDevice`] so that a driver
    /// reading or acknowledging it never waits for the register lock.
    interrupt_status: Arc<AtomicU32>,
    status: u32,
    config_generation: u32,
    guest_cid: u64,
    irq: Option<EventFd>,
    /// Interrupt lines of single queues, for a bus that gives each queue
    /// its own (vhost-user's call eventfds); such a queue's interrupts
    /// skip `InterruptStatus` and the shared line.
    queue_irqs: [Option<EventFd>; NUM_QUEUES],
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
}

impl<A: GuestAddressSpace> VsockMmio<A> {
    /// Creates a device over `mem`. Returns `None` if `config.queue_size`
    /// is not a power of two in 1..=32768.
    pub fn new(mem: A, config: VsockConfig) -> Option<Self> {
        let mk = || {
            let mut q = DeviceQueue::new(config.queue_size)?;
            q.set_max_payload(config.max_tx_payload);
            Some(q)
        };
        let queues = [mk()?, mk()?, mk()?];
        Some(VsockMmio {
            tx_budget: usize::from(config.queue_size),
            mem,
            guest_cid: config.guest_cid,
            config,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queue_regs: [QueueRegs::default(); NUM_QUEUES],
            queues,
            interrupt_status: Arc::new(AtomicU32::new(0)),
            status: 0,
            config_generation: 0,
            irq: None,
            queue_irqs: [None, None, None],
            interrupts_raised: 0,
            session: 0,
            transport_reset_pending: false,
        })
    }

    /// Sets the line interrupts are raised on (a KVM irqfd, or the
    /// in-process transport's interrupt eventfd).
    pub fn set_irq(&mut self, irq: EventFd) {
        self.irq = Some(irq);
    }

    /// Takes the interrupt line away, for a device loop that delivers
    /// interrupts itself (it watches [`Self::interrupts_raised`]).
    pub fn take_irq(&mut self) -> Option<EventFd> {
        self.irq.take()
    }

    /// How many interrupts the device has raised so far.
    pub fn interrupts_raised(&self) -> u64 {
        self.interrupts_raised
    }

    /// The guest memory the queues live in.
    pub fn memory(&self) -> &A {
        &self.mem
    }

    /// The configuration the device was created with.
    pub fn config(&self) -> &VsockConfig {
        &self.config
    }

    /// Features offered by the device.
    pub fn device_features(&self) -> u64 {
        self.config.features
    }

    /// Features the driver accepted; meaningful once FEATURES_OK is set.
    pub fn negotiated_features(&self) -> u64 {
        if self.status & STATUS_FEATURES_OK != 0 { self.driver_features } else { 0 }
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the driver finished initialisation and may be served: not
    /// before DRIVER_OK, and not once either side gave up (the driver set
    /// FAILED, or the device NEEDS_RESET).
    pub fn driver_ok(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0
            && self.status & (STATUS_NEEDS_RESET | STATUS_FAILED) == 0
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

    /// The `InterruptStatus` register.
    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status.load(Ordering::Acquire)
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

    /// Pops every TX packet (see [`DeviceQueue::drain_tx`]).
    pub fn drain_tx<F>(&mut self, f: F) -> Result<DrainStats, QueueError>
    where
        F: FnMut(Result<TxPacket<'_>, QueueError>),
    {
        if !self.driver_ok() {
            return Err(QueueError::NotReady);
        }
        let mem = self.mem.memory();
        let result = self.queues[TX_QUEUE].drain_tx(&*mem, self.tx_budget, f);
        drop(mem);
        self.note_queue_result(&result);
        result
    }

    /// Caps how many tx chains one [`Self::drain_tx`] takes (at least 1).
    pub fn set_tx_budget(&mut self, budget: usize) {
        self.tx_budget = budget.max(1);
    }

    /// A fatal queue error means the driver broke its rings: the device
    /// can do nothing more with them, so it says so (DEVICE_NEEDS_RESET
    /// and a config interrupt) instead of failing quietly for ever.
    fn note_queue_result<T>(&mut self, result: &Result<T, QueueError>) {
        if let Err(e) = result
            && e.is_fatal()
            && *e != QueueError::NotReady
        {
            let _ = self.set_needs_reset();
        }
    }

    /// Writes a packet into the next RX buffer (see
    /// [`DeviceQueue::write_rx`]).
    pub fn write_rx(
        &mut self,
        header: &[u8; HDR_LEN],
        payload: &[u8],
    ) -> Result<Option<u32>, QueueError> {
        if !self.driver_ok() {
            return Err(QueueError::NotReady);
        }
        let mem = self.mem.memory();
        let result = self.queues[RX_QUEUE].write_rx(&*mem, header, payload);
        drop(mem);
        self.note_queue_result(&result);
        result
    }

    /// Posts an event (see [`DeviceQueue::post_event`]).
    pub fn post_event(&mut self, id: u32) -> Result<bool, QueueError> {
        if !self.driver_ok() {
            return Err(QueueError::NotReady);
        }
        let mem = self.mem.memory();
        let result = self.queues[EVENT_QUEUE].post_event(&*mem, id);
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
    /// and interrupts the driver for it. Cheap when nothing is pending.
    pub fn deliver_pending_events(&mut self) {
        if !self.transport_reset_pending || !self.driver_ok() {
            return;
        }
        if let Ok(true) = self.post_event(EVENT_TRANSPORT_RESET) {
            self.transport_reset_pending = false;
            let _ = self.interrupt_if_needed(EVENT_QUEUE);
        }
    }

    /// Raises a used-buffer interrupt for `queue` if the driver asked for
    /// one (EVENT_IDX-aware). Returns whether an interrupt was raised.
    pub fn interrupt_if_needed(&mut self, queue: usize) -> Result<bool, QueueError> {
        let mem = self.mem.memory();
        let q = self.queues.get_mut(queue).ok_or(QueueError::NotReady)?;
        if !q.needs_interrupt(&*mem)? {
            return Ok(false);
        }
        drop(mem);
        // A failed eventfd write only loses a wakeup the driver also
        // recovers from by polling, so it is not a queue error.
        if let Some(line) = &self.queue_irqs[queue] {
            self.interrupts_raised += 1;
            let _ = line.write(1);
        } else {
            let _ = self.raise_interrupt(INT_VRING);
        }
        Ok(true)
    }

    /// Sets bits in `InterruptStatus` and triggers the interrupt line.
    pub fn raise_interrupt(&mut self, bits: u32) -> io::Result<()> {
        self.interrupt_status.fetch_or(bits, Ordering::AcqRel);
        self.interrupts_raised += 1;
        match &self.irq {
            Some(irq) => irq.write(1),
            None => Ok(()),
        }
    }

    /// Changes the guest CID, as after a migration: bumps the config
    /// generation and raises a config interrupt. The caller then posts a
    /// TRANSPORT_RESET event.
    pub fn set_guest_cid(&mut self, cid: u64) -> io::Result<()> {
        self.guest_cid = cid;
        self.config_generation = self.config_generation.wrapping_add(1);
        self.raise_interrupt(INT_CONFIG)
    }

    /// Marks the device broken (DEVICE_NEEDS_RESET), e.g. after a fatal
    /// queue error, and tells the driver through a config interrupt.
    pub fn set_needs_reset(&mut self) -> io::Result<()> {
        self.status |= STATUS_NEEDS_RESET;
        if self.status & STATUS_DRIVER_OK != 0 { self.raise_interrupt(INT_CONFIG) } else { Ok(()) }
    }

    /// For a bus without registers, whose frontend negotiates on the
    /// driver's behalf (vhost-user's SET_FEATURES): takes `features` as the
    /// driver's feature writes followed by FEATURES_OK. Bits the device did
    /// not offer are dropped rather than refused, because such a frontend
    /// mixes in bits of its own transport (vhost-user's
    /// PROTOCOL_FEATURES). Returns the bits the device keeps.
    pub fn accept_driver_features(&mut self, features: u64) -> u64 {
        self.driver_features = features & self.config.features;
        self.status |= STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        self.driver_features
    }

    /// For a bus without registers: makes queue `index` live with `size`
    /// entries at the given guest-physical ring addresses, its indices
    /// starting where the frontend says (vhost-user's SET_VRING_BASE: a
    /// queue resumed by a new backend does not start at 0).
    ///
    /// Once the rx and tx queues are both live, the driver counts as
    /// started (DRIVER_OK, a new session); the event queue is not needed,
    /// because under vhost-user it belongs to the frontend. Returns `false`,
    /// leaving the queue stopped, if the size is invalid or the rings lie
    /// outside guest memory.
    pub fn start_queue(&mut self, index: usize, rings: QueueRings) -> bool {
        let event_idx = self.negotiated_features() & features::EVENT_IDX != 0;
        let indirect = self.negotiated_features() & features::INDIRECT_DESC != 0;
        let mem = self.mem.memory();
        let Some(dq) = self.queues.get_mut(index) else {
            return false;
        };
        dq.reset();
        let q = dq.queue_mut();
        let configured = q.try_set_size(rings.size).is_ok()
            && q.try_set_desc_table_address(GuestAddress(rings.desc)).is_ok()
            && q.try_set_avail_ring_address(GuestAddress(rings.avail)).is_ok()
            && q.try_set_used_ring_address(GuestAddress(rings.used)).is_ok();
        if !configured
            || !dq.activate(&*mem, rings.next_avail, rings.next_used, event_idx, indirect)
        {
            return false;
        }
        drop(mem);
        let running = self.queues[RX_QUEUE].is_ready() && self.queues[TX_QUEUE].is_ready();
        if running && self.status & STATUS_DRIVER_OK == 0 {
            self.status |= STATUS_DRIVER_OK;
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
        let dq = self.queues.get_mut(index)?;
        if !dq.is_ready() {
            return None;
        }
        let position = QueuePosition {
            next_avail: dq.queue().next_avail(),
            next_used: dq.queue().next_used(),
        };
        dq.reset();
        if index != EVENT_QUEUE && self.status & STATUS_DRIVER_OK != 0 {
            self.status &= !STATUS_DRIVER_OK;
            self.session += 1;
        }
        Some(position)
    }

    /// For a bus that gives each queue an interrupt line of its own
    /// (vhost-user's call eventfds): `queue`'s used-buffer interrupts go to
    /// `line`, or back to the shared line with `None`.
    pub fn set_queue_interrupt(&mut self, queue: usize, line: Option<EventFd>) {
        if let Some(slot) = self.queue_irqs.get_mut(queue) {
            *slot = line;
        }
    }

    /// Reads from the register file. Any width and offset is accepted.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG_OFFSET {
            self.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let value = self.read_reg(offset);
        data.copy_from_slice(&value.to_le_bytes());
    }

    /// Writes to the register file. Any width and offset is accepted;
    /// invalid accesses are ignored.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> MmioEvent {
        if offset >= CONFIG_OFFSET {
            // guest_cid is read-only for the driver.
            return MmioEvent::None;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return MmioEvent::None;
        };
        if !offset.is_multiple_of(4) {
            return MmioEvent::None;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes))
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.guest_cid.to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset.checked_add(i as u64);
            if let Some(b) = at.and_then(|at| config.get(usize::try_from(at).ok()?)) {
                *byte = *b;
            }
        }
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let Ok(offset) = u32::try_from(offset) else {
            return 0;
        };
        let sel = self.selected_queue();
        match offset {
            reg::VIRTIO_MMIO_MAGIC_VALUE => MAGIC_VALUE,
            reg::VIRTIO_MMIO_VERSION => MMIO_VERSION,
            reg::VIRTIO_MMIO_DEVICE_ID => VSOCK_DEVICE_ID,
            reg::VIRTIO_MMIO_VENDOR_ID => self.config.vendor_id,
            reg::VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.config.features as u32,
                1 => (self.config.features >> 32) as u32,
                _ => 0,
            },
            reg::VIRTIO_MMIO_QUEUE_NUM_MAX => sel.map_or(0, |q| u32::from(q.queue().max_size())),
            reg::VIRTIO_MMIO_QUEUE_READY => sel.map_or(0, |q| u32::from(q.is_ready())),
            reg::VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status(),
            reg::VIRTIO_MMIO_STATUS => self.status,
            reg::VIRTIO_MMIO_CONFIG_GENERATION => self.config_generation,
            // There is no shared-memory region: a missing region reads as
            // all ones, length and base (spec 4.2.2.1), so a driver that
            // probes SHMSel 0 sees "none" rather than an empty region at 0.
            reg::VIRTIO_MMIO_SHM_LEN_LOW
            | reg::VIRTIO_MMIO_SHM_LEN_HIGH
            | reg::VIRTIO_MMIO_SHM_BASE_LOW
            | reg::VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            // Write-only and unknown registers read as 0.
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) -> MmioEvent {
        let Ok(offset) = u32::try_from(offset) else {
            return MmioEvent::None;
        };
        match offset {
            reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            reg::VIRTIO_MMIO_QUEUE_NUM => self.with_queue_regs(|r| r.num = value),
            reg::VIRTIO_MMIO_QUEUE_READY => self.write_queue_ready(value),
            reg::VIRTIO_MMIO_QUEUE_NOTIFY => {
                if let Ok(q) = u16::try_from(value)
                    && usize::from(q) < NUM_QUEUES
                {
                    return MmioEvent::Notify(q);
                }
            }
            reg::VIRTIO_MMIO_INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!value, Ordering::AcqRel);
            }
            reg::VIRTIO_MMIO_STATUS => return self.write_status(value),
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.desc, value))
            }
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.desc, value))
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.driver, value))
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.driver, value))
            }
            reg::VIRTIO_MMIO_QUEUE_USED_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.device, value))
            }
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.device, value))
            }
            _ => {}
        }
        MmioEvent::None
    }

    fn selected_queue(&self) -> Option<&DeviceQueue> {
        self.queues.get(usize::try_from(self.queue_sel).ok()?)
    }

    /// Applies `f` to the latched registers of the selected queue, unless
    /// that queue is live (the spec forbids changing a ready queue).
    fn with_queue_regs(&mut self, f: impl FnOnce(&mut QueueRegs)) {
        let Ok(i) = usize::try_from(self.queue_sel) else {
            return;
        };
        if let (Some(r), Some(q)) = (self.queue_regs.get_mut(i), self.queues.get(i))
            && !q.is_ready()
        {
            f(r);
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        // Features may change only between DRIVER and FEATURES_OK.
        if self.status & STATUS_DRIVER == 0 || self.status & STATUS_FEATURES_OK != 0 {
            return;
        }
        match self.driver_features_sel {
            0 => set_low(&mut self.driver_features, value),
            1 => set_high(&mut self.driver_features, value),
            _ => {}
        }
    }

    fn write_queue_ready(&mut self, value: u32) {
        let Ok(i) = usize::try_from(self.queue_sel) else {
            return;
        };
        let Some(regs) = self.queue_regs.get(i).copied() else {
            return;
        };
        let event_idx = self.negotiated_features() & features::EVENT_IDX != 0;
        let indirect = self.negotiated_features() & features::INDIRECT_DESC != 0;
        let mem = self.mem.memory();
        let dq = &mut self.queues[i];
        if value == 0 {
            // Forget ring positions so a re-setup starts from index 0.
            dq.reset();
            return;
        }
        if dq.is_ready() || self.status & STATUS_FEATURES_OK == 0 {
            return;
        }
        let q = dq.queue_mut();
        let configured = u16::try_from(regs.num).ok().is_some_and(|n| q.try_set_size(n).is_ok())
            && q.try_set_desc_table_address(GuestAddress(regs.desc)).is_ok()
            && q.try_set_avail_ring_address(GuestAddress(regs.driver)).is_ok()
            && q.try_set_used_ring_address(GuestAddress(regs.device)).is_ok();
        if !configured {
            return;
        }
        // virtio-mmio starts a new queue's rings at index 0. Rings outside
        // guest memory leave QueueReady at 0, which the driver can read back.
        dq.activate(&*mem, 0, 0, event_idx, indirect);
    }

    fn write_status(&mut self, value: u32) -> MmioEvent {
        if value == 0 {
            self.reset();
            return MmioEvent::Reset;
        }
        let old = self.status;
        // A driver never clears status bits except by writing 0.
        if (old & !STATUS_NEEDS_RESET) & !value != 0 {
            return MmioEvent::None;
        }
        // NEEDS_RESET belongs to the device: the driver can neither set nor
        // clear it (short of a reset).
        let mut new = (value & !STATUS_NEEDS_RESET) | (old & STATUS_NEEDS_RESET);
        if new & STATUS_FEATURES_OK != 0 && old & STATUS_FEATURES_OK == 0 {
            let acceptable = self.driver_features & !self.config.features == 0
                && self.driver_features & features::VERSION_1 != 0;
            if !acceptable {
                new &= !STATUS_FEATURES_OK;
            }
        }
        if new & STATUS_DRIVER_OK != 0 && new & STATUS_FEATURES_OK == 0 {
            new &= !STATUS_DRIVER_OK;
        }
        self.status = new;
        if new & STATUS_FAILED != 0 && old & STATUS_FAILED == 0 {
            MmioEvent::Failed
        } else if new & STATUS_DRIVER_OK != 0 && old & STATUS_DRIVER_OK == 0 {
            self.session += 1;
            MmioEvent::DriverOk
        } else {
            MmioEvent::None
        }
    }

    fn reset(&mut self) {
        self.session += 1;
        self.transport_reset_pending = false;
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.interrupt_status.store(0, Ordering::Release);
        self.queue_regs = [QueueRegs::default(); NUM_QUEUES];
        for q in &mut self.queues {
            q.reset();
        }
    }
}

/// The register file as a bus reaches it from several threads: the
/// interrupt registers lock-free, everything else behind one lock.
///
/// A vCPU that takes the device's interrupt reads `InterruptStatus` and
/// writes `InterruptACK` first thing. The device loop holds the lock while
/// it works on the queues, so if those two registers went through the lock
/// every interrupt would wait for the device's round to end. They live in
/// an atomic the register file shares.
#[derive(Debug)]
pub struct MmioDevice<A: GuestAddressSpace> {
    interrupt_status: Arc<AtomicU32>,
    regs: Mutex<VsockMmio<A>>,
}

impl<A: GuestAddressSpace> MmioDevice<A> {
    pub fn new(mmio: VsockMmio<A>) -> Self {
        Self { interrupt_status: mmio.interrupt_status.clone(), regs: Mutex::new(mmio) }
    }

    /// The register file and queues, for the device loop.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, VsockMmio<A>>> {
        self.regs.lock()
    }
}

impl<A: GuestAddressSpace + Send> MmioBus for MmioDevice<A> {
    fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        if offset == u64::from(reg::VIRTIO_MMIO_INTERRUPT_STATUS) && data.len() == 4 {
            data.copy_from_slice(&self.interrupt_status.load(Ordering::Acquire).to_le_bytes());
            return;
        }
        self.regs.mmio_read(offset, data)
    }

    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent {
        if offset == u64::from(reg::VIRTIO_MMIO_INTERRUPT_ACK)
            && let Ok(bytes) = <[u8; 4]>::try_from(data)
        {
            self.interrupt_status.fetch_and(!u32::from_le_bytes(bytes), Ordering::AcqRel);
            return MmioEvent::None;
        }
        self.regs.mmio_write(offset, data)
    }
}

impl<A: GuestAddressSpace + Send> MmioBus for Mutex<VsockMmio<A>> {
    fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        self.lock().unwrap_or_else(|p| p.into_inner()).read(offset, data)
    }

    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent {
        self.lock().unwrap_or_else(|p| p.into_inner()).write(offset, data)
    }
}

fn set_low(v: &mut u64, low: u32) {
    *v = (*v & !0xffff_ffff) | u64::from(low);
}

fn set_high(v: &mut u64, high: u32) {
    *v = (*v & 0xffff_ffff) | (u64::from(high) << 32);
}

/// Status bits exposed for drivers and tests written against raw values.
pub mod status {
    /// ACKNOWLEDGE.
    pub const ACKNOWLEDGE: u32 = super::STATUS_ACKNOWLEDGE;
    /// DRIVER.
    pub const DRIVER: u32 = super::STATUS_DRIVER;
    /// FEATURES_OK.
    pub const FEATURES_OK: u32 = super::STATUS_FEATURES_OK;
    /// DRIVER_OK.
    pub const DRIVER_OK: u32 = super::STATUS_DRIVER_OK;
    /// DEVICE_NEEDS_RESET.
    pub const NEEDS_RESET: u32 = super::STATUS_NEEDS_RESET;
    /// FAILED.
    pub const FAILED: u32 = super::STATUS_FAILED;
}
