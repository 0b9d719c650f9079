//! Per-socket state: what one socket knows, without the stack's tables.
//!
//! A [`Socket`] is one entry in the stack's socket table. It holds the
//! connection's credit counters, its receive and send buffers, the control
//! packets it still owes the peer, its options and its wakers. Everything
//! here is local to one socket; lookups, port tables and packet routing
//! live in [`crate::Stack`].
//!
//! Credit (virtio spec §5.10.6.3) in one paragraph: each side advertises
//! `buf_alloc`, the size of its receive buffer, and `fwd_cnt`, how many
//! payload bytes its application has consumed. Both count bytes with
//! free-running `u32`s that wrap. A sender may have at most
//! `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)` bytes outstanding. We also cap
//! that at our own `buf_alloc`, as Linux does, so a peer with a huge buffer
//! cannot make us queue unbounded data.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use core::time::Duration;

use crate::addr::VsockAddr;
use crate::error::Error;
use crate::readiness::{Readiness, ReadinessHook, WakerSlot};
use crate::ring::ByteRing;
use crate::time::Instant;
use crate::wire::{MAX_PAYLOAD, SocketType, shutdown_flags};

slotmap::new_key_type! {
    /// Names one socket in a [`crate::Stack`]. A handle stops working when
    /// the socket is closed, even if the stack reuses its slot.
    pub struct SocketHandle;
}

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

/// One queued datagram: who it is from (rx) or for (tx), and its size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Datagram {
    pub addr: VsockAddr,
    pub len: u32,
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

    /// Received bytes the application has not read.
    pub rx: ByteRing,
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
    /// The peer will send nothing more: it shut down SEND, or reset.
    pub peer_done: bool,
    /// RST has been sent or received: no packet for this connection may follow.
    pub finished: bool,
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

    pub fn rx_message_limit(rx_limit: u32) -> usize {
        (rx_limit as usize / 16).max(1024)
    }
}

#[derive(Debug, Default)]
pub(crate) struct DatagramQueues {
    /// Bytes of received datagrams kept before new ones are dropped.
    pub recv_limit: u32,
    /// Bytes of unsent datagrams kept before `send_to` would block.
    pub send_limit: u32,
    pub rx: ByteRing,
    pub rx_meta: VecDeque<Datagram>,
    pub tx: ByteRing,
    pub tx_meta: VecDeque<Datagram>,
}

pub(crate) struct Socket {
    pub ty: SocketType,
    pub state: State,
    /// False once the application has closed its handle; the socket may
    /// live on to finish the close handshake.
    pub app_owned: bool,
    /// The bound address; the CID may be `VMADDR_CID_ANY`.
    pub local: Option<VsockAddr>,
    /// The connected peer, or a datagram socket's default destination.
    pub peer: Option<VsockAddr>,
    /// The CID this connection uses as its source (our CID, or CID 1).
    pub local_cid: u32,
    /// Whether this socket holds `local.port` in a bind table.
    pub owns_port: bool,
    pub conn: Connection,
    pub dgram: DatagramQueues,
    pub backlog: usize,
    /// A listener that takes connection requests for every port no other
    /// listener holds (see `Stack::listen_catch_all`).
    pub catch_all: bool,
    /// A connection from a catch-all listener that has not been answered:
    /// the application decides with `confirm` or `refuse`.
    pub awaiting_confirmation: bool,
    pub accept_queue: VecDeque<SocketHandle>,
    /// The listener whose accept queue holds this socket.
    pub parent: Option<SocketHandle>,
    /// An error reported by the next call (SO_ERROR).
    pub error: Option<Error>,
    pub deadline: Option<Instant>,

    pub buffer_size: u32,
    pub rcvlowat: u32,
    pub connect_timeout: Duration,

    pub readers: WakerSlot,
    pub writers: WakerSlot,
    pub hook: Option<Box<dyn ReadinessHook>>,
    pub wake_read: bool,
    pub wake_write: bool,
    pub in_wake_list: bool,
    pub in_tx_queue: bool,
}

