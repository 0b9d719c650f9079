//! The bare-metal platform's sockets, over the stack `net` runs: each is a
//! stack handle and a non-blocking flag, and each call is one stack call
//! made blocking or not by `net::call`. [`Bare`] names them for the
//! platform contract.
//!
//! The rules the WASI shim applies before the stack sees a call apply here
//! too (a connect to `VMADDR_PORT_ANY` or `VMADDR_CID_ANY` is
//! `InvalidInput`; a refused or reset handshake is `ConnectionRefused`), so
//! the same app sees the same errors on both targets. What the shim adds
//! beyond that, per-component grants and socket quotas, has no place here:
//! the app owns the whole VM.

use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt::Debug;
use core::marker::PhantomData;
use core::ops::Deref;
use core::task::Poll;
use core::time::Duration;

use pier_stack::{Readiness, SocketHandle, SocketType, Stack};

use super::net;
use crate::addr::{VMADDR_CID_ANY, VMADDR_PORT_ANY, VsockAddr};
use crate::io::{self, ErrorKind};
use crate::kind;
use crate::message::RecvMessage;
use crate::net::Shutdown;
use crate::platform::contract::{self, Platform, Wait};

/// The bare-metal platform.
#[derive(Debug)]
pub(crate) enum Bare {}

impl Platform for Bare {
    type Wait = Self;
    type StreamListener = ConnListener<Stream>;
    type Stream = Stream;
    type StreamConnecting = Connecting<kind::Stream>;
    type SeqpacketListener = ConnListener<SeqStream>;
    type Seqpacket = SeqStream;
    type SeqpacketConnecting = Connecting<kind::Seqpacket>;
    type Datagram = Datagram;

    fn local_cid() -> io::Result<u32> {
        net::with(|net| net.stack.local_cid())
    }
}

/// The backlog listeners ask for: std's `TcpListener::bind` on Linux asks
/// 4096 (capped there by somaxconn), and the WASI shim allows as much.
const BACKLOG: usize = 4096;

/// One stack socket, closed when dropped. The socket types deref to it,
/// and through it answer what every socket does (addresses, the inq hint,
/// non-blocking mode, readiness).
#[derive(Debug)]
pub(crate) struct Socket {
    handle: SocketHandle,
    nonblocking: Cell<bool>,
    /// SO_LINGER 0: dropping resets the connection instead of closing it.
    abort_on_drop: Cell<bool>,
}

impl Socket {
    fn open(ty: SocketType) -> io::Result<Self> {
        let handle = net::with(|net| net.stack.socket(ty))?.map_err(net::error)?;
        Ok(Self::from_handle(handle))
    }

    fn from_handle(handle: SocketHandle) -> Self {
        Self { handle, nonblocking: Cell::new(false), abort_on_drop: Cell::new(false) }
    }

    /// One stack call, blocking unless the socket is non-blocking.
    fn call<T>(
        &self,
        mut op: impl FnMut(&mut Stack, SocketHandle, pier_stack::Instant) -> pier_stack::Result<T>,
    ) -> io::Result<T> {
        net::call(self.nonblocking.get(), |stack, now| op(stack, self.handle, now))
    }

    /// A stack call that never waits, and whose packets (if any) leave at
    /// once.
    fn now<T>(
        &self,
        op: impl FnOnce(&mut Stack, SocketHandle) -> pier_stack::Result<T>,
    ) -> io::Result<T> {
        let mut op = Some(op);
        net::call(true, |stack, _| match op.take() {
            Some(op) => op(stack, self.handle),
            None => Err(pier_stack::Error::WouldBlock),
        })
    }

    /// Sends the connect request; `finish_connect` reports the outcome.
    fn start_connect(&self, addr: VsockAddr, timeout: Option<Duration>) -> io::Result<()> {
        if addr.port == VMADDR_PORT_ANY || addr.cid == VMADDR_CID_ANY {
            return Err(io::Error::new(ErrorKind::InvalidInput, "vsock: invalid-argument"));
        }
        if let Some(timeout) = timeout {
            self.now(|s, h| s.set_connect_timeout(h, timeout))?;
        }
        let now = net::now();
        self.now(|s, h| s.connect(h, addr, now))
    }

    fn finish_connect(&self, nonblocking: bool) -> io::Result<()> {
        let handle = self.handle;
        net::call_mapped(nonblocking, |stack, _| stack.finish_connect(handle), net::connect_error)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.now(|s, h| s.peer_addr(h))
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.now(|s, h| s.recv_queued(h))
    }

