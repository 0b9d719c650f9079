//! Stream sockets under std's names (`TcpListener` → [`VsockListener`],
//! `TcpStream` → [`VsockStream`]), so that server and client code reads
//! like any std networking code and ports between targets unchanged. The
//! listener and what every connection does are `conn`'s; here are what
//! only a byte stream does: `Read` and `Write`, and its queue sizes.

use crate::conn::{self, Connection};
use crate::io::{self, Read, Write};
use crate::kind::Stream;
use crate::platform::contract::ByteStream as _;

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
pub type VsockListener = conn::Listener<Stream>;

/// The iterator returned by [`VsockListener::incoming`]. It never returns
/// `None`.
pub type Incoming<'a> = conn::Incoming<'a, Stream>;

/// A connected stream socket, like `std::net::TcpStream`.
///
/// Reading and writing go through [`Read`] and [`Write`], implemented for
/// both `VsockStream` and `&VsockStream`, so one connection can be read
/// and written through shared references. `read` returns `Ok(0)` once the
/// peer has shut down its sending side and everything was read.
///
/// Dropping the stream closes the connection the way close(2) does: what
/// was written is still delivered, then the peer sees both directions shut.
pub type VsockStream = Connection<Stream>;

impl VsockStream {
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
}

impl Read for &VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
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
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}
