//! Async stream sockets, tokio-vsock's shape: `accept().await`, an
//! [`Incoming`] stream of connections, and streams that read and write
//! through the `futures-io` traits and split into owned halves, so a
//! reader task and a writer task can share one connection.
//!
//! Each type wraps the blocking type of the same name in non-blocking
//! mode: an operation is the blocking type's call, retried when the
//! reactor says its socket is ready (`reactor::Interest`), so both APIs
//! share one implementation per backend and report the same errors.

use alloc::rc::Rc;
use core::future::poll_fn;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use futures_core::Stream;

use super::io::{AsyncRead, AsyncWrite};
use super::reactor::Interest;
use crate::io;
use crate::{Shutdown, VsockAddr, backend};

/// A listening stream socket whose `accept` is a future.
///
/// ```no_run
/// use pier_rt::asynch::{self, AsyncReadExt, AsyncWriteExt, VsockListener};
/// use pier_rt::{VsockAddr, VsockAddrExt};
///
/// # async fn serve() -> std::io::Result<()> {
/// let listener = VsockListener::bind(VsockAddr::any_cid(1234))?;
/// loop {
///     let (mut stream, _peer) = listener.accept().await?;
///     asynch::spawn(async move {
///         let mut buf = [0; 4096];
///         while let Ok(n @ 1..) = stream.read(&mut buf).await {
///             if stream.write_all(&buf[..n]).await.is_err() {
///                 break;
///             }
///         }
///     });
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct VsockListener {
    // Before `inner`: the reactor must forget the socket's pollable first.
    accepts: Interest,
    inner: crate::VsockListener,
}

impl VsockListener {
    /// Binds to `addr` and starts listening; see
    /// [`crate::VsockListener::bind`]. Binding never waits on a peer, so
    /// this is not a future.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        Self::from_blocking(crate::VsockListener::bind(addr)?)
    }

    /// Makes a blocking listener async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::VsockListener) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { accepts: Interest::new(), inner })
    }

    /// Accepts one connection once a peer has connected.
    pub async fn accept(&self) -> io::Result<(VsockStream, VsockAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// `accept` as a poll function, for hand-written futures.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(VsockStream, VsockAddr)>> {
        self.accepts
            .poll_io(cx, || self.inner.readable().0.raw(), || self.inner.accept())
            .map(|r| r.and_then(|(s, peer)| Ok((VsockStream::from_blocking(s)?, peer))))
    }

    /// The accepted connections as an endless [`Stream`].
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }
}

/// The [`Stream`] of [`VsockListener::incoming`]; it never ends.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a VsockListener,
}

impl Stream for Incoming<'_> {
    type Item = io::Result<VsockStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

/// A backend's connect under way, as `connect` needs it.
pub(super) trait Connecting: Sized {
    type Conn;
    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self>;
    fn finish(&mut self) -> io::Result<Self::Conn>;
    fn ready(&self) -> Option<backend::RawPoll>;
}

macro_rules! connecting {
    ($($ty:ty => $conn:ty),*) => {$(
        impl Connecting for $ty {
            type Conn = $conn;
            fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
                <$ty>::start(addr, timeout)
            }
            fn finish(&mut self) -> io::Result<$conn> {
                <$ty>::finish(self)
            }
            fn ready(&self) -> Option<backend::RawPoll> {
                <$ty>::ready(self).raw()
            }
        }
    )*};
}

connecting!(backend::StreamConnecting => backend::Stream, backend::SeqConnecting => backend::SeqStream);

/// Starts a connect and waits for its outcome without blocking the other
/// tasks.
pub(super) async fn connect<C: Connecting>(
    addr: VsockAddr,
    timeout: Option<Duration>,
) -> io::Result<C::Conn> {
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero connect timeout"));
    }
    let mut connecting = C::start(addr, timeout)?;
    // Declared after `connecting`, so dropped first: the reactor lets go
    // of the connect's pollable before it goes.
    let waits = Interest::new();
    poll_fn(|cx| match connecting.finish() {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            waits.wait(cx, connecting.ready());
            Poll::Pending
        }
        result => Poll::Ready(result),
    })
    .await
}

/// What a connection and its halves share: the socket and one reactor
/// slot per direction.
#[derive(Debug)]
pub(super) struct Shared<S> {
    pub(super) reads: Interest,
    pub(super) writes: Interest,
    pub(super) inner: S,
}