    fn writable(&self) -> PollRef<'_> {
        self.ready(Readiness::WRITABLE)
    }

    fn ready(&self, flags: Readiness) -> PollRef<'_> {
        PollRef { raw: RawPoll { handle: self.handle, flags }, _socket: PhantomData }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let now = net::now();
        if self.abort_on_drop.get() {
            // SO_LINGER 0: queued data is discarded and the peer reset.
            let _ = self.now(|s, h| s.abort(h, now));
        } else {
            // close(2): queued data still goes out, and the close handshake
            // runs on in the stack, driven by later calls.
            let _ = self.now(|s, h| s.close(h, now));
        }
    }
}

/// Every socket type derefs to its [`Socket`], which answers the calls
/// every socket has.
impl<T: Deref<Target = Socket> + Debug> contract::Socket<Bare> for T {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.now(|s, h| s.local_addr(h))
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        self.ready(Readiness::READABLE)
    }
}

/// A listener for connections of type `C` (stream or seqpacket).
#[derive(Debug)]
pub(crate) struct ConnListener<C> {
    socket: Socket,
    _accepts: PhantomData<C>,
}

impl<K: Kind> contract::Listener<Bare> for ConnListener<Conn<K>> {
    type Conn = Conn<K>;

    fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        // Bound and listening before the driver is polled. The network
        // may have started with `open` just now, and a host connection
        // made while the guest booted arrives with the first poll: polled
        // before the listener exists, it would be refused, and the host
        // would have to connect again (at boot, a round trip of half a
        // millisecond and more on a nested host).
        net::with(|net| {
            net.stack.bind(socket.handle, addr)?;
            net.stack.listen(socket.handle, BACKLOG)
        })?
        .map_err(net::error)?;
        Ok(Self { socket, _accepts: PhantomData })
    }

    fn accept(&self) -> io::Result<(Conn<K>, VsockAddr)> {
        let (handle, peer) = self.socket.call(|s, h, _| s.accept(h))?;
        Ok((Conn { socket: Socket::from_handle(handle), _kind: PhantomData }, peer))
    }
}

/// The stack's socket type of each connection kind.
pub(crate) trait Kind: Debug {
    const TYPE: SocketType;
}

impl Kind for kind::Stream {
    const TYPE: SocketType = SocketType::Stream;
}

impl Kind for kind::Seqpacket {
    const TYPE: SocketType = SocketType::SeqPacket;
}

/// A connected stream or seqpacket socket: what the two share is here,
/// the data calls in each kind's own impl.
#[derive(Debug)]
pub(crate) struct Conn<K> {
    socket: Socket,
    _kind: PhantomData<K>,
}

pub(crate) type Stream = Conn<kind::Stream>;
pub(crate) type SeqStream = Conn<kind::Seqpacket>;

impl<K: Kind> contract::Connection<Bare> for Conn<K> {
    fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        socket.start_connect(addr, timeout)?;
        socket.finish_connect(false)?;
        Ok(Self { socket, _kind: PhantomData })
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.peer_addr()
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => pier_stack::Shutdown::Read,
            Shutdown::Write => pier_stack::Shutdown::Write,
            Shutdown::Both => pier_stack::Shutdown::Both,
        };
        self.socket.now(|s, h| s.shutdown(h, how))
    }

    /// SO_LINGER: `None` closes in order on drop, `Some(0)` resets; a
    /// drop never blocks, so longer timeouts are not supported.
    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        match linger {
            None => self.socket.abort_on_drop.set(false),
            Some(d) if d.is_zero() => self.socket.abort_on_drop.set(true),
            Some(_) => return Err(io::Error::new(ErrorKind::Unsupported, "vsock: not-supported")),
        }
        Ok(())
    }

    fn writable(&self) -> PollRef<'_> {
        self.socket.writable()
    }
}

/// A connect under way, so that an async connect can wait for it without
/// blocking: `finish` reports `WouldBlock` until the peer has answered.
#[derive(Debug)]
pub(crate) struct Connecting<K> {
    /// Taken by the connection once the connect succeeds.
    socket: Option<Socket>,
    _kind: PhantomData<K>,
}

impl<K: Kind> contract::Connecting<Bare> for Connecting<K> {
    type Conn = Conn<K>;

    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        socket.start_connect(addr, timeout)?;
        Ok(Self { socket: Some(socket), _kind: PhantomData })
    }

    fn finish(&mut self) -> io::Result<Conn<K>> {
        self.socket.as_ref().ok_or(ErrorKind::NotConnected)?.finish_connect(true)?;
        let socket = self.socket.take().expect("checked above");
        Ok(Conn { socket, _kind: PhantomData })
    }

    /// The stack makes a socket writable once its connect succeeded or
    /// failed.
    fn ready(&self) -> PollRef<'_> {
        match &self.socket {
            Some(socket) => socket.writable(),
            // Finished: report ready, and `finish` says so.
            None => PollRef {
                raw: RawPoll { handle: SocketHandle::default(), flags: Readiness::WRITABLE },
                _socket: PhantomData,
            },
        }
    }
}

