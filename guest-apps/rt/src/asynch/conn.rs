//! The async listener and connection of both connection kinds, written
//! once and generic over the kind, as the blocking ones in
//! [`crate::conn`] are: `accept().await`, an [`Incoming`] stream of
//! connections, an async connect, and owned halves, so a reader task and
//! a writer task can share one connection. The names apps use are
//! aliases of them ([`VsockStream`](super::VsockStream) is
//! `Connection<Stream>`); what only one kind does (the `futures-io`
//! traits, message futures) is documented on those aliases.
//!
//! Each type wraps the blocking type of the same kind in non-blocking
//! mode: an operation is the blocking type's call, retried when the
//! reactor says its socket is ready, so both APIs share
//! one implementation per platform and report the same errors.

use alloc::rc::Rc;
use core::future::poll_fn;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use futures_core::Stream;

use super::reactor::Interest;
use crate::addr::VsockAddr;
use crate::conn::ConnectionKind;
use crate::io;
use crate::net::Shutdown;
use crate::platform::Waiting;
use crate::platform::contract::{Connecting as _, Wait as _};

/// A listening socket of kind `K` whose `accept` is a future;
/// [`VsockListener`](super::VsockListener) and
/// [`SeqpacketListener`](super::SeqpacketListener) name the two kinds.
#[derive(Debug)]
pub struct Listener<K: ConnectionKind> {
    // Before `inner`: the reactor must forget the socket's pollable first.
    accepts: Interest,
    inner: crate::conn::Listener<K>,
}

impl<K: ConnectionKind> Listener<K> {
    /// Binds to `addr` and starts listening; see
    /// [`crate::VsockListener::bind`]. Binding never waits on a peer, so
    /// this is not a future.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        Self::from_blocking(crate::conn::Listener::bind(addr)?)
    }

    /// Makes a blocking listener async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::conn::Listener<K>) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { accepts: Interest::new(), inner })
    }

    /// Accepts one connection once a peer has connected.
    pub async fn accept(&self) -> io::Result<(Connection<K>, VsockAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// `accept` as a poll function, for hand-written futures.
    pub fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Connection<K>, VsockAddr)>> {
        self.accepts
            .poll_io(cx, || self.inner.readable().raw(), || self.inner.accept())
            .map(|r| r.and_then(|(conn, peer)| Ok((Connection::from_blocking(conn)?, peer))))
    }

    /// The accepted connections as an endless [`Stream`].
    pub fn incoming(&self) -> Incoming<'_, K> {
        Incoming { listener: self }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }
}

/// The [`Stream`] of [`Listener::incoming`]; it never ends.
#[derive(Debug)]
pub struct Incoming<'a, K: ConnectionKind> {
    listener: &'a Listener<K>,
}

impl<K: ConnectionKind> Stream for Incoming<'_, K> {
    type Item = io::Result<Connection<K>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener.poll_accept(cx).map(|r| Some(r.map(|(conn, _)| conn)))
    }
}

/// What a connection and its halves share: the socket and one reactor
/// slot per direction.
#[derive(Debug)]
pub(super) struct Shared<K: ConnectionKind> {
    pub(super) reads: Interest,
    pub(super) writes: Interest,
    pub(super) inner: crate::conn::Connection<K>,
}

/// A connected socket of kind `K` with futures for its calls;
/// [`VsockStream`](super::VsockStream) and
/// [`SeqpacketStream`](super::SeqpacketStream) name the two kinds, and
/// have each kind's data calls.
///
/// Dropping it closes the connection as the blocking type does.
#[derive(Debug)]
pub struct Connection<K: ConnectionKind> {
    pub(super) shared: Shared<K>,
}

impl<K: ConnectionKind> Connection<K> {
    /// Connects to `addr` once the peer answers; see
    /// [`crate::VsockStream::connect`] (the same errors, and a 2-second
    /// connect timeout).
    pub async fn connect(addr: VsockAddr) -> io::Result<Self> {
        Self::connect_timeout(addr, None).await
    }

    /// [`connect`](Self::connect) with a connect timeout of `timeout`
    /// instead of the default (`None`).
    pub async fn connect_timeout(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        if timeout.is_some_and(|t| t.is_zero()) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero connect timeout"));
        }
        let mut connecting = K::Connecting::start(addr, timeout)?;
        // Declared after `connecting`, so dropped first: the reactor lets
        // go of the connect's pollable before it goes.
        let waits = Interest::new();
        let inner = poll_fn(|cx| match connecting.finish() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                waits.wait(cx, Waiting::raw(&connecting.ready()));
                Poll::Pending
            }
            result => Poll::Ready(result),
        })
        .await?;
        Self::from_blocking(crate::conn::Connection { inner })
    }

    /// Makes a blocking connection async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::conn::Connection<K>) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { shared: Shared { reads: Interest::new(), writes: Interest::new(), inner } })
    }

    /// Splits the connection into a receiving and a sending half that can
    /// move to different tasks.
    pub fn into_split(self) -> (ReadHalf<K>, WriteHalf<K>) {
        let shared = Rc::new(self.shared);
        (ReadHalf { shared: shared.clone() }, WriteHalf { shared })
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

/// The receiving half of [`Connection::into_split`].
#[derive(Debug)]
pub struct ReadHalf<K: ConnectionKind> {
    pub(super) shared: Rc<Shared<K>>,
}

/// The sending half of [`Connection::into_split`]. Dropping it shuts
/// down sending (the half-close), as tokio-vsock's does; the connection
/// closes once both halves are gone.
#[derive(Debug)]
pub struct WriteHalf<K: ConnectionKind> {
    pub(super) shared: Rc<Shared<K>>,
}

impl<K: ConnectionKind> ReadHalf<K> {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.peer_addr()
    }
}

impl<K: ConnectionKind> WriteHalf<K> {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.shared.inner.peer_addr()
    }
}

impl<K: ConnectionKind> Drop for WriteHalf<K> {
    fn drop(&mut self) {
        let _ = self.shared.inner.shutdown(Shutdown::Write);
    }
}
