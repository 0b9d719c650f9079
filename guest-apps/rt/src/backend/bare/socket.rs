//! The socket items the shells in `stream`, `seqpacket` and `datagram`
//! wrap, over the stack `net` runs: each is a stack handle and a
//! non-blocking flag, and each call is one stack call made blocking or not
//! by `net::call`.
//!
//! The rules the WASI shim applies before the stack sees a call apply here
//! too (a connect to `VMADDR_PORT_ANY` or `VMADDR_CID_ANY` is
//! `InvalidInput`; a refused or reset handshake is `ConnectionRefused`), so
//! the same app sees the same errors on both targets. What the shim adds
//! beyond that, per-component grants and socket quotas, has no place here:
//! the app owns the whole VM.

use alloc::vec::Vec;
use core::cell::Cell;
use core::marker::PhantomData;
use core::ops::Deref;
use core::task::Poll;
use core::time::Duration;

use pier_stack::{Readiness, SocketHandle, SocketType, Stack};

use super::net;
use crate::io::{self, ErrorKind};
use crate::{RecvMessage, Shutdown, VMADDR_CID_ANY, VMADDR_PORT_ANY, VsockAddr};

/// The backlog listeners ask for: std's `TcpListener::bind` on Linux asks
/// 4096 (capped there by somaxconn), and the WASI shim allows as much.
const BACKLOG: usize = 4096;

pub(crate) fn local_cid() -> io::Result<u32> {
    net::with(|net| net.stack.local_cid())
}

/// One stack socket, closed when dropped. The socket types deref to it
/// for the calls every type has (addresses, the inq hint, non-blocking
/// mode, readiness), which the backend contract asks of each.
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
        Ok(Self { handle, nonblocking: Cell::new(false), abort_on_drop: Cell::new(false) })
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

    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        self.now(|s, h| s.local_addr(h))
    }

    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.now(|s, h| s.peer_addr(h))
    }

    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        self.now(|s, h| s.recv_queued(h))
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    pub(crate) fn readable(&self) -> PollRef<'_> {
        self.ready(Readiness::READABLE)
    }

    pub(crate) fn writable(&self) -> PollRef<'_> {
        self.ready(Readiness::WRITABLE)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => pier_stack::Shutdown::Read,
            Shutdown::Write => pier_stack::Shutdown::Write,
            Shutdown::Both => pier_stack::Shutdown::Both,
        };
        self.now(|s, h| s.shutdown(h, how))
    }

    fn ready(&self, flags: Readiness) -> PollRef<'_> {
        PollRef { handle: self.handle, flags, _socket: PhantomData }
    }
}

impl Socket {
    /// SO_LINGER: `None` closes in order on drop, `Some(0)` resets; a
    /// drop never blocks, so longer timeouts are not supported.
    pub(crate) fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        match linger {
            None => self.abort_on_drop.set(false),
            Some(d) if d.is_zero() => self.abort_on_drop.set(true),
            Some(_) => return Err(io::Error::new(ErrorKind::Unsupported, "vsock: not-supported")),
        }
        Ok(())
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

/// A listener for connections of type `C` (stream or seqpacket).
#[derive(Debug)]
pub(crate) struct ConnListener<C> {
    socket: Socket,
    _accepts: PhantomData<C>,
}

pub(crate) type Listener = ConnListener<Stream>;
pub(crate) type SeqListener = ConnListener<SeqStream>;

impl<K: Kind> ConnListener<Conn<K>> {
    pub(crate) fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        socket.now(|s, h| s.bind(h, addr))?;
        socket.now(|s, h| s.listen(h, BACKLOG))?;
        Ok(Self { socket, _accepts: PhantomData })
    }

    pub(crate) fn accept(&self) -> io::Result<(Conn<K>, VsockAddr)> {
        let (handle, peer) = self.socket.call(|s, h, _| s.accept(h))?;
        let socket =
            Socket { handle, nonblocking: Cell::new(false), abort_on_drop: Cell::new(false) };
        Ok((Conn { socket, _kind: PhantomData }, peer))
    }
}

/// The two connected socket types, as type parameters.
pub(crate) trait Kind {
    const TYPE: SocketType;
}

#[derive(Debug)]
pub(crate) enum StreamKind {}
impl Kind for StreamKind {
    const TYPE: SocketType = SocketType::Stream;
}

#[derive(Debug)]
pub(crate) enum SeqpacketKind {}
impl Kind for SeqpacketKind {
    const TYPE: SocketType = SocketType::SeqPacket;
}

/// A connected stream or seqpacket socket: what the two share is here,
/// the data calls in each type's own `impl`.
#[derive(Debug)]
pub(crate) struct Conn<K> {
    socket: Socket,
    _kind: PhantomData<K>,
}

pub(crate) type Stream = Conn<StreamKind>;
pub(crate) type SeqStream = Conn<SeqpacketKind>;

impl<K: Kind> Conn<K> {
    pub(crate) fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        socket.start_connect(addr, timeout)?;
        socket.finish_connect(false)?;
        Ok(Self { socket, _kind: PhantomData })
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

pub(crate) type StreamConnecting = Connecting<StreamKind>;
pub(crate) type SeqConnecting = Connecting<SeqpacketKind>;

impl<K: Kind> Connecting<K> {
    pub(crate) fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = Socket::open(K::TYPE)?;
        socket.start_connect(addr, timeout)?;
        Ok(Self { socket: Some(socket), _kind: PhantomData })
    }

