//! The device's host endpoint: the host side of every vsock connection.
//!
//! The device owns a [`pier_stack::Stack`] at CID 2, the same protocol core
//! the guest runs, so the host side gets credit, RST rules, timers, half
//! close and seqpacket for free, with the same code the guest's side is
//! tested with. This module moves packets between that stack and the
//! virtqueues:
//!
//! - **tx → stack**: every packet the driver published is checked for its
//!   source (`src_cid` must be the guest's CID, as vhost requires; others are
//!   dropped and counted) and handed to the stack as one batch. A stream
//!   payload left in guest memory stays there: the stack offers it to the
//!   host side, which sends it from there, and copies only what is left
//!   into a socket buffer. Datagrams, packets for siblings and captured
//!   packets are copied out first, since their consumers take bytes.
//! - **stack → rx**: the stack's packets are written into the driver's
//!   receive buffers. No buffer posted means the sink is full and the
//!   packet waits in the stack; a buffer smaller than the packet makes the
//!   stack cut smaller packets from then on. The buffers left over are
//!   lent to the host side ([`RxLender`]), which reads host → guest stream
//!   bytes from their socket straight into them, past the stack's send
//!   buffer (the stack counts them and makes the header).
//!
//! A packet addressed to any CID but 2 (for example the guest's own CID)
//! is dropped, as Linux's vhost does: the guest's stack delivers traffic
//! for its own CID itself and never hands it to the device.
//!
//! The host side follows the driver's lifecycle. Each reset or DRIVER_OK
//! of the device starts a new driver session ([`VsockDevice::session`]): the
//! connections of the old session are reset (host programs see their
//! connections close), packets queued for the old driver are dropped, and
//! the host stack carries exactly the socket types the new driver
//! negotiated. A driver that did not take DGRAM (Linux's does not) gets no
//! datagrams at all, rather than packets of a type it answers with RST.
//!
//! With a [`Capture`] set, every packet taken from the tx queue (whatever
//! becomes of it) and every packet written into an rx buffer is recorded,
//! in the order the device saw them. Without one, the cost is a branch per
//! packet.
//!
//! What the host stack's sockets connect to (Unix sockets, tests) is the
//! [`HostSide`]'s business, not this module's. Host datagrams from the
//! host_side and the host stack's packets reach the receive queue through one
//! writer, so both follow the same rules (buffer sizes, negotiated types).

use pier_stack::wire::{HEADER_LEN, RawHeader, SocketType};
use std::cell::RefCell;

use pier_stack::{
    Config, DirectReceive, Instant, Payload, SinkFull, SocketHandle, Stack, TxSink,
    VMADDR_CID_HOST, WakeList,
};
use vm_memory::GuestAddressSpace;

use crate::capture::Capture;
use crate::cid::GuestCid;
use crate::device::{RX_QUEUE, TX_QUEUE, VsockDevice};
use crate::host_side::{HostSide, RxLender};
use crate::queues::{QueueError, RxPayload};
use pier_stack::virtio::VsockFeatures;

/// The smallest receive buffer payload area worth lending to the host
/// side. Each lent buffer costs the host side one read system call, where
/// the host stack's send buffer takes up to the whole credit in one and
/// then copies it out buffer by buffer; with pier-driver's 64 KiB buffers
/// the copy saved outweighs the calls, with the 4 KiB buffers a Linux
/// guest posts it does not (measured host -> guest, in-process bus: 4 KiB
/// buffers 0.67x -> 0.55x of a Unix pair, 16 and 32 KiB ones slower too,
/// 64 KiB ones 20.7 -> 29.6 Gbit/s).
pub const MIN_LENT_PAYLOAD: usize = pier_stack::wire::MAX_PAYLOAD;

