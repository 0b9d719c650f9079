//! Receiving: batches of packets from the device, decoding, and routing
//! each packet to its connection, its listener or its datagram socket.
//!
//! Routing follows Linux (`virtio_transport_recv_pkt`): a packet is matched
//! first against established connections by its 4-tuple, then against
//! listeners by its destination port. A stream or seqpacket packet that
//! matches nothing is answered with RST, unless it is itself an RST. A
//! datagram that matches nothing is dropped silently.

use core::fmt;

use super::Stack;
use super::endpoint::catch_all_slot;
use super::table::ConnKey;
use super::wakes::Wake;
use crate::addr::VMADDR_CID_LOCAL;
use crate::payload::Payload;
use crate::readiness::WakeList;
use crate::socket::{ConnectionSocket, DirectReceive, HoldOffer, SocketHandle, State, answer};
use crate::stats::{DropReason, RstReason};
use crate::time::Instant;
use crate::wire::{self, DecodeError, Header, MAX_PAYLOAD, Op, RawHeader, SocketType};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    Device,
    Loopback,
}

/// Receives one batch of packets; see [`Stack::rx_batch`].
///
/// Readiness changes are recorded, not delivered, until [`RxBatch::finish`]
/// hands the wakers to the caller. Dropping an unfinished batch keeps them in
/// the stack for the next call that returns wakers.
pub struct RxBatch<'a> {
    stack: &'a mut Stack,
    now: Instant,
    tap: Tap<'a>,
}

impl fmt::Debug for RxBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBatch").field("now", &self.now).finish_non_exhaustive()
    }
}

/// The tap a batch offers payloads to, if any.
pub(super) type Tap<'a> = Option<&'a mut dyn DirectReceive>;

impl RxBatch<'_> {
    /// One received buffer: a header, then `len` bytes of payload, then
    /// possibly slack the device did not fill.
    pub fn receive(&mut self, frame: &[u8]) {
        self.stack.receive_frame(self.now, frame, Origin::Device, &mut self.tap, None);
    }

    /// One received buffer, as [`Self::receive`], from a driver that lends
    /// its receive buffers ([`Stack::set_held_buffers`]): `frame` is the
    /// start of buffer `id`. Returns `true` if the stack kept the payload
    /// there for the application to read in place: the driver must then
    /// leave the buffer alone (not post it again) until the stack releases
    /// it ([`Stack::take_released_buffers`]). Without lent buffers, never.
    pub fn receive_held(&mut self, frame: &[u8], id: u16) -> bool {
        let offer =
            self.stack.held_buffers.is_some().then_some(HoldOffer { id, start: wire::HEADER_LEN });
        self.stack.receive_frame(self.now, frame, Origin::Device, &mut self.tap, offer)
    }

    /// One received packet whose header and payload are apart (as a
    /// device may deliver them, or another stack's sink hands them over).
    pub fn receive_parts(&mut self, header: &RawHeader, payload: &[u8]) {
        self.receive_payload(header, Payload::bytes(payload));
    }

    /// One received packet, as [`Self::receive_parts`], whose payload may
    /// lie where the stack may only copy it out (see [`Payload`]).
    pub fn receive_payload(&mut self, header: &RawHeader, payload: Payload<'_>) {
        self.stack.receive_raw(self.now, header, payload, Origin::Device, &mut self.tap);
    }

    /// Ends the batch and moves the recorded wakers into `wakes`: wake them
    /// after releasing any lock around the stack.
    pub fn finish(self, wakes: &mut WakeList) {
        self.stack.drain_wakes(wakes);
    }
}

