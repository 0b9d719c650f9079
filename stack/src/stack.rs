//! The stack: socket tables, packet routing, the socket API, transmit and timers.
//!
//! [`Stack`] is sans-IO. It is driven by three kinds of input and produces
//! three kinds of output, and does nothing on its own:
//!
//! | in | out |
//! |---|---|
//! | received packets ([`Stack::rx_batch`]) | packets to send ([`Stack::dispatch`] into a [`TxSink`]) |
//! | the time ([`Stack::handle_timeout`]) | the next deadline ([`Stack::poll_at`]) |
//! | socket calls (`bind`, `send`, ...) | wakers to wake ([`WakeList`]) |
//!
//! A driver's loop is: feed the packets the device returned as one batch,
//! dispatch, wake the returned wakers after dropping any lock, and sleep
//! until the device interrupts or `poll_at` passes.
//!
//! Routing follows Linux (`virtio_transport_recv_pkt`): a packet is matched
//! first against established connections by its 4-tuple, then against
//! listeners by its destination port. A stream or seqpacket packet that
//! matches nothing is answered with RST, unless it is itself an RST. A
//! datagram that matches nothing is dropped silently. Packets addressed to
//! the stack's own CID, or to CID 1, never reach the sink: `dispatch`
//! delivers them inside the stack, like Linux's `vsock_loopback`.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;
use core::mem;
use core::task::Waker;
use core::time::Duration;

use hashbrown::HashMap;
use slotmap::SlotMap;

use crate::addr::{
    LAST_RESERVED_PORT, VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr,
};
use crate::config::{Config, Features, MIN_BUFFER_SIZE};
use crate::error::{Error, Result};
use crate::readiness::{Interest, Readiness, ReadinessEvent, ReadinessHook, WakeList};
use crate::socket::{Connection, Datagram, Message, Socket, SocketHandle, State};
use crate::stats::{DropReason, RstReason, Stats};
use crate::time::Instant;
use crate::wire::{
    self, DecodeError, Header, MAX_PAYLOAD, Op, RawHeader, SocketType, seq_flags, shutdown_flags,
};
use alloc::boxed::Box;

/// Linux tries this many successive ports before giving up on an ephemeral bind.
const EPHEMERAL_PORT_RETRIES: usize = 24;
/// Most packets one `dispatch` call moves, so local loopback traffic cannot
/// keep a caller inside the stack forever.
const DISPATCH_BUDGET: usize = 1 << 16;

/// Where packets leave the stack.
///
/// The header comes as a [`RawHeader`] because one kind of reply cannot be
/// typed: the RST that answers a packet of an unknown type must echo that
/// type. Call [`RawHeader::encode`] for the 44 wire bytes, or
/// [`RawHeader::check`] for a typed [`Header`].
///
/// `transmit` copies the header and payload into the transport's own buffer
/// (a virtqueue descriptor, a socket, a test's wire). Returning
/// [`SinkFull`] keeps the packet in the stack for the next `dispatch`; it is
/// not lost and its bytes are not yet charged to the peer's credit.
pub trait TxSink {
    fn transmit(
        &mut self,
        header: &RawHeader,
        payload: &[u8],
    ) -> core::result::Result<(), SinkFull>;
}

/// The sink has no room now; try again after the transport has drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkFull;

impl<F> TxSink for F
where
    F: FnMut(&RawHeader, &[u8]) -> core::result::Result<(), SinkFull>,
{
    fn transmit(
        &mut self,
        header: &RawHeader,
        payload: &[u8],
    ) -> core::result::Result<(), SinkFull> {
        self(header, payload)
    }
}

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

/// What one receive returned, beside the bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes copied to the caller.
    pub len: usize,
    /// Full size of the message or datagram; for streams, equal to `len`.
    pub message_len: usize,
    /// The message or datagram was longer than the buffer (MSG_TRUNC).
    pub truncated: bool,
    /// The message ended a record (MSG_EOR).
    pub end_of_record: bool,
    /// The peer has finished and nothing is left: this receive is the EOF.
    pub eof: bool,
    /// Bytes still queued after this receive (msg_inq). For a stream whose
    /// peer has finished, an empty queue reports 1 rather than 0, so that a
    /// caller that stops on 0 still makes the receive that sees EOF, as
    /// Linux's vsock does after TCP's `tcp_inq_hint`
    /// (`docs/linux-behaviours.md#inq-hint`).
    pub inq: usize,
    /// The sender: the connected peer, or the datagram's source.
    pub from: Option<VsockAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ConnKey {
    local_port: u32,
    peer_cid: u32,
    peer_port: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Device,
    Loopback,
}

/// Which waiters a readiness change concerns: a socket's readers, its
/// writers, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// Something to read (data, a connection to accept): wake readers.
    Readable,
    /// Room to send (credit, a freed send buffer): wake writers.
    Writable,
    /// The connection changed state (established, shut down, reset,
    /// failed): both a receive and a send may now return at once.
    Both,
}

/// The next packet a socket will send.
#[derive(Clone, Copy, Debug)]
enum Planned {
    Request,
    Response,
    Data { len: usize, flags: u32 },
    Shutdown(u32),
    CreditUpdate,
    Datagram { to: VsockAddr, len: usize },
}

/// The vsock protocol core for one CID.
pub struct Stack {
    config: Config,
    local_cid: u32,
    sockets: SlotMap<SocketHandle, Socket>,
    /// Established (and connecting) stream and seqpacket sockets by 4-tuple.
    connected: HashMap<ConnKey, SocketHandle>,
    /// Stream and seqpacket ports (one table, as in Linux).
    bound: HashMap<u32, SocketHandle>,
    /// Datagram ports: a space of their own (datagram RFC).
    dgram_bound: HashMap<u32, SocketHandle>,
    /// Catch-all listeners, for stream and for seqpacket.
    catch_all: [Option<SocketHandle>; 2],
    /// Sockets with something to send, served round robin.
    tx_queue: VecDeque<SocketHandle>,
    /// RSTs owed to connections that have no socket (or no longer have
    /// one); bounded, so a flood of bad packets cannot grow memory.
    replies: VecDeque<(RawHeader, RstReason)>,
    /// Sockets with a connect or close deadline. Entries go stale when the
    /// deadline is cleared; they are dropped when next examined.
    timers: Vec<SocketHandle>,
    /// Sockets with a recorded, undelivered readiness change.
    wake_pending: Vec<SocketHandle>,
    next_ephemeral: u32,
    /// Largest payload `dispatch` puts in one packet: 64 KiB, or less when
    /// the device's receive buffers are smaller.
    max_payload: usize,
    /// Reused buffer for payloads delivered inside the stack, and for the
    /// rare datagram that wraps around its ring.
    scratch: Vec<u8>,
    stats: Stats,
}

