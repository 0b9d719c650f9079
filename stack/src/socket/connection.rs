//! A stream or seqpacket socket: its connection, its listener queue, and
//! the packets it owes the peer.
//!
//! Credit (virtio spec §5.10.6.3) in one paragraph: each side advertises
//! `buf_alloc`, the size of its receive buffer, and `fwd_cnt`, how many
//! payload bytes its application has consumed. Both count bytes with
//! free-running `u32`s that wrap. A sender may have at most
//! `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)` bytes outstanding. We also cap
//! that at our own `buf_alloc`, as Linux does, so a peer with a huge buffer
//! cannot make us queue unbounded data.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::rx_queue::RxQueue;
use super::{HeldBuffers, Options, RecvInfo, SocketHandle};
use crate::addr::VsockAddr;
use crate::error::{Error, Result};
use crate::readiness::Readiness;
use crate::ring::ByteRing;
use crate::time::Instant;
use crate::wire::{Header, MAX_PAYLOAD, SocketType, shutdown_flags};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Created, maybe bound; not connected, not listening.
    Unconnected,
    Listening,
    /// REQUEST sent (or about to be); waiting for RESPONSE until the deadline.
    Connecting,
    Connected,
    /// The application closed an established connection. SHUTDOWN goes out
    /// after any queued data; the socket waits for the peer's RST until the
    /// close deadline, then sends its own.
    Closing,
    /// The connection is over (reset, or both sides shut down) but the
    /// application still holds the socket and may read what is queued.
    Disconnected,
}

/// Bookkeeping for one seqpacket message in a buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Message {
    pub len: u32,
    pub end_of_record: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Connection {
    /// SHUTDOWN flags we have set (sticky).
    pub local_shutdown: u32,
    /// SHUTDOWN flags the peer has sent (sticky).
    pub peer_shutdown: u32,
    /// SHUTDOWN flags already on the wire.
    pub shutdown_sent: u32,

    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: u32,
    /// Payload bytes handed to the transport.
    pub tx_cnt: u32,
    /// Payload bytes our application has consumed.
    pub fwd_cnt: u32,
    /// The `fwd_cnt` the peer last heard from us.
    pub last_fwd_cnt_sent: u32,
    /// Most the peer may have queued with us: the largest `buf_alloc` we
    /// ever advertised on this connection, since a shrink only takes effect
    /// once the peer has seen it.
    pub rx_limit: u32,

    /// Received bytes the application has not read (some perhaps still in
    /// the driver's buffers).
    pub rx: RxQueue,
    /// Complete seqpacket messages in `rx`, oldest first.
    pub rx_messages: VecDeque<Message>,
    /// Bytes at the tail of `rx` that belong to a message still arriving.
    pub rx_partial: u32,

    /// Accepted bytes not yet handed to the transport.
    pub tx: ByteRing,
    /// Seqpacket messages in `tx`; the first may be partly sent.
    pub tx_messages: VecDeque<Message>,
    /// Bytes of the first message in `tx_messages` already sent.
    pub tx_head_sent: u32,

    pub send_request: bool,
    pub send_response: bool,
    pub send_credit_update: bool,
    /// The application has read everything queued since the last credit
    /// update was owed: it keeps up, and waits for the peer.
    pub reader_drained: bool,
    /// The peer will send nothing more: it shut down SEND, or reset.
    pub peer_done: bool,
    /// The peer ended both directions (SHUTDOWN of both, or RST) while
    /// data was still queued. Linux then leaves the connection ESTABLISHED
    /// (`virtio_transport_do_close`), so it stays writable only while the
    /// peer's last credit has room; without queued data it moves to
    /// TCP_CLOSING, writable whatever the credit.
    pub still_established: bool,
    /// RST has been sent or received: no packet for this connection may follow.
    pub finished: bool,
    /// The peer ended the connection with an RST rather than SHUTDOWN.
    /// Linux's reads show both as end-of-file; an API that reports how the
    /// peer ended (vsock:sockets@0.2.0's receive future) tells them apart
    /// by this.
    pub peer_reset: bool,
}