    pub(crate) fn finish(&mut self) -> io::Result<Conn<K>> {
        self.socket.as_ref().ok_or(ErrorKind::NotConnected)?.finish_connect(true)?;
        let socket = self.socket.take().expect("checked above");
        Ok(Conn { socket, _kind: PhantomData })
    }

    /// Ready when `finish` will not report `WouldBlock`: the stack makes
    /// a socket writable once its connect succeeded or failed.
    pub(crate) fn ready(&self) -> PollRef<'_> {
        match &self.socket {
            Some(socket) => socket.writable(),
            // Finished: report ready, and `finish` says so.
            None => PollRef {
                handle: SocketHandle::default(),
                flags: Readiness::WRITABLE,
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

impl Stream {
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.socket.call(|s, h, _| s.recv(h, buf)).map(|info| info.len)
    }
    pub(crate) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.socket.call(|s, h, _| s.send(h, buf))
    }
    /// Blocking: waits until everything written has left (or the
    /// connection failed); non-blocking: nothing to do.
    pub(crate) fn flush(&self) -> io::Result<()> {
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
    pub(crate) fn send_queued(&self) -> io::Result<usize> {
        self.socket.now(|s, h| s.send_queued(h))
    }
}

impl SeqStream {
    pub(crate) fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send_message(h, data, end_of_record))?;
        Ok(data.len())
    }
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        let info = self.socket.call(|s, h, _| s.recv(h, buf))?;
        Ok(RecvMessage {
            len: info.len,
            truncated: info.truncated,
            end_of_record: info.end_of_record,
        })
    }
}

#[derive(Debug)]
pub(crate) struct Datagram {
    socket: Socket,
}

impl Datagram {
    pub(crate) fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = Socket::open(SocketType::Datagram)?;
        socket.now(|s, h| s.bind(h, addr))?;
        Ok(Self { socket })
    }
    pub(crate) fn connect(&mut self, peer: VsockAddr) -> io::Result<()> {
        let now = net::now();
        self.socket.now(|s, h| s.connect(h, peer, now))
    }
    pub(crate) fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send_to(h, buf, to))?;
        Ok(buf.len())
    }
    pub(crate) fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.send(h, buf))
    }
    pub(crate) fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        let info = self.socket.call(|s, h, _| s.recv(h, buf))?;
        let from =
            info.from.ok_or_else(|| io::Error::other("vsock: a datagram without a sender"))?;
        Ok((info.len, from))
    }
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.call(|s, h, _| s.recv(h, buf)).map(|info| info.len)
    }
}

/// One condition a `Poller` waits for: a socket and the flags that make
/// it ready. It borrows the socket so the socket outlives the wait.
#[derive(Debug)]
pub(crate) struct PollRef<'a> {
    handle: SocketHandle,
    flags: Readiness,
    _socket: PhantomData<&'a Socket>,
}

impl PollRef<'_> {
    /// The condition without its borrow, for the async reactor. A stale
    /// one is harmless: a closed socket's handle reads as ready.
    pub(crate) fn raw(&self) -> Option<RawPoll> {
        Some(RawPoll { handle: self.handle, flags: self.flags })
    }
}

/// A `PollRef` the async reactor keeps across turns of the executor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll {
    handle: SocketHandle,
    flags: Readiness,
}

/// Whether the socket is ready for `flags`, or has an error or hangup (a
/// call then returns at once), or is gone (the call then reports why).
fn is_ready(stack: &Stack, handle: SocketHandle, flags: Readiness) -> bool {
    stack
        .readiness(handle)
        .map_or(true, |r| r.intersects(flags | Readiness::ERROR | Readiness::HANGUP))
}

/// The async reactor's wait: `poll` over raw conditions, appending the
/// ready ones' indices to `ready`. The driver is pumped while it waits,
/// so the stack's timers run and packets move.
pub(crate) fn wait_raw(
    keys: &[RawPoll],
    timeout: Option<Duration>,
    ready: &mut Vec<usize>,
) -> io::Result<()> {
    if keys.is_empty() && timeout.is_none() {
        return Err(io::Error::new(ErrorKind::InvalidInput, "poll: nothing to wait for"));
    }
    let deadline = timeout.map(|t| net::now() + t);
    let start = ready.len();
    let outcome = net::until(false, deadline, |stack, _| {
        ready.truncate(start);
        ready.extend(
            keys.iter()
                .enumerate()
                .filter(|(_, k)| is_ready(stack, k.handle, k.flags))
                .map(|(i, _)| i),
        );
        if ready.len() == start { Poll::Pending } else { Poll::Ready(()) }
    })?;
    if outcome.is_pending() {
        ready.truncate(start);
    }
    Ok(())
}

/// poll(2) over stack readiness: an entry is ready when its flags, an
/// error or a hangup are set (a call on it then returns at once), or when
/// its socket is gone (the call then reports why).
pub(crate) fn poll(entries: &[PollRef<'_>], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    if entries.is_empty() && timeout.is_none() {
        return Err(io::Error::new(ErrorKind::InvalidInput, "poll: nothing to wait for"));
    }
    let deadline = timeout.map(|t| net::now() + t);
    let mut ready = Vec::new();
    let outcome = net::until(false, deadline, |stack, _| {
        ready.clear();
        for (i, entry) in entries.iter().enumerate() {
            if is_ready(stack, entry.handle, entry.flags) {
                ready.push(i);
            }
        }
        if ready.is_empty() { Poll::Pending } else { Poll::Ready(()) }
    })?;
    if outcome.is_pending() {
        ready.clear();
    }
    Ok(ready)
}
