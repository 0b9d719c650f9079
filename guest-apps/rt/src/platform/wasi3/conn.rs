//! Listening and connecting, shared by stream and seqpacket sockets: both
//! resources have the same `create`, `bind`, `listen` (a stream of
//! accepted sockets) and `async connect`, and differ only in what a
//! connected socket becomes ([`SockKind::connected`]).
//!
//! An accept is the listener stream's `next` kept in flight; a connect is
//! the `connect` call kept in flight, owning its socket, raced against a
//! timer when the caller gave a timeout.

use std::cell::{Cell, RefCell};
use std::fmt::Debug;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use wit_bindgen::StreamReader;

use super::bindings::vsock::sockets::types::{ErrorCode, VsockAddress};
use super::convert::error;
use super::wait::in_async_run;
use super::wait::{Pending, PollRef, Ready as _, Wasi3Wait, block, timer, try_now, wait};
use crate::addr::VsockAddr;
use crate::platform::contract;

/// A stream or seqpacket socket resource, as listening and connecting
/// need it. wit-bindgen makes each its own type with inherent methods;
/// `stream` and `seqpacket` implement this for theirs by forwarding.
pub(crate) trait SockKind: 'static {
    type Socket: 'static + Debug;
    /// What a connected socket becomes.
    type Conn;
    fn create() -> Result<Self::Socket, ErrorCode>;
    fn bind(s: &Self::Socket, local: VsockAddress) -> Result<(), ErrorCode>;
    fn set_listen_backlog_size(s: &Self::Socket, value: u64) -> Result<(), ErrorCode>;
    fn listen(s: &Self::Socket) -> Result<StreamReader<Self::Socket>, ErrorCode>;
    fn connect(
        s: &Self::Socket,
        remote: VsockAddress,
    ) -> impl Future<Output = Result<(), ErrorCode>> + '_;
    fn local_address(s: &Self::Socket) -> Result<VsockAddress, ErrorCode>;
    fn remote_address(s: &Self::Socket) -> Result<VsockAddress, ErrorCode>;
    /// The connection a connected socket (accepted, or connected by us)
    /// becomes.
    fn connected(s: Self::Socket) -> Self::Conn;
}

/// The backlog every listener asks for: Linux's default somaxconn.
const LISTEN_BACKLOG: u64 = 4096;

/// One accept in flight: the listener stream and what `next` gave.
type Accepted<S> = (StreamReader<S>, Option<S>);

/// A listening stream or seqpacket socket.
pub(crate) struct Listener<K: SockKind> {
    // Declared before `socket`, so dropped first: the stream of accepted
    // sockets is the listening socket's child.
    accept: Pending<Accepted<K::Socket>>,
    incoming: RefCell<Option<StreamReader<K::Socket>>>,
    socket: K::Socket,
    nonblocking: Cell<bool>,
}

impl<K: SockKind> Debug for Listener<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("socket", &self.socket)
            .field("accept", &self.accept)
            .finish()
    }
}

impl<K: SockKind> Listener<K> {
    /// Starts the next accept unless one is in flight or done.
    fn start_accept(&self) {
        if !self.accept.is_idle() {
            return;
        }
        if let Some(mut incoming) = self.incoming.borrow_mut().take() {
            self.accept.start(async move {
                let next = incoming.next().await;
                (incoming, next)
            });
        }
    }
}

impl<K: SockKind> contract::Socket<Wasi3Wait> for Listener<K> {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        K::local_address(&self.socket).map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        self.start_accept();
        PollRef::Op(&self.accept)
    }
}

impl<K: SockKind> contract::Listener<Wasi3Wait> for Listener<K> {
    type Conn = K::Conn;

    fn bind(addr: VsockAddr) -> io::Result<Self> {
        in_async_run()?;
        let socket = K::create().map_err(error)?;
        K::bind(&socket, addr.into()).map_err(error)?;
        // As std's `TcpListener::bind` on Linux: ask for the most the host
        // allows. vsock refuses a connection whose listener's backlog is
        // full, so a small default would refuse bursts a server could
        // take.
        K::set_listen_backlog_size(&socket, LISTEN_BACKLOG).map_err(error)?;
        let incoming = K::listen(&socket).map_err(error)?;
        Ok(Self {
            accept: Pending::default(),
            incoming: RefCell::new(Some(incoming)),
            socket,
            nonblocking: Cell::new(false),
        })
    }

    fn accept(&self) -> io::Result<(K::Conn, VsockAddr)> {
        loop {
            if let Some((incoming, next)) = self.accept.take() {
                *self.incoming.borrow_mut() = Some(incoming);
                let socket = next.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::ConnectionAborted, "vsock: the listener ended")
                })?;
                let peer = K::remote_address(&socket);
                let conn = K::connected(socket);
                return Ok((conn, peer.map_err(error)?.into()));
            }
            self.start_accept();
            wait(self.nonblocking.get(), &self.accept)?;
        }
    }
}

/// A connect in flight: the socket and how its connect ended.
type Connected<S> = (S, io::Result<()>);

/// A connect under way, so an async connect can wait for it without
/// blocking: `finish` reports `WouldBlock` until the peer has answered.
pub(crate) struct Connecting<K: SockKind> {
    op: Pending<Connected<K::Socket>>,
    finished: Cell<bool>,
}

impl<K: SockKind> Debug for Connecting<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting").field("op", &self.op).finish()
    }
}

impl<K: SockKind> contract::Connecting<Wasi3Wait> for Connecting<K> {
    type Conn = K::Conn;

    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        in_async_run()?;
        let socket = K::create().map_err(error)?;
        let op = Pending::default();
        op.start(async move {
            let result = {
                let mut connect = pin!(K::connect(&socket, addr.into()));
                let mut deadline = timeout.map(timer);
                poll_fn(|cx| {
                    if let Poll::Ready(r) = connect.as_mut().poll(cx) {
                        return Poll::Ready(r.map_err(error));
                    }
                    let timed_out =
                        deadline.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready());
                    if timed_out {
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "vsock: timeout")))
                    } else {
                        Poll::Pending
                    }
                })
                .await
            };
            (socket, result)
        });
        Ok(Self { op, finished: Cell::new(false) })
    }

    fn finish(&mut self) -> io::Result<K::Conn> {
        if self.finished.get() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        if !self.op.is_done() && !try_now(|cx| self.op.poll_ready(cx)) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.finished.set(true);
        self.take_connection()
    }

    fn ready(&self) -> PollRef<'_> {
        PollRef::Op(&self.op)
    }
}

impl<K: SockKind> Connecting<K> {
    /// The connection, once `op` finished (its result not taken yet).
    fn take_connection(&self) -> io::Result<K::Conn> {
        let (socket, result) = self.op.take().ok_or(io::ErrorKind::NotConnected)?;
        result?;
        Ok(K::connected(socket))
    }
}

/// [`contract::Connection::connect`] for both kinds: the connect, waited
/// for.
pub(super) fn connect<K: SockKind>(
    addr: VsockAddr,
    timeout: Option<Duration>,
) -> io::Result<K::Conn> {
    let connecting = <Connecting<K> as contract::Connecting<Wasi3Wait>>::start(addr, timeout)?;
    block(|cx| connecting.op.poll_ready(cx), |_| {});
    connecting.take_connection()
}

/// `set_linger` for both kinds. vsock:sockets@0.2.0 has no SO_LINGER:
/// dropping a connection always closes it in order.
pub(super) fn linger(linger: Option<Duration>) -> io::Result<()> {
    match linger {
        None => Ok(()),
        Some(_) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "vsock: SO_LINGER is not in vsock:sockets@0.2.0",
        )),
    }
}