impl core::fmt::Debug for Stack {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Stack")
            .field("local_cid", &self.local_cid)
            .field("sockets", &self.sockets.len())
            .finish_non_exhaustive()
    }
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

/// Takes a stream connection's incoming bytes straight out of the packet,
/// before they are copied into the socket's receive buffer.
///
/// For a transport that only relays a connection elsewhere (the host
/// bridge writes its bytes to a Unix socket), the buffer is a detour: a
/// copy in, and a copy out when the relay reads. With a tap, the stack
/// offers the payload first whenever the receive buffer is empty (so order
/// is kept); what the tap takes counts as received and read at once
/// (`fwd_cnt` moves, credit flows back as after a `recv`), and the rest is
/// buffered as usual. Readiness fires only for what was buffered.
pub trait DirectReceive {
    /// Bytes that arrived on stream socket `socket`; returns how many
    /// leading bytes it took (0 when it cannot take any now).
    fn deliver(&mut self, socket: SocketHandle, data: &[u8]) -> usize;
}

/// The tap a batch offers payloads to, if any.
type Tap<'a> = Option<&'a mut dyn DirectReceive>;

impl RxBatch<'_> {
    /// One received buffer: a header, then `len` bytes of payload, then
    /// possibly slack the device did not fill.
    pub fn receive(&mut self, frame: &[u8]) {
        self.stack.receive_frame(self.now, frame, Origin::Device, &mut self.tap);
    }

    /// One received packet whose header and payload are apart (as a
    /// device may deliver them, or another stack's sink hands them over).
    pub fn receive_parts(&mut self, header: &RawHeader, payload: &[u8]) {
        self.stack.receive_raw(self.now, header, payload, Origin::Device, &mut self.tap);
    }

    /// Ends the batch and moves the recorded wakers into `wakes`: wake them
    /// after releasing any lock around the stack.
    pub fn finish(self, wakes: &mut WakeList) {
        self.stack.drain_wakes(wakes);
    }
}

impl Stack {
    pub fn new(config: Config) -> Self {
        let span = VMADDR_PORT_ANY - LAST_RESERVED_PORT - 1;
        let next_ephemeral = LAST_RESERVED_PORT + 1 + config.ephemeral_seed % span;
        Self {
            local_cid: config.local_cid,
            config,
            sockets: SlotMap::with_key(),
            connected: HashMap::new(),
            bound: HashMap::new(),
            dgram_bound: HashMap::new(),
            catch_all: [None, None],
            tx_queue: VecDeque::new(),
            replies: VecDeque::new(),
            timers: Vec::new(),
            wake_pending: Vec::new(),
            next_ephemeral,
            max_payload: MAX_PAYLOAD,
            scratch: Vec::new(),
            stats: Stats::default(),
        }
    }

