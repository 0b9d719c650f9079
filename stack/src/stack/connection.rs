//! Stream and seqpacket sockets: their calls, and the connection state
//! machine that handles their packets.
//!
//! A connection goes Unconnected → Connecting (REQUEST sent) → Connected
//! → Closing (SHUTDOWN sent after queued data) or Disconnected (the peer
//! shut down or reset, the application still reads what is queued).

use super::Stack;
use super::endpoint::ConnKey;
use super::receive::Tap;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::readiness::Readiness;
use crate::socket::{Connection, ConnectionSocket, Message, Socket, SocketHandle, State};
use crate::stats::{DropReason, RstReason};
use crate::time::Instant;
use crate::wire::{Header, Op, SocketType, seq_flags, shutdown_flags};

/// Which half of a connection `shutdown` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Read,
    Write,
    Both,
}

impl Shutdown {
    fn flags(self) -> u32 {
        match self {
            Self::Read => shutdown_flags::RCV,
            Self::Write => shutdown_flags::SEND,
            Self::Both => shutdown_flags::BOTH,
        }
    }
}

impl Stack {
    /// Answers a connection accepted from a catch-all listener: RESPONSE.
    pub fn confirm(&mut self, h: SocketHandle) -> Result<()> {
        self.awaiting_confirmation(h)?.confirm();
        self.enqueue_tx(h);
        Ok(())
    }

    /// Refuses a connection accepted from a catch-all listener: RST, and
    /// the handle is closed.
    pub fn refuse(&mut self, h: SocketHandle) -> Result<()> {
        self.awaiting_confirmation(h)?;
        self.socket_rst(h, RstReason::Refused);
        self.free(h);
        Ok(())
    }

