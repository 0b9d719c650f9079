//! The connection state machine: what a stream or seqpacket socket does
//! with each event (a packet, a deadline, a close, a transport reset), and
//! which packet it sends next.
//!
//! Like smoltcp's `tcp::Socket::process` and quinn-proto's `Connection`,
//! the machine changes only its own socket and returns an [`Outcome`]:
//! what the endpoint around it (the tables, queues, counters and wakers of
//! [`crate::Stack`]) must do in consequence. The endpoint finds the
//! socket, hands it the event and applies the outcome; the protocol rules
//! live here, in one place.

use core::time::Duration;

use super::connection::{Connection, ConnectionSocket, Message, State};
use super::rx_queue::MIN_HELD;
use super::{DirectReceive, HoldOffer, SocketHandle};
use crate::addr::VsockAddr;
use crate::error::Error;
use crate::payload::Payload;
use crate::readiness::Readiness;
use crate::stats::{DropReason, RstReason};
use crate::time::Instant;
use crate::wire::{Header, Op, RawHeader, SocketType, seq_flags, shutdown_flags};

/// A packet a connection sends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Packet {
    Request,
    Response,
    Data { len: usize, flags: u32 },
    Shutdown(u32),
    CreditUpdate,
}

/// What the endpoint must do after the connection state machine handled
/// an event (a packet, a deadline, a close, a transport reset).
///
/// The state machine changes only its own socket. The tables, queues,
/// counters and wakers around it belong to the endpoint ([`crate::Stack`]),
/// which applies an outcome in this order: counters, the RST, the timer
/// and transmit queues, readiness (writable, then readable, then both),
/// and last what becomes of the socket's place in the tables.
#[must_use]
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// An RST to send: this socket's own, or the answer to a packet it
    /// does not take. At most one per event.
    pub rst: Option<(RawHeader, RstReason)>,
    /// The packet was dropped, and why.
    pub dropped: Option<DropReason>,
    /// The handshake completed: count it, and the socket is writable.
    pub established: bool,
    /// The peer asked for our credit (answered by a credit update).
    pub credit_requested: bool,
    /// Bytes a [`DirectReceive`] tap took straight from the packet.
    pub delivered_directly: usize,
    /// Bytes left in the packet's receive buffer, which the socket now
    /// holds (see `HoldOffer`): the driver must not reuse the buffer.
    pub held: usize,
    /// A deadline was armed: the socket must be on the timer list.
    pub arm_timer: bool,
    /// The socket has a packet to send: it must be on the transmit queue.
    pub transmit: bool,
    /// The peer granted credit: writers may go on.
    pub writable: bool,
    /// Data became readable.
    pub readable: bool,
    /// The peer shut down a direction: both readers and writers look again.
    pub shut_down: bool,
    /// What becomes of the socket's place in the tables.
    pub end: End,
}

/// What becomes of a connection's place in the endpoint's tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum End {
    /// Nothing changes.
    #[default]
    Open,
    /// The connect failed: the 4-tuple is free again, and the socket stays
    /// (unconnected) to report the error and to be connected again.
    ConnectFailed,
    /// The connection is over: the port and 4-tuple are free again, and
    /// the socket stays for its owner to read what is queued, or goes if
    /// nobody holds it.
    Disconnected,
    /// The socket is finished: it leaves the stack.
    Closed,
}

impl Outcome {
    /// Treats `received` as a packet no socket takes: answered with an RST
    /// for `reason`, unless it is an RST itself (an RST never draws an
    /// RST), which is dropped and counted.
    pub fn answer(&mut self, received: &Header, reason: RstReason) {
        match answer(received, reason) {
            Ok(rst) => self.rst = Some(rst),
            Err(drop) => self.dropped = Some(drop),
        }
    }
}

/// The RST that answers `received`, a stream or seqpacket packet no socket
/// takes; or, when it is an RST itself, why it is dropped instead.
pub(crate) fn answer(
    received: &Header,
    reason: RstReason,
) -> core::result::Result<(RawHeader, RstReason), DropReason> {
    if received.op == Op::Rst {
        Err(DropReason::RstForUnknown)
    } else {
        Ok((RawHeader::rst_reply(&received.to_raw()), reason))
    }
}