impl Stack {
    /// Starts a batch of received packets.
    pub fn rx_batch(&mut self, now: Instant) -> RxBatch<'_> {
        RxBatch { stack: self, now, tap: None }
    }

    /// Starts a batch whose stream payloads are offered to `tap` first
    /// (see [`DirectReceive`]).
    pub fn rx_batch_with_tap<'a>(
        &'a mut self,
        now: Instant,
        tap: &'a mut dyn DirectReceive,
    ) -> RxBatch<'a> {
        RxBatch { stack: self, now, tap: Some(tap) }
    }

    /// Receives every frame as one batch and returns the wakers in `wakes`.
    pub fn receive_batch<'f>(
        &mut self,
        now: Instant,
        frames: impl IntoIterator<Item = &'f [u8]>,
        wakes: &mut WakeList,
    ) {
        let mut batch = self.rx_batch(now);
        for frame in frames {
            batch.receive(frame);
        }
        batch.finish(wakes);
    }

    /// One received buffer: decode it, then route it. Returns whether the
    /// payload was held in its buffer (only with `hold`).
    pub(super) fn receive_frame(
        &mut self,
        now: Instant,
        frame: &[u8],
        origin: Origin,
        tap: &mut Tap<'_>,
        hold: Option<HoldOffer>,
    ) -> bool {
        match wire::decode(frame) {
            Ok((header, payload)) => {
                self.process(now, &header, Payload::bytes(payload), origin, tap, hold)
            }
            Err(err) => {
                self.undecodable(err, origin);
                false
            }
        }
    }

    /// One received packet with its header and payload apart: check that
    /// they agree, then route it.
    pub(super) fn receive_raw(
        &mut self,
        now: Instant,
        raw: &RawHeader,
        payload: Payload<'_>,
        origin: Origin,
        tap: &mut Tap<'_>,
    ) {
        let checked = if raw.len as usize > MAX_PAYLOAD {
            Err(DecodeError::PayloadTooLarge { declared: raw.len })
        } else if raw.len as usize != payload.len() {
            Err(DecodeError::LengthMismatch { declared: raw.len, available: payload.len() })
        } else {
            raw.check()
        };
        match checked {
            Ok(header) => {
                self.process(now, &header, payload, origin, tap, None);
            }
            Err(err) => self.undecodable(err, origin),
        }
    }

    /// A packet that did not decode: answered when the spec asks for it,
    /// counted in any case.
    pub(super) fn undecodable(&mut self, err: DecodeError, origin: Origin) {
        match err {
            DecodeError::UnknownType { header } => {
                self.process_undecodable(header, RstReason::UnsupportedType, origin)
            }
            DecodeError::UnknownOp { header } => {
                self.process_undecodable(header, RstReason::UnknownOp, origin)
            }
            DecodeError::Truncated { .. }
            | DecodeError::LengthMismatch { .. }
            | DecodeError::PayloadTooLarge { .. } => {
                self.count_rx(origin, 0);
                self.stats.count_drop(DropReason::Malformed);
            }
        }
    }

    /// Counts a received packet, from the device or from inside the stack.
    pub(super) fn count_rx(&mut self, origin: Origin, bytes: usize) {
        match origin {
            Origin::Device => {
                self.stats.rx_packets += 1;
                self.stats.rx_bytes += bytes as u64;
            }
            Origin::Loopback => {
                self.stats.loopback_packets += 1;
                self.stats.loopback_bytes += bytes as u64;
            }
        }
    }

    /// Whether a packet for `dst_cid` is ours: our CID, or CID 1 from inside
    /// the stack.
    pub(super) fn addressed_to_us(&self, dst_cid: u64, origin: Origin) -> bool {
        dst_cid == self.local_cid as u64
            || (origin == Origin::Loopback && dst_cid == VMADDR_CID_LOCAL as u64)
    }

    /// A header with a type or op we do not know. The spec wants an RST
    /// that echoes the type, unless it is an RST or a datagram.
    pub(super) fn process_undecodable(
        &mut self,
        raw: RawHeader,
        reason: RstReason,
        origin: Origin,
    ) {
        self.count_rx(origin, 0);
        if !self.addressed_to_us(raw.dst_cid, origin) {
            self.stats.count_drop(DropReason::WrongDestination);
        } else if raw.src_cid > u32::MAX as u64 {
            self.stats.count_drop(DropReason::InvalidCid);
        } else if raw.op == Op::Rst as u16 {
            self.stats.count_drop(DropReason::UnknownOp);
        } else if raw.type_ == SocketType::Datagram as u16 {
            self.stats.count_drop(DropReason::DatagramBadOp);
        } else {
            self.reply_rst(&raw, reason);
        }
    }

    /// Routes a decoded packet: to a datagram socket, to the connection its
    /// 4-tuple names, to the listener on its port, to the catch-all listener,
    /// or, matching none, to an RST. Returns whether a connection held the
    /// payload in its buffer (only with `hold`).
    pub(super) fn process(
        &mut self,
        now: Instant,
        hdr: &Header,
        payload: Payload<'_>,
        origin: Origin,
        tap: &mut Tap<'_>,
        hold: Option<HoldOffer>,
    ) -> bool {
        self.count_rx(origin, payload.len());
        if !self.addressed_to_us(hdr.dst_cid, origin) {
            self.stats.count_drop(DropReason::WrongDestination);
            return false;
        }
        if hdr.src_cid > u32::MAX as u64 {
            self.stats.count_drop(DropReason::InvalidCid);
            return false;
        }
        if hdr.socket_type == SocketType::Datagram {
            self.process_datagram(hdr, payload);
            return false;
        }
        if hdr.op == Op::Rst {
            self.stats.rst_received += 1;
        }
        if !self.config.features.supports(hdr.socket_type) {
            if hdr.op == Op::Rst {
                self.stats.count_drop(DropReason::TypeNotNegotiated);
            } else {
                self.reply_rst(&hdr.to_raw(), RstReason::UnsupportedType);
            }
            return false;
        }
        let key = ConnKey::of_received(hdr);
        if let Some(&h) = self.connected.get(&key) {
            if self.sockets[h].socket.ty() != hdr.socket_type {
                self.unmatched(hdr, RstReason::TypeMismatch);
                return false;
            }
            let outcome = self.conn_mut(h).process(h, now, hdr, payload, tap, hold);
            let held = outcome.held > 0;
            self.apply(h, outcome);
            return held;
        }
        if let Some(h) = self.bound_for(true, hdr.dst_port, hdr.dst_cid)
            && let Some(l) = self.sockets[h].socket.as_connection()
            && l.state == State::Listening
        {
            if l.ty != hdr.socket_type {
                self.unmatched(hdr, RstReason::TypeMismatch);
            } else {
                self.on_listener_packet(now, h, hdr);
            }
            return false;
        }
        if let Some(h) = self.catch_all[catch_all_slot(hdr.socket_type)] {
            self.on_listener_packet(now, h, hdr);
            return false;
        }
        let reason =
            if hdr.op == Op::Response { RstReason::StrayResponse } else { RstReason::NoSocket };
        self.unmatched(hdr, reason);
        false
    }

    /// A stream or seqpacket packet nobody takes: RST it, unless it is an RST.
    pub(super) fn unmatched(&mut self, hdr: &Header, reason: RstReason) {
        match answer(hdr, reason) {
            Ok((rst, reason)) => self.queue_rst(rst, reason),
            Err(drop) => self.stats.count_drop(drop),
        }
    }

    /// A packet for a listener: a REQUEST becomes a connection in its accept
    /// queue (or an RST when the queue or the stack is full); anything else
    /// is answered with an RST, except an RST.
    pub(super) fn on_listener_packet(
        &mut self,
        now: Instant,
        listener: SocketHandle,
        hdr: &Header,
    ) {
        match hdr.op {
            Op::Request => {}
            Op::Rst => {
                self.stats.count_drop(DropReason::Ignored);
                return;
            }
            _ => {
                self.reply_rst(&hdr.to_raw(), RstReason::ProtocolViolation);
                return;
            }
        }
        let l = self.conn(listener);
        // Linux's sk_acceptq_is_full: full once the queue holds more than `backlog`.
        if l.listener.queue.len() > l.listener.backlog {
            self.reply_rst(&hdr.to_raw(), RstReason::BacklogFull);
            return;
        }
        if self.sockets.len() >= self.config.max_sockets {
            self.reply_rst(&hdr.to_raw(), RstReason::SocketLimit);
            return;
        }
        let child = ConnectionSocket::accepted(self.conn(listener), listener, hdr, now);
        let awaiting = child.awaiting_confirmation;
        let child = self.insert_accepted(child);
        if awaiting {
            self.timers.push(child);
        }
        let key = ConnKey::of_received(hdr);
        self.connected.insert(key, child);
        self.conn_mut(listener).listener.queue.push_back(child);
        self.stats.connections_established += 1;
        self.enqueue_tx(child);
        self.note(listener, Wake::Readable);
    }
}
