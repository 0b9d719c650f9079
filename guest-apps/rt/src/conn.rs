//! The listener and the connection of both connection kinds, written
//! once: [`Listener`], [`Incoming`] and [`Connection`] are generic over
//! the kind ([`kind::Stream`] or [`kind::Seqpacket`]), and the names apps
//! use are aliases of them ([`VsockListener`](crate::VsockListener) is
//! `Listener<Stream>`, [`SeqpacketStream`](crate::SeqpacketStream) is
//! `Connection<Seqpacket>`). What only one kind does, reading bytes or
//! receiving messages, is documented on those aliases.
//!
//! Each call is the platform's, through the platform contract, under std's
//! name.

use core::time::Duration;

use crate::addr::VsockAddr;
use crate::io;
use crate::kind;
use crate::net::Shutdown;
use crate::platform::Active;
use crate::platform::contract::{Connection as _, Kind, Listener as _, Socket as _};
use crate::poll::Readiness;

/// A connection kind: [`kind::Stream`] or [`kind::Seqpacket`], and no
/// other.
///
/// Sealed: the bound brings along the kind's platform types, which are
/// pier-rt's own.
#[allow(private_bounds)]
pub trait ConnectionKind: Kind<Active> {}

impl ConnectionKind for kind::Stream {}
impl ConnectionKind for kind::Seqpacket {}

/// A listening socket of kind `K`, like `std::net::TcpListener`;
/// [`VsockListener`](crate::VsockListener) and
/// [`SeqpacketListener`](crate::SeqpacketListener) name the two kinds.
#[derive(Debug)]
pub struct Listener<K: ConnectionKind> {
    inner: K::Listener,
}

impl<K: ConnectionKind> Listener<K> {
    /// Binds to `addr` and starts listening.
    ///
    /// Use [`VMADDR_CID_ANY`](crate::VMADDR_CID_ANY) as the CID to accept
    /// connections however the peer addressed us, and
    /// [`VMADDR_PORT_ANY`](crate::VMADDR_PORT_ANY) for a free port (read it
    /// back with [`local_addr`](Self::local_addr)). Stream and seqpacket
    /// sockets share one port space. Fails with `PermissionDenied` if the
    /// host did not grant the port, and with `Unsupported` when the
    /// transport lacks the kind (seqpacket, on some).
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        K::Listener::bind(addr).map(|inner| Self { inner })
    }

    /// Accepts one connection and returns it with the peer's address.
    ///
    /// Blocks until a connection is established, unless the listener is
    /// non-blocking: then an empty backlog returns `WouldBlock` at once.
    pub fn accept(&self) -> io::Result<(Connection<K>, VsockAddr)> {
        self.inner.accept().map(|(inner, peer)| (Connection { inner }, peer))
    }

    /// An endless iterator over accepted connections, like
    /// `TcpListener::incoming`.
    pub fn incoming(&self) -> Incoming<'_, K> {
        Incoming { listener: self }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// In non-blocking mode, `accept` returns `WouldBlock` instead of
    /// waiting. Wait with a [`Poller`](crate::Poller) on
    /// [`readable`](Self::readable) instead.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when `accept` will not wait: a connection (or an error) is
    /// pending.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }
}

/// The iterator returned by [`Listener::incoming`]. It never returns
/// `None`.
#[derive(Debug)]
pub struct Incoming<'a, K: ConnectionKind> {
    listener: &'a Listener<K>,
}

impl<K: ConnectionKind> Iterator for Incoming<'_, K> {
    type Item = io::Result<Connection<K>>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(conn, _)| conn))
    }
}

/// A connected socket of kind `K`; [`VsockStream`](crate::VsockStream)
/// and [`SeqpacketStream`](crate::SeqpacketStream) name the two kinds,
/// and have each kind's data calls.
///
/// Dropping it closes the connection the way close(2) does: what was
/// sent is still delivered, then the peer sees both directions shut.
#[derive(Debug)]
pub struct Connection<K: ConnectionKind> {
    pub(crate) inner: K::Conn,
}

impl<K: ConnectionKind> Connection<K> {
    /// Connects to `addr`, waiting for the peer's answer or the connect
    /// timeout (2 seconds by default).
    ///
    /// A peer with no listener on the port refuses with
    /// `ConnectionRefused`; an address the host did not grant fails with
    /// `PermissionDenied`.
    pub fn connect(addr: VsockAddr) -> io::Result<Self> {
        K::Conn::connect(addr, None).map(|inner| Self { inner })
    }

    /// Connects like [`connect`](Self::connect), with a connect timeout of
    /// `timeout` instead of the default.
    pub fn connect_timeout(addr: VsockAddr, timeout: Duration) -> io::Result<Self> {
        if timeout.is_zero() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero connect timeout"));
        }
        K::Conn::connect(addr, Some(timeout)).map(|inner| Self { inner })
    }

    /// SO_LINGER, as std's `TcpStream::set_linger`: what dropping the
    /// connection does. `None` (the default) closes it in order: what was
    /// sent is delivered, then the peer reads the end. `Some(Duration::ZERO)`
    /// resets it instead: unsent data is discarded and the peer sees a
    /// reset at once, so it cannot take the end for a clean one. Other
    /// timeouts are `Unsupported` (dropping never blocks).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.inner.set_linger(linger)
    }

    /// Shuts down receiving, sending or both, like `TcpStream::shutdown`.
    ///
    /// `Shutdown::Write` is the half-close: what was already sent is
    /// delivered, then the peer reads the end (a stream's `read` returns
    /// 0, a seqpacket `recv` a message of length 0), and this side can
    /// still receive the peer's reply.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.inner.peer_addr()
    }

    /// This side's address; for a client, the ephemeral port it was given.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// In non-blocking mode, calls that would wait (receiving, sending)
    /// return `WouldBlock` instead.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when a receive will not wait: data, the end, or an error.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }

    /// Ready when a send will not wait: the peer's credit allows more, or
    /// the connection has failed.
    pub fn writable(&self) -> Readiness<'_> {
        Readiness(self.inner.writable())
    }
}