impl ConnectionSocket {
    /// Starts the handshake with `peer` from `local_cid`: a REQUEST is owed
    /// and the connect deadline armed. The caller has bound the socket and
    /// entered it in the connection table.
    pub fn start_connect(&mut self, peer: VsockAddr, local_cid: u32, now: Instant) -> Outcome {
        self.state = State::Connecting;
        self.peer = Some(peer);
        self.local_cid = local_cid;
        self.error = None;
        self.conn = Connection {
            rx_limit: self.options.buffer_size,
            send_request: true,
            ..Connection::default()
        };
        self.deadline = Some(now + self.options.connect_timeout);
        Outcome { arm_timer: true, transmit: true, ..Outcome::default() }
    }

    /// Answers a connection from a catch-all listener: a RESPONSE is owed.
    pub fn confirm(&mut self) -> Outcome {
        self.awaiting_confirmation = false;
        self.deadline = None;
        self.conn.send_response = true;
        Outcome { transmit: true, ..Outcome::default() }
    }

    /// Refuses a connection from a catch-all listener: RST, and the socket
    /// is finished.
    pub fn refuse(&mut self) -> Outcome {
        let mut o = Outcome { end: End::Closed, ..Outcome::default() };
        self.rst(RstReason::Refused, &mut o);
        o
    }

    /// The application let go of the socket (or of the listener whose
    /// queue held it). An established connection closes in the background:
    /// SHUTDOWN after the queued data, then the peer's RST or, at the close
    /// deadline, our own.
    pub fn close(&mut self, now: Instant, close_timeout: Duration) -> Outcome {
        let mut o = Outcome { end: End::Closed, ..Outcome::default() };
        if self.awaiting_confirmation {
            self.rst(RstReason::Refused, &mut o);
            return o;
        }
        match self.state {
            State::Connected if self.conn.peer_shutdown == shutdown_flags::BOTH => {
                self.rst(RstReason::CloseAfterPeerShutdown, &mut o);
            }
            State::Connected => {
                self.conn.local_shutdown = shutdown_flags::BOTH;
                self.state = State::Closing;
                self.deadline = Some(now + close_timeout);
                o = Outcome { arm_timer: true, transmit: true, ..Outcome::default() };
            }
            State::Disconnected if !self.conn.finished => {
                self.rst(RstReason::CloseAfterPeerShutdown, &mut o);
            }
            State::Unconnected
            | State::Listening
            | State::Connecting
            | State::Disconnected
            | State::Closing => {}
        }
        o
    }

    /// The application aborts the connection: an RST goes out at once and
    /// whatever was queued either way is discarded, so the peer learns the
    /// connection failed rather than that it ended in order.
    pub fn abort_by_app(&mut self) -> Outcome {
        let mut o = Outcome { end: End::Closed, ..Outcome::default() };
        match self.state {
            State::Connecting | State::Connected | State::Closing | State::Disconnected => {
                self.rst(RstReason::Aborted, &mut o);
            }
            State::Unconnected | State::Listening => {}
        }
        o
    }

    /// The deadline passed: a connect times out, a close that got no RST
    /// sends one, a catch-all connection nobody answered is refused.
    pub fn timed_out(&mut self) -> Outcome {
        let mut o = Outcome::default();
        match self.state {
            State::Connecting => self.fail_connect(Error::TimedOut, &mut o),
            State::Closing => {
                self.rst(RstReason::CloseTimeout, &mut o);
                o.end = End::Closed;
            }
            State::Connected if self.awaiting_confirmation => {
                self.rst(RstReason::Refused, &mut o);
                self.awaiting_confirmation = false;
                self.disconnect(Some(Error::TimedOut), &mut o);
            }
            _ => self.deadline = None,
        }
        o
    }

    /// The transport was reset: every connection fails with
    /// connection-reset, and nothing more may be sent on it. As in Linux
    /// (`virtio_vsock_reset_sock`), a connection the peer had already ended
    /// also takes the error: it becomes TCP_CLOSE with ECONNRESET pending.
    pub fn transport_reset(&mut self) -> Outcome {
        let mut o = Outcome::default();
        match self.state {
            State::Connecting => self.fail_connect(Error::ConnectionReset, &mut o),
            State::Connected => {
                self.conn.finished = true;
                self.disconnect(Some(Error::ConnectionReset), &mut o);
            }
            State::Closing => o.end = End::Closed,
            State::Disconnected => {
                self.conn.finished = true;
                self.conn.still_established = false;
                self.error.get_or_insert(Error::ConnectionReset);
                o.shut_down = true;
            }
            State::Unconnected | State::Listening => {}
        }
        o
    }

    // ----- receive: the state machine ------------------------------------

