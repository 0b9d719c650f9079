//! Async stream sockets, tokio-vsock's shape: the listener, connect and
//! halves are `conn`'s, shared with seqpacket; here streams read and
//! write through the `futures-io` traits.

use core::pin::Pin;
use core::task::{Context, Poll};

use super::conn::{self, Shared};
use super::io::{AsyncRead, AsyncWrite};
use crate::io::{self, Read, Write};
use crate::kind::Stream;
use crate::net::Shutdown;

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
pub type VsockListener = conn::Listener<Stream>;

/// The [`Stream`](futures_core::Stream) of [`VsockListener::incoming`];
/// it never ends.
pub type Incoming<'a> = conn::Incoming<'a, Stream>;

/// A connected stream socket, read and written through [`AsyncRead`] and
/// [`AsyncWrite`] (implemented for `&VsockStream` too, so one task can
/// read and write it at once with `futures::join!`-style code).
///
/// `poll_close` (`close().await`) is the half-close,
/// `shutdown(Shutdown::Write)`; `poll_flush` returns at once, since
/// written bytes are delivered without one. Dropping the stream closes
/// the connection as the blocking type does.
pub type VsockStream = conn::Connection<Stream>;

/// The reading half of [`VsockStream::into_split`].
pub type OwnedReadHalf = conn::ReadHalf<Stream>;

/// The writing half of [`VsockStream::into_split`]. Dropping it shuts
/// down writing (the half-close), as tokio-vsock's does; the connection
/// closes once both halves are gone.
pub type OwnedWriteHalf = conn::WriteHalf<Stream>;

impl VsockStream {
    /// See [`crate::VsockStream::recv_queued`].
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.shared.inner.recv_queued()
    }

    /// See [`crate::VsockStream::send_queued`].
    pub fn send_queued(&self) -> io::Result<usize> {
        self.shared.inner.send_queued()
    }
}

impl Shared<Stream> {
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        self.reads.poll_io(cx, || self.inner.readable().raw(), || (&self.inner).read(buf))
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.writes.poll_io(cx, || self.inner.writable().raw(), || (&self.inner).write(buf))
    }

    fn poll_close(&self) -> Poll<io::Result<()>> {
        Poll::Ready(self.inner.shutdown(Shutdown::Write))
    }
}

/// `AsyncRead` for a type that reaches a `Shared<Stream>` via `$get`.
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

/// `AsyncWrite` for a type that reaches a `Shared<Stream>` via `$get`.
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
