//! pier-driver: the guest side of virtio-vsock.
//!
//! A virtio-vsock device has three queues: the driver posts empty buffers
//! on **rx** for the device to fill, puts packets on **tx** for the device
//! to take, and keeps a few small buffers on **event** for the device to
//! report a transport reset. This crate keeps those queues running and
//! moves packets between them and a [`pier_stack::Stack`]:
//!
//! ```text
//!   Stack ──dispatch──▶ tx buffers ──▶ device
//!   Stack ◀──one batch── rx buffers ◀── device
//!   Stack ◀──transport_reset── event buffers ◀── device
//! ```
//!
//! It is `no_std` + `alloc` and reaches the device only through
//! virtio-drivers' [`Transport`] and [`Hal`] traits and its [`VirtQueue`],
//! so the same code runs over MMIO in a unikernel, over PCI, and over the
//! in-process transport of pier's Wasm host. It does not use
//! virtio-drivers' own socket driver, which is stream-only, spins on every
//! transmit and never stocks the event queue.
//!
//! Rules it keeps:
//!
//! - **Receive buffers are large.** Linux posts about 4 KiB per buffer,
//!   which caps host-to-guest throughput; a buffer here holds a whole 64 KiB
//!   packet ([`DriverConfig::rx_buffer_size`]).
//! - **Receive payloads start on a page boundary.** The header of every
//!   receive buffer ends where a page does, so a host kernel's copy of
//!   socket bytes into the payload runs at its best (see
//!   `RX_PAYLOAD_PAGE_LEAD`).
//! - **Any layout in, at most two descriptors out.** A received buffer is
//!   accepted whatever the device wrote, after checking `44 + len <= used`.
//!   A transmitted packet is its header in one descriptor and its payload in
//!   at most one more, which rust-vmm's parser (vhost-device-vsock) needs.
//! - **Never spin on tx.** When every tx buffer is in flight, `dispatch`
//!   sees a full sink and keeps the packet in the stack; receiving goes on,
//!   and the stack's own reply queue is bounded.
//! - **One copy.** Payload bytes are copied once, between a DMA buffer and
//!   a socket buffer; or, once the driver lends its receive buffers to the
//!   stack ([`VsockDriver::lend_rx_buffers`]), a received stream payload
//!   stays in its buffer and is copied once, by the application's receive.
//!   Nothing is allocated per packet.
//! - **Lent buffers never starve the device.** A buffer whose payload is
//!   unread stays out of the rx ring, so at most three quarters of them are
//!   lent at once ([`VsockDriver::max_lent`]); when none can be spared the
//!   payload is copied and the buffer posted again at once, as without
//!   lending. The advertised credit is bytes, whichever way they are kept,
//!   so it needs no change.
//! - **Wrap-safe notifications.** virtio-drivers 0.13's `should_notify`
//!   compares ring indices without wrap arithmetic; [`need_kick`] corrects it.
//!
//! Modules: `dma` (buffers in DMA memory from the platform's `Hal`,
//! [`DmaBuffer`]); [`handshake`] (whether to kick the device, whether
//! used entries raced with a re-armed interrupt: the fenced decisions,
//! model-checked with loom); `after_reset` (the transport as the queues'
//! set-up sees it, which knows no queue is in use after the reset and
//! spares the device the question); the queue handling is here. The
//! feature bits it
//! negotiates, the queue indices and the event ids are the spec's, in
//! [`pier_stack::virtio`], which the device side uses too.

#![no_std]

extern crate alloc;

mod after_reset;
mod dma;
pub mod handshake;

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;

use pier_stack::copy::copy_bytes;
use pier_stack::wire::{HEADER_LEN, MAX_PAYLOAD, RawHeader};
use pier_stack::{HeldBuffers, InPlace, Instant, SinkFull, SocketHandle, Stack, WakeList};
use virtio_drivers::Hal;
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};

pub use dma::DmaBuffer;
pub use handshake::{QUEUE_SIZE, need_kick};
use handshake::{should_kick, used_after_drain, used_after_interrupts_on};
use pier_stack::virtio::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE};
pub use pier_stack::virtio::{EVENT_TRANSPORT_RESET, VsockFeatures};

