//! Datagram sockets under `std::net::UdpSocket`'s names, so that code
//! written against UDP moves over with an address change.

use crate::addr::VsockAddr;
use crate::io;
use crate::platform::Active;
use crate::platform::contract::{Datagram as _, Platform, Socket as _};
use crate::poll::Readiness;

/// A vsock datagram socket, like `std::net::UdpSocket`.
///
/// Datagrams are at most 64 KiB and delivery is best effort. Datagram
/// ports are a space of their own: a datagram socket may use the same
/// port number as a stream or seqpacket listener.
#[derive(Debug)]
pub struct VsockDatagram {
    inner: <Active as Platform>::Datagram,
}

impl VsockDatagram {
    /// Creates a socket bound to `addr`. Fails with `Unsupported` when the
    /// transport has no datagram support.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        <Active as Platform>::Datagram::bind(addr).map(|inner| Self { inner })
    }

    /// Fixes the peer: [`send`](Self::send) goes there and only its
    /// datagrams are received.
    ///
    /// Unlike `UdpSocket::connect` this takes `&mut self`: the socket's
    /// readiness handles are tied to the old association, so none may be
    /// alive while it changes. Datagrams received but not yet read are
    /// dropped.
    pub fn connect(&mut self, addr: VsockAddr) -> io::Result<()> {
        self.inner.connect(addr)
    }

    /// Sends one datagram to `addr`. On a connected socket `addr` must be
    /// the connected peer.
    pub fn send_to(&self, buf: &[u8], addr: VsockAddr) -> io::Result<usize> {
        self.inner.send_to(buf, addr)
    }

    /// Sends one datagram to the connected peer; `NotConnected` if there is
    /// none.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner.send(buf)
    }

    /// Receives one datagram and its sender. Bytes that do not fit in
    /// `buf` are discarded, as with UDP.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        self.inner.recv_from(buf)
    }

    /// Receives one datagram from the connected peer.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.recv(buf)
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.inner.peer_addr()
    }

    /// Payload bytes queued for `recv`, as of the last fetch from the
    /// transport (the inq hint).
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.inner.recv_queued()
    }

    /// In non-blocking mode, sends and receives that would wait return
    /// `WouldBlock` instead.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when a receive will not wait.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }

    /// Ready when a send will not wait.
    pub fn writable(&self) -> Readiness<'_> {
        Readiness(self.inner.writable())
    }
}