    /// Handles a packet of this connection (the endpoint found it by its
    /// 4-tuple, and it is of this socket's type). Its credit is taken
    /// first, whatever its op; then the op acts on the socket's state.
    /// Stream payloads are offered to `tap` first while nothing is
    /// buffered; `h` is this socket's handle, for the tap. With `hold`, a
    /// stream payload may stay in its receive buffer.
    pub fn process(
        &mut self,
        h: SocketHandle,
        now: Instant,
        hdr: &Header,
        payload: Payload<'_>,
        tap: &mut Option<&mut dyn DirectReceive>,
        hold: Option<HoldOffer>,
    ) -> Outcome {
        let mut o = Outcome::default();
        if self.state == State::Connecting && self.deadline.is_some_and(|d| d <= now) {
            // The timer is due but has not been handled yet: the connect has
            // already failed, and this packet finds no socket.
            self.fail_connect(Error::TimedOut, &mut o);
            let reason =
                if hdr.op == Op::Response { RstReason::StrayResponse } else { RstReason::NoSocket };
            o.answer(hdr, reason);
            return o;
        }
        self.take_credit(hdr, &mut o);
        match self.state {
            State::Connecting => match hdr.op {
                Op::Response => {
                    self.state = State::Connected;
                    self.deadline = None;
                    o.established = true;
                    o.transmit |= self.wants_tx();
                }
                Op::Rst => self.fail_connect(Error::ConnectionReset, &mut o),
                Op::Invalid => o.dropped = Some(DropReason::Ignored),
                _ => {
                    o.answer(hdr, RstReason::ProtocolViolation);
                    self.fail_connect(Error::Protocol, &mut o);
                }
            },
            State::Connected => match hdr.op {
                Op::Rw => self.on_data(h, hdr, payload, tap, hold, &mut o),
                Op::CreditUpdate => {}
                Op::CreditRequest => self.on_credit_request(&mut o),
                Op::Shutdown => self.on_peer_shutdown(hdr.flags, &mut o),
                Op::Rst => self.on_peer_rst(&mut o),
                Op::Request | Op::Response | Op::Invalid => o.dropped = Some(DropReason::Ignored),
            },
            State::Closing => match hdr.op {
                Op::Rst => o.end = End::Closed,
                Op::Shutdown => {
                    self.conn.peer_shutdown |= hdr.flags & shutdown_flags::BOTH;
                    if self.conn.peer_shutdown == shutdown_flags::BOTH {
                        self.rst(RstReason::CloseAfterPeerShutdown, &mut o);
                        o.end = End::Closed;
                    }
                }
                Op::CreditRequest => self.on_credit_request(&mut o),
                Op::CreditUpdate => {}
                Op::Rw | Op::Request | Op::Response | Op::Invalid => {
                    o.dropped = Some(DropReason::SocketClosing)
                }
            },
            State::Unconnected | State::Listening | State::Disconnected => {
                o.dropped = Some(DropReason::Ignored)
            }
        }
        o
    }

    /// Takes the credit every header carries
    /// (`docs/linux-behaviours.md#credit-from-every-header`).
    fn take_credit(&mut self, hdr: &Header, o: &mut Outcome) {
        let window_before = self.conn.send_window(self.send_cap());
        let peer_buf_alloc_before = self.conn.peer_buf_alloc;
        self.conn.update_peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
        if self.conn.peer_buf_alloc != peer_buf_alloc_before {
            // The peer's own buffer caps what it may send us; a smaller cap
            // can make credit we had not reported yet the thing it waits for.
            o.transmit |= self.credit_update_if_due();
        }
        if self.conn.send_window(self.send_cap()) > window_before && self.state != State::Connecting
        {
            o.transmit |= self.wants_tx();
            o.writable = true;
        }
    }

    /// CREDIT_REQUEST: a credit update is owed.
    fn on_credit_request(&mut self, o: &mut Outcome) {
        o.credit_requested = true;
        self.conn.send_credit_update = true;
        o.transmit = true;
    }