/// Counters for what the endpoint saw at the queue boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Packets taken from the tx queue and given to the stack.
    pub from_guest: u64,
    /// Guest → host stream bytes the host side sent on from guest memory
    /// itself, with no copy of the device's in between (payloads the
    /// device left there, [`TxLending::Shared`](crate::queues::TxLending)).
    pub from_guest_bytes_unstaged: u64,
    /// Packets whose `src_cid` was not the guest's: dropped.
    pub spoofed_source: u64,
    /// Chains the queue rejected (bad descriptors, lengths): returned unused.
    pub bad_chains: u64,
    /// Datagrams taken from the guest and handed to the datagram handler.
    pub datagrams_from_guest: u64,
    /// Packets written into rx buffers.
    pub to_guest: u64,
    /// Of those, stream packets whose bytes the host side read straight
    /// into the buffer (see [`RxLender`]), past the host stack's buffer.
    pub to_guest_in_place: u64,
    /// Guest packets for a CID other than the host's, handed to the
    /// host_side (sibling VMs under vhost-user).
    pub to_elsewhere: u64,
    /// Rounds that ended with packets waiting for rx buffers.
    pub rx_full: u64,
    /// Times a receive buffer was too small for a packet, and the stack
    /// was told to cut smaller ones.
    pub rx_buffer_shrinks: u64,
    /// Datagrams either way while the driver has not negotiated DGRAM:
    /// dropped.
    pub datagrams_not_negotiated: u64,
    /// Host datagrams larger than the guest's receive buffers: dropped.
    pub datagrams_too_large: u64,
    /// Drivers that went away (a device reset, or a new DRIVER_OK without
    /// one), each resetting the host side's connections.
    pub driver_resets: u64,
}

/// Offers the host stack's stream payloads to the host_side. The host_side is
/// shared with the datagram path of the same batch, which never runs while
/// the stack is inside `deliver`, so the borrow never clashes.
struct RelayTap<'a, 'b, B: ?Sized> {
    host_side: &'a RefCell<&'b mut B>,
    /// Bytes the host side took from payloads left in guest memory.
    unstaged: u64,
}

impl<B: HostSide + ?Sized> DirectReceive for RelayTap<'_, '_, B> {
    fn deliver(&mut self, socket: SocketHandle, data: Payload<'_>) -> usize {
        let taken = self.host_side.borrow_mut().guest_stream_bytes(socket, data);
        if data.as_bytes().is_none() {
            self.unstaged += taken as u64;
        }
        taken
    }
}

/// The host stack and its connection to the queues.
#[derive(Debug)]
pub struct HostEndpoint {
    stack: Stack,
    guest_cid: u64,
    stats: EndpointStats,
    /// The device's driver session last seen.
    session: u64,
    /// Whether the host side serves a driver that reached DRIVER_OK.
    serving: bool,
    /// Tx chains were left in the ring when the round's budget ran out.
    tx_more: bool,
    /// The driver's receive buffers are large enough to lend to the host
    /// side (see [`MIN_LENT_PAYLOAD`]); learnt anew each driver session.
    rx_lendable: bool,
    /// Where packets are recorded, when they are.
    capture: Option<Capture>,
    /// A payload left in guest memory, copied out for a consumer that
    /// takes bytes (see [`bytes_of`]); grows once to the largest payload.
    payload_copy: Vec<u8>,
}

/// `payload` as bytes: itself when it is, or copied into `copy` when it
/// lies in guest memory.
fn bytes_of<'p>(payload: Payload<'p>, copy: &'p mut Vec<u8>) -> &'p [u8] {
    if let Some(bytes) = payload.as_bytes() {
        return bytes;
    }
    copy.resize(payload.len(), 0);
    payload.copy_to(copy);
    copy
}

impl HostEndpoint {
    /// A host endpoint for a guest at `guest_cid`; `configure` may adjust
    /// the host stack's settings (buffer sizes, limits).
    pub fn new(guest_cid: u64, configure: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::new(VMADDR_CID_HOST);
        configure(&mut config);
        Self {
            stack: Stack::new(config),
            guest_cid,
            stats: EndpointStats::default(),
            session: 0,
            serving: false,
            tx_more: false,
            rx_lendable: true,
            capture: None,
            payload_copy: Vec::new(),
        }
    }

    /// Records every packet that crosses the queues from now on, both
    /// ways, or stops recording (`None`, which also ends the capture).
    pub fn set_capture(&mut self, capture: Option<Capture>) {
        self.capture = capture;
    }

    /// The host stack: where host-side sockets are opened, and what a
    /// host_side works on.
    pub fn stack(&mut self) -> &mut Stack {
        &mut self.stack
    }

    /// What the endpoint saw at the queue boundary; the protocol's own
    /// counters are the stack's.
    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    /// The only source CID accepted from the driver.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Follows a CID change (snapshot restore): connections fail, listeners stay.
    pub fn set_guest_cid(&mut self, cid: GuestCid, wakes: &mut WakeList) {
        self.guest_cid = cid.as_u64();
        self.stack.transport_reset(VMADDR_CID_HOST, wakes);
    }