impl Connection {
    /// Bytes the peer can still take, by the credit rules.
    pub fn send_window(&self, own_buf_alloc: u32) -> u32 {
        let cap = self.peer_buf_alloc.min(own_buf_alloc);
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        cap.saturating_sub(in_flight)
    }

    /// Bytes `send` may still accept: the window less what is queued.
    pub fn send_space(&self, own_buf_alloc: u32) -> usize {
        (self.send_window(own_buf_alloc) as usize).saturating_sub(self.tx.len())
    }

    /// Takes credit from a header. Every packet of a connection carries
    /// valid credit, whatever its op, so this runs for every header, not
    /// only RW and CREDIT_UPDATE (`docs/linux-behaviours.md#credit-from-every-header`).
    pub fn update_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
    }

    /// Decides whether the peer must hear our `fwd_cnt` now rather than on
    /// the next packet we happen to send.
    ///
    /// The peer may send at most `min(our buf_alloc, its own buf_alloc)`
    /// beyond what it thinks we consumed; its own `buf_alloc` is in every
    /// header it sends, so we know that cap too. By its count it can still
    /// send `cap - queued - unreported`. An update is due when that drops
    /// below `threshold` (it is about to stall), or when what is queued plus
    /// what it could still send is below the reader's low-water mark (the
    /// reader would wait for bytes the peer is not allowed to send).
    pub fn credit_update_due(&self, buf_alloc: u32, rcvlowat: u32, seqpacket: bool) -> bool {
        let unreported = self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent);
        if unreported == 0 {
            return false;
        }
        if seqpacket {
            // A message must fit whole, so any stale credit can stall the peer.
            return true;
        }
        let cap = buf_alloc.min(self.peer_buf_alloc) as u64;
        let queued = self.rx.len() as u64;
        let peer_view_free = cap.saturating_sub(queued + unreported as u64);
        let threshold = (MAX_PAYLOAD as u64).min(cap / 2);
        peer_view_free < threshold || queued + peer_view_free < rcvlowat as u64
    }

    /// Most seqpacket messages a queue of `rx_limit` bytes keeps track of, so
    /// empty messages cannot grow the bookkeeping without bound.
    pub fn rx_message_limit(rx_limit: u32) -> usize {
        (rx_limit as usize / 16).max(1024)
    }
}

/// What a listening socket keeps.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    /// Most connections waiting in `queue` (Linux's `sk_max_ack_backlog`).
    pub backlog: usize,
    /// A listener that takes connection requests for every port no other
    /// listener holds (see `Stack::listen_catch_all`).
    pub catch_all: bool,
    /// Established connections not yet accepted, oldest first.
    pub queue: VecDeque<SocketHandle>,
}

/// A stream or seqpacket socket.
#[derive(Debug)]
pub(crate) struct ConnectionSocket {
    /// `Stream` or `SeqPacket`.
    pub ty: SocketType,
    pub state: State,
    /// The bound address; the CID may be `VMADDR_CID_ANY`.
    pub local: Option<VsockAddr>,
    /// The connected peer.
    pub peer: Option<VsockAddr>,
    /// The CID this connection uses as its source (our CID, or CID 1).
    pub local_cid: u32,
    pub conn: Connection,
    pub listener: Listener,
    /// A connection from a catch-all listener that has not been answered:
    /// the application decides with `confirm` or `refuse`.
    pub awaiting_confirmation: bool,
    /// The listener whose accept queue holds this socket.
    pub parent: Option<SocketHandle>,
    /// An error reported by the next call (SO_ERROR).
    pub error: Option<Error>,
    /// When the connect or close in progress gives up.
    pub deadline: Option<Instant>,
    pub options: Options,
}

impl ConnectionSocket {
    /// A new, unbound, unconnected socket of type `ty` (stream or seqpacket).
    pub fn new(ty: SocketType, options: Options) -> Self {
        Self {
            ty,
            state: State::Unconnected,
            local: None,
            peer: None,
            local_cid: 0,
            conn: Connection::default(),
            listener: Listener::default(),
            awaiting_confirmation: false,
            parent: None,
            error: None,
            deadline: None,
            options,
        }
    }