/// Smallest write [`VsockDriver::send_in_place`] copies straight into a tx
/// buffer. Smaller ones go through the socket's send buffer, where the
/// writes made while the device is busy merge into one packet: in the echo
/// benchmark, sending 1 KiB and 4 KiB writes in place made more packets,
/// and more system calls on the host side (one Unix-socket write each),
/// than the copy saved.
pub const MIN_SEND_IN_PLACE: usize = 16 * 1024;
/// Where a receive buffer starts in its first page: the header fills the
/// page's last bytes, so the payload starts on a page boundary. A host that
/// reads a socket straight into a receive payload (pier's bridge does, for
/// stream bytes) has its kernel copy the bytes with `rep movsb`, whose
/// speed on AMD Zen CPUs depends on where the destination lies in its page
/// against the source: in a loop of 64 KiB copies on an AMD EPYC host, 4 to
/// 12 bytes past it ran at a twentieth of the speed of the same offset, and
/// 44 bytes past at about two thirds. A Unix socket's data pages start on a
/// page boundary, so a page-aligned payload gives a read that starts at one
/// the best case (64 KiB reads of a Unix stream on that host: 13.5 GB/s
/// page-aligned, 12.9 to 13.2 at offset 44, 4.6 at offset 8; through the
/// whole chain the difference was within that host's run-to-run noise). The
/// lead costs no memory: a header and 64 KiB span 17 pages either way.
/// Transmit buffers keep the header at the page start: the host kernel
/// copies a transmitted payload into socket memory laid out by the
/// message's size, so no one offset suits every packet, and with page-
/// aligned transmit payloads the datagram echo ran 15 % slower at 4 KiB and
/// at 65,507 bytes.
const RX_PAYLOAD_PAGE_LEAD: usize = virtio_drivers::PAGE_SIZE - HEADER_LEN;
/// Event buffers kept posted.
const EVENT_QUEUE_SIZE: usize = 8;

/// How big, and how many, the driver's buffers are.
#[derive(Clone, Copy, Debug)]
pub struct DriverConfig {
    /// Bytes per receive buffer, header included. The default holds a full
    /// 64 KiB packet, so the device never has to split one.
    pub rx_buffer_size: usize,
    /// Receive buffers kept posted (at most [`QUEUE_SIZE`]). The default,
    /// 16 (1 MiB), keeps the buffers the device writes and the stack reads
    /// in cache: the device fills them in ring order, so every buffer
    /// posted is part of the working set. Host to guest through the whole
    /// chain, 16 beat 64 by 1.3x to 1.5x on average over five runs
    /// (`cargo bench -p pier-device --bench unix_chain`, second table).
    pub rx_buffers: usize,
    /// Transmit buffers; each carries one packet of up to 64 KiB in two
    /// descriptors, so at most `QUEUE_SIZE / 2` are useful.
    pub tx_buffers: usize,
    /// Offer VIRTIO_F_EVENT_IDX. With it, the device interrupts once per
    /// batch of used buffers and the driver kicks once per batch of
    /// available ones, automatically. Without it, the driver decides when
    /// it wants interrupts ([`VsockDriver::set_interrupts`]): a guest that
    /// polls while busy and sleeps only when idle turns them off while it
    /// polls, where each one would only cost it a trap (on nested hosts,
    /// a VM exit, emulated ring-0 code and an EOI exit).
    pub event_idx: bool,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            rx_buffer_size: HEADER_LEN + MAX_PAYLOAD,
            rx_buffers: 16,
            tx_buffers: 32,
            event_idx: true,
        }
    }
}

/// Why the driver could not start.
#[derive(Debug)]
pub enum DriverError {
    /// The transport is not a vsock device.
    WrongDevice(DeviceType),
    /// The device did not offer VIRTIO_F_VERSION_1.
    NoVersion1,
    /// The device did not accept the features the driver chose (it left
    /// FEATURES_OK clear).
    FeaturesRejected,
    /// A queue could not be set up, or DMA memory could not be had.
    Virtio(virtio_drivers::Error),
    /// A buffer size or count is outside what the queues can hold.
    BadConfig(&'static str),
}

impl From<virtio_drivers::Error> for DriverError {
    fn from(e: virtio_drivers::Error) -> Self {
        Self::Virtio(e)
    }
}

impl core::fmt::Display for DriverError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::WrongDevice(t) => write!(f, "not a vsock device: {t:?}"),
            Self::NoVersion1 => f.write_str("device does not offer VIRTIO_F_VERSION_1"),
            Self::FeaturesRejected => f.write_str("device did not accept the negotiated features"),
            Self::Virtio(e) => write!(f, "virtio: {e}"),
            Self::BadConfig(why) => write!(f, "bad driver configuration: {why}"),
        }
    }
}

