//! Seqpacket sockets. std has no seqpacket type, so the shape follows the
//! stream types (listener, accept, connect) and the calls follow the
//! socket API: one `send` is one message, one `recv` is one message, and
//! the end-of-record mark and truncation are reported the way
//! `recvmsg(2)` reports MSG_EOR and MSG_TRUNC.

use crate::io;
use core::time::Duration;

use crate::{Readiness, Shutdown, VsockAddr, backend};

/// What [`SeqpacketStream::recv`] got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMessage {
    /// Bytes copied into the buffer. 0 means end-of-file: vsock never
    /// carries empty messages, so a 0-length receive is always the peer
    /// having finished.
    pub len: usize,
    /// The message was longer than the buffer (or than the host's
    /// per-message cap); the rest is discarded (MSG_TRUNC).
    pub truncated: bool,
    /// The sender marked this message as the end of a record (MSG_EOR).
    pub end_of_record: bool,
}

/// A listening seqpacket socket.
#[derive(Debug)]
pub struct SeqpacketListener {
    inner: backend::SeqListener,
}

impl SeqpacketListener {
    /// Binds to `addr` and starts listening. Stream and seqpacket sockets
    /// share one port space. Fails with `Unsupported` when the transport
    /// has no seqpacket support.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        backend::SeqListener::bind(addr).map(|inner| Self { inner })
    }

    /// Accepts one connection; blocks unless non-blocking (then an empty
    /// backlog returns `WouldBlock` at once).
    pub fn accept(&self) -> io::Result<(SeqpacketStream, VsockAddr)> {
        self.inner.accept().map(|(inner, peer)| (SeqpacketStream { inner }, peer))
    }

    /// An endless iterator over accepted connections.
    pub fn incoming(&self) -> SeqpacketIncoming<'_> {
        SeqpacketIncoming { listener: self }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// In non-blocking mode, `accept` returns `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when `accept` will not wait.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }
}

/// The iterator returned by [`SeqpacketListener::incoming`]. It never
/// returns `None`.
#[derive(Debug)]
pub struct SeqpacketIncoming<'a> {
    listener: &'a SeqpacketListener,
}

impl Iterator for SeqpacketIncoming<'_> {
    type Item = io::Result<SeqpacketStream>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(stream, _)| stream))
    }
}

/// A connected seqpacket socket: reliable, ordered messages.
///
/// Dropping it closes the connection; messages already sent are still
/// delivered.
#[derive(Debug)]
pub struct SeqpacketStream {
    pub(crate) inner: backend::SeqStream,
}

impl SeqpacketStream {
    /// Connects to `addr`; see [`VsockStream::connect`](crate::VsockStream::connect).
    pub fn connect(addr: VsockAddr) -> io::Result<Self> {
        backend::SeqStream::connect(addr, None).map(|inner| Self { inner })
    }

    /// Connects with a connect timeout of `timeout` instead of the default
    /// 2 seconds.
    pub fn connect_timeout(addr: VsockAddr, timeout: Duration) -> io::Result<Self> {
        if timeout.is_zero() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero connect timeout"));
        }
        backend::SeqStream::connect(addr, Some(timeout)).map(|inner| Self { inner })
    }

    /// Sends `data` as one message and returns its length.
    ///
    /// The message goes whole or not at all. It blocks until the message is
    /// accepted, unless non-blocking. A message larger than the connection
    /// can ever carry (the smaller of the two sides' buffer sizes, 256 KiB
    /// by default) fails with `InvalidInput` (EMSGSIZE). An empty message is
    /// accepted but, as in Linux, not transmitted.
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.inner.send(data, false)
    }

    /// Sends `data` as one message, marking it as the end of a record when
    /// `eor` is set (MSG_EOR).
    pub fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.inner.send(data, eor)
    }

    /// Receives one message into `buf`.
    ///
    /// Blocks until a message arrives, unless non-blocking. A message
    /// longer than `buf` fills it, the rest is discarded and `truncated` is
    /// set. A `len` of 0 is end-of-file.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.inner.recv(buf)
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

    /// Shuts down receiving, sending or both. After `Shutdown::Write` the
    /// peer receives what was sent, then end-of-file.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.inner.peer_addr()
    }

    /// This side's address.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        self.inner.local_addr()
    }

    /// Bytes of messages queued for `recv` (msg_inq), as of the last time
    /// messages were fetched from the transport. 0 means a `recv` would
    /// most likely wait. A hint; use [`readable`](Self::readable) to wait.
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.inner.recv_queued()
    }

    /// In non-blocking mode, `send` and `recv` return `WouldBlock` instead
    /// of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// Ready when `recv` will not wait.
    pub fn readable(&self) -> Readiness<'_> {
        Readiness(self.inner.readable())
    }

    /// Ready when `send` will not wait.
    pub fn writable(&self) -> Readiness<'_> {
        Readiness(self.inner.writable())
    }
}