    /// The connection a listener accepts for the REQUEST `hdr`: established
    /// at once with the listener's options and owing a RESPONSE; or, from a
    /// catch-all listener, waiting for the application to confirm or refuse
    /// it before the connect timeout.
    pub fn accepted(
        listener: &ConnectionSocket,
        parent: SocketHandle,
        hdr: &Header,
        now: Instant,
    ) -> Self {
        let options = listener.options;
        let catch_all = listener.listener.catch_all;
        let mut child = Self::new(listener.ty, options);
        child.state = State::Connected;
        child.parent = Some(parent);
        child.local = Some(VsockAddr::new(hdr.dst_cid as u32, hdr.dst_port));
        child.local_cid = hdr.dst_cid as u32;
        child.peer = Some(VsockAddr::new(hdr.src_cid as u32, hdr.src_port));
        child.conn = Connection {
            rx_limit: options.buffer_size,
            peer_buf_alloc: hdr.buf_alloc,
            peer_fwd_cnt: hdr.fwd_cnt,
            send_response: !catch_all,
            ..Connection::default()
        };
        if catch_all {
            child.awaiting_confirmation = true;
            child.deadline = Some(now + options.connect_timeout);
        }
        child
    }

    pub fn is_seqpacket(&self) -> bool {
        self.ty == SocketType::SeqPacket
    }

    /// The peer will send nothing more and everything it sent was read.
    pub fn at_eof(&self) -> bool {
        let c = &self.conn;
        let drained = if self.is_seqpacket() { c.rx_messages.is_empty() } else { c.rx.is_empty() };
        drained && (c.peer_done || c.local_shutdown & shutdown_flags::RCV != 0)
    }

    /// Bytes a receive can return now.
    pub fn readable_bytes(&self) -> usize {
        if self.is_seqpacket() {
            self.conn.rx.len() - self.conn.rx_partial as usize
        } else {
            self.conn.rx.len()
        }
    }

    /// What the socket is ready for, exactly as Linux's `vsock_poll`
    /// reports it (`docs/linux-behaviours.md#readiness`, held to it by
    /// `stack/tests/readiness.rs`): one rule per flag, from the state, our
    /// shutdown, the peer's shutdown and a pending error. A call that can
    /// only fail does not make the socket ready (no WRITABLE once shut for
    /// sending); [`Self::unblocked`] adds those for adapters that need it.
    pub fn readiness(&self) -> Readiness {
        let mut r = Readiness::EMPTY;
        // A pending error adds ERROR and nothing else: IN and OUT come only
        // from their own rules.
        if self.error.is_some() {
            r |= Readiness::ERROR;
        }
        let c = &self.conn;
        let recv_shut = c.local_shutdown & shutdown_flags::RCV != 0;
        let send_shut = c.local_shutdown & shutdown_flags::SEND != 0;
        let peer_send_shut = c.peer_shutdown & shutdown_flags::SEND != 0;
        if c.local_shutdown == shutdown_flags::BOTH || (send_shut && peer_send_shut) {
            r |= Readiness::HANGUP;
        }
        // Either side ended our read direction: a receive returns EOF at once.
        if recv_shut || peer_send_shut {
            r |= Readiness::READ_CLOSED | Readiness::READABLE;
        }
        match self.state {
            // Linux's TCP_CLOSE (fresh, or a connect that failed).
            State::Unconnected if !send_shut => r |= Readiness::WRITABLE,
            State::Unconnected | State::Connecting | State::Closing => {}
            State::Listening => {
                if !self.listener.queue.is_empty() {
                    r |= Readiness::READABLE;
                }
            }
            State::Connected | State::Disconnected => {
                let data_ready = if self.is_seqpacket() {
                    !c.rx_messages.is_empty()
                } else {
                    c.rx.len() >= self.options.rcvlowat.max(1) as usize
                };
                if data_ready {
                    r |= Readiness::READABLE;
                }
                // ESTABLISHED is writable while the peer's credit has room;
                // a connection Linux has moved to TCP_CLOSING or TCP_CLOSE
                // is writable whatever the credit. Neither after SHUT_WR.
                let established = self.state == State::Connected || c.still_established;
                if !send_shut && (!established || c.send_space(self.send_cap()) > 0) {
                    r |= Readiness::WRITABLE;
                }
            }
        }
        r
    }