/// Counters for what the driver saw; the stack counts the protocol side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub rx_buffers_used: u64,
    /// Of those, buffers whose payload the stack kept to be read in place
    /// ([`VsockDriver::lend_rx_buffers`]).
    pub rx_buffers_held: u64,
    /// Used buffers shorter than a header, or whose `len` overruns what the
    /// device wrote; handed back without reaching the stack.
    pub rx_malformed: u64,
    pub tx_packets: u64,
    /// Times `dispatch` found every tx buffer in flight.
    pub tx_full: u64,
    /// Kicks, on every queue.
    pub notifications: u64,
    /// Kicks of the rx queue alone: refills the device asked to hear of.
    pub rx_notifications: u64,
    pub transport_resets: u64,
    pub unknown_events: u64,
    /// Used entries naming a descriptor the driver never handed out: the
    /// device broke the protocol, and the queue is no longer read.
    pub device_errors: u64,
}

/// What one `poll` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    pub received: usize,
    pub sent: usize,
    /// The stack still has packets but every tx buffer is in flight.
    pub tx_blocked: bool,
}

/// A virtio-vsock driver bound to one device.
pub struct VsockDriver<H: Hal, T: Transport> {
    transport: T,
    rx: VirtQueue<H, QUEUE_SIZE>,
    tx: VirtQueue<H, QUEUE_SIZE>,
    event: VirtQueue<H, EVENT_QUEUE_SIZE>,
    /// Shared with the stack once lent ([`Self::lend_rx_buffers`]), which
    /// reads held payloads through it; the driver writes (posts) only the
    /// buffers the stack does not hold.
    rx_buffers: Arc<RxBuffers<H>>,
    /// rx descriptor token → buffer index.
    rx_by_token: [u16; QUEUE_SIZE],
    /// Whether the stack has the rx buffers ([`Self::lend_rx_buffers`]).
    rx_lent: bool,
    /// Per rx buffer: the stack holds its payload, so it is not posted.
    rx_held: Vec<bool>,
    /// How many entries of `rx_held` are set.
    rx_held_count: usize,
    tx_buffers: Vec<DmaBuffer<H>>,
    tx_free: Vec<u16>,
    tx_by_token: [(u16, u32); QUEUE_SIZE],
    event_buffers: DmaBuffer<H>,
    event_by_token: [u16; EVENT_QUEUE_SIZE],
    /// Which descriptor tokens are with the device, per queue. A used entry
    /// for any other token would make virtio-drivers recycle the wrong
    /// chain (and panic), so it is refused here.
    in_flight: [[bool; QUEUE_SIZE]; 3],
    /// A queue on which the device returned a token it was never given.
    broken: [bool; 3],
    /// How many buffers each queue has ever published (its avail index).
    rx_published: u16,
    tx_published: u16,
    features: VsockFeatures,
    guest_cid: u64,
    stats: DriverStats,
}

