//! Async seqpacket sockets: the blocking types' calls as futures, one
//! message per `send` and per `recv` as there, and owned halves for a
//! reader task and a writer task.

use alloc::rc::Rc;
use core::future::poll_fn;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use futures_core::Stream;

use super::reactor::Interest;
use super::stream::Shared;
use crate::io;
use crate::{RecvMessage, Shutdown, VsockAddr, backend};

/// A listening seqpacket socket whose `accept` is a future.
#[derive(Debug)]
pub struct SeqpacketListener {
    accepts: Interest,
    inner: crate::SeqpacketListener,
}

impl SeqpacketListener {
    /// Binds to `addr` and starts listening; see
    /// [`crate::SeqpacketListener::bind`].
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        Self::from_blocking(crate::SeqpacketListener::bind(addr)?)
    }

    /// Makes a blocking listener async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::SeqpacketListener) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { accepts: Interest::new(), inner })
    }

    /// Accepts one connection once a peer has connected.
    pub async fn accept(&self) -> io::Result<(SeqpacketStream, VsockAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// `accept` as a poll function.
    pub fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(SeqpacketStream, VsockAddr)>> {
        self.accepts
            .poll_io(cx, || self.inner.readable().0.raw(), || self.inner.accept())
            .map(|r| r.and_then(|(s, peer)| Ok((SeqpacketStream::from_blocking(s)?, peer))))
    }

    /// The accepted connections as an endless [`Stream`].
    pub fn incoming(&self) -> SeqpacketIncoming<'_> {
        SeqpacketIncoming { listener: self }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }
}

/// The [`Stream`] of [`SeqpacketListener::incoming`]; it never ends.
#[derive(Debug)]
pub struct SeqpacketIncoming<'a> {
    listener: &'a SeqpacketListener,
}

impl Stream for SeqpacketIncoming<'_> {
    type Item = io::Result<SeqpacketStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

impl Shared<crate::SeqpacketStream> {
    async fn send(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        poll_fn(|cx| {
            self.writes.poll_io(
                cx,
                || self.inner.writable().0.raw(),
                || self.inner.send_eor(data, eor),
            )
        })
        .await
    }

    async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        poll_fn(|cx| {
            self.reads.poll_io(cx, || self.inner.readable().0.raw(), || self.inner.recv(buf))
        })
        .await
    }
}

/// A connected seqpacket socket with message futures. `send` and `recv`
/// take `&self`, so one task may wait for both at once.
#[derive(Debug)]
pub struct SeqpacketStream {
    shared: Shared<crate::SeqpacketStream>,
}

impl SeqpacketStream {
    /// Connects to `addr` once the peer answers; see
    /// [`crate::SeqpacketStream::connect`].
    pub async fn connect(addr: VsockAddr) -> io::Result<Self> {
        Self::connect_timeout(addr, None).await
    }

    /// [`connect`](Self::connect) with a connect timeout of `timeout`
    /// instead of the default (`None`).
    pub async fn connect_timeout(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let inner = super::stream::connect::<backend::SeqConnecting>(addr, timeout).await?;
        Self::from_blocking(crate::SeqpacketStream { inner })
    }

    /// Makes a blocking connection async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::SeqpacketStream) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { shared: Shared::new(inner) })
    }

    /// Sends `data` as one message once the peer has room for it; see
    /// [`crate::SeqpacketStream::send`].
    pub async fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.shared.send(data, false).await
    }

    /// Sends one message, marked end-of-record when `eor` is set.
    pub async fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.shared.send(data, eor).await
    }

    /// Receives one message; a `len` of 0 is end-of-file. See
    /// [`crate::SeqpacketStream::recv`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.shared.recv(buf).await
    }

    /// Splits the connection into a receiving and a sending half that can
    /// move to different tasks.
    pub fn into_split(self) -> (SeqpacketReadHalf, SeqpacketWriteHalf) {
        let shared = Rc::new(self.shared);
        (SeqpacketReadHalf { shared: shared.clone() }, SeqpacketWriteHalf { shared })
    }

    /// Shuts down receiving, sending or both; never waits.
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
}

/// The receiving half of [`SeqpacketStream::into_split`].
#[derive(Debug)]
pub struct SeqpacketReadHalf {
    shared: Rc<Shared<crate::SeqpacketStream>>,
}

impl SeqpacketReadHalf {
    /// Receives one message; see [`SeqpacketStream::recv`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.shared.recv(buf).await
    }
}

/// The sending half of [`SeqpacketStream::into_split`]. Dropping it shuts
/// down sending; the connection closes once both halves are gone.
#[derive(Debug)]
pub struct SeqpacketWriteHalf {
    shared: Rc<Shared<crate::SeqpacketStream>>,
}

impl SeqpacketWriteHalf {
    /// Sends one message; see [`SeqpacketStream::send`].
    pub async fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.shared.send(data, false).await
    }

    /// Sends one message, marked end-of-record when `eor` is set.
    pub async fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.shared.send(data, eor).await
    }
}

impl Drop for SeqpacketWriteHalf {
    fn drop(&mut self) {
        let _ = self.shared.inner.shutdown(Shutdown::Write);
    }
}