impl core::fmt::Debug for Socket {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Socket")
            .field("ty", &self.ty)
            .field("state", &self.state)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Socket {
    pub fn new(ty: SocketType, buffer_size: u32, connect_timeout: Duration) -> Self {
        Self {
            ty,
            state: State::Unconnected,
            app_owned: true,
            local: None,
            peer: None,
            local_cid: 0,
            owns_port: false,
            conn: Connection::default(),
            dgram: DatagramQueues::default(),
            backlog: 0,
            catch_all: false,
            awaiting_confirmation: false,
            accept_queue: VecDeque::new(),
            parent: None,
            error: None,
            deadline: None,
            buffer_size,
            rcvlowat: 1,
            connect_timeout,
            readers: WakerSlot::default(),
            writers: WakerSlot::default(),
            hook: None,
            wake_read: false,
            wake_write: false,
            in_wake_list: false,
            in_tx_queue: false,
        }
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
        match self.ty {
            SocketType::Datagram => self.dgram.rx.len(),
            SocketType::SeqPacket => self.conn.rx.len() - self.conn.rx_partial as usize,
            SocketType::Stream => self.conn.rx.len(),
        }
    }

    pub fn readiness(&self) -> Readiness {
        let mut r = Readiness::EMPTY;
        if self.error.is_some() {
            r |= Readiness::ERROR | Readiness::READABLE | Readiness::WRITABLE;
        }
        match self.ty {
            SocketType::Datagram => {
                if !self.dgram.rx_meta.is_empty() {
                    r |= Readiness::READABLE;
                }
                let limit = self.dgram.send_limit as usize;
                if limit.saturating_sub(self.dgram.tx.len()) >= MAX_PAYLOAD.min(limit) {
                    r |= Readiness::WRITABLE;
                }
                return r;
            }
            SocketType::Stream | SocketType::SeqPacket => {}
        }
        let c = &self.conn;
        // Linux's vsock_poll: RDHUP when either side ended our read
        // direction, HUP when both directions are shut on our side or
        // both sides stopped sending.
        if c.local_shutdown & shutdown_flags::RCV != 0 || c.peer_done {
            r |= Readiness::READ_CLOSED;
        }
        let send_shut = c.local_shutdown & shutdown_flags::SEND != 0;
        if c.local_shutdown == shutdown_flags::BOTH || (send_shut && c.peer_done) {
            r |= Readiness::HANGUP;
        }
        match self.state {
            // A send would fail at once (ENOTCONN), so it does not block.
            State::Unconnected => r |= Readiness::WRITABLE,
            State::Connecting | State::Closing => {}
            State::Listening => {
                if !self.accept_queue.is_empty() {
                    r |= Readiness::READABLE;
                }
            }
            State::Connected | State::Disconnected => {
                let data_ready = if self.is_seqpacket() {
                    !c.rx_messages.is_empty()
                } else {
                    c.rx.len() >= self.rcvlowat.max(1) as usize
                };
                if data_ready || self.at_eof() || self.state == State::Disconnected {
                    r |= Readiness::READABLE;
                }
                let send_fails = self.state == State::Disconnected
                    || c.local_shutdown & shutdown_flags::SEND != 0
                    || c.peer_shutdown & shutdown_flags::RCV != 0;
                if send_fails || c.send_space(self.buffer_size) > 0 {
                    r |= Readiness::WRITABLE;
                }
            }
        }
        r
    }

    /// Whether the socket has a packet to hand to the transport now.
    pub fn wants_tx(&self) -> bool {
        if self.ty == SocketType::Datagram {
            return !self.dgram.tx_meta.is_empty();
        }
        let c = &self.conn;
        if c.finished {
            return false;
        }
        c.send_request
            || c.send_response
            || c.send_credit_update
            || (matches!(self.state, State::Connected | State::Closing)
                && ((!c.tx.is_empty() && c.send_window(self.buffer_size) > 0)
                    || (c.tx.is_empty() && c.local_shutdown & !c.shutdown_sent != 0)))
    }

    /// Bytes of memory this socket's buffers hold, for the memory bound tests.
    pub fn buffered_bytes(&self) -> usize {
        self.conn.rx.capacity()
            + self.conn.tx.capacity()
            + self.dgram.rx.capacity()
            + self.dgram.tx.capacity()
    }
}