impl<H: Hal, T: Transport> core::fmt::Debug for VsockDriver<H, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VsockDriver")
            .field("guest_cid", &self.guest_cid)
            .field("features", &self.features)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<H: Hal, T: Transport> VsockDriver<H, T> {
    /// Negotiates features, reads the CID, stocks the event queue, then the
    /// rx queue (the order virtio spec §5.10.6 asks for), and starts the device.
    pub fn new(mut transport: T, config: DriverConfig) -> Result<Self, DriverError> {
        if transport.device_type() != DeviceType::Socket {
            return Err(DriverError::WrongDevice(transport.device_type()));
        }
        if config.rx_buffers == 0 || config.rx_buffers > QUEUE_SIZE {
            return Err(DriverError::BadConfig("rx_buffers must be 1..=QUEUE_SIZE"));
        }
        if config.tx_buffers == 0 || config.tx_buffers > QUEUE_SIZE / 2 {
            return Err(DriverError::BadConfig("tx_buffers must be 1..=QUEUE_SIZE/2"));
        }
        if config.rx_buffer_size <= HEADER_LEN {
            return Err(DriverError::BadConfig("rx_buffer_size must exceed the 44-byte header"));
        }
        let offered = if config.event_idx {
            VsockFeatures::SUPPORTED
        } else {
            VsockFeatures::SUPPORTED - VsockFeatures::EVENT_IDX
        };
        let features = transport.begin_init(offered);
        if !features.contains(VsockFeatures::VERSION_1) {
            give_up(&mut transport);
            return Err(DriverError::NoVersion1);
        }
        // The device may refuse the subset we wrote by leaving FEATURES_OK
        // clear; the driver must read the status back and give up if so
        // (spec 3.1.1 step 6). virtio-drivers' begin_init does not.
        if !transport.get_status().contains(DeviceStatus::FEATURES_OK) {
            give_up(&mut transport);
            return Err(DriverError::FeaturesRejected);
        }
        let event_idx = features.contains(VsockFeatures::EVENT_IDX);
        let guest_cid = read_cid(&transport)?;
        let mut just_reset = after_reset::JustReset(&mut transport);
        let rx = VirtQueue::new(&mut just_reset, RX_QUEUE, false, event_idx)?;
        let tx = VirtQueue::new(&mut just_reset, TX_QUEUE, false, event_idx)?;
        let event = VirtQueue::new(&mut just_reset, EVENT_QUEUE, false, event_idx)?;
        let mut driver = Self {
            event_buffers: DmaBuffer::new(EVENT_QUEUE_SIZE * 4)?,
            rx_buffers: Arc::new(RxBuffers(
                (0..config.rx_buffers)
                    .map(|_| DmaBuffer::with_lead(config.rx_buffer_size, RX_PAYLOAD_PAGE_LEAD))
                    .collect::<Result<_, _>>()?,
            )),
            rx_lent: false,
            rx_held: alloc::vec![false; config.rx_buffers],
            rx_held_count: 0,
            tx_buffers: (0..config.tx_buffers)
                .map(|_| DmaBuffer::new(HEADER_LEN + MAX_PAYLOAD))
                .collect::<Result<_, _>>()?,
            tx_free: (0..config.tx_buffers as u16).rev().collect(),
            rx_by_token: [0; QUEUE_SIZE],
            tx_by_token: [(0, 0); QUEUE_SIZE],
            event_by_token: [0; EVENT_QUEUE_SIZE],
            rx_published: 0,
            tx_published: 0,
            in_flight: [[false; QUEUE_SIZE]; 3],
            broken: [false; 3],
            transport,
            rx,
            tx,
            event,
            features,
            guest_cid,
            stats: DriverStats::default(),
        };
        for i in 0..EVENT_QUEUE_SIZE {
            driver.post_event_buffer(i)?;
        }
        for i in 0..driver.rx_buffers.0.len() {
            driver.post_rx_buffer(i)?;
        }
        driver.transport.finish_init();
        driver.transport.notify(EVENT_QUEUE);
        driver.transport.notify(RX_QUEUE);
        Ok(driver)
    }

    /// The transport the driver reaches the device through.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Whether the device has set DEVICE_NEEDS_RESET (virtio 1.2 §2.1.2):
    /// it can serve this driver no more, and a driver that wants the device
    /// back resets it ([`Self::reset`]) and starts again. One read of the
    /// status register (on MMIO, a VM exit), so a guest asks only when
    /// something says it may have changed, never on every poll.
    pub fn device_needs_reset(&self) -> bool {
        self.transport.get_status().contains(DeviceStatus::DEVICE_NEEDS_RESET)
    }

    /// Resets the device and hands its transport back, for a guest that
    /// restarts its driver: `VsockDriver::new` on the transport starts the
    /// new one. The device is reset before the queues and buffers are
    /// freed, so it never writes memory the guest gives to something else.
    /// Call [`Stack::take_back_held_buffers`] first, while the buffers the
    /// stack holds are still there, then [`Stack::transport_reset`] once
    /// the new driver has read the CID: every connection ends, listeners
    /// stay.
    pub fn reset(mut self) -> T {
        self.transport.set_status(DeviceStatus::empty());
        let Self { transport, .. } = self;
        transport
    }

    /// The guest's CID, as the device last reported it.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    pub fn features(&self) -> VsockFeatures {
        self.features
    }

    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// A stack configuration that matches what the device negotiated: its
    /// CID and the socket types it carries. Socket types the device lacks
    /// then fail at creation with `SocketTypeNotSupported`.
    pub fn stack_config(&self) -> pier_stack::Config {
        let mut config = pier_stack::Config::new(self.guest_cid as u32);
        config.features = self.features.socket_types();
        config
    }

    /// Lends the receive buffers to `stack`, the one this driver's `poll`
    /// feeds, so that stream payloads stay in them until the application
    /// reads them (see [`Stack::set_held_buffers`]): the copy into the
    /// socket's buffer, on whichever thread polls the driver, goes away.
    /// Buffers come back through the stack as their bytes are read, and
    /// `poll` posts them again.
    ///
    /// For a transport where the device cannot write a buffer the driver
    /// has not posted (every virtio device; a buffer the stack holds is
    /// not in the ring).
    pub fn lend_rx_buffers(&mut self, stack: &mut Stack)
    where
        H: 'static,
    {
        stack.set_held_buffers(Box::new(LentRxBuffers(self.rx_buffers.clone())));
        self.rx_lent = true;
    }

    /// Most receive buffers the stack may hold at once: three quarters,
    /// and never all, so that the device always has buffers to fill (for
    /// other connections, control packets, and this one's copied bytes)
    /// while an application leaves its bytes unread.
    pub fn max_lent(&self) -> usize {
        let buffers = self.rx_buffers.0.len();
        if self.rx_lent { buffers - (buffers / 4).max(1) } else { 0 }
    }

    /// Receive buffers the stack holds now, with payload unread: out of
    /// the ring until the application reads them.
    pub fn rx_held(&self) -> usize {
        self.rx_held_count
    }

    /// Posts again the buffers the stack no longer holds; returns how many.
    fn repost_released(&mut self, stack: &mut Stack) -> usize {
        let mut reposted = 0;
        for index in stack.take_released_buffers() {
            let index = index as usize;
            if !self.rx_held.get(index).copied().unwrap_or(false) {
                continue;
            }
            self.rx_held[index] = false;
            self.rx_held_count -= 1;
            // A held buffer was out of the ring, so there is a slot for it.
            let _ = self.post_rx_buffer(index);
            reposted += 1;
        }
        reposted
    }

    fn post_rx_buffer(&mut self, index: usize) -> Result<(), DriverError> {
        // SAFETY: the buffer is not held by the stack (callers post only
        // those), so nothing else views it; it is DMA memory this driver
        // owns and does not touch until the device hands it back through
        // `pop_used`.
        let buffer = unsafe { self.rx_buffers.0[index].as_mut_slice_unchecked() };
        // SAFETY: as above.
        let token = unsafe { self.rx.add(&[], &mut [buffer]) }?;
        self.rx_by_token[token as usize] = index as u16;
        self.in_flight[RX_QUEUE as usize][token as usize] = true;
        self.rx_published = self.rx_published.wrapping_add(1);
        Ok(())
    }

    fn post_event_buffer(&mut self, index: usize) -> Result<(), DriverError> {
        let slot = &mut self.event_buffers.as_mut_slice()[index * 4..index * 4 + 4];
        // SAFETY: as for rx buffers.
        let token = unsafe { self.event.add(&[], &mut [slot]) }?;
        self.event_by_token[token as usize] = index as u16;
        self.in_flight[EVENT_QUEUE as usize][token as usize] = true;
        Ok(())
    }

    /// Moves everything that is ready: events, completed transmissions,
    /// received packets (as one batch), then the stack's outgoing packets.
    /// Wakers come back in `wakes`, to be woken once the caller holds no lock.
    ///
    /// It does not acknowledge the device's interrupt: a polling guest has
    /// no interrupt to acknowledge, and on transports where reading the
    /// interrupt status costs an exit (or a lock) that would tax every
    /// poll. An interrupt handler calls [`VsockDriver::ack_interrupt`].
    pub fn poll(&mut self, stack: &mut Stack, now: Instant, wakes: &mut WakeList) -> PollOutcome {
        self.poll_events(stack, wakes);
        self.reclaim_tx();
        let received = self.receive(stack, now, wakes);
        stack.handle_timeout(now, wakes);
        let (sent, tx_blocked) = self.transmit(stack, now, wakes);
        PollOutcome { received, sent, tx_blocked }
    }

    /// Accepts a used token only if it names a chain this driver handed
    /// out and has not had back.
    fn take_token(&mut self, queue: u16, token: u16) -> bool {
        let q = queue as usize;
        if self.broken[q] {
            return false;
        }
        match self.in_flight[q].get_mut(token as usize) {
            Some(slot) if *slot => {
                *slot = false;
                true
            }
            _ => {
                self.broken[q] = true;
                self.stats.device_errors += 1;
                false
            }
        }
    }

    /// Transmit buffers the device has not handed back yet: packets that
    /// may not have reached it. A guest about to end waits for 0.
    pub fn tx_in_flight(&self) -> usize {
        self.tx_buffers.len() - self.tx_free.len()
    }

    /// Asks the device for interrupts on used buffers, or tells it not to
    /// bother (the avail rings' NO_INTERRUPT flag). Only honoured without
    /// EVENT_IDX ([`DriverConfig::event_idx`]); with it, `used_event`
    /// rules. A driver that turns interrupts on before sleeping must then
    /// check [`Self::has_used`] before it sleeps: a buffer used before the
    /// device saw the flag raised no interrupt.
    pub fn set_interrupts(&mut self, enabled: bool) {
        self.rx.set_dev_notify(enabled);
        self.tx.set_dev_notify(enabled);
        self.event.set_dev_notify(enabled);
    }

    /// Whether the device has handed back buffers `poll` has not taken
    /// yet. It fences first, so the caller's earlier stores (the interrupt
    /// flags) are ordered before the reads of the used indices
    /// ([`handshake::used_after_interrupts_on`]).
    pub fn has_used(&self) -> bool {
        // One fence for the three: the rx check fences first, and the other
        // two loads come after it.
        used_after_interrupts_on(&self.rx) || self.tx.can_pop() || self.event.can_pop()
    }

    /// Acknowledges the device's interrupt (reads and clears its status),
    /// for an interrupt-driven guest; call it from the handler, then `poll`.
    pub fn ack_interrupt(&mut self) {
        self.transport.ack_interrupt();
    }

    fn poll_events(&mut self, stack: &mut Stack, wakes: &mut WakeList) {
        'drain: loop {
            while let Some(token) = self.event.peek_used() {
                if !self.take_token(EVENT_QUEUE, token) {
                    break 'drain;
                }
                let index = self.event_by_token[token as usize] as usize;
                let slot = &mut self.event_buffers.as_mut_slice()[index * 4..index * 4 + 4];
                // SAFETY: the same buffer `post_event_buffer` added with this token.
                let popped = unsafe { self.event.pop_used(token, &[], &mut [slot]) };
                if popped.is_err() {
                    break 'drain;
                }
                let bytes = &self.event_buffers.as_slice()[index * 4..index * 4 + 4];
                let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                if id == EVENT_TRANSPORT_RESET {
                    self.stats.transport_resets += 1;
                    if let Ok(cid) = read_cid(&self.transport) {
                        self.guest_cid = cid;
                    }
                    stack.transport_reset(self.guest_cid as u32, wakes);
                } else {
                    self.stats.unknown_events += 1;
                }
                // The buffer was just returned, so there is room for it again.
                let _ = self.post_event_buffer(index);
                self.transport.notify(EVENT_QUEUE);
            }
            if !used_after_drain(&self.event) {
                break;
            }
        }
    }

    fn reclaim_tx(&mut self) {
        'drain: loop {
            while let Some(token) = self.tx.peek_used() {
                if !self.take_token(TX_QUEUE, token) {
                    break 'drain;
                }
                let (index, payload_len) = self.tx_by_token[token as usize];
                let buffer = &self.tx_buffers[index as usize];
                let (header, payload) = buffer.as_slice().split_at(HEADER_LEN);
                let payload = &payload[..payload_len as usize];
                // SAFETY: the same two buffers `transmit` added with this token.
                let popped = unsafe {
                    if payload.is_empty() {
                        self.tx.pop_used(token, &[header], &mut [])
                    } else {
                        self.tx.pop_used(token, &[header, payload], &mut [])
                    }
                };
                if popped.is_err() {
                    break 'drain;
                }
                self.tx_free.push(index);
            }
            if !used_after_drain(&self.tx) {
                break;
            }
        }
    }

    fn receive(&mut self, stack: &mut Stack, now: Instant, wakes: &mut WakeList) -> usize {
        let mut received = 0;
        let reposted = self.repost_released(stack);
        let max_lent = self.max_lent();
        let mut batch = stack.rx_batch(now);
        'drain: loop {
            while let Some(token) = self.rx.peek_used() {
                if !self.take_token(RX_QUEUE, token) {
                    break 'drain;
                }
                let index = self.rx_by_token[token as usize] as usize;
                let buffer = &self.rx_buffers.0[index];
                // SAFETY: the same buffer `post_rx_buffer` added with this
                // token; posted, so the stack does not hold it.
                let popped =
                    unsafe { self.rx.pop_used(token, &[], &mut [buffer.as_mut_slice_unchecked()]) };
                let used = match popped {
                    Ok(used) => used as usize,
                    Err(_) => break 'drain,
                };
                self.stats.rx_buffers_used += 1;
                let frame = &buffer.as_slice()[..used.min(buffer.len())];
                if frame.len() < HEADER_LEN
                    || RawHeader::parse(frame)
                        .is_ok_and(|h| HEADER_LEN + h.len as usize > frame.len())
                {
                    self.stats.rx_malformed += 1;
                } else if self.rx_held_count < max_lent {
                    received += 1;
                    if batch.receive_held(frame, index as u16) {
                        self.rx_held[index] = true;
                        self.rx_held_count += 1;
                        self.stats.rx_buffers_held += 1;
                        continue;
                    }
                } else {
                    batch.receive(frame);
                    received += 1;
                }
                // The buffer came back, so the ring has a slot for it.
                let _ = self.post_rx_buffer(index);
            }
            if !used_after_drain(&self.rx) {
                break;
            }
        }
        batch.finish(wakes);
        let event_idx = self.features.contains(VsockFeatures::EVENT_IDX);
        if received + reposted > 0 && should_kick(&self.rx, event_idx, self.rx_published) {
            self.stats.notifications += 1;
            self.stats.rx_notifications += 1;
            self.transport.notify(RX_QUEUE);
        }
        received
    }

    fn transmit(&mut self, stack: &mut Stack, now: Instant, wakes: &mut WakeList) -> (usize, bool) {
        let mut sink = TxSinkImpl { driver: self, sent: 0, blocked: false };
        stack.dispatch(now, &mut sink, wakes);
        let (sent, blocked) = (sink.sent, sink.blocked);
        if blocked {
            self.stats.tx_full += 1;
        }
        if sent > 0 {
            self.kick_tx();
        }
        (sent, blocked)
    }

    fn kick_tx(&mut self) {
        let event_idx = self.features.contains(VsockFeatures::EVENT_IDX);
        if should_kick(&self.tx, event_idx, self.tx_published) {
            self.stats.notifications += 1;
            self.transport.notify(TX_QUEUE);
        }
    }

    /// Puts one packet on the tx queue: the header in one descriptor, the
    /// payload (if any) in a second. `Err(SinkFull)` when every tx buffer
    /// is in flight.
    fn push_tx(&mut self, header: &RawHeader, payload: &[u8]) -> Result<(), SinkFull> {
        let index = *self.tx_free.last().ok_or(SinkFull)?;
        if payload.len() > MAX_PAYLOAD {
            return Err(SinkFull);
        }
        let bytes = self.tx_buffers[index as usize].as_mut_slice();
        copy_bytes(&mut bytes[HEADER_LEN..HEADER_LEN + payload.len()], payload);
        self.publish_tx(header, payload.len())
    }

    /// Puts the next free tx buffer on the tx queue, with `header` written
    /// in front of the `len` payload bytes already in it.
    fn publish_tx(&mut self, header: &RawHeader, len: usize) -> Result<(), SinkFull> {
        let index = *self.tx_free.last().ok_or(SinkFull)?;
        let buffer = &mut self.tx_buffers[index as usize];
        buffer.as_mut_slice()[..HEADER_LEN].copy_from_slice(&header.encode());
        let (head, rest) = buffer.as_slice().split_at(HEADER_LEN);
        let body = &rest[..len];
        // SAFETY: the buffer stays untouched until `reclaim_tx` pops it.
        let token = unsafe {
            if body.is_empty() {
                self.tx.add(&[head], &mut [])
            } else {
                self.tx.add(&[head, body], &mut [])
            }
        }
        .map_err(|_| SinkFull)?;
        self.tx_free.pop();
        self.tx_by_token[token as usize] = (index, len as u32);
        self.in_flight[TX_QUEUE as usize][token as usize] = true;
        self.tx_published = self.tx_published.wrapping_add(1);
        self.stats.tx_packets += 1;
        Ok(())
    }

    /// Sends stream bytes on `h` as [`Stack::send`] does, but copied once,
    /// straight into a tx buffer, instead of into the socket's send buffer
    /// and out again at the next `poll` ([`Stack::send_in_place`]): whole
    /// packets of what the peer's credit allows, while tx buffers are free
    /// and nothing of the connection is queued ahead; what is left goes
    /// through [`Stack::send`] (all of it for a socket that is not a
    /// stream, and writes under [`MIN_SEND_IN_PLACE`]). Kicks the device if
    /// it published a packet.
    pub fn send_in_place(
        &mut self,
        stack: &mut Stack,
        h: SocketHandle,
        data: &[u8],
    ) -> pier_stack::Result<usize> {
        if data.len() < MIN_SEND_IN_PLACE {
            return stack.send(h, data);
        }
        self.reclaim_tx();
        let mut sent = 0;
        let mut failure = None;
        while sent < data.len()
            && let Some(&index) = self.tx_free.last()
        {
            let rest = &data[sent..];
            let buffer = &mut self.tx_buffers[index as usize];
            let outcome = stack.send_in_place(h, MAX_PAYLOAD, |limit| {
                let n = limit.min(rest.len());
                copy_bytes(&mut buffer.as_mut_slice()[HEADER_LEN..HEADER_LEN + n], &rest[..n]);
                Ok::<_, core::convert::Infallible>(n)
            });
            match outcome {
                Ok(InPlace::Packet(header)) => {
                    let len = header.len as usize;
                    // A buffer is free (checked above), and the ring has
                    // two descriptors for each, so this cannot fail.
                    let _ = self.publish_tx(&header, len);
                    sent += len;
                }
                Ok(InPlace::Queued | InPlace::Empty) | Err(pier_stack::Error::NotSupported) => {
                    break;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if sent > 0 {
            self.kick_tx();
        }
        stack.finish_in_place(h, data, sent, failure)
    }

    /// Sends one packet exactly as given, bypassing the stack. For tools
    /// that speak the protocol themselves: conformance harnesses, fuzzers,
    /// tests that play a misbehaving guest.
    pub fn transmit_raw(&mut self, header: &RawHeader, payload: &[u8]) -> Result<(), SinkFull> {
        self.reclaim_tx();
        self.push_tx(header, payload)?;
        self.kick_tx();
        Ok(())
    }
}

/// The driver's receive buffers, by index.
struct RxBuffers<H: Hal>(Vec<DmaBuffer<H>>);

/// The receive buffers as the stack reads them.
struct LentRxBuffers<H: Hal>(Arc<RxBuffers<H>>);

impl<H: Hal> HeldBuffers for LentRxBuffers<H> {
    fn buffer(&self, id: u16) -> &[u8] {
        // The driver leaves a held buffer alone (it is not posted), so this
        // view is the only one.
        self.0.0[id as usize].as_slice()
    }
}

/// The stack's view of the tx queue during one `dispatch`.
struct TxSinkImpl<'a, H: Hal, T: Transport> {
    driver: &'a mut VsockDriver<H, T>,
    sent: usize,
    blocked: bool,
}

impl<H: Hal, T: Transport> pier_stack::TxSink for TxSinkImpl<'_, H, T> {
    fn transmit(&mut self, header: &RawHeader, payload: &[u8]) -> Result<(), SinkFull> {
        match self.driver.push_tx(header, payload) {
            Ok(()) => {
                self.sent += 1;
                Ok(())
            }
            Err(full) => {
                self.blocked = true;
                Err(full)
            }
        }
    }
}

