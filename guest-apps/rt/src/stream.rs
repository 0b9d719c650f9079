//! Stream sockets under std's names (`TcpListener` → [`VsockListener`],
//! `TcpStream` → [`VsockStream`]), so that server and client code reads
//! like any std networking code and ports between targets unchanged.

use crate::io::{self, Read, Write};
use core::time::Duration;

use crate::{Readiness, Shutdown, VsockAddr, backend};

/// A listening stream socket, like `std::net::TcpListener`.
///
/// ```no_run
/// use pier_rt::{VsockAddr, VsockAddrExt, VsockListener};
/// use std::io::{Read, Write};
///
/// let listener = VsockListener::bind(VsockAddr::any_cid(1234))?;
/// for stream in listener.incoming() {
///     let mut stream = stream?;
///     let mut buf = [0; 4096];
///     let n = stream.read(&mut buf)?;
///     stream.write_all(&buf[..n])?;
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct VsockListener {
    inner: backend::Listener,
}

impl VsockListener {
    /// Binds to `addr` and starts listening.
    ///
    /// Use [`VMADDR_CID_ANY`](crate::VMADDR_CID_ANY) as the CID to accept
    /// connections however the peer addressed us, and
    /// [`VMADDR_PORT_ANY`](crate::VMADDR_PORT_ANY) for a free port (read it
    /// back with [`local_addr`](Self::local_addr)). Fails with
    /// `PermissionDenied` if the host did not grant the port.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        backend::Listener::bind(addr).map(|inner| Self { inner })
    }

    /// Accepts one connection and returns it with the peer's address.
    ///
    /// Blocks until a connection is established, unless the listener is
    /// non-blocking: then an empty backlog returns `WouldBlock` at once.
    pub fn accept(&self) -> io::Result<(VsockStream, VsockAddr)> {
        self.inner.accept().map(|(inner, peer)| (VsockStream { inner }, peer))
    }

    /// An endless iterator over accepted connections, like
    /// `TcpListener::incoming`.
    pub fn incoming(&self) -> Incoming<'_> {
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

/// The iterator returned by [`VsockListener::incoming`]. It never returns
/// `None`.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a VsockListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<VsockStream>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(stream, _)| stream))
    }
}

/// A connected stream socket, like `std::net::TcpStream`.
///
/// Reading and writing go through [`Read`] and [`Write`], implemented for
/// both `VsockStream` and `&VsockStream`, so one connection can be read
/// and written through shared references. `read` returns `Ok(0)` once the
/// peer has shut down its sending side and everything was read.
///
/// Dropping the stream closes the connection the way close(2) does: what
/// was written is still delivered, then the peer sees both directions shut.
#[derive(Debug)]
pub struct VsockStream {
    pub(crate) inner: backend::Stream,
}

impl VsockStream {
    /// Connects to `addr`, waiting for the peer's answer or the connect
    /// timeout (2 seconds by default).
    ///
    /// A peer with no listener on the port refuses with
    /// `ConnectionRefused`; an address the host did not grant fails with
    /// `PermissionDenied`.
    pub fn connect(addr: VsockAddr) -> io::Result<Self> {
        backend::Stream::connect(addr, None).map(|inner| Self { inner })
    }

    /// Connects like [`connect`](Self::connect), with a connect timeout of
    /// `timeout` instead of the default.
    pub fn connect_timeout(addr: VsockAddr, timeout: Duration) -> io::Result<Self> {
        if timeout.is_zero() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero connect timeout"));
        }
        backend::Stream::connect(addr, Some(timeout)).map(|inner| Self { inner })
    }

    /// SO_LINGER, as std's `TcpStream::set_linger`: what dropping the
    /// stream does to the connection. `None` (the default) closes it in
    /// order: written bytes are delivered, then the peer reads
    /// end-of-stream. `Some(Duration::ZERO)` resets it instead: unsent
    /// bytes are discarded and the peer sees a reset at once, so it cannot
    /// take the end for a clean one. Other timeouts are `Unsupported`
    /// (dropping never blocks).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.inner.set_linger(linger)
    }

    /// Shuts down reading, writing or both, like `TcpStream::shutdown`.
    ///
    /// `Shutdown::Write` is the half-close: bytes already written are
    /// delivered, then the peer reads end-of-stream, and this side can
    /// still read the peer's reply.
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

    /// How many bytes a `read` could return now without waiting (SIOCINQ).
    ///
    /// Once the peer has finished and everything was read this is 1, not
    /// 0, so a loop that reads while the hint is non-zero still makes the
    /// read that returns end-of-stream. It is a hint; use
    /// [`readable`](Self::readable) to wait.
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.inner.recv_queued()
    }

    /// Bytes written but not yet handed to the transport (SIOCOUTQ, as
    /// Linux's vsock reports it); 0 means everything written has gone out.
    pub fn send_queued(&self) -> io::Result<usize> {
        self.inner.send_queued()
    }

    /// In non-blocking mode, reads and writes that would wait return
    /// `WouldBlock` instead.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when `read` will not wait: data, end-of-stream or an error.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }

    /// Ready when `write` will not wait: the peer's credit allows more
    /// bytes, or the stream has failed.
    pub fn writable(&self) -> Readiness<'_> {
        Readiness(self.inner.writable())
    }
}

impl Read for &VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Write for &VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    /// Written bytes are delivered without a flush; in blocking mode this
    /// waits until they have left, in non-blocking mode it does nothing.
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Write for VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