impl<S> Shared<S> {
    pub(super) fn new(inner: S) -> Self {
        Self { reads: Interest::new(), writes: Interest::new(), inner }
    }
}

impl Shared<crate::VsockStream> {
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        use crate::io::Read;
        self.reads.poll_io(cx, || self.inner.readable().0.raw(), || (&self.inner).read(buf))
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        use crate::io::Write;
        self.writes.poll_io(cx, || self.inner.writable().0.raw(), || (&self.inner).write(buf))
    }

    fn poll_close(&self) -> Poll<io::Result<()>> {
        Poll::Ready(self.inner.shutdown(Shutdown::Write))
    }
}

/// A connected stream socket, read and written through [`AsyncRead`] and
/// [`AsyncWrite`] (implemented for `&VsockStream` too, so one task can
/// read and write it at once with `futures::join!`-style code).
///
/// `poll_close` (`close().await`) is the half-close,
/// `shutdown(Shutdown::Write)`; `poll_flush` returns at once, since
/// written bytes are delivered without one. Dropping the stream closes
/// the connection as the blocking type does.
#[derive(Debug)]
pub struct VsockStream {
    shared: Shared<crate::VsockStream>,
}

impl VsockStream {
    /// Connects to `addr` once the peer answers; see
    /// [`crate::VsockStream::connect`] (the same errors, and a 2-second
    /// connect timeout).
    pub async fn connect(addr: VsockAddr) -> io::Result<Self> {
        Self::connect_timeout(addr, None).await
    }

    /// [`connect`](Self::connect) with a connect timeout of `timeout`
    /// instead of the default (`None`).
    pub async fn connect_timeout(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let inner = connect::<backend::StreamConnecting>(addr, timeout).await?;
        Self::from_blocking(crate::VsockStream { inner })
    }

    /// Makes a blocking stream async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::VsockStream) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { shared: Shared::new(inner) })
    }

    /// Splits the stream into a reading and a writing half that can move
    /// to different tasks.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let shared = Rc::new(self.shared);
        (OwnedReadHalf { shared: shared.clone() }, OwnedWriteHalf { shared })
    }

    /// Shuts down reading, writing or both; never waits.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.shared.inner.shutdown(how)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.peer_addr()
    }

    /// This side's address.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.local_addr()
    }

    /// See [`crate::VsockStream::recv_queued`].
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.shared.inner.recv_queued()
    }

    /// See [`crate::VsockStream::send_queued`].
    pub fn send_queued(&self) -> io::Result<usize> {
        self.shared.inner.send_queued()
    }
}

/// The reading half of [`VsockStream::into_split`].
#[derive(Debug)]
pub struct OwnedReadHalf {
    shared: Rc<Shared<crate::VsockStream>>,
}

/// The writing half of [`VsockStream::into_split`]. Dropping it shuts
/// down writing (the half-close), as tokio-vsock's does; the connection
/// closes once both halves are gone.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    shared: Rc<Shared<crate::VsockStream>>,
}

impl OwnedReadHalf {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.peer_addr()
    }
}

impl OwnedWriteHalf {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.peer_addr()
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        let _ = self.shared.inner.shutdown(Shutdown::Write);
    }
}

/// `AsyncRead` for a type that reaches a `Shared<VsockStream>` via `$get`.
macro_rules! async_read {
    ($($ty:ty => |$s:ident| $get:expr),* $(,)?) => {$(
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut [u8],
            ) -> Poll<io::Result<usize>> {
                let $s = &*self;
                $get.poll_read(cx, buf)
            }
        }
    )*};
}

macro_rules! async_write {
    ($($ty:ty => |$s:ident| $get:expr),* $(,)?) => {$(
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                let $s = &*self;
                $get.poll_write(cx, buf)
            }
            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let $s = &*self;
                $get.poll_close()
            }
        }
    )*};
}

async_read! {
    VsockStream => |s| s.shared,
    &VsockStream => |s| s.shared,
    OwnedReadHalf => |s| s.shared,
}

async_write! {
    VsockStream => |s| s.shared,
    &VsockStream => |s| s.shared,
    OwnedWriteHalf => |s| s.shared,
}