    /// Gives the guest a new CID, everywhere the host side uses it: the
    /// config space changes and the driver is told with a TRANSPORT_RESET
    /// event (kept until it has an event buffer), the host endpoint accepts
    /// only the new source, the host_side addresses the new CID, and
    /// connections on both sides fail.
    pub fn change_guest_cid<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        host_side: &mut impl HostSide,
        cid: GuestCid,
        wakes: &mut WakeList,
    ) {
        // The config interrupt is only a hint; the event is what counts.
        device.set_guest_cid(cid.as_u64());
        device.request_transport_reset();
        host_side.guest_cid_changed(cid);
        self.set_guest_cid(cid, wakes);
    }

    /// Sends the driver a TRANSPORT_RESET without changing its CID: what a
    /// device does after a snapshot is restored on the same CID.
    /// Connections on both sides fail; listeners stay.
    pub fn reset_transport<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        host_side: &mut impl HostSide,
        wakes: &mut WakeList,
    ) {
        let cid = u32::try_from(self.guest_cid)
            .ok()
            .and_then(|cid| GuestCid::new(cid).ok())
            .expect("the endpoint's guest CID came from a GuestCid");
        self.change_guest_cid(device, host_side, cid, wakes);
    }

    /// Whether the last round left tx chains in the ring (its budget ran
    /// out): the device loop must run another round without waiting for
    /// a kick, since driver notifications are still off.
    pub fn tx_pending(&self) -> bool {
        self.tx_more
    }

    /// Follows the driver's lifecycle: when the device was reset or a
    /// driver (re)started since the last call, the host side's connections
    /// are reset and its socket types follow what the driver negotiated.
    /// Also delivers a TRANSPORT_RESET still waiting for an event buffer.
    /// Every other method calls it; it costs a comparison when nothing
    /// changed.
    pub fn follow_driver<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        wakes: &mut WakeList,
    ) {
        device.deliver_pending_events();
        if device.session() == self.session {
            return;
        }
        self.session = device.session();
        if self.serving {
            // Connections of the old driver are gone; tell their host
            // sockets (the bridge closes the host programs' connections)
            // and drop whatever was queued for the old driver. What a host
            // program queued before the first driver came is kept for it.
            self.serving = false;
            self.stats.driver_resets += 1;
            tracing::debug!(
                session = self.session,
                "the driver went away: resetting the host side's connections"
            );
            self.tx_more = false;
            self.stack.transport_reset(VMADDR_CID_HOST, wakes);
        }
        self.rx_lendable = true;
        if device.driver_ok() {
            let negotiated = VsockFeatures::from_bits_truncate(device.negotiated_features());
            self.stack.set_features(negotiated.socket_types());
            self.serving = true;
        }
    }

    /// Whether the driver negotiated datagrams (feature bit 3).
    pub fn datagrams_negotiated(&self) -> bool {
        self.stack.config().features.datagram
    }

    /// Takes the packets the driver published (up to the device's per-round
    /// budget) into the stack, as one batch.
    pub fn take_tx<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        host_side: &mut impl HostSide,
        now: Instant,
        wakes: &mut WakeList,
    ) -> Result<usize, QueueError> {
        self.follow_driver(device, wakes);
        let datagrams = self.datagrams_negotiated();
        let Self { stack, guest_cid, stats, tx_more, capture, payload_copy, .. } = self;
        let host_side = RefCell::new(host_side);
        let mut tap = RelayTap { host_side: &host_side, unstaged: 0 };
        let mut batch = stack.rx_batch_with_tap(now, &mut tap);
        let mut taken = 0;
        let result = device.drain_tx(|packet| {
            let packet = match packet {
                Ok(p) => p,
                Err(e) => {
                    stats.bad_chains += 1;
                    tracing::debug!("dropped a tx chain: {e}");
                    return;
                }
            };
            let Ok(raw) = RawHeader::parse(packet.header) else {
                stats.bad_chains += 1;
                tracing::debug!("dropped a tx chain: shorter than a header");
                return;
            };
            let to_host = raw.dst_cid == u64::from(VMADDR_CID_HOST);
            let datagram = raw.type_ == SocketType::Datagram as u16;
            // A capture records the bytes the device passed on, and
            // datagrams and packets for siblings are taken as bytes.
            let payload = if capture.is_some() || datagram || !to_host {
                Payload::bytes(bytes_of(packet.payload, payload_copy))
            } else {
                packet.payload
            };
            let bytes = payload.as_bytes();
            if let Some(capture) = capture
                && let Some(bytes) = bytes
            {
                capture.packet(&raw, bytes);
            }
            if raw.src_cid != *guest_cid {
                stats.spoofed_source += 1;
                tracing::debug!(
                    src_cid = raw.src_cid,
                    guest_cid = *guest_cid,
                    "dropped a guest packet: spoofed source CID"
                );
                return;
            }
            if !to_host
                && let Some(bytes) = bytes
                && host_side.borrow_mut().guest_packet_elsewhere(&raw, bytes)
            {
                stats.to_elsewhere += 1;
                return;
            }
            if datagram {
                if !datagrams {
                    stats.datagrams_not_negotiated += 1;
                    tracing::debug!("dropped a guest datagram: DGRAM not negotiated");
                    return;
                }
                if let Some(bytes) = bytes
                    && host_side.borrow_mut().guest_datagram(&raw, bytes)
                {
                    stats.datagrams_from_guest += 1;
                    return;
                }
            }
            stats.from_guest += 1;
            taken += 1;
            batch.receive_payload(&raw, payload);
        });
        batch.finish(wakes);
        stats.from_guest_bytes_unstaged += tap.unstaged;
        *tx_more = result.as_ref().is_ok_and(|drained| drained.more);
        // Every chain that went back to the driver, a packet or a rejected
        // one, may be what it waits for: the tx-done interrupt frees its
        // buffers (spec 2.7.7.2). needs_interrupt answers no when nothing
        // was returned.
        let _ = device.interrupt_if_needed(TX_QUEUE);
        result.map(|_| taken)
    }

    /// Fires the host stack's timers.
    pub fn handle_timeout(&mut self, now: Instant, wakes: &mut WakeList) {
        self.stack.handle_timeout(now, wakes);
    }

    /// Writes what the host has for the guest into the driver's receive
    /// buffers, the host side's datagrams first, then the host stack's
    /// packets, and raises the used-buffer interrupt if the driver wants
    /// one. Returns the packets written.
    pub fn give_rx<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        host_side: &mut impl HostSide,
        now: Instant,
        wakes: &mut WakeList,
    ) -> usize {
        self.follow_driver(device, wakes);
        let datagrams = self.datagrams_negotiated();
        let Self { stack, stats, capture, rx_lendable, .. } = self;
        let mut sink = RxQueueWriter {
            device,
            written: 0,
            in_place: 0,
            shrink_to: None,
            lending: false,
            small_buffers: false,
            capture: capture.as_mut(),
        };
        host_side.packets_from_elsewhere(&mut sink, stack.max_payload());
        if let Some(max) = sink.shrink_to.take()
            && max > 0
            && max < stack.max_payload()
        {
            // A forwarded packet met a buffer too small for it: learn the
            // size, and send it again in pieces that fit.
            stats.rx_buffer_shrinks += 1;
            stack.set_max_payload(max);
            host_side.packets_from_elsewhere(&mut sink, max);
        }
        host_side.host_datagrams(&mut HostDatagramFilter {
            rx: &mut sink,
            negotiated: datagrams,
            max_payload: stack.max_payload(),
            stats,
        });
        stack.dispatch(now, &mut sink, wakes);
        if let Some(max) = sink.shrink_to.take()
            && max > 0
            && max < stack.max_payload()
        {
            stats.rx_buffer_shrinks += 1;
            tracing::debug!(max, "rx buffers too small: cutting smaller packets");
            stack.set_max_payload(max);
            stack.dispatch(now, &mut sink, wakes);
        }
        // The stack's own packets first, so control packets of other
        // connections always find buffers; then the stream bytes waiting
        // in host sockets go straight into what is left. A relay that
        // could not lend (or found nothing to) may have queued bytes in
        // the stack instead: they go out now.
        sink.lending = *rx_lendable;
        host_side.lend_rx(stack, &mut sink, now);
        stack.dispatch(now, &mut sink, wakes);
        if sink.small_buffers {
            *rx_lendable = false;
        }
        let written = sink.written;
        stats.to_guest += written as u64;
        stats.to_guest_in_place += sink.in_place as u64;
        if stack.has_pending_tx() {
            stats.rx_full += 1;
        }
        // Also for buffers handed back unused (malformed, or too small for
        // a header): the driver needs them back to repost them.
        let _ = device.interrupt_if_needed(RX_QUEUE);
        written
    }

    /// One full round: take tx, fire timers, let the host_side move data,
    /// give rx. Returns the packets moved.
    pub fn process<A: GuestAddressSpace>(
        &mut self,
        device: &mut VsockDevice<A>,
        host_side: &mut impl HostSide,
        now: Instant,
        wakes: &mut WakeList,
    ) -> usize {
        let taken = self.take_tx(device, host_side, now, wakes).unwrap_or(0);
        self.handle_timeout(now, wakes);
        // The host_side learns which sockets changed through their wakers,
        // so they fire before it looks.
        wakes.wake_all();
        host_side.service(&mut self.stack, now);
        taken + self.give_rx(device, host_side, now, wakes)
    }

    /// The earliest host-stack deadline.
    pub fn poll_at(&self) -> Option<Instant> {
        self.stack.poll_at()
    }
}

