//! Async datagram sockets: `send_to` and `recv_from` as futures.

use core::future::poll_fn;

use super::reactor::Interest;
use crate::addr::VsockAddr;
use crate::io;

/// A datagram socket with send and receive futures; see
/// [`crate::VsockDatagram`] for the semantics. The calls take `&self`, so
/// one task may wait to send and to receive at once.
#[derive(Debug)]
pub struct VsockDatagram {
    reads: Interest,
    writes: Interest,
    inner: crate::datagram::VsockDatagram,
}

impl VsockDatagram {
    /// Creates a socket bound to `addr`.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        Self::from_blocking(crate::datagram::VsockDatagram::bind(addr)?)
    }

    /// Makes a blocking socket async (it becomes non-blocking).
    pub fn from_blocking(inner: crate::datagram::VsockDatagram) -> io::Result<Self> {
        inner.set_nonblocking(true)?;
        Ok(Self { reads: Interest::new(), writes: Interest::new(), inner })
    }

    /// Fixes the peer; see [`crate::VsockDatagram::connect`].
    pub fn connect(&mut self, addr: VsockAddr) -> io::Result<()> {
        // The socket's pollables change: the reactor must let go of the
        // old ones first, and the tasks re-arm with the new.
        self.reads = Interest::new();
        self.writes = Interest::new();
        self.inner.connect(addr)
    }

    /// Sends one datagram to `addr` once there is room.
    pub async fn send_to(&self, buf: &[u8], addr: VsockAddr) -> io::Result<usize> {
        poll_fn(|cx| {
            self.writes.poll_io(
                cx,
                || self.inner.writable().raw(),
                || self.inner.send_to(buf, addr),
            )
        })
        .await
    }

    /// Sends one datagram to the connected peer.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        poll_fn(|cx| {
            self.writes.poll_io(cx, || self.inner.writable().raw(), || self.inner.send(buf))
        })
        .await
    }

    /// Receives one datagram and its sender, once one arrives.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        poll_fn(|cx| {
            self.reads.poll_io(cx, || self.inner.readable().raw(), || self.inner.recv_from(buf))
        })
        .await
    }

    /// Receives one datagram from the connected peer.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        poll_fn(|cx| {
            self.reads.poll_io(cx, || self.inner.readable().raw(), || self.inner.recv(buf))
        })
        .await
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.inner.peer_addr()
    }
}
