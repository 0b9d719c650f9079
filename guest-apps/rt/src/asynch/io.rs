//! Async reads and writes: the `futures-io` traits, and the few awaitable
//! methods an app needs on top of them.
//!
//! On hosted targets [`AsyncRead`] and [`AsyncWrite`] *are* `futures-io`'s
//! traits, so pier's sockets work with every adapter written for them
//! (futures-util's `AsyncReadExt`, `futures::io::copy`, codecs). That
//! crate defines them only with std, so on bare metal pier-rt defines
//! stand-ins with the same methods, over [`crate::io::Error`]. The
//! extension traits here ([`AsyncReadExt`], [`AsyncWriteExt`]) give
//! `read(..).await`, `write_all(..).await` and `close().await` on both
//! targets, so an app that uses them builds for both unchanged. (An app
//! that also imports futures-util's traits of the same names must pick
//! one per call site, as with any two extension traits.)

use core::future::{Future, poll_fn};
use core::pin::Pin;
use core::task::Poll;

use crate::io::{self, ErrorKind};

#[cfg(not(target_os = "none"))]
pub use futures_io::{AsyncRead, AsyncWrite};

#[cfg(target_os = "none")]
pub use bare::{AsyncRead, AsyncWrite};

#[cfg(target_os = "none")]
mod bare {
    use core::pin::Pin;
    use core::task::{Context, Poll};

    use crate::io;

    /// `futures_io::AsyncRead`'s required method, for bare metal.
    pub trait AsyncRead {
        /// Reads into `buf`; `Ready(Ok(0))` is end-of-stream.
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>>;
    }

    /// `futures_io::AsyncWrite`'s required methods, for bare metal.
    pub trait AsyncWrite {
        /// Writes some of `buf` and says how much.
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>>;
        /// Waits until written bytes have left.
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
        /// Finishes the writing side (for sockets, the half-close).
        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    }
}

/// Awaitable reads, on every target.
pub trait AsyncReadExt: AsyncRead {
    /// Reads into `buf` once data (or end-of-stream, `Ok(0)`) is there.
    fn read<'a>(&'a mut self, buf: &'a mut [u8]) -> impl Future<Output = io::Result<usize>> + 'a
    where
        Self: Unpin,
    {
        poll_fn(move |cx| Pin::new(&mut *self).poll_read(cx, buf))
    }
}

impl<R: AsyncRead + ?Sized> AsyncReadExt for R {}

/// Awaitable writes, on every target.
pub trait AsyncWriteExt: AsyncWrite {
    /// Writes some of `buf` once there is room, and says how much.
    fn write<'a>(&'a mut self, buf: &'a [u8]) -> impl Future<Output = io::Result<usize>> + 'a
    where
        Self: Unpin,
    {
        poll_fn(move |cx| Pin::new(&mut *self).poll_write(cx, buf))
    }

    /// Writes all of `buf`, waiting for room as often as it takes.
    fn write_all<'a>(&'a mut self, buf: &'a [u8]) -> impl Future<Output = io::Result<()>> + 'a
    where
        Self: Unpin,
    {
        let mut rest = buf;
        poll_fn(move |cx| {
            while !rest.is_empty() {
                match Pin::new(&mut *self).poll_write(cx, rest) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(ErrorKind::WriteZero.into()));
                    }
                    Poll::Ready(Ok(n)) => rest = &rest[n..],
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            Poll::Ready(Ok(()))
        })
    }

    /// Waits until what was written has left.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + '_
    where
        Self: Unpin,
    {
        poll_fn(move |cx| Pin::new(&mut *self).poll_flush(cx))
    }

    /// Finishes writing: for pier's sockets, the half-close
    /// (`shutdown(Shutdown::Write)`), after which the peer reads
    /// end-of-stream once it has everything.
    fn close(&mut self) -> impl Future<Output = io::Result<()>> + '_
    where
        Self: Unpin,
    {
        poll_fn(move |cx| Pin::new(&mut *self).poll_close(cx))
    }
}

impl<W: AsyncWrite + ?Sized> AsyncWriteExt for W {}