    /// [`Self::readiness`] plus the calls that would return at once only to
    /// fail or to report the end: READABLE when a receive would return EOF
    /// or an error, WRITABLE when a send would fail. A waiter that must
    /// wake whenever its call would not block (a `wasi:io` pollable, a
    /// runtime's reactor) waits for this rather than for Linux's mask. A
    /// connect under way adds nothing (its caller waits for the outcome),
    /// nor does a listener (its one call that waits is accept).
    pub fn unblocked(&self) -> Readiness {
        let mut r = self.readiness();
        match self.state {
            State::Connecting | State::Listening => {}
            State::Unconnected | State::Closing => r |= Readiness::READABLE | Readiness::WRITABLE,
            State::Connected | State::Disconnected => {
                if self.error.is_some() || self.at_eof() {
                    r |= Readiness::READABLE;
                }
                if self.error.is_some() || self.send_refusal().is_some() {
                    r |= Readiness::WRITABLE;
                }
            }
        }
        r
    }

    /// Whether the socket has a packet to hand to the transport now.
    pub fn wants_tx(&self) -> bool {
        let c = &self.conn;
        if c.finished {
            return false;
        }
        c.send_request
            || c.send_response
            || c.send_credit_update
            || (matches!(self.state, State::Connected | State::Closing)
                && ((!c.tx.is_empty() && c.send_window(self.send_cap()) > 0)
                    || (c.tx.is_empty() && c.local_shutdown & !c.shutdown_sent != 0)))
    }

    /// The checks of Linux's `vsock_connectible_sendmsg`, in its order: a
    /// pending error, then EPIPE (ours or the peer's shutdown), then ENOTCONN.
    pub fn check_sendable(&mut self) -> Result<()> {
        if self.state == State::Disconnected
            && let Some(err) = self.error.take()
        {
            return Err(err);
        }
        self.send_refusal().map_or(Ok(()), Err)
    }

    /// Why a send fails at once, short of a pending error: EPIPE after our
    /// SHUT_WR or the peer's SHUT_RD, or once the connection is over;
    /// ENOTCONN on a socket that is not connected.
    fn send_refusal(&self) -> Option<Error> {
        let c = &self.conn;
        if c.local_shutdown & shutdown_flags::SEND != 0
            || c.peer_shutdown & shutdown_flags::RCV != 0
        {
            return Some(Error::BrokenPipe);
        }
        match self.state {
            State::Connected if self.awaiting_confirmation => Some(Error::NotConnected),
            State::Connected => None,
            State::Disconnected => Some(Error::BrokenPipe),
            State::Unconnected | State::Listening | State::Connecting | State::Closing => {
                Some(Error::NotConnected)
            }
        }
    }

    // ----- calls ----------------------------------------------------------

    /// `finish_connect`: `Ok` once established, would-block while the
    /// handshake runs, the failure once.
    pub fn finish_connect(&mut self) -> Result<()> {
        match self.state {
            State::Connected | State::Closing | State::Disconnected => Ok(()),
            State::Connecting => Err(Error::WouldBlock),
            State::Listening => Err(Error::InvalidArgument),
            State::Unconnected => Err(self.error.take().unwrap_or(Error::NotConnected)),
        }
    }

    /// Queues stream bytes up to the send space; returns how many.
    pub fn send(&mut self, data: &[u8]) -> Result<usize> {
        self.check_sendable()?;
        if data.is_empty() {
            return Ok(0);
        }
        let space = self.conn.send_space(self.send_cap());
        if space == 0 {
            return Err(Error::WouldBlock);
        }
        let n = space.min(data.len());
        self.conn.tx.push(&data[..n]);
        Ok(n)
    }

    /// Lends `fill` the send space of a stream (see `Stack::send_with`).
    pub fn send_with<E>(
        &mut self,
        fill: impl FnOnce(&mut [u8], &mut [u8]) -> core::result::Result<usize, E>,
    ) -> Result<usize> {
        let space = self.send_space()?;
        if space == 0 {
            return Err(Error::WouldBlock);
        }
        self.conn.tx.fill_with(space, fill).map_err(|_| Error::Fault)
    }