impl<C> Deref for ConnListener<C> {
    type Target = Socket;
    fn deref(&self) -> &Socket {
        &self.socket
    }
}

impl<K> Deref for Conn<K> {
    type Target = Socket;
    fn deref(&self) -> &Socket {
        &self.socket
    }
}

impl Deref for Datagram {
    type Target = Socket;
    fn deref(&self) -> &Socket {
        &self.socket
    }
}

impl contract::ByteStream<Bare> for Stream {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.socket.call(|s, h, _| s.recv(h, buf)).map(|info| info.len)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.socket.call(|s, h, _| s.send(h, buf))
    }

    /// Blocking: waits until everything written has left (or the
    /// connection failed); non-blocking: nothing to do.
    fn flush(&self) -> io::Result<()> {
        if self.socket.nonblocking.get() {
            return Ok(());
        }
        let handle = self.socket.handle;
        // A blocking `until` without a deadline only returns when ready.
        let _ready = net::until(false, None, |s, _| match s.send_queued(handle) {
            Ok(0) | Err(_) => Poll::Ready(()),
            Ok(_) => Poll::Pending,
        })?;
        Ok(())
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.socket.recv_queued()
    }

    fn send_queued(&self) -> io::Result<usize> {
        self.socket.now(|s, h| s.send_queued(h))
    }
}

impl contract::MessageStream<Bare> for SeqStream {
    fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send_message(h, data, end_of_record))?;
        Ok(data.len())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        let info = self.socket.call(|s, h, _| s.recv(h, buf))?;
        Ok(RecvMessage {
            len: info.len,
            truncated: info.truncated,
            end_of_record: info.end_of_record,
        })
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.socket.recv_queued()
    }
}

#[derive(Debug)]
pub(crate) struct Datagram {
    socket: Socket,
}

impl contract::Datagram<Bare> for Datagram {
    fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = Socket::open(SocketType::Datagram)?;
        socket.now(|s, h| s.bind(h, addr))?;
        Ok(Self { socket })
    }

    fn connect(&mut self, peer: VsockAddr) -> io::Result<()> {
        let now = net::now();
        self.socket.now(|s, h| s.connect(h, peer, now))
    }

    fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send_to(h, buf, to))?;
        Ok(buf.len())
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send(h, buf))
    }

    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        let info = self.socket.call(|s, h, _| s.recv(h, buf))?;
        let from =
            info.from.ok_or_else(|| io::Error::other("vsock: a datagram without a sender"))?;
        Ok((info.len, from))
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.recv(h, buf)).map(|info| info.len)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.peer_addr()
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.socket.recv_queued()
    }

    fn writable(&self) -> PollRef<'_> {
        self.socket.writable()
    }
}

/// One condition a `Poller` waits for: a socket and the flags that make
/// it ready. It borrows the socket so the socket outlives the wait.
#[derive(Debug)]
pub(crate) struct PollRef<'a> {
    raw: RawPoll,
    _socket: PhantomData<&'a Socket>,
}

/// A `PollRef` the async reactor keeps across turns of the executor. A
/// stale one is harmless: a closed socket's handle reads as ready.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll {
    handle: SocketHandle,
    flags: Readiness,
}

impl RawPoll {
    /// Whether the call waiting for the flags would not block: the socket
    /// is ready for them, or the call would fail or end at once (an error,
    /// a hangup, a send after SHUT_WR), or the socket is gone (the call
    /// then reports why). The stack's `readiness` is Linux's poll mask,
    /// which leaves out a send that can only fail; `unblocked` has it, as
    /// the WASI shim's pollables do.
    fn holds(self, stack: &Stack) -> bool {
        stack
            .unblocked(self.handle)
            .map_or(true, |r| r.intersects(self.flags | Readiness::ERROR | Readiness::HANGUP))
    }
}

impl Wait for Bare {
    type PollRef<'a> = PollRef<'a>;
    type RawPoll = RawPoll;

    fn raw(ready: &PollRef<'_>) -> Option<RawPoll> {
        Some(ready.raw)
    }

    /// poll(2) over stack readiness. The driver is pumped while it waits,
    /// so the stack's timers run and packets move.
    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<RawPoll>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        let deadline = timeout.map(|t| net::now() + t);
        let start = ready.len();
        let outcome = net::until(false, deadline, |stack, _| {
            ready.truncate(start);
            ready.extend((0..count).filter(|&i| condition(i).is_none_or(|c| c.holds(stack))));
            if ready.len() == start { Poll::Pending } else { Poll::Ready(()) }
        })?;
        if outcome.is_pending() {
            ready.truncate(start);
        }
        Ok(())
    }
}
