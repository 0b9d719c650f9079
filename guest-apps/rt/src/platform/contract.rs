//! The platform contract: what every platform supplies, as traits, so the
//! compiler holds each platform to the same list and the public shells
//! are written once, against these traits rather than against a platform.
//!
//! A platform is a type implementing [`Platform`]: its associated types are
//! its socket types, each implementing the trait of its role, and its
//! [`Wait`] type says how its readiness is waited on. The shells reach a
//! platform's types only through these associated types (a connection
//! kind's through [`Kind`]), so nothing of a platform appears in a public
//! signature.
//!
//! The rules every implementation follows, whatever its transport:
//!
//! - A call blocks until it can make progress, unless the socket was made
//!   non-blocking: then it returns `WouldBlock` instead of waiting.
//!   Waiting never spins without end: it waits on the same condition the
//!   socket's readiness reports.
//! - Errors are `io::Error`s whose kinds follow the Linux errno of the
//!   situation (`ConnectionRefused`, `ConnectionReset`, `PermissionDenied`,
//!   `Unsupported` when the transport lacks the socket type, ...), the
//!   same on every platform for the same failure.
//! - Readiness is level-triggered: a condition stays ready while it holds,
//!   and a socket that holds what the next call needs already is ready
//!   without a wait.

use alloc::vec::Vec;
use core::fmt::Debug;
use core::time::Duration;

use crate::addr::VsockAddr;
use crate::io;
use crate::kind;
use crate::message::RecvMessage;
use crate::net::Shutdown;

/// A platform: the socket types it supplies, and how they are waited on.
pub(crate) trait Platform {
    /// How this platform's sockets are waited on.
    type Wait: Wait;
    /// A listening stream socket.
    type StreamListener: Listener<Self::Wait, Conn = Self::Stream>;
    /// A connected stream socket.
    type Stream: ByteStream<Self::Wait>;
    /// A stream connect under way.
    type StreamConnecting: Connecting<Self::Wait, Conn = Self::Stream>;
    /// A listening seqpacket socket.
    type SeqpacketListener: Listener<Self::Wait, Conn = Self::Seqpacket>;
    /// A connected seqpacket socket.
    type Seqpacket: MessageStream<Self::Wait>;
    /// A seqpacket connect under way.
    type SeqpacketConnecting: Connecting<Self::Wait, Conn = Self::Seqpacket>;
    /// A datagram socket.
    type Datagram: Datagram<Self::Wait>;

    /// This side's CID (IOCTL_VM_SOCKETS_GET_LOCAL_CID).
    fn local_cid() -> io::Result<u32>;
}

/// How a platform waits: its readiness conditions, and the one wait on
/// them that the `Poller` and the async reactor share.
pub(crate) trait Wait {
    /// One condition a `Poller` waits for. It borrows its socket, so the
    /// socket outlives the wait.
    type PollRef<'a>: Debug;
    /// A condition without its borrow, which the async reactor keeps
    /// across turns of the executor. The reactor forgets it before the
    /// socket it came from is dropped, so one it waits on is always live.
    type RawPoll: Copy + Debug;