/// Tells the device the driver has given up on it (status FAILED).
///
/// FAILED is added to the bits already set: a driver never clears a status
/// bit except by a reset (spec 2.1.2), and a device may ignore a write that
/// does, which would leave it waiting for a driver that has gone.
fn give_up<T: Transport>(transport: &mut T) {
    let status = transport.get_status();
    transport.set_status(status | DeviceStatus::FAILED);
}

/// Reads `le64 guest_cid` from config space.
///
/// As two 32-bit halves inside one config-generation loop: virtio only
/// promises 4-byte alignment for config space and requires 64-bit fields
/// to be read with 32-bit accesses (spec 4.2.2.2), and virtio-drivers' MMIO
/// and PCI transports assert it. The high half is reserved (zero); a CID is
/// 32 bits on the wire.
fn read_cid<T: Transport>(transport: &T) -> Result<u64, DriverError> {
    let (low, high) = transport.read_consistent(|| {
        Ok((transport.read_config_space::<u32>(0)?, transport.read_config_space::<u32>(4)?))
    })?;
    let cid = u64::from(u32::from_le(low)) | (u64::from(u32::from_le(high)) << 32);
    Ok(cid & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kicks_across_the_index_wrap() {
        // virtio-drivers says no right after the wrap; we kick anyway.
        assert!(need_kick(false, 0));
        assert!(need_kick(false, (QUEUE_SIZE - 1) as u16));
        assert!(!need_kick(false, QUEUE_SIZE as u16));
        assert!(need_kick(true, 40_000));
    }
}