    /// RW on an established connection: the payload is offered to the tap,
    /// then held in its receive buffer or buffered; a peer that sends past
    /// its credit, or more messages than we keep track of, is reset.
    fn on_data(
        &mut self,
        h: SocketHandle,
        hdr: &Header,
        payload: Payload<'_>,
        tap: &mut Option<&mut dyn DirectReceive>,
        hold: Option<HoldOffer>,
        o: &mut Outcome,
    ) {
        if self.conn.local_shutdown & shutdown_flags::RCV != 0 {
            o.dropped = Some(DropReason::AfterShutdown);
            return;
        }
        if self.conn.rx.len() + payload.len() > self.conn.rx_limit as usize {
            self.abort(RstReason::CreditOverrun, o);
            return;
        }
        let seqpacket = self.is_seqpacket();
        let mut payload = payload;
        // Only with nothing buffered, so bytes keep their order.
        if let Some(tap) = tap
            && !seqpacket
            && self.conn.rx.is_empty()
            && !payload.is_empty()
        {
            let taken = tap.deliver(h, payload).min(payload.len());
            if taken > 0 {
                o.delivered_directly = taken;
                o.transmit |= self.consumed(taken);
                payload = payload.skip(taken);
                if payload.is_empty() {
                    return;
                }
            }
        }
        let c = &mut self.conn;
        if let Some(offer) = hold
            && !seqpacket
            && payload.len() >= MIN_HELD
            && payload.as_bytes().is_some()
            && c.rx.can_hold()
        {
            let start = offer.start + o.delivered_directly;
            c.rx.hold(offer.id, start, payload.len());
            o.held = payload.len();
            o.readable = self.readiness().contains(Readiness::READABLE);
            return;
        }
        let end_of_message = seqpacket && hdr.flags & seq_flags::EOM != 0;
        if end_of_message && c.rx_messages.len() >= Connection::rx_message_limit(c.rx_limit) {
            self.abort(RstReason::MessageQueueOverflow, o);
            return;
        }
        c.rx.push(payload);
        if seqpacket {
            c.rx_partial += payload.len() as u32;
            if end_of_message {
                c.rx_messages.push_back(Message {
                    len: c.rx_partial,
                    end_of_record: hdr.flags & seq_flags::EOR != 0,
                });
                c.rx_partial = 0;
            }
        }
        o.readable = self.readiness().contains(Readiness::READABLE);
    }

    /// SHUTDOWN from the peer; its flags add to those it sent before.
    fn on_peer_shutdown(&mut self, flags: u32, o: &mut Outcome) {
        let c = &mut self.conn;
        c.peer_shutdown |= flags & shutdown_flags::BOTH;
        if c.peer_shutdown & shutdown_flags::SEND != 0 {
            c.peer_done = true;
        }
        if c.peer_shutdown == shutdown_flags::BOTH {
            // Both ways done. With nothing left to read the connection ends
            // here with our RST; otherwise it leaves the tables now (so the
            // peer can reuse its port) and the RST waits for our close.
            if self.readable_bytes() == 0 {
                self.rst(RstReason::PeerShutdown, o);
            }
            self.disconnect(None, o);
            self.conn.still_established = !self.conn.rx.is_empty();
        } else {
            o.shut_down = true;
        }
    }

    /// As in Linux (`virtio_transport_do_close`), an RST on an established
    /// connection reads as a full shutdown by the peer: queued data stays
    /// readable, then EOF; sends fail with EPIPE. No error is raised.
    fn on_peer_rst(&mut self, o: &mut Outcome) {
        self.conn.finished = true;
        self.conn.peer_reset = true;
        self.conn.peer_shutdown = shutdown_flags::BOTH;
        self.disconnect(None, o);
        self.conn.still_established = !self.conn.rx.is_empty();
    }

    /// We end the connection with an RST: the peer broke a rule.
    fn abort(&mut self, reason: RstReason, o: &mut Outcome) {
        self.rst(reason, o);
        self.disconnect(Some(Error::ConnectionReset), o);
    }

    /// The connection is over; nothing more is sent on it but the RST, and
    /// `error` (if any) is reported by the next call.
    fn disconnect(&mut self, error: Option<Error>, o: &mut Outcome) {
        let c = &mut self.conn;
        c.peer_done = true;
        c.tx.release();
        c.tx_messages.clear();
        c.tx_head_sent = 0;
        c.send_request = false;
        c.send_response = false;
        c.send_credit_update = false;
        if error.is_some() {
            self.error = error;
        }
        self.state = State::Disconnected;
        self.deadline = None;
        o.end = End::Disconnected;
    }

    /// The connect failed with `error`; the socket may connect again.
    fn fail_connect(&mut self, error: Error, o: &mut Outcome) {
        self.state = State::Unconnected;
        self.error = Some(error);
        self.deadline = None;
        self.conn = Connection::default();
        o.end = End::ConnectFailed;
    }

    /// Ends the connection with an RST from this socket for `reason`,
    /// unless one was already sent or received: nothing may follow it.
    fn rst(&mut self, reason: RstReason, o: &mut Outcome) {
        if self.conn.finished {
            return;
        }
        self.conn.finished = true;
        if let (Some(_), Some(peer)) = (self.local, self.peer) {
            o.rst = Some((self.header_to(peer, Op::Rst).to_raw(), reason));
        }
    }