    /// The application's connection `h` from a catch-all listener, while
    /// it waits for `confirm` or `refuse`; invalid-argument otherwise.
    fn awaiting_confirmation(&mut self, h: SocketHandle) -> Result<&mut ConnectionSocket> {
        match self.app_mut(h)? {
            Socket::Connection(c) if c.awaiting_confirmation => Ok(c),
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Starts connecting; [`Stack::finish_connect`] reports how it ended.
    ///
    /// For a datagram socket this only sets the default destination.
    pub fn connect(&mut self, h: SocketHandle, addr: VsockAddr, now: Instant) -> Result<()> {
        let s = self.app(h)?;
        if addr.port == VMADDR_PORT_ANY || (addr.cid == VMADDR_CID_ANY && s.ty().is_connectible()) {
            return Err(Error::InvalidArgument);
        }
        let Socket::Connection(c) = s else {
            self.autobind(h)?;
            self.sockets[h].socket.as_datagram_mut().expect("a datagram socket").peer = Some(addr);
            return Ok(());
        };
        match c.state {
            State::Unconnected => {}
            State::Listening => return Err(Error::InvalidArgument),
            State::Connecting => return Err(Error::Already),
            State::Connected | State::Closing | State::Disconnected => {
                return Err(Error::IsConnected);
            }
        }
        self.autobind(h)?;
        let local_port = self.conn_mut(h).local.expect("bound").port;
        let key = ConnKey::new(local_port, addr);
        if self.connected.contains_key(&key) {
            return Err(Error::AddressInUse);
        }
        self.connected.insert(key, h);
        let local_cid =
            if addr.cid == VMADDR_CID_LOCAL { VMADDR_CID_LOCAL } else { self.local_cid };
        self.conn_mut(h).start_connect(addr, local_cid, now);
        self.timers.push(h);
        self.enqueue_tx(h);
        Ok(())
    }

    /// The outcome of `connect`: `Ok` once established, `WouldBlock` while
    /// the handshake runs, the failure once (connection-reset, timed-out).
    pub fn finish_connect(&mut self, h: SocketHandle) -> Result<()> {
        match self.app_mut(h)? {
            Socket::Connection(c) => c.finish_connect(),
            Socket::Datagram(_) => Err(Error::NotConnected),
        }
    }

    /// The stream part of [`Stack::send`].
    pub(super) fn send_stream(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize> {
        let n = self.app_conn(h)?.send(data)?;
        if n > 0 {
            self.enqueue_tx(h);
        }
        Ok(n)
    }

    /// Sends on a stream by lending `fill` the socket's buffer space for up
    /// to [`Self::send_space`] bytes, as at most two slices; `fill` writes
    /// the bytes to send at their start and returns how many. This is how a
    /// relay reads from its source straight into the stack (no bounce
    /// buffer). If `fill` fails, nothing is sent and the call returns
    /// [`Error::Fault`]; the caller keeps its own error.
    pub fn send_with<E>(
        &mut self,
        h: SocketHandle,
        fill: impl FnOnce(&mut [u8], &mut [u8]) -> core::result::Result<usize, E>,
    ) -> Result<usize> {
        let n = self.app_conn(h)?.send_with(fill)?;
        if n > 0 {
            self.enqueue_tx(h);
        }
        Ok(n)
    }

    /// Bytes `send` would take now on a stream: the peer's credit less what
    /// is already queued. Lets a relay read exactly that much from its
    /// source, so nothing has to be read twice or held back. Fails as
    /// `send` would (broken-pipe, not-connected, ...).
    pub fn send_space(&mut self, h: SocketHandle) -> Result<usize> {
        self.app_conn(h)?.send_space()
    }

    /// Queues one whole seqpacket message, or nothing.
    pub fn send_message(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        end_of_record: bool,
    ) -> Result<()> {
        if self.app_conn(h)?.send_message(data, end_of_record)? {
            self.enqueue_tx(h);
        }
        Ok(())
    }

    /// Ends one or both directions (sticky). The peer hears it as SHUTDOWN
    /// once queued data has gone out.
    pub fn shutdown(&mut self, h: SocketHandle, how: Shutdown) -> Result<()> {
        let tell_peer = match self.app_mut(h)? {
            Socket::Connection(c) => c.shutdown(how.flags())?,
            Socket::Datagram(d) => d.shutdown(how.flags())?,
        };
        if tell_peer {
            self.enqueue_tx(h);
        }
        self.note(h, Wake::Both);
        Ok(())
    }

    /// The application (or its listener's close) let go of connection `h`.
    pub(super) fn close_owned(&mut self, h: SocketHandle, now: Instant) {
        let close_timeout = self.config.close_timeout;
        let s = self.conn_mut(h);
        if s.awaiting_confirmation {
            self.socket_rst(h, RstReason::Refused);
            self.free(h);
            return;
        }
        match s.state {
            State::Connected if s.conn.peer_shutdown == shutdown_flags::BOTH => {
                self.socket_rst(h, RstReason::CloseAfterPeerShutdown);
                self.free(h);
            }
            State::Connected => {
                s.conn.local_shutdown = shutdown_flags::BOTH;
                s.state = State::Closing;
                s.deadline = Some(now + close_timeout);
                self.timers.push(h);
                self.enqueue_tx(h);
            }
            State::Disconnected if !s.conn.finished => {
                self.socket_rst(h, RstReason::CloseAfterPeerShutdown);
                self.free(h);
            }
            State::Unconnected
            | State::Listening
            | State::Connecting
            | State::Disconnected
            | State::Closing => self.free(h),
        }
    }

    pub(super) fn on_connection_packet(
        &mut self,
        now: Instant,
        h: SocketHandle,
        hdr: &Header,
        payload: &[u8],
        tap: &mut Tap<'_>,
    ) {
        let s = self.conn_mut(h);
        if s.state == State::Connecting && s.deadline.is_some_and(|d| d <= now) {
            // The timer is due but has not been handled yet: the connect has
            // already failed, and this packet finds no socket.
            self.fail_connect(h, Error::TimedOut);
            let reason =
                if hdr.op == Op::Response { RstReason::StrayResponse } else { RstReason::NoSocket };
            self.unmatched(hdr, reason);
            return;
        }
        let window_before = s.conn.send_window(s.options.buffer_size);
        let peer_buf_alloc_before = s.conn.peer_buf_alloc;
        s.conn.update_peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
        if s.state == State::Connected
            && s.conn.peer_buf_alloc != peer_buf_alloc_before
            && s.conn.credit_update_due(s.options.buffer_size, s.options.rcvlowat, s.is_seqpacket())
        {
            // The peer's own buffer caps what it may send us; a smaller cap
            // can make credit we had not reported yet the thing it waits for.
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        let s = self.conn_mut(h);
        if s.conn.send_window(s.options.buffer_size) > window_before && s.state != State::Connecting
        {
            if s.wants_tx() {
                self.enqueue_tx(h);
            }
            self.note(h, Wake::Writable);
        }
        let s = self.conn_mut(h);
        match s.state {
            State::Connecting => match hdr.op {
                Op::Response => {
                    s.state = State::Connected;
                    s.deadline = None;
                    let more = s.wants_tx();
                    self.stats.connections_established += 1;
                    if more {
                        self.enqueue_tx(h);
                    }
                    self.note(h, Wake::Writable);
                }
                Op::Rst => self.fail_connect(h, Error::ConnectionReset),
                Op::Invalid => self.stats.count_drop(DropReason::Ignored),
                _ => {
                    self.reply_rst(&hdr.to_raw(), RstReason::ProtocolViolation);
                    self.fail_connect(h, Error::Protocol);
                }
            },
            State::Connected => match hdr.op {
                Op::Rw => self.on_data(h, hdr, payload, tap),
                Op::CreditUpdate => {}
                Op::CreditRequest => {
                    s.conn.send_credit_update = true;
                    self.stats.credit_requests_received += 1;
                    self.enqueue_tx(h);
                }
                Op::Shutdown => self.on_peer_shutdown(h, hdr.flags),
                Op::Rst => self.on_peer_rst(h),
                Op::Request | Op::Response | Op::Invalid => {
                    self.stats.count_drop(DropReason::Ignored)
                }
            },
            State::Closing => match hdr.op {
                Op::Rst => self.free(h),
                Op::Shutdown => {
                    s.conn.peer_shutdown |= hdr.flags & shutdown_flags::BOTH;
                    if s.conn.peer_shutdown == shutdown_flags::BOTH {
                        self.socket_rst(h, RstReason::CloseAfterPeerShutdown);
                        self.free(h);
                    }
                }
                Op::CreditRequest => {
                    s.conn.send_credit_update = true;
                    self.stats.credit_requests_received += 1;
                    self.enqueue_tx(h);
                }
                Op::CreditUpdate => {}
                Op::Rw | Op::Request | Op::Response | Op::Invalid => {
                    self.stats.count_drop(DropReason::SocketClosing)
                }
            },
            State::Unconnected | State::Listening | State::Disconnected => {
                self.stats.count_drop(DropReason::Ignored)
            }
        }
    }

    pub(super) fn on_data(
        &mut self,
        h: SocketHandle,
        hdr: &Header,
        payload: &[u8],
        tap: &mut Tap<'_>,
    ) {
        let s = self.conn_mut(h);
        let c = &mut s.conn;
        if c.local_shutdown & shutdown_flags::RCV != 0 {
            self.stats.count_drop(DropReason::AfterShutdown);
            return;
        }
        if c.rx.len() + payload.len() > c.rx_limit as usize {
            self.abort(h, RstReason::CreditOverrun);
            return;
        }
        let seqpacket = s.ty == SocketType::SeqPacket;
        let mut payload = payload;
        // Only with nothing buffered, so bytes keep their order.
        if let Some(tap) = tap
            && !seqpacket
            && c.rx.is_empty()
            && !payload.is_empty()
        {
            let taken = tap.deliver(h, payload).min(payload.len());
            if taken > 0 {
                self.stats.rx_bytes_delivered_directly += taken as u64;
                if self.conn_mut(h).consumed(taken) {
                    self.enqueue_tx(h);
                }
                payload = &payload[taken..];
                if payload.is_empty() {
                    return;
                }
            }
        }
        let s = self.conn_mut(h);
        let c = &mut s.conn;
        let end_of_message = seqpacket && hdr.flags & seq_flags::EOM != 0;
        if end_of_message && c.rx_messages.len() >= Connection::rx_message_limit(c.rx_limit) {
            self.abort(h, RstReason::MessageQueueOverflow);
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
        let ready = s.readiness().contains(Readiness::READABLE);
        if ready {
            self.note(h, Wake::Readable);
        }
    }

    pub(super) fn on_peer_shutdown(&mut self, h: SocketHandle, flags: u32) {
        let s = self.conn_mut(h);
        s.conn.peer_shutdown |= flags & shutdown_flags::BOTH;
        if s.conn.peer_shutdown & shutdown_flags::SEND != 0 {
            s.conn.peer_done = true;
        }
        if s.conn.peer_shutdown == shutdown_flags::BOTH {
            // Both ways done. With nothing left to read the connection ends
            // here with our RST; otherwise it leaves the tables now (so the
            // peer can reuse its port) and the RST waits for our close.
            if s.readable_bytes() == 0 {
                self.socket_rst(h, RstReason::PeerShutdown);
            }
            self.disconnect(h, None);
        } else {
            self.note(h, Wake::Both);
        }
    }

    /// As in Linux (`virtio_transport_do_close`), an RST on an established
    /// connection reads as a full shutdown by the peer: queued data stays
    /// readable, then EOF; sends fail with EPIPE. No error is raised.
    pub(super) fn on_peer_rst(&mut self, h: SocketHandle) {
        let s = self.conn_mut(h);
        s.conn.finished = true;
        s.conn.peer_shutdown = shutdown_flags::BOTH;
        self.disconnect(h, None);
    }

    /// We end the connection with an RST: the peer broke a rule, or its
    /// listener went away.
    pub(super) fn abort(&mut self, h: SocketHandle, reason: RstReason) {
        self.socket_rst(h, reason);
        self.disconnect(h, Some(Error::ConnectionReset));
    }

    /// The connection is over; the socket stays for its owner to read what
    /// is queued, or goes if nobody owns it.
    pub(super) fn disconnect(&mut self, h: SocketHandle, error: Option<Error>) {
        let s = self.conn_mut(h);
        let c = &mut s.conn;
        c.peer_done = true;
        c.tx.release();
        c.tx_messages.clear();
        c.tx_head_sent = 0;
        c.send_request = false;
        c.send_response = false;
        c.send_credit_update = false;
        if error.is_some() {
            s.error = error;
        }
        s.state = State::Disconnected;
        s.deadline = None;
        let orphan = s.parent.is_none() && !self.sockets[h].app_owned;
        self.detach(h);
        if orphan {
            self.free(h);
        } else {
            self.note(h, Wake::Both);
        }
    }

    pub(super) fn fail_connect(&mut self, h: SocketHandle, error: Error) {
        self.detach_connection(h);
        let s = self.conn_mut(h);
        s.state = State::Unconnected;
        s.error = Some(error);
        s.deadline = None;
        s.conn = Connection::default();
        self.note(h, Wake::Both);
    }
}