    /// Whether new stream bytes may go to the transport at once, without
    /// passing through the send buffer: nothing is queued that must leave
    /// before them (bytes, the handshake's packets, a SHUTDOWN owed). A
    /// credit update owed may be outrun: the data packet carries the same
    /// credit.
    pub fn can_send_in_place(&self) -> bool {
        let c = &self.conn;
        self.state == State::Connected
            && !c.finished
            && !c.send_request
            && !c.send_response
            && c.tx.is_empty()
            && c.local_shutdown & !c.shutdown_sent == 0
    }

    /// Bytes a stream send would take now, or why it would fail.
    pub fn send_space(&mut self) -> Result<usize> {
        if self.ty != SocketType::Stream {
            return Err(Error::NotSupported);
        }
        self.check_sendable()?;
        Ok(self.conn.send_space(self.send_cap()))
    }

    /// Queues one whole seqpacket message, or nothing; returns whether a
    /// message was queued (an empty one never is: Linux sends none).
    pub fn send_message(&mut self, data: &[u8], end_of_record: bool) -> Result<bool> {
        if self.ty != SocketType::SeqPacket {
            return Err(Error::NotSupported);
        }
        self.check_sendable()?;
        let buffer_size = self.options.buffer_size;
        let c = &mut self.conn;
        let cap = c.peer_buf_alloc.min(buffer_size) as usize;
        if data.len() > cap {
            return Err(Error::MessageTooLarge);
        }
        if data.is_empty() {
            return Ok(false);
        }
        if data.len() > c.send_space(buffer_size)
            || c.tx_messages.len() >= Connection::rx_message_limit(buffer_size)
        {
            return Err(Error::WouldBlock);
        }
        c.tx.push(data);
        c.tx_messages.push_back(Message { len: data.len() as u32, end_of_record });
        Ok(true)
    }