/// Host datagrams on their way into the receive buffers: dropped and
/// counted when the driver has not negotiated datagrams, or when one is
/// larger than the guest's buffers hold (it could never be delivered and
/// would block every datagram behind it).
struct HostDatagramFilter<'s, 'a, A: GuestAddressSpace> {
    rx: &'s mut RxQueueWriter<'a, A>,
    negotiated: bool,
    max_payload: usize,
    stats: &'s mut EndpointStats,
}

impl<A: GuestAddressSpace> TxSink for HostDatagramFilter<'_, '_, A> {
    fn transmit(&mut self, header: &RawHeader, payload: &[u8]) -> Result<(), SinkFull> {
        if !self.negotiated {
            self.stats.datagrams_not_negotiated += 1;
            tracing::debug!("dropped a host datagram: DGRAM not negotiated");
            return Ok(());
        }
        if payload.len() > self.max_payload {
            self.stats.datagrams_too_large += 1;
            tracing::debug!(
                len = payload.len(),
                max = self.max_payload,
                "dropped a host datagram: larger than the guest's buffers"
            );
            return Ok(());
        }
        self.rx.transmit(header, payload)
    }
}

/// Writes packets into the driver's receive buffers: what the host stack
/// transmits (a [`TxSink`] to the stack) is what the guest receives.
struct RxQueueWriter<'a, A: GuestAddressSpace> {
    device: &'a mut VsockDevice<A>,
    written: usize,
    /// Of `written`, packets filled in place.
    in_place: usize,
    /// Set when a buffer was too small: the largest payload that fits.
    shrink_to: Option<usize>,
    /// Buffers may be lent to the relay (see [`RxLender::lends`]).
    lending: bool,
    /// A buffer turned out smaller than [`MIN_LENT_PAYLOAD`].
    small_buffers: bool,
    capture: Option<&'a mut Capture>,
}

