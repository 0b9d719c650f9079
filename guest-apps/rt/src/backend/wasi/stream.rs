//! Stream sockets over WIT. The data path is plain wasi:io streams, so the
//! work here is turning them into blocking-or-not reads and writes and
//! mapping stream errors back to vsock error codes; listening and
//! connecting are `conn.rs`'s, shared with seqpacket.

use std::cell::{Cell, OnceCell};
use std::io;
use std::net::Shutdown;
use std::time::Duration;

use wasip2::io::poll::Pollable;
use wasip2::io::streams::{InputStream, OutputStream, StreamError};

use super::bindings::vsock::sockets::stream_socket::{ShutdownType, StreamSocket};
use super::{PollRef, error, lazy, stream_error, to_usize, wait};
use crate::VsockAddr;

pub(crate) fn shutdown_type(how: Shutdown) -> ShutdownType {
    match how {
        Shutdown::Read => ShutdownType::Receive,
        Shutdown::Write => ShutdownType::Send,
        Shutdown::Both => ShutdownType::Both,
    }
}

pub(crate) type Listener = super::conn::Listener<StreamSocket>;

#[derive(Debug)]
pub(crate) struct Stream {
    // Children first, in the order they must be dropped: each pollable
    // before its stream, the streams before the socket.
    rx_ready: OnceCell<Pollable>,
    tx_ready: OnceCell<Pollable>,
    rx: InputStream,
    tx: OutputStream,
    socket: StreamSocket,
    nonblocking: Cell<bool>,
}

impl Stream {
    pub(super) fn new(socket: StreamSocket, rx: InputStream, tx: OutputStream) -> Self {
        Self {
            rx_ready: OnceCell::new(),
            tx_ready: OnceCell::new(),
            rx,
            tx,
            socket,
            nonblocking: Cell::new(false),
        }
    }

    pub(crate) fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        super::conn::connect::<StreamSocket>(addr, timeout)
    }

    fn rx_ready(&self) -> &Pollable {
        lazy(&self.rx_ready, || self.rx.subscribe())
    }

    fn tx_ready(&self) -> &Pollable {
        lazy(&self.tx_ready, || self.tx.subscribe())
    }

    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let want = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        loop {
            match self.rx.read(want) {
                Ok(chunk) if chunk.is_empty() => wait(self.nonblocking.get(), self.rx_ready())?,
                Ok(chunk) => {
                    // The host may not return more than asked; never trust it
                    // to the point of panicking.
                    let n = chunk.len().min(buf.len());
                    buf[..n].copy_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(StreamError::Closed) => return Ok(0),
                Err(StreamError::LastOperationFailed(e)) => return Err(stream_error(e)),
            }
        }
    }

    pub(crate) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.tx.check_write() {
                Ok(0) => wait(self.nonblocking.get(), self.tx_ready())?,
                Ok(permit) => {
                    let n = to_usize(permit).min(buf.len());
                    return match self.tx.write(&buf[..n]) {
                        Ok(()) => Ok(n),
                        Err(e) => Err(write_error(e)),
                    };
                }
                Err(e) => return Err(write_error(e)),
            }
        }
    }

    /// Accepted bytes reach the peer without a flush (the WIT promises
    /// that), so a flush only matters to a caller that wants to know they
    /// left. Non-blocking callers never wait here.
    pub(crate) fn flush(&self) -> io::Result<()> {
        if self.nonblocking.get() {
            return Ok(());
        }
        match self.tx.flush() {
            Ok(()) => {}
            Err(StreamError::Closed) => return Ok(()),
            Err(StreamError::LastOperationFailed(e)) => return Err(stream_error(e)),
        }
        // check-write stays 0 until the flush completes.
        loop {
            match self.tx.check_write() {
                Ok(0) => self.tx_ready().block(),
                Ok(_) | Err(StreamError::Closed) => return Ok(()),
                Err(StreamError::LastOperationFailed(e)) => return Err(stream_error(e)),
            }
        }
    }

    pub(crate) fn set_linger(&self, linger: Option<core::time::Duration>) -> io::Result<()> {
        let nanos = linger.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.socket.set_linger(nanos).map_err(error)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket.shutdown(shutdown_type(how)).map_err(error)
    }

    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.remote_address().map(Into::into).map_err(error)
    }

    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        self.socket.receive_queued().map(to_usize).map_err(error)
    }

    pub(crate) fn send_queued(&self) -> io::Result<usize> {
        self.socket.send_queued().map(to_usize).map_err(error)
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    pub(crate) fn readable(&self) -> PollRef<'_> {
        PollRef::Pollable(self.rx_ready())
    }

    pub(crate) fn writable(&self) -> PollRef<'_> {
        PollRef::Pollable(self.tx_ready())
    }
}

/// A closed output stream is the EPIPE case: we shut down sending, or the
/// peer can no longer receive.
fn write_error(e: StreamError) -> io::Error {
    match e {
        StreamError::Closed => io::Error::new(io::ErrorKind::BrokenPipe, "vsock: stream closed"),
        StreamError::LastOperationFailed(e) => stream_error(e),
    }
}