    /// `ready` without its borrow; `None` when it holds already (the
    /// socket has what the next call needs), so there is nothing to wait
    /// for.
    fn raw(ready: &Self::PollRef<'_>) -> Option<Self::RawPoll>;

    /// Waits until at least one of `count` conditions holds or `timeout`
    /// passes, and appends the indices of those that hold to `ready`, in
    /// ascending order (none after a timeout; `Some(Duration::ZERO)` only
    /// looks). `condition(i)` is the `i`th condition, `None` for one that
    /// holds already: the others are then only looked at. The caller
    /// always gives something to wait for: a condition or a timeout.
    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<Self::RawPoll>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()>;
}

/// A connection kind's types in platform `B`, for code that is generic
/// over the kind.
pub(crate) trait Kind<B: Platform> {
    /// The kind's listener.
    type Listener: Listener<B::Wait, Conn = Self::Conn>;
    /// The kind's connection.
    type Conn: Connection<B::Wait>;
    /// The kind's connect under way.
    type Connecting: Connecting<B::Wait, Conn = Self::Conn>;
}

impl<B: Platform> Kind<B> for kind::Stream {
    type Listener = B::StreamListener;
    type Conn = B::Stream;
    type Connecting = B::StreamConnecting;
}

impl<B: Platform> Kind<B> for kind::Seqpacket {
    type Listener = B::SeqpacketListener;
    type Conn = B::Seqpacket;
    type Connecting = B::SeqpacketConnecting;
}

/// What every socket answers.
pub(crate) trait Socket<W: Wait>: Debug + Sized {
    /// The address the socket is bound to; for a client connection, the
    /// ephemeral port it was given.
    fn local_addr(&self) -> io::Result<VsockAddr>;
    /// In non-blocking mode, calls that would wait return `WouldBlock`.
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
    /// Ready when the next receive (for a listener, the next accept) will
    /// not wait: something to receive, the end, or an error.
    fn readable(&self) -> W::PollRef<'_>;
}

/// A listening stream or seqpacket socket.
pub(crate) trait Listener<W: Wait>: Socket<W> {
    /// The connections it accepts.
    type Conn;
    /// Binds to `addr` and listens, with the largest backlog the transport
    /// allows (std's `TcpListener::bind` asks 4096 on Linux): vsock
    /// refuses a connection whose listener's backlog is full.
    fn bind(addr: VsockAddr) -> io::Result<Self>;
    /// One established connection and its peer's address.
    fn accept(&self) -> io::Result<(Self::Conn, VsockAddr)>;
}

/// What a connected stream and a connected seqpacket socket share.
///
/// Dropping one closes it as close(2) does: what was sent is still
/// delivered, then the peer sees the end, unless SO_LINGER 0 was set.
pub(crate) trait Connection<W: Wait>: Socket<W> {
    /// Connects to `addr`, blocking (whatever the mode, since there is no
    /// socket yet to make non-blocking) until the peer answers or the
    /// connect timeout passes: `timeout`, or the transport's default of
    /// 2 seconds. A connect to `VMADDR_CID_ANY` or `VMADDR_PORT_ANY` is
    /// `InvalidInput`; a peer with no listener refuses
    /// (`ConnectionRefused`).
    fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self>;
    /// The peer's address.
    fn peer_addr(&self) -> io::Result<VsockAddr>;
    /// Shuts down receiving, sending or both; never waits. After
    /// `Shutdown::Write` the peer receives what was sent, then the end.
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// SO_LINGER: `None` closes in order on drop, `Some(Duration::ZERO)`
    /// resets the connection instead; other timeouts are `Unsupported`,
    /// since dropping never blocks.
    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()>;
    /// Ready when the next send will not wait: the peer has room, or the
    /// connection has failed.
    fn writable(&self) -> W::PollRef<'_>;
}

/// A connected stream socket's data calls.
pub(crate) trait ByteStream<W: Wait>: Connection<W> {
    /// Reads some bytes; `Ok(0)` once the peer has shut down sending and
    /// everything was read (and for an empty `buf`).
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes some of `buf`, as much as the transport takes now, and says
    /// how much; `Ok(0)` only for an empty `buf`.
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Written bytes are delivered without a flush; blocking, this waits
    /// until they have left, and non-blocking it does nothing.
    fn flush(&self) -> io::Result<()>;
    /// Bytes a `read` could return now (SIOCINQ); 1 once the peer has
    /// finished and everything was read, so that a loop reading while
    /// this is non-zero still makes the read that returns the end.
    fn recv_queued(&self) -> io::Result<usize>;
    /// Bytes written but not yet handed to the transport (SIOCOUTQ).
    fn send_queued(&self) -> io::Result<usize>;
}

/// A connected seqpacket socket's data calls: one message per call.
pub(crate) trait MessageStream<W: Wait>: Connection<W> {
    /// Sends `data` as one message, whole or not at all, marked as the end
    /// of a record when `end_of_record` is set; returns its length. A
    /// message longer than the connection can ever carry is
    /// `InvalidInput` (EMSGSIZE); an empty one is accepted and not sent.
    fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize>;
    /// Receives one message: as much as fits in `buf`, the rest discarded
    /// and reported as truncated; a `len` of 0 is the end.
    fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage>;
    /// Bytes of messages queued for `recv` (msg_inq), as of the last time
    /// messages were fetched from the transport.
    fn recv_queued(&self) -> io::Result<usize>;
}

/// A connect under way, so an async connect can wait for it without
/// blocking the other tasks.
pub(crate) trait Connecting<W: Wait>: Debug + Sized {
    /// The connection it becomes.
    type Conn;
    /// Starts connecting to `addr` (with [`Connection::connect`]'s rules
    /// and timeout) and returns at once.
    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self>;
    /// The connection once the peer accepted, `WouldBlock` until it has
    /// answered, or why it failed; `NotConnected` once it has returned the
    /// connection.
    fn finish(&mut self) -> io::Result<Self::Conn>;
    /// Ready when `finish` will not return `WouldBlock`.
    fn ready(&self) -> W::PollRef<'_>;
}

/// A datagram socket. Datagrams are at most 64 KiB, delivery is best
/// effort, and datagram ports are a space of their own.
pub(crate) trait Datagram<W: Wait>: Socket<W> {
    /// A socket bound to `addr`.
    fn bind(addr: VsockAddr) -> io::Result<Self>;
    /// Fixes the peer: `send` goes there and only its datagrams are
    /// received. Datagrams received but not yet read are dropped.
    fn connect(&mut self, peer: VsockAddr) -> io::Result<()>;
    /// Sends one datagram to `to` (on a connected socket, the peer);
    /// returns its length.
    fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize>;
    /// Sends one datagram to the connected peer; `NotConnected` without
    /// one.
    fn send(&self, buf: &[u8]) -> io::Result<usize>;
    /// Receives one datagram and its sender; what does not fit in `buf`
    /// is discarded.
    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)>;
    /// Receives one datagram (from the connected peer).
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// The connected peer.
    fn peer_addr(&self) -> io::Result<VsockAddr>;
    /// Payload bytes queued for `recv`, as of the last fetch from the
    /// transport.
    fn recv_queued(&self) -> io::Result<usize>;
    /// Ready when a send will not wait.
    fn writable(&self) -> W::PollRef<'_>;
}