    /// Receives by lending the queued bytes to `copy` (see
    /// `Stack::recv_with`). Also returns whether consuming made a credit
    /// update due, which the caller must send; that can happen even when
    /// the receive fails (a faulted message is still consumed). Held
    /// payloads are read from `held` and, once read, their buffers go to
    /// `released`.
    pub fn recv_with<E>(
        &mut self,
        peek: bool,
        held: Option<&dyn HeldBuffers>,
        released: &mut Vec<u16>,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> (Result<RecvInfo>, bool) {
        match self.state {
            State::Connected | State::Disconnected => {}
            State::Unconnected | State::Listening | State::Connecting | State::Closing => {
                return (Err(Error::NotConnected), false);
            }
        }
        let from = self.peer;
        let eof = RecvInfo { eof: true, inq: 1, from, ..RecvInfo::default() };
        if self.conn.local_shutdown & shutdown_flags::RCV != 0 {
            return (Ok(eof), false);
        }
        let seqpacket = self.is_seqpacket();
        let (len, end_of_record) = if seqpacket {
            match self.conn.rx_messages.front() {
                Some(m) => (m.len as usize, m.end_of_record),
                None => (0, false),
            }
        } else {
            (self.conn.rx.len(), false)
        };
        let has_data = if seqpacket { !self.conn.rx_messages.is_empty() } else { len > 0 };
        if !has_data {
            if let Some(err) = self.error.take() {
                return (Err(err), false);
            }
            if self.at_eof() {
                return (Ok(eof), false);
            }
            return (Err(Error::WouldBlock), false);
        }
        let (a, b) = self.conn.rx.front(len, held);
        let offered = a.len() + b.len();
        let taken = match copy(a, b) {
            Ok(n) => n.min(offered),
            Err(_) => {
                let owed = seqpacket && !peek && self.consume(len, true, released);
                return (Err(Error::Fault), owed);
            }
        };
        let owed = !peek && self.consume(if seqpacket { len } else { taken }, seqpacket, released);
        let mut inq = self.readable_bytes();
        if !seqpacket && inq == 0 && self.conn.peer_done {
            inq = 1;
        }
        let info = RecvInfo {
            len: taken,
            message_len: if seqpacket { len } else { taken },
            truncated: taken < len && seqpacket,
            end_of_record,
            eof: false,
            inq,
            from,
        };
        (Ok(info), owed)
    }

    /// The application consumed `n` bytes (a whole message if
    /// `whole_message`); returns whether a credit update is now owed.
    fn consume(&mut self, n: usize, whole_message: bool, released: &mut Vec<u16>) -> bool {
        self.conn.rx.consume(n, released);
        if whole_message {
            self.conn.rx_messages.pop_front();
        }
        self.consumed(n)
    }

    /// `n` received bytes count as read: `fwd_cnt` moves on. Returns
    /// whether the peer must hear of it now (a credit update is owed).
    pub fn consumed(&mut self, n: usize) -> bool {
        self.conn.fwd_cnt = self.conn.fwd_cnt.wrapping_add(n as u32);
        if self.conn.rx.is_empty() {
            self.conn.reader_drained = true;
        }
        self.credit_update_if_due()
    }

    /// Owes a credit update if the peer needs one now; returns whether it does.
    pub fn credit_update_if_due(&mut self) -> bool {
        let due = self.state == State::Connected
            && self.conn.credit_update_due(
                self.options.buffer_size,
                self.options.rcvlowat,
                self.is_seqpacket(),
            );
        if due {
            self.autotune_buffer();
            self.conn.send_credit_update = true;
        }
        due
    }

    /// Grows a stream's buffer (doubling it, up to the autotuning limit)
    /// when a credit update is owed and the application has emptied the
    /// queue since the last one: it keeps up, so the peer, about to stall,
    /// was held back by the buffer, not by the reader. The update about to
    /// go out carries the new size. A reader that falls behind always
    /// leaves bytes queued and keeps the buffer where it is, so only a
    /// connection that drains what it gets holds more.
    fn autotune_buffer(&mut self) {
        let drained = core::mem::take(&mut self.conn.reader_drained);
        let limit = self.options.autotune_max;
        if self.ty != SocketType::Stream || self.options.buffer_size >= limit || !drained {
            return;
        }
        self.options.buffer_size = self.options.buffer_size.saturating_mul(2).min(limit);
        self.conn.rx_limit = self.conn.rx_limit.max(self.options.buffer_size);
        net_debug!(
            "stream buffer grown to {} bytes (cid {})",
            self.options.buffer_size,
            self.local_cid
        );
    }

    /// What caps this connection's send window on its own side
    /// ([`Options::send_cap`] for a stream; a seqpacket socket's messages
    /// are bounded by its buffer size, as Linux bounds them).
    pub fn send_cap(&self) -> u32 {
        if self.ty == SocketType::Stream {
            self.options.send_cap()
        } else {
            self.options.buffer_size
        }
    }

    /// Ends directions of the connection (sticky). Returns whether the
    /// peer must be told (a SHUTDOWN is owed).
    pub fn shutdown(&mut self, flags: u32) -> Result<bool> {
        if !matches!(self.state, State::Connected | State::Disconnected) {
            return Err(Error::NotConnected);
        }
        self.conn.local_shutdown |= flags;
        Ok(self.state == State::Connected)
    }

    /// SO_VM_SOCKETS_BUFFER_SIZE: the new size takes effect at once, and
    /// the peer of an established connection hears it (returns whether a
    /// credit update is owed).
    pub fn set_buffer_size(&mut self, size: u32) -> bool {
        self.options.buffer_size = size;
        self.options.autotune_max = 0;
        self.conn.rx_limit = self.conn.rx_limit.max(size);
        if self.state == State::Connected {
            self.conn.send_credit_update = true;
        }
        self.state == State::Connected
    }

    /// SO_RCVLOWAT (0 means 1). A stream's mark cannot pass its buffer.
    /// Returns whether a credit update is owed: the reader may now wait for
    /// more than the peer believes it may send.
    pub fn set_rcvlowat(&mut self, bytes: u32) -> Result<bool> {
        if self.ty == SocketType::Stream && bytes > self.options.buffer_size {
            return Err(Error::InvalidArgument);
        }
        self.options.rcvlowat = bytes.max(1);
        Ok(self.credit_update_if_due())
    }
}