    // ----- transmit -----------------------------------------------------

    /// Decides the socket's next packet, in protocol order: handshake,
    /// data, then SHUTDOWN (only once data is out), then a bare credit update.
    pub fn next_packet(&self, max_payload: usize) -> Option<Packet> {
        let c = &self.conn;
        if c.finished {
            return None;
        }
        if c.send_request {
            return Some(Packet::Request);
        }
        if c.send_response {
            return Some(Packet::Response);
        }
        if matches!(self.state, State::Connected | State::Closing) {
            if let Some(data) = self.next_data(max_payload) {
                return Some(data);
            }
            let unsent = c.local_shutdown & !c.shutdown_sent;
            if unsent != 0 && c.tx.is_empty() && c.tx_messages.is_empty() {
                return Some(Packet::Shutdown(c.local_shutdown));
            }
        }
        if c.send_credit_update {
            return Some(Packet::CreditUpdate);
        }
        None
    }

    /// The next RW: as much as the window, the ring's contiguous run and
    /// `max_payload` allow; a seqpacket message's last part carries EOM (and
    /// EOR).
    fn next_data(&self, max_payload: usize) -> Option<Packet> {
        let c = &self.conn;
        let window = c.send_window(self.send_cap()) as usize;
        let run = c.tx.contiguous_at(0, max_payload).len();
        if self.is_seqpacket() {
            let msg = c.tx_messages.front()?;
            let remaining = (msg.len - c.tx_head_sent) as usize;
            let len = remaining.min(run).min(window);
            if len == 0 && remaining > 0 {
                return None;
            }
            let mut flags = 0;
            if len == remaining {
                flags = seq_flags::EOM;
                if msg.end_of_record {
                    flags |= seq_flags::EOR;
                }
            }
            return Some(Packet::Data { len, flags });
        }
        let len = run.min(window);
        (len > 0).then_some(Packet::Data { len, flags: 0 })
    }

    /// Counts `len` stream bytes the transport took straight from the
    /// source as sent (see `Stack::send_in_place`), and returns the header
    /// of their packet: the peer's credit shrinks as if they had passed
    /// through the send buffer, and the header tells the peer our
    /// `fwd_cnt`, so it also serves as a credit update.
    pub fn sent_in_place(&mut self, len: usize) -> Header {
        let packet = Packet::Data { len, flags: 0 };
        let header = self.header(packet);
        let c = &mut self.conn;
        c.tx_cnt = c.tx_cnt.wrapping_add(len as u32);
        c.last_fwd_cnt_sent = c.fwd_cnt;
        c.send_credit_update = false;
        header
    }

    /// The header of `packet`.
    pub fn header(&self, packet: Packet) -> Header {
        let (op, len, flags) = match packet {
            Packet::Request => (Op::Request, 0, 0),
            Packet::Response => (Op::Response, 0, 0),
            Packet::Data { len, flags } => (Op::Rw, len, flags),
            Packet::Shutdown(flags) => (Op::Shutdown, 0, flags),
            Packet::CreditUpdate => (Op::CreditUpdate, 0, 0),
        };
        let to = self.peer.expect("packets are only planned for sockets with a peer");
        self.header_to(to, op).with_len(len as u32).with_flags(flags)
    }

    /// A header from this connection's end to `to`, with the credit this
    /// side advertises.
    fn header_to(&self, to: VsockAddr, op: Op) -> Header {
        let local_port = self.local.map_or(0, |l| l.port);
        Header::new(self.ty, op, VsockAddr::new(self.local_cid, local_port), to)
            .with_credit(self.options.buffer_size, self.conn.fwd_cnt)
    }

    /// Records that `packet` left: advance counters, clear what it carried.
    pub fn sent(&mut self, packet: Packet) {
        let c = &mut self.conn;
        // Every packet tells the peer our fwd_cnt, so it is also a credit update.
        c.last_fwd_cnt_sent = c.fwd_cnt;
        c.send_credit_update = false;
        match packet {
            Packet::Request => c.send_request = false,
            Packet::Response => c.send_response = false,
            Packet::Data { len, flags } => {
                c.tx.consume(len);
                c.tx_cnt = c.tx_cnt.wrapping_add(len as u32);
                if self.ty == SocketType::SeqPacket {
                    c.tx_head_sent += len as u32;
                    if flags & seq_flags::EOM != 0 {
                        c.tx_messages.pop_front();
                        c.tx_head_sent = 0;
                    }
                }
            }
            Packet::Shutdown(flags) => c.shutdown_sent |= flags,
            Packet::CreditUpdate => {}
        }
    }
}