    pub fn local_cid(&self) -> u32 {
        self.local_cid
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes the socket types the transport carries, for a transport
    /// whose peer negotiated anew (a virtio device after its driver reset
    /// and set up again). Call it on a stack without connections of the
    /// types it removes, for example right after [`Stack::transport_reset`]:
    /// packets of a removed type are refused from then on (RST, or dropped
    /// and counted for datagrams), as at creation.
    pub fn set_features(&mut self, features: Features) {
        self.config.features = features;
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sockets alive, including unaccepted and closing ones.
    pub fn socket_count(&self) -> usize {
        self.sockets.len()
    }

    /// Bytes of buffer storage all sockets hold.
    pub fn buffered_bytes(&self) -> usize {
        self.sockets.values().map(Socket::buffered_bytes).sum()
    }

    /// Caps the payload of every packet `dispatch` produces, for a transport
    /// whose peer posts receive buffers smaller than 64 KiB (a device model
    /// serving a guest with small buffers). Streams and seqpacket messages are
    /// cut smaller; a datagram that no longer fits is dropped and counted.
    pub fn set_max_payload(&mut self, bytes: usize) {
        self.max_payload = bytes.clamp(1, MAX_PAYLOAD);
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Whether `dispatch` has packets to move.
    pub fn has_pending_tx(&self) -> bool {
        !self.replies.is_empty()
            || self.tx_queue.iter().any(|&h| self.sockets.get(h).is_some_and(Socket::wants_tx))
    }

    // ----- socket calls -------------------------------------------------

    pub fn socket(&mut self, ty: SocketType) -> Result<SocketHandle> {
        if !self.config.features.supports(ty) {
            return Err(Error::SocketTypeNotSupported);
        }
        if self.sockets.len() >= self.config.max_sockets {
            return Err(Error::SocketLimit);
        }
        let mut socket = Socket::new(ty, self.config.buffer_size, self.config.connect_timeout);
        socket.dgram.recv_limit = self.config.datagram_receive_buffer;
        socket.dgram.send_limit = self.config.datagram_send_buffer;
        Ok(self.sockets.insert(socket))
    }

    fn app(&self, h: SocketHandle) -> Result<&Socket> {
        match self.sockets.get(h) {
            Some(s) if s.app_owned => Ok(s),
            _ => Err(Error::BadHandle),
        }
    }

    fn app_mut(&mut self, h: SocketHandle) -> Result<&mut Socket> {
        match self.sockets.get_mut(h) {
            Some(s) if s.app_owned => Ok(s),
            _ => Err(Error::BadHandle),
        }
    }

    pub fn socket_type(&self, h: SocketHandle) -> Result<SocketType> {
        Ok(self.app(h)?.ty)
    }

    pub fn bind(&mut self, h: SocketHandle, addr: VsockAddr) -> Result<()> {
        let s = self.app(h)?;
        if s.local.is_some() {
            return Err(Error::InvalidArgument);
        }
        if !matches!(s.state, State::Unconnected) {
            return Err(Error::InvalidArgument);
        }
        let connectible = s.ty.is_connectible();
        if addr.cid != VMADDR_CID_ANY && addr.cid != self.local_cid && addr.cid != VMADDR_CID_LOCAL
        {
            return Err(Error::AddressNotAvailable);
        }
        let port = if addr.port == VMADDR_PORT_ANY {
            self.ephemeral_port(connectible)?
        } else {
            if addr.port <= LAST_RESERVED_PORT && !self.config.allow_privileged_ports {
                return Err(Error::PermissionDenied);
            }
            if self.port_table(connectible).contains_key(&addr.port) {
                return Err(Error::AddressInUse);
            }
            addr.port
        };
        self.port_table_mut(connectible).insert(port, h);
        let s = &mut self.sockets[h];
        s.local = Some(VsockAddr::new(addr.cid, port));
        s.owns_port = true;
        Ok(())
    }

    fn port_table(&self, connectible: bool) -> &HashMap<u32, SocketHandle> {
        if connectible { &self.bound } else { &self.dgram_bound }
    }

    fn port_table_mut(&mut self, connectible: bool) -> &mut HashMap<u32, SocketHandle> {
        if connectible { &mut self.bound } else { &mut self.dgram_bound }
    }

    fn ephemeral_port(&mut self, connectible: bool) -> Result<u32> {
        for _ in 0..EPHEMERAL_PORT_RETRIES {
            let port = self.next_ephemeral;
            self.next_ephemeral =
                if port >= VMADDR_PORT_ANY - 1 { LAST_RESERVED_PORT + 1 } else { port + 1 };
            if !self.port_table(connectible).contains_key(&port) {
                return Ok(port);
            }
        }
        Err(Error::AddressNotAvailable)
    }

    fn autobind(&mut self, h: SocketHandle) -> Result<()> {
        if self.sockets[h].local.is_none() {
            self.bind(h, VsockAddr::any())?;
        }
        Ok(())
    }

    pub fn listen(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app_mut(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        match s.state {
            State::Unconnected if s.local.is_some() => {
                s.state = State::Listening;
                s.backlog = backlog;
                Ok(())
            }
            State::Listening => {
                s.backlog = backlog;
                Ok(())
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Takes one established connection off a listener's queue.
    ///
    /// An empty queue returns [`Error::WouldBlock`] at once and arms
    /// nothing: no timer, no packet, as Linux's non-blocking accept
    /// (`docs/linux-behaviours.md#nonblocking-accept`). To wait, register a
    /// read waker on the listener.
    pub fn accept(&mut self, h: SocketHandle) -> Result<(SocketHandle, VsockAddr)> {
        let s = self.app_mut(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        if s.state != State::Listening {
            return Err(Error::InvalidArgument);
        }
        let Some(child) = s.accept_queue.pop_front() else {
            return Err(Error::WouldBlock);
        };
        let c = &mut self.sockets[child];
        c.parent = None;
        c.app_owned = true;
        let peer = c.peer.expect("queued connections have a peer");
        Ok((child, peer))
    }

    /// Makes `h` a catch-all listener: it receives the connection requests
    /// for every port that no other listener holds, for its socket type.
    ///
    /// This is how a host endpoint bridges to services it only discovers
    /// per request (Firecracker's `<uds>_<port>`): connections it accepts
    /// are not answered yet; `local_addr` tells which port the peer dialled,
    /// and the application answers with [`Stack::confirm`] (RESPONSE) or
    /// [`Stack::refuse`] (RST). Unanswered ones are refused when the
    /// listener's connect timeout runs out, so the peer never hangs.
    pub fn listen_catch_all(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        if s.state != State::Unconnected || s.local.is_some() {
            return Err(Error::InvalidArgument);
        }
        let slot = catch_all_slot(s.ty);
        if self.catch_all[slot].is_some() {
            return Err(Error::AddressInUse);
        }
        self.catch_all[slot] = Some(h);
        let s = &mut self.sockets[h];
        s.state = State::Listening;
        s.catch_all = true;
        s.backlog = backlog;
        Ok(())
    }

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
        let key = ConnKey { local_port, peer_cid: addr.cid, peer_port: addr.port };
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

    /// Queues stream bytes; returns how many were taken.
    ///
    /// Takes at most what the peer's credit allows beyond what is already
    /// queued, so accepted bytes can always be sent without waiting.
    pub fn send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize> {
        let s = self.app(h)?;
        match s.ty {
            SocketType::Datagram => {
                // Linux answers EINVAL, not EDESTADDRREQ, for a datagram with nowhere to go.
                let to = s.peer.ok_or(Error::InvalidArgument)?;
                self.send_to(h, data, to)?;
                return Ok(data.len());
            }
            SocketType::SeqPacket => {
                self.send_message(h, data, false)?;
                return Ok(data.len());
            }
            SocketType::Stream => {}
        }
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

    /// Queues one datagram for `to`. Each datagram travels as one packet.
    pub fn send_to(&mut self, h: SocketHandle, data: &[u8], to: VsockAddr) -> Result<()> {
        let s = self.app(h)?;
        if s.ty != SocketType::Datagram {
            return Err(Error::NotSupported);
        }
        if s.conn.local_shutdown & shutdown_flags::SEND != 0 {
            return Err(Error::BrokenPipe);
        }
        if to.port == VMADDR_PORT_ANY {
            return Err(Error::InvalidArgument);
        }
        // As in Linux, a datagram to CID_ANY goes to ourselves.
        let to =
            if to.cid == VMADDR_CID_ANY { VsockAddr::new(self.local_cid, to.port) } else { to };
        if data.len() > MAX_PAYLOAD || data.len() > s.dgram.send_limit as usize {
            return Err(Error::MessageTooLarge);
        }
        let free = (s.dgram.send_limit as usize).saturating_sub(s.dgram.tx.len());
        if data.len() > free || s.dgram.tx_meta.len() >= dgram_count_limit(s.dgram.send_limit) {
            return Err(Error::WouldBlock);
        }
        self.autobind(h)?;
        let s = &mut self.sockets[h];
        s.dgram.tx.push(data);
        s.dgram.tx_meta.push_back(Datagram { addr: to, len: data.len() as u32 });
        self.enqueue_tx(h);
        Ok(())
    }

    /// Receives into `buf`: stream bytes, or one whole message or datagram.
    pub fn recv(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<RecvInfo> {
        self.recv_with(h, false, |a, b| Ok::<_, core::convert::Infallible>(copy_out(a, b, buf)))
    }

    /// Like `recv`, but leaves the data queued (MSG_PEEK).
    pub fn peek(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<RecvInfo> {
        self.recv_with(h, true, |a, b| Ok::<_, core::convert::Infallible>(copy_out(a, b, buf)))
    }

    /// Receives by lending the queued bytes to `copy`, which returns how many
    /// it took. This is how adapters copy straight into their own memory.
    ///
    /// For a stream, `copy` sees everything queued. For seqpacket and
    /// datagrams it sees exactly one message; the message is consumed whole
    /// and reported truncated if `copy` took less. If `copy` fails the call
    /// returns [`Error::Fault`]: a stream consumes nothing, a message is
    /// dropped, as in Linux.
    pub fn recv_with<E>(
        &mut self,
        h: SocketHandle,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        let ty = self.app(h)?.ty;
        match ty {
            SocketType::Datagram => self.recv_datagram(h, peek, copy),
            SocketType::Stream | SocketType::SeqPacket => self.recv_connected(h, peek, copy),
        }
    }

    fn recv_datagram<E>(
        &mut self,
        h: SocketHandle,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        let s = self.app_mut(h)?;
        if s.conn.local_shutdown & shutdown_flags::RCV != 0 {
            return Ok(RecvInfo { eof: true, ..RecvInfo::default() });
        }
        let Some(head) = s.dgram.rx_meta.front().copied() else {
            return Err(Error::WouldBlock);
        };
        let len = head.len as usize;
        let (a, b) = prefix(s.dgram.rx.as_slices(), len);
        let taken = copy(a, b);
        if !peek {
            s.dgram.rx.consume(len);
            s.dgram.rx_meta.pop_front();
        }
        let taken = taken.map_err(|_| Error::Fault)?.min(len);
        Ok(RecvInfo {
            len: taken,
            message_len: len,
            truncated: taken < len,
            end_of_record: false,
            eof: false,
            inq: s.dgram.rx.len(),
            from: Some(head.addr),
        })
    }

    fn recv_connected<E>(
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
        let (a, b) = prefix(s.conn.rx.as_slices(), len);
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

    fn consume_rx(&mut self, h: SocketHandle, n: usize, whole_message: bool) {
        let s = &mut self.sockets[h];
        s.conn.rx.consume(n);
        if whole_message {
            s.conn.rx_messages.pop_front();
        }
        s.conn.fwd_cnt = s.conn.fwd_cnt.wrapping_add(n as u32);
        self.credit_update_if_due(h);
    }

    /// Queues a credit update if the peer needs one now.
    fn credit_update_if_due(&mut self, h: SocketHandle) {
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

    /// Closes the handle. An established connection closes in the
    /// background: queued data is still sent, then SHUTDOWN, and the socket
    /// lives until the peer's RST or the close timeout.
    pub fn close(&mut self, h: SocketHandle, now: Instant) -> Result<()> {
        let s = self.app_mut(h)?;
        s.app_owned = false;
        s.readers.take();
        s.writers.take();
        s.hook = None;
        match s.state {
            State::Listening => {
                // Connections nobody accepted are closed like any other
                // (Linux's `__vsock_release` of pending children).
                let children = mem::take(&mut s.accept_queue);
                self.free(h);
                for child in children {
                    self.sockets[child].parent = None;
                    self.close_owned(child, now);
                }
            }
            _ => self.close_owned(h, now),
        }
        Ok(())
    }

    fn close_owned(&mut self, h: SocketHandle, now: Instant) {
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

    // ----- options and queries -------------------------------------------

    pub fn local_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let s = self.app(h)?;
        let local = s.local.ok_or(Error::InvalidArgument)?;
        if s.peer.is_some() && s.ty.is_connectible() && local.cid == VMADDR_CID_ANY {
            return Ok(VsockAddr::new(s.local_cid, local.port));
        }
        Ok(local)
    }

    pub fn peer_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let s = self.app(h)?;
        match (s.ty, s.state) {
            (SocketType::Datagram, _) | (_, State::Connected | State::Disconnected) => {
                s.peer.ok_or(Error::NotConnected)
            }
            _ => Err(Error::NotConnected),
        }
    }

    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness> {
        Ok(self.app(h)?.readiness())
    }

    pub fn is_listening(&self, h: SocketHandle) -> Result<bool> {
        Ok(self.app(h)?.state == State::Listening)
    }

    /// Parks a waker to be woken when the socket may have become readable
    /// (`Interest::Read`) or writable (`Interest::Write`).
    pub fn register_waker(
        &mut self,
        h: SocketHandle,
        interest: Interest,
        waker: &Waker,
    ) -> Result<()> {
        let s = self.app_mut(h)?;
        match interest {
            Interest::Read => s.readers.register(waker),
            Interest::Write => s.writers.register(waker),
        }
        Ok(())
    }

    /// Replaces the socket's native notification path; see [`ReadinessHook`].
    pub fn set_readiness_hook(
        &mut self,
        h: SocketHandle,
        hook: Option<Box<dyn ReadinessHook>>,
    ) -> Result<()> {
        self.app_mut(h)?.hook = hook;
        Ok(())
    }

    /// Bytes a receive can return now (SIOCINQ).
    pub fn recv_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.readable_bytes())
    }

    /// Bytes accepted by `send` and not yet handed to the transport (SIOCOUTQ).
    pub fn send_queued(&self, h: SocketHandle) -> Result<usize> {
        let s = self.app(h)?;
        Ok(if s.ty == SocketType::Datagram { s.dgram.tx.len() } else { s.conn.tx.len() })
    }

    pub fn buffer_size(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.buffer_size)
    }

    /// Sets the receive buffer (SO_VM_SOCKETS_BUFFER_SIZE), clamped to
    /// `[128, max_buffer_size]`; the peer hears the new size at once.
    pub fn set_buffer_size(&mut self, h: SocketHandle, size: u64) -> Result<()> {
        let max = self.config.max_buffer_size;
        let s = self.app_mut(h)?;
        let size = size.clamp(MIN_BUFFER_SIZE as u64, max as u64) as u32;
        s.buffer_size = size;
        if s.ty == SocketType::Datagram {
            s.dgram.recv_limit = size;
            return Ok(());
        }
        s.conn.rx_limit = s.conn.rx_limit.max(size);
        if s.state == State::Connected {
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        Ok(())
    }

    pub fn rcvlowat(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.rcvlowat)
    }

    /// Sets SO_RCVLOWAT: a stream is readable only with this many bytes
    /// queued (or at EOF or an error). If the reader would otherwise wait
    /// for bytes the peer has no credit to send, a credit update goes out.
    pub fn set_rcvlowat(&mut self, h: SocketHandle, bytes: u32) -> Result<()> {
        let s = self.app_mut(h)?;
        if s.ty == SocketType::Stream && bytes > s.buffer_size {
            return Err(Error::InvalidArgument);
        }
        s.rcvlowat = bytes.max(1);
        if s.state == State::Connected
            && s.conn.credit_update_due(s.buffer_size, s.rcvlowat, s.is_seqpacket())
        {
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        if self.sockets[h].readiness().contains(Readiness::READABLE) {
            self.note(h, Wake::Readable);
        }
        Ok(())
    }

    pub fn connect_timeout(&self, h: SocketHandle) -> Result<Duration> {
        Ok(self.app(h)?.connect_timeout)
    }

    pub fn set_connect_timeout(&mut self, h: SocketHandle, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument);
        }
        self.app_mut(h)?.connect_timeout = timeout;
        Ok(())
    }

    // ----- timers and transport events ---------------------------------

    /// The earliest deadline, if any: call `handle_timeout` then.
    pub fn poll_at(&self) -> Option<Instant> {
        self.timers.iter().filter_map(|&h| self.sockets.get(h).and_then(|s| s.deadline)).min()
    }

    /// Fires every deadline at or before `now`: connects time out, closes
    /// that got no RST send one.
    pub fn handle_timeout(&mut self, now: Instant, wakes: &mut WakeList) {
        let timers = mem::take(&mut self.timers);
        let mut kept = Vec::with_capacity(timers.len());
        for h in timers {
            let Some(s) = self.sockets.get(h) else { continue };
            let Some(deadline) = s.deadline else { continue };
            if deadline > now {
                kept.push(h);
                continue;
            }
            match s.state {
                State::Connecting => self.fail_connect(h, Error::TimedOut),
                State::Closing => {
                    self.socket_rst(h, RstReason::CloseTimeout);
                    self.free(h);
                }
                State::Connected if s.awaiting_confirmation => {
                    self.socket_rst(h, RstReason::Refused);
                    self.sockets[h].awaiting_confirmation = false;
                    self.disconnect(h, Some(Error::TimedOut));
                }
                _ => self.sockets[h].deadline = None,
            }
        }
        kept.append(&mut self.timers);
        self.timers = kept;
        self.drain_wakes(wakes);
    }

    /// The device reported TRANSPORT_RESET (for example after a snapshot
    /// restore): adopt the new CID, fail every connection with
    /// connection-reset without sending anything, keep listeners.
    pub fn transport_reset(&mut self, new_cid: u32, wakes: &mut WakeList) {
        self.stats.transport_resets += 1;
        self.local_cid = new_cid;
        self.replies.clear();
        let handles: Vec<SocketHandle> = self.sockets.keys().collect();
        for h in handles {
            let s = &mut self.sockets[h];
            if !s.ty.is_connectible() {
                continue;
            }
            match s.state {
                State::Connecting => self.fail_connect(h, Error::ConnectionReset),
                State::Connected => {
                    s.conn.finished = true;
                    self.disconnect(h, Some(Error::ConnectionReset));
                }
                State::Closing => self.free(h),
                State::Disconnected => s.conn.finished = true,
                State::Unconnected | State::Listening => {}
            }
        }
        self.drain_wakes(wakes);
    }

    // ----- receive path --------------------------------------------------

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

    fn receive_frame(&mut self, now: Instant, frame: &[u8], origin: Origin, tap: &mut Tap<'_>) {
        match wire::decode(frame) {
            Ok((header, payload)) => self.process(now, &header, payload, origin, tap),
            Err(err) => self.undecodable(err, origin),
        }
    }

    fn receive_raw(
        &mut self,
        now: Instant,
        raw: &RawHeader,
        payload: &[u8],
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
            Ok(header) => self.process(now, &header, payload, origin, tap),
            Err(err) => self.undecodable(err, origin),
        }
    }

    fn undecodable(&mut self, err: DecodeError, origin: Origin) {
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

    fn count_rx(&mut self, origin: Origin, bytes: usize) {
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

    fn addressed_to_us(&self, dst_cid: u64, origin: Origin) -> bool {
        dst_cid == self.local_cid as u64
            || (origin == Origin::Loopback && dst_cid == VMADDR_CID_LOCAL as u64)
    }

    /// A header with a type or op we do not know. The spec wants an RST
    /// that echoes the type, unless it is an RST or a datagram.
    fn process_undecodable(&mut self, raw: RawHeader, reason: RstReason, origin: Origin) {
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

    fn process(
        &mut self,
        now: Instant,
        hdr: &Header,
        payload: &[u8],
        origin: Origin,
        tap: &mut Tap<'_>,
    ) {
        self.count_rx(origin, payload.len());
        if !self.addressed_to_us(hdr.dst_cid, origin) {
            self.stats.count_drop(DropReason::WrongDestination);
            return;
        }
        if hdr.src_cid > u32::MAX as u64 {
            self.stats.count_drop(DropReason::InvalidCid);
            return;
        }
        if hdr.socket_type == SocketType::Datagram {
            self.process_datagram(hdr, payload);
            return;
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
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_cid: hdr.src_cid as u32,
            peer_port: hdr.src_port,
        };
        if let Some(&h) = self.connected.get(&key) {
            if self.sockets[h].ty != hdr.socket_type {
                self.unmatched(hdr, RstReason::TypeMismatch);
            } else {
                self.on_connection_packet(now, h, hdr, payload, tap);
            }
            return;
        }
        if let Some(&h) = self.bound.get(&hdr.dst_port) {
            let s = &self.sockets[h];
            let cid_matches =
                s.local.is_some_and(|l| l.cid == VMADDR_CID_ANY || l.cid as u64 == hdr.dst_cid);
            if s.state == State::Listening && cid_matches {
                if s.ty != hdr.socket_type {
                    self.unmatched(hdr, RstReason::TypeMismatch);
                } else {
                    self.on_listener_packet(now, h, hdr);
                }
                return;
            }
        }
        if let Some(h) = self.catch_all[catch_all_slot(hdr.socket_type)] {
            self.on_listener_packet(now, h, hdr);
            return;
        }
        let reason =
            if hdr.op == Op::Response { RstReason::StrayResponse } else { RstReason::NoSocket };
        self.unmatched(hdr, reason);
    }

    /// A stream or seqpacket packet nobody takes: RST it, unless it is an RST.
    fn unmatched(&mut self, hdr: &Header, reason: RstReason) {
        if hdr.op == Op::Rst {
            self.stats.count_drop(DropReason::RstForUnknown);
        } else {
            self.reply_rst(&hdr.to_raw(), reason);
        }
    }

    fn on_listener_packet(&mut self, now: Instant, listener: SocketHandle, hdr: &Header) {
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
        let l = &self.sockets[listener];
        // Linux's sk_acceptq_is_full: full once the queue holds more than `backlog`.
        if l.accept_queue.len() > l.backlog {
            self.reply_rst(&hdr.to_raw(), RstReason::BacklogFull);
            return;
        }
        if self.sockets.len() >= self.config.max_sockets {
            self.reply_rst(&hdr.to_raw(), RstReason::SocketLimit);
            return;
        }
        let mut child = Socket::new(l.ty, l.buffer_size, l.connect_timeout);
        child.rcvlowat = l.rcvlowat;
        child.state = State::Connected;
        child.app_owned = false;
        child.parent = Some(listener);
        child.local = Some(VsockAddr::new(hdr.dst_cid as u32, hdr.dst_port));
        child.local_cid = hdr.dst_cid as u32;
        child.peer = Some(VsockAddr::new(hdr.src_cid as u32, hdr.src_port));
        child.conn = Connection {
            rx_limit: l.buffer_size,
            peer_buf_alloc: hdr.buf_alloc,
            peer_fwd_cnt: hdr.fwd_cnt,
            send_response: !l.catch_all,
            ..Connection::default()
        };
        if l.catch_all {
            child.awaiting_confirmation = true;
            child.deadline = Some(now + l.connect_timeout);
        }
        let awaiting = child.awaiting_confirmation;
        let child = self.sockets.insert(child);
        if awaiting {
            self.timers.push(child);
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_cid: hdr.src_cid as u32,
            peer_port: hdr.src_port,
        };
        self.connected.insert(key, child);
        self.sockets[listener].accept_queue.push_back(child);
        self.stats.connections_established += 1;
        self.enqueue_tx(child);
        self.note(listener, Wake::Readable);
    }

    fn on_connection_packet(
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

    fn on_data(&mut self, h: SocketHandle, hdr: &Header, payload: &[u8], tap: &mut Tap<'_>) {
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

    fn on_peer_shutdown(&mut self, h: SocketHandle, flags: u32) {
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
    fn on_peer_rst(&mut self, h: SocketHandle) {
        let s = &mut self.sockets[h];
        s.conn.finished = true;
        s.conn.peer_shutdown = shutdown_flags::BOTH;
        self.disconnect(h, None);
    }

    /// We end the connection with an RST: the peer broke a rule, or its
    /// listener went away.
    fn abort(&mut self, h: SocketHandle, reason: RstReason) {
        self.socket_rst(h, reason);
        self.disconnect(h, Some(Error::ConnectionReset));
    }

    /// The connection is over; the socket stays for its owner to read what
    /// is queued, or goes if nobody owns it.
    fn disconnect(&mut self, h: SocketHandle, error: Option<Error>) {
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

    fn fail_connect(&mut self, h: SocketHandle, error: Error) {
        self.detach_connection(h);
        let s = &mut self.sockets[h];
        s.state = State::Unconnected;
        s.error = Some(error);
        s.deadline = None;
        s.conn = Connection::default();
        self.note(h, Wake::Both);
    }

    /// Removes the socket's 4-tuple from the connection table.
    fn detach_connection(&mut self, h: SocketHandle) {
        let s = &self.sockets[h];
        if let (Some(local), Some(peer)) = (s.local, s.peer) {
            let key = ConnKey { local_port: local.port, peer_cid: peer.cid, peer_port: peer.port };
            if self.connected.get(&key) == Some(&h) {
                self.connected.remove(&key);
            }
        }
    }

    /// Removes the socket from every table, so its port and 4-tuple can be reused.
    fn detach(&mut self, h: SocketHandle) {
        self.detach_connection(h);
        let s = &mut self.sockets[h];
        if s.owns_port {
            s.owns_port = false;
            let port = s.local.expect("owner of a port is bound").port;
            let table = if s.ty.is_connectible() { &mut self.bound } else { &mut self.dgram_bound };
            if table.get(&port) == Some(&h) {
                table.remove(&port);
            }
        }
    }

    fn free(&mut self, h: SocketHandle) {
        if !self.sockets.contains_key(h) {
            return;
        }
        for slot in &mut self.catch_all {
            if *slot == Some(h) {
                *slot = None;
            }
        }
        self.detach(h);
        if let Some(parent) = self.sockets[h].parent
            && let Some(p) = self.sockets.get_mut(parent)
        {
            p.accept_queue.retain(|&c| c != h);
        }
        self.sockets.remove(h);
    }

    fn process_datagram(&mut self, hdr: &Header, payload: &[u8]) {
        if !self.config.features.datagram {
            self.stats.count_drop(DropReason::TypeNotNegotiated);
            return;
        }
        if hdr.op != Op::Rw {
            self.stats.count_drop(DropReason::DatagramBadOp);
            return;
        }
        let Some(&h) = self.dgram_bound.get(&hdr.dst_port) else {
            self.stats.count_drop(DropReason::DatagramNoSocket);
            return;
        };
        let s = &mut self.sockets[h];
        let cid_matches =
            s.local.is_some_and(|l| l.cid == VMADDR_CID_ANY || l.cid as u64 == hdr.dst_cid);
        if !cid_matches {
            self.stats.count_drop(DropReason::DatagramNoSocket);
            return;
        }
        if s.conn.local_shutdown & shutdown_flags::RCV != 0 {
            self.stats.count_drop(DropReason::AfterShutdown);
            return;
        }
        let q = &mut s.dgram;
        if q.rx.len() + payload.len() > q.recv_limit as usize
            || q.rx_meta.len() >= dgram_count_limit(q.recv_limit)
        {
            self.stats.count_drop(DropReason::DatagramReceiveBufferFull);
            return;
        }
        q.rx.push(payload);
        q.rx_meta.push_back(Datagram {
            addr: VsockAddr::new(hdr.src_cid as u32, hdr.src_port),
            len: payload.len() as u32,
        });
        self.note(h, Wake::Readable);
    }

    // ----- transmit path -------------------------------------------------

    fn enqueue_tx(&mut self, h: SocketHandle) {
        if let Some(s) = self.sockets.get_mut(h)
            && !s.in_tx_queue
        {
            s.in_tx_queue = true;
            self.tx_queue.push_back(h);
        }
    }

    /// Queues an RST answering `to`, with the addresses swapped and the type echoed.
    fn reply_rst(&mut self, to: &RawHeader, reason: RstReason) {
        self.queue_rst(RawHeader::rst_reply(to), reason);
    }

    /// Queues an RST from a socket to its peer. Nothing may follow it.
    fn socket_rst(&mut self, h: SocketHandle, reason: RstReason) {
        let s = &mut self.sockets[h];
        if s.conn.finished {
            return;
        }
        s.conn.finished = true;
        let (Some(local), Some(peer)) = (s.local, s.peer) else { return };
        let rst = Header::new(s.ty, Op::Rst, VsockAddr::new(s.local_cid, local.port), peer)
            .with_credit(s.buffer_size, s.conn.fwd_cnt);
        self.queue_rst(rst.to_raw(), reason);
    }

    fn queue_rst(&mut self, rst: RawHeader, reason: RstReason) {
        if self.replies.len() >= self.config.reply_queue_len {
            self.stats.count_drop(DropReason::ReplyQueueFull);
            return;
        }
        self.replies.push_back((rst, reason));
    }

    fn is_local(&self, dst_cid: u64) -> bool {
        is_local_cid(self.local_cid, dst_cid)
    }

    /// Moves packets out: RSTs owed first, then sockets round robin, one
    /// packet per turn. Packets for our own CID are delivered in place.
    /// Stops when the sink is full or nothing is left; returns the packets
    /// moved. Wakers from loopback deliveries land in `wakes`.
    pub fn dispatch(
        &mut self,
        now: Instant,
        sink: &mut impl TxSink,
        wakes: &mut WakeList,
    ) -> usize {
        let mut moved = 0;
        while moved < DISPATCH_BUDGET {
            if let Some(&(rst, reason)) = self.replies.front() {
                if self.is_local(rst.dst_cid) {
                    self.replies.pop_front();
                    self.stats.count_rst(reason);
                    self.receive_raw(now, &rst, &[], Origin::Loopback, &mut None);
                } else if sink.transmit(&rst, &[]).is_ok() {
                    self.replies.pop_front();
                    self.stats.count_rst(reason);
                    self.stats.tx_packets += 1;
                } else {
                    break;
                }
                moved += 1;
                continue;
            }
            let Some(h) = self.tx_queue.pop_front() else { break };
            let Some(s) = self.sockets.get_mut(h) else { continue };
            s.in_tx_queue = false;
            let Some(plan) = plan_packet(s, self.max_payload) else { continue };
            if let Planned::Datagram { len, .. } = plan
                && len > self.max_payload
            {
                self.stats.count_drop(DropReason::DatagramTooLargeForTransport);
                self.commit(h, plan);
                continue;
            }
            let header = build_header(s, plan, self.local_cid).to_raw();
            let local = is_local_cid(self.local_cid, header.dst_cid);
            let payload_len = header.len as usize;
            if local {
                let mut scratch = mem::take(&mut self.scratch);
                scratch.clear();
                copy_head(s, payload_len, &mut scratch);
                self.commit(h, plan);
                self.receive_raw(now, &header, &scratch, Origin::Loopback, &mut None);
                self.scratch = scratch;
            } else {
                let Self { sockets, scratch, .. } = self;
                let s = &sockets[h];
                let head = head_payload(s, payload_len);
                let payload: &[u8] = if head.len() == payload_len {
                    head
                } else {
                    scratch.clear();
                    copy_head(s, payload_len, scratch);
                    scratch
                };
                if sink.transmit(&header, payload).is_err() {
                    self.sockets[h].in_tx_queue = true;
                    self.tx_queue.push_front(h);
                    break;
                }
                self.stats.tx_packets += 1;
                self.stats.tx_bytes += payload_len as u64;
                self.commit(h, plan);
            }
            moved += 1;
        }
        self.drain_wakes(wakes);
        moved
    }

    /// Records that a packet left: advance counters, clear what it carried.
    fn commit(&mut self, h: SocketHandle, plan: Planned) {
        let s = &mut self.sockets[h];
        let c = &mut s.conn;
        if s.ty.is_connectible() {
            // Every packet tells the peer our fwd_cnt, so it is also a credit update.
            c.last_fwd_cnt_sent = c.fwd_cnt;
            c.send_credit_update = false;
        }
        match plan {
            Planned::Request => c.send_request = false,
            Planned::Response => c.send_response = false,
            Planned::Data { len, flags } => {
                c.tx.consume(len);
                c.tx_cnt = c.tx_cnt.wrapping_add(len as u32);
                if s.ty == SocketType::SeqPacket {
                    c.tx_head_sent += len as u32;
                    if flags & seq_flags::EOM != 0 {
                        c.tx_messages.pop_front();
                        c.tx_head_sent = 0;
                    }
                }
            }
            Planned::Shutdown(flags) => c.shutdown_sent |= flags,
            Planned::CreditUpdate => self.stats.credit_updates_sent += 1,
            Planned::Datagram { len, .. } => {
                s.dgram.tx.consume(len);
                s.dgram.tx_meta.pop_front();
            }
        }
        let more = s.wants_tx();
        let freed_space = matches!(plan, Planned::Datagram { .. });
        if more {
            self.enqueue_tx(h);
        }
        if freed_space {
            self.note(h, Wake::Writable);
        }
    }

    // ----- wakeups ---------------------------------------------------------

    /// Records a readiness change. A socket with a replacement hook is told
    /// at once, per packet; everyone else waits for the end of the batch.
    fn note(&mut self, h: SocketHandle, wake: Wake) {
        let (read, write) = (wake != Wake::Writable, wake != Wake::Readable);
        let Some(s) = self.sockets.get_mut(h) else { return };
        if let Some(hook) = s.hook.as_mut() {
            if write {
                hook.notify(h, ReadinessEvent::WriteSpace);
            }
            if read {
                hook.notify(h, ReadinessEvent::DataReady);
            }
            return;
        }
        s.wake_read |= read;
        s.wake_write |= write;
        if !s.in_wake_list {
            s.in_wake_list = true;
            self.wake_pending.push(h);
        }
    }

    fn drain_wakes(&mut self, wakes: &mut WakeList) {
        let Self { wake_pending, sockets, .. } = self;
        for h in wake_pending.drain(..) {
            let Some(s) = sockets.get_mut(h) else { continue };
            s.in_wake_list = false;
            if mem::take(&mut s.wake_write)
                && let Some(w) = s.writers.take()
            {
                wakes.push_write_space(w);
            }
            if mem::take(&mut s.wake_read)
                && let Some(w) = s.readers.take()
            {
                wakes.push_data_ready(w);
            }
        }
    }

    /// Hands over wakers recorded by socket calls (for example a shutdown
    /// that another task is waiting on).
    pub fn take_wakes(&mut self, wakes: &mut WakeList) {
        self.drain_wakes(wakes);
    }

    /// Hands over every parked waker, ready or not: for a host that is
    /// shutting down and needs each waiting task to run once more and see
    /// that (a task woken without cause just looks and parks again).
    pub fn wake_all(&mut self, wakes: &mut WakeList) {
        self.drain_wakes(wakes);
        for (_, s) in self.sockets.iter_mut() {
            if let Some(w) = s.writers.take() {
                wakes.push_write_space(w);
            }
            if let Some(w) = s.readers.take() {
                wakes.push_data_ready(w);
            }
        }
    }
}

/// The checks of Linux's `vsock_connectible_sendmsg`, in its order: a
/// pending error, then EPIPE (ours or the peer's shutdown), then ENOTCONN.
fn check_sendable(s: &mut Socket) -> Result<()> {
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

fn catch_all_slot(ty: SocketType) -> usize {
    usize::from(ty == SocketType::SeqPacket)
}

/// Most datagrams a queue holds, so empty datagrams cannot grow it without bound.
fn dgram_count_limit(bytes: u32) -> usize {
    (bytes as usize / 16).max(1024)
}

/// The first `len` bytes of a ring's two slices.
fn prefix<'a>((a, b): (&'a [u8], &'a [u8]), len: usize) -> (&'a [u8], &'a [u8]) {
    if len <= a.len() { (&a[..len], &[]) } else { (a, &b[..len - a.len()]) }
}

fn copy_out(a: &[u8], b: &[u8], buf: &mut [u8]) -> usize {
    let first = a.len().min(buf.len());
    buf[..first].copy_from_slice(&a[..first]);
    let second = b.len().min(buf.len() - first);
    buf[first..first + second].copy_from_slice(&b[..second]);
    first + second
}

/// Decides the socket's next packet, in protocol order: handshake, data,
/// then SHUTDOWN (only once data is out), then a bare credit update.
fn plan_packet(s: &Socket, max_payload: usize) -> Option<Planned> {
    if s.ty == SocketType::Datagram {
        let d = s.dgram.tx_meta.front()?;
        return Some(Planned::Datagram { to: d.addr, len: d.len as usize });
    }
    let c = &s.conn;
    if c.finished {
        return None;
    }
    if c.send_request {
        return Some(Planned::Request);
    }
    if c.send_response {
        return Some(Planned::Response);
    }
    if matches!(s.state, State::Connected | State::Closing) {
        if let Some(plan) = plan_data(s, max_payload) {
            return Some(plan);
        }
        let unsent = c.local_shutdown & !c.shutdown_sent;
        if unsent != 0 && c.tx.is_empty() && c.tx_messages.is_empty() {
            return Some(Planned::Shutdown(c.local_shutdown));
        }
    }
    if c.send_credit_update {
        return Some(Planned::CreditUpdate);
    }
    None
}

fn plan_data(s: &Socket, max_payload: usize) -> Option<Planned> {
    let c = &s.conn;
    let window = c.send_window(s.buffer_size) as usize;
    let run = c.tx.contiguous_at(0, max_payload).len();
    if s.ty == SocketType::SeqPacket {
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
        return Some(Planned::Data { len, flags });
    }
    let len = run.min(window);
    (len > 0).then_some(Planned::Data { len, flags: 0 })
}

/// Whether a packet for `dst_cid` stays inside a stack whose CID is `local_cid`.
fn is_local_cid(local_cid: u32, dst_cid: u64) -> bool {
    dst_cid == local_cid as u64 || dst_cid == VMADDR_CID_LOCAL as u64
}

fn build_header(s: &Socket, plan: Planned, stack_cid: u32) -> Header {
    let local_port = s.local.map_or(0, |l| l.port);
    let (op, len, flags, to) = match plan {
        Planned::Request => (Op::Request, 0, 0, s.peer),
        Planned::Response => (Op::Response, 0, 0, s.peer),
        Planned::Data { len, flags } => (Op::Rw, len, flags, s.peer),
        Planned::Shutdown(flags) => (Op::Shutdown, 0, flags, s.peer),
        Planned::CreditUpdate => (Op::CreditUpdate, 0, 0, s.peer),
        Planned::Datagram { to, len } => (Op::Rw, len, 0, Some(to)),
    };
    let to = to.expect("packets are only planned for sockets with a peer");
    if s.ty == SocketType::Datagram {
        // A datagram socket has no connection: its source CID is the one it
        // is bound to, or the one that reaches `to` (CID 1 for loopback).
        let cid = match s.local.map(|l| l.cid) {
            Some(cid) if cid != VMADDR_CID_ANY => cid,
            _ if to.cid == VMADDR_CID_LOCAL => VMADDR_CID_LOCAL,
            _ => stack_cid,
        };
        return Header::datagram(VsockAddr::new(cid, local_port), to, len as u32);
    }
    Header::new(s.ty, op, VsockAddr::new(s.local_cid, local_port), to)
        .with_len(len as u32)
        .with_flags(flags)
        .with_credit(s.buffer_size, s.conn.fwd_cnt)
}

/// The payload at the head of the socket's send ring, as far as it runs contiguously.
fn head_payload(s: &Socket, len: usize) -> &[u8] {
    let ring = if s.ty == SocketType::Datagram { &s.dgram.tx } else { &s.conn.tx };
    ring.contiguous_at(0, len)
}

fn copy_head(s: &Socket, len: usize, out: &mut Vec<u8>) {
    let ring = if s.ty == SocketType::Datagram { &s.dgram.tx } else { &s.conn.tx };
    out.resize(len, 0);
    let copied = ring.peek(0, out);
    debug_assert_eq!(copied, len);
}