impl<A: GuestAddressSpace> RxLender for RxQueueWriter<'_, A> {
    fn lends(&self) -> bool {
        self.lending && self.capture.is_none()
    }

    fn fill(&mut self, fill: &mut dyn FnMut(&mut RxPayload<'_>) -> Option<RawHeader>) -> bool {
        if !self.lends() {
            return false;
        }
        let mut lent = false;
        let small_buffers = &mut self.small_buffers;
        match self.device.fill_rx(|payload| {
            if payload.capacity() < MIN_LENT_PAYLOAD {
                *small_buffers = true;
                return None;
            }
            lent = true;
            fill(payload).map(|header| header.encode())
        }) {
            Ok(Some(_)) => {
                self.written += 1;
                self.in_place += 1;
                true
            }
            // No buffer, or one that `fill` left for the next packet.
            Ok(None) if !self.small_buffers => lent,
            Ok(None) => {
                self.lending = false;
                false
            }
            // A buffer with no room for data (the host stack's next
            // packet learns its size), or a broken queue.
            Err(_) => {
                self.lending = false;
                false
            }
        }
    }
}

impl<A: GuestAddressSpace> TxSink for RxQueueWriter<'_, A> {
    fn transmit(&mut self, header: &RawHeader, payload: &[u8]) -> Result<(), SinkFull> {
        match self.device.write_rx(&header.encode(), payload) {
            Ok(Some(_)) => {
                self.written += 1;
                if let Some(capture) = self.capture.as_deref_mut() {
                    capture.packet(header, payload);
                }
                Ok(())
            }
            Ok(None) => Err(SinkFull),
            Err(QueueError::BufferTooSmall { capacity, .. }) => {
                self.shrink_to = Some((capacity as usize).saturating_sub(HEADER_LEN));
                Err(SinkFull)
            }
            // The queue itself is broken (the driver reset it, or its rings
            // are unreadable): nothing can be delivered until it is set up
            // again, so the packet stays queued.
            Err(_) => Err(SinkFull),
        }
    }
}
