//! Stream and seqpacket sockets: their calls, and the connection state
//! machine that handles their packets.
//!
//! A connection goes Unconnected → Connecting (REQUEST sent) → Connected
//! → Closing (SHUTDOWN sent after queued data) or Disconnected (the peer
//! shut down or reset, the application still reads what is queued).

use super::endpoint::ConnKey;
use super::receive::Tap;
use super::wakes::Wake;
use super::{RecvInfo, Stack};
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::readiness::Readiness;
use crate::socket::{Connection, Message, Socket, SocketHandle, State};
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
        let s = self.app_mut(h)?;
        if !s.awaiting_confirmation {
            return Err(Error::InvalidArgument);
        }
        s.awaiting_confirmation = false;
        s.deadline = None;
        s.conn.send_response = true;
        self.enqueue_tx(h);
        Ok(())
    }

    /// Refuses a connection accepted from a catch-all listener: RST, and
    /// the handle is closed.
    pub fn refuse(&mut self, h: SocketHandle) -> Result<()> {
        let s = self.app_mut(h)?;
        if !s.awaiting_confirmation {
            return Err(Error::InvalidArgument);
        }
        self.socket_rst(h, RstReason::Refused);
        self.free(h);
        Ok(())
    }

    /// Starts connecting; [`Stack::finish_connect`] reports how it ended.
    ///
    /// For a datagram socket this only sets the default destination.
    pub fn connect(&mut self, h: SocketHandle, addr: VsockAddr, now: Instant) -> Result<()> {
        let s = self.app(h)?;
        if addr.port == VMADDR_PORT_ANY || (addr.cid == VMADDR_CID_ANY && s.ty.is_connectible()) {
            return Err(Error::InvalidArgument);
        }
        if s.ty == SocketType::Datagram {
            self.autobind(h)?;
            self.sockets[h].peer = Some(addr);
            return Ok(());
        }
        match s.state {
            State::Unconnected => {}
            State::Listening => return Err(Error::InvalidArgument),
            State::Connecting => return Err(Error::Already),
            State::Connected | State::Closing | State::Disconnected => {
                return Err(Error::IsConnected);
            }
        }
        self.autobind(h)?;
        let local_port = self.sockets[h].local.expect("bound").port;
        let key = ConnKey::new(local_port, addr);
        if self.connected.contains_key(&key) {
            return Err(Error::AddressInUse);
        }
        self.connected.insert(key, h);
        let local_cid =
            if addr.cid == VMADDR_CID_LOCAL { VMADDR_CID_LOCAL } else { self.local_cid };
        let s = &mut self.sockets[h];
        s.state = State::Connecting;
        s.peer = Some(addr);
        s.local_cid = local_cid;
        s.error = None;
        s.conn =
            Connection { rx_limit: s.buffer_size, send_request: true, ..Connection::default() };
        s.deadline = Some(now + s.connect_timeout);
        self.timers.push(h);
        self.enqueue_tx(h);
        Ok(())
    }

    /// The outcome of `connect`: `Ok` once established, `WouldBlock` while
    /// the handshake runs, the failure once (connection-reset, timed-out).
    pub fn finish_connect(&mut self, h: SocketHandle) -> Result<()> {
        let s = self.app_mut(h)?;
        match s.state {
            State::Connected | State::Closing | State::Disconnected => Ok(()),
            State::Connecting => Err(Error::WouldBlock),
            State::Listening => Err(Error::InvalidArgument),
            State::Unconnected => Err(s.error.take().unwrap_or(Error::NotConnected)),
        }
    }

    /// The stream part of [`Stack::send`].
    pub(super) fn send_stream(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize> {
        let s = self.app_mut(h)?;
        check_sendable(s)?;
        if data.is_empty() {
            return Ok(0);
        }
        let space = s.conn.send_space(s.buffer_size);
        if space == 0 {
            return Err(Error::WouldBlock);
        }
        let n = space.min(data.len());
        s.conn.tx.push(&data[..n]);
        self.enqueue_tx(h);
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
        let s = self.app_mut(h)?;
        if s.ty != SocketType::Stream {
            return Err(Error::NotSupported);
        }
        check_sendable(s)?;
        let space = s.conn.send_space(s.buffer_size);
        if space == 0 {
            return Err(Error::WouldBlock);
        }
        let n = s.conn.tx.fill_with(space, fill).map_err(|_| Error::Fault)?;
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
        let s = self.app_mut(h)?;
        if s.ty != SocketType::Stream {
            return Err(Error::NotSupported);
        }
        check_sendable(s)?;
        Ok(s.conn.send_space(s.buffer_size))
    }

    /// Queues one whole seqpacket message, or nothing.
    pub fn send_message(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        end_of_record: bool,
    ) -> Result<()> {
        let s = self.app_mut(h)?;
        if s.ty != SocketType::SeqPacket {
            return Err(Error::NotSupported);
        }
        check_sendable(s)?;
        let cap = s.conn.peer_buf_alloc.min(s.buffer_size) as usize;
        if data.len() > cap {
            return Err(Error::MessageTooLarge);
        }
        if data.is_empty() {
            // Linux never transmits an empty message; neither do we.
            return Ok(());
        }
        if data.len() > s.conn.send_space(s.buffer_size)
            || s.conn.tx_messages.len() >= Connection::rx_message_limit(s.buffer_size)
        {
            return Err(Error::WouldBlock);
        }
        s.conn.tx.push(data);
        s.conn.tx_messages.push_back(Message { len: data.len() as u32, end_of_record });
        self.enqueue_tx(h);
        Ok(())
    }

    pub(super) fn recv_connected<E>(
        &mut self,
        h: SocketHandle,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        let s = self.app_mut(h)?;
        match s.state {
            State::Connected | State::Disconnected => {}
            State::Unconnected | State::Listening | State::Connecting | State::Closing => {
                return Err(Error::NotConnected);
            }
        }
        let from = s.peer;
        let eof = RecvInfo { eof: true, inq: 1, from, ..RecvInfo::default() };
        if s.conn.local_shutdown & shutdown_flags::RCV != 0 {
            return Ok(eof);
        }
        let seqpacket = s.is_seqpacket();
        let (len, end_of_record) = if seqpacket {
            match s.conn.rx_messages.front() {
                Some(m) => (m.len as usize, m.end_of_record),
                None => (0, false),
            }
        } else {
            (s.conn.rx.len(), false)
        };
        let has_data = if seqpacket { !s.conn.rx_messages.is_empty() } else { len > 0 };
        if !has_data {
            if let Some(err) = s.error.take() {
                return Err(err);
            }
            if s.at_eof() {
                return Ok(eof);
            }
            return Err(Error::WouldBlock);
        }
        let (a, b) = s.conn.rx.front(len);
        let result = copy(a, b);
        let taken = match result {
            Ok(n) => n.min(len),
            Err(_) => {
                if seqpacket && !peek {
                    self.consume_rx(h, len, true);
                }
                return Err(Error::Fault);
            }
        };
        if !peek {
            let consumed = if seqpacket { len } else { taken };
            self.consume_rx(h, consumed, seqpacket);
        }
        let s = &self.sockets[h];
        let mut inq = s.readable_bytes();
        if !seqpacket && inq == 0 && s.conn.peer_done {
            inq = 1;
        }
        Ok(RecvInfo {
            len: taken,
            message_len: if seqpacket { len } else { taken },
            truncated: taken < len && seqpacket,
            end_of_record,
            eof: false,
            inq,
            from,
        })
    }

    pub(super) fn consume_rx(&mut self, h: SocketHandle, n: usize, whole_message: bool) {
        let s = &mut self.sockets[h];
        s.conn.rx.consume(n);
        if whole_message {
            s.conn.rx_messages.pop_front();
        }
        s.conn.fwd_cnt = s.conn.fwd_cnt.wrapping_add(n as u32);
        self.credit_update_if_due(h);
    }

    /// Queues a credit update if the peer needs one now.
    pub(super) fn credit_update_if_due(&mut self, h: SocketHandle) {
        let s = &mut self.sockets[h];
        if s.state == State::Connected
            && s.conn.credit_update_due(s.buffer_size, s.rcvlowat, s.is_seqpacket())
        {
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
    }

    /// Ends one or both directions (sticky). The peer hears it as SHUTDOWN
    /// once queued data has gone out.
    pub fn shutdown(&mut self, h: SocketHandle, how: Shutdown) -> Result<()> {
        let s = self.app_mut(h)?;
        if s.ty == SocketType::Datagram {
            if s.peer.is_none() {
                return Err(Error::NotConnected);
            }
        } else if !matches!(s.state, State::Connected | State::Disconnected) {
            return Err(Error::NotConnected);
        }
        s.conn.local_shutdown |= how.flags();
        let connected = s.state == State::Connected && s.ty.is_connectible();
        if connected {
            self.enqueue_tx(h);
        }
        self.note(h, Wake::Both);
        Ok(())
    }

    pub(super) fn close_owned(&mut self, h: SocketHandle, now: Instant) {
        let s = &mut self.sockets[h];
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
                s.deadline = Some(now + self.config.close_timeout);
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
        let s = &mut self.sockets[h];
        if s.state == State::Connecting && s.deadline.is_some_and(|d| d <= now) {
            // The timer is due but has not been handled yet: the connect has
            // already failed, and this packet finds no socket.
            self.fail_connect(h, Error::TimedOut);
            let reason =
                if hdr.op == Op::Response { RstReason::StrayResponse } else { RstReason::NoSocket };
            self.unmatched(hdr, reason);
            return;
        }
        let window_before = s.conn.send_window(s.buffer_size);
        let peer_buf_alloc_before = s.conn.peer_buf_alloc;
        s.conn.update_peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
        if s.state == State::Connected
            && s.conn.peer_buf_alloc != peer_buf_alloc_before
            && s.conn.credit_update_due(s.buffer_size, s.rcvlowat, s.is_seqpacket())
        {
            // The peer's own buffer caps what it may send us; a smaller cap
            // can make credit we had not reported yet the thing it waits for.
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        let s = &mut self.sockets[h];
        if s.conn.send_window(s.buffer_size) > window_before && s.state != State::Connecting {
            if s.wants_tx() {
                self.enqueue_tx(h);
            }
            self.note(h, Wake::Writable);
        }
        let s = &mut self.sockets[h];
        match s.state {
            State::Connecting => match hdr.op {
                Op::Response => {
                    s.state = State::Connected;
                    s.deadline = None;
                    self.stats.connections_established += 1;
                    if s.wants_tx() {
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
                    self.stats.credit_requests_received += 1;
                    s.conn.send_credit_update = true;
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
                    self.stats.credit_requests_received += 1;
                    s.conn.send_credit_update = true;
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
        let s = &mut self.sockets[h];
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
                let c = &mut self.sockets[h].conn;
                c.fwd_cnt = c.fwd_cnt.wrapping_add(taken as u32);
                self.credit_update_if_due(h);
                payload = &payload[taken..];
                if payload.is_empty() {
                    return;
                }
            }
        }
        let s = &mut self.sockets[h];
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
        let s = &mut self.sockets[h];
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
        let s = &mut self.sockets[h];
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
        let s = &mut self.sockets[h];
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
        let orphan = !s.app_owned && s.parent.is_none();
        self.detach(h);
        if orphan {
            self.free(h);
        } else {
            self.note(h, Wake::Both);
        }
    }

    pub(super) fn fail_connect(&mut self, h: SocketHandle, error: Error) {
        self.detach_connection(h);
        let s = &mut self.sockets[h];
        s.state = State::Unconnected;
        s.error = Some(error);
        s.deadline = None;
        s.conn = Connection::default();
        self.note(h, Wake::Both);
    }
}

/// The checks of Linux's `vsock_connectible_sendmsg`, in its order: a
/// pending error, then EPIPE (ours or the peer's shutdown), then ENOTCONN.
pub(super) fn check_sendable(s: &mut Socket) -> Result<()> {
    if s.state == State::Disconnected
        && let Some(err) = s.error.take()
    {
        return Err(err);
    }
    let c = &s.conn;
    if c.local_shutdown & shutdown_flags::SEND != 0 || c.peer_shutdown & shutdown_flags::RCV != 0 {
        return Err(Error::BrokenPipe);
    }
    match s.state {
        State::Connected if s.awaiting_confirmation => Err(Error::NotConnected),
        State::Connected => Ok(()),
        State::Disconnected => Err(Error::BrokenPipe),
        State::Unconnected | State::Listening | State::Connecting | State::Closing => {
            Err(Error::NotConnected)
        }
    }
}
