//! Stream sockets over WIT. The data path is plain wasi:io streams, so the
//! work here is turning them into blocking-or-not reads and writes and
//! mapping stream errors back to vsock error codes; listening, connecting
//! and the rest of the connection are `conn`'s, shared with seqpacket.

use std::io;

use wasip2::io::streams::{InputStream, OutputStream, StreamError};

use super::bindings::vsock::sockets::stream_create_socket::create_stream_socket;
use super::bindings::vsock::sockets::stream_socket::StreamSocket;
use super::conn::{self, Conn, conn_socket};
use super::network::{error, stream_error, to_usize};
use super::wait::{WasiPoll, wait};
use crate::platform::contract::ByteStream;

conn_socket!(StreamSocket, create_stream_socket, InputStream, OutputStream, ());

/// A listening stream socket.
pub(crate) type Listener = conn::Listener<StreamSocket>;
/// A stream connect under way.
pub(crate) type Connecting = conn::Connecting<StreamSocket>;
/// A connected stream socket.
pub(crate) type Stream = Conn<StreamSocket>;

impl ByteStream<WasiPoll> for Stream {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
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

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
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
    fn flush(&self) -> io::Result<()> {
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

    fn recv_queued(&self) -> io::Result<usize> {
        self.socket.receive_queued().map(to_usize).map_err(error)
    }

    fn send_queued(&self) -> io::Result<usize> {
        self.socket.send_queued().map(to_usize).map_err(error)
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
