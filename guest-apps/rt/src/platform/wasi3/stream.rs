//! Stream sockets over `vsock:sockets@0.2.0`: a connection is the
//! socket, the `stream<u8>` its `receive` gives (and the future saying
//! how the peer ended), and the `stream<u8>` this side hands to `send`,
//! whose end is SHUT_WR.
//!
//! Reads keep one `read` of the receive stream in flight into a buffer
//! of [`READ_SIZE`]; a `read` call copies out of what it delivered. Bytes
//! are taken from the host only as the app reads them, so an app that
//! stops reading stops its peer through credit. Writes copy at most
//! [`WRITE_SIZE`] into a buffer that a background send writes out whole:
//! a blocking write waits for that, a non-blocking one returns at once and
//! the next write (or `writable`) waits. A dropped connection lets its
//! last send finish, then ends the stream, so what was written is still
//! delivered.

use std::cell::{Cell, RefCell};
use std::fmt::Debug;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use wit_bindgen::{FutureReader, StreamReader, StreamResult, StreamWriter};

use super::bindings::vsock::sockets::types::{ErrorCode, ShutdownType, StreamSocket, VsockAddress};
use super::bindings::wit_stream;
use super::conn::{self, SockKind};
use super::convert::{error, to_usize};
use super::wait::{Pending, PollRef, Sending, Wasi3Wait, wait};
use crate::addr::VsockAddr;
use crate::net::Shutdown;
use crate::platform::contract::{self, ByteStream};

/// Bytes one read of the receive stream asks for: the shim copies up to
/// this much out of the stack per call.
const READ_SIZE: usize = 64 * 1024;
/// Bytes one write hands to the send stream at most.
const WRITE_SIZE: usize = 64 * 1024;

/// The stream socket kind, for `conn`.
#[derive(Debug)]
pub(crate) enum Kind {}

impl SockKind for Kind {
    type Socket = StreamSocket;
    type Conn = Stream;

    fn create() -> Result<StreamSocket, ErrorCode> {
        StreamSocket::create()
    }
    fn bind(s: &StreamSocket, local: VsockAddress) -> Result<(), ErrorCode> {
        s.bind(local)
    }
    fn set_listen_backlog_size(s: &StreamSocket, value: u64) -> Result<(), ErrorCode> {
        s.set_listen_backlog_size(value)
    }
    fn listen(s: &StreamSocket) -> Result<StreamReader<StreamSocket>, ErrorCode> {
        s.listen()
    }
    fn connect(
        s: &StreamSocket,
        remote: VsockAddress,
    ) -> impl Future<Output = Result<(), ErrorCode>> + '_ {
        s.connect(remote)
    }
    fn local_address(s: &StreamSocket) -> Result<VsockAddress, ErrorCode> {
        s.get_local_address()
    }
    fn remote_address(s: &StreamSocket) -> Result<VsockAddress, ErrorCode> {
        s.get_remote_address()
    }
    fn connected(socket: StreamSocket) -> Stream {
        Stream::new(socket)
    }
}

/// How the peer's side ended, as the receive future said.
type Ended = Result<(), ErrorCode>;

/// What a read in flight gives back.
enum ReadOutcome {
    /// Bytes, and the stream and end future to read on with.
    Data(StreamReader<u8>, FutureReader<Ended>, Vec<u8>),
    /// The stream ended; how the peer ended.
    End(Ended),
}

/// What a send in flight gives back: the stream end to write on with,
/// what it could not write (the peer is gone when that is not empty), and
/// the socket, kept alive until the send is done.
type WriteOutcome = (StreamWriter<u8>, Vec<u8>, Rc<StreamSocket>);

/// A connected stream socket.
pub(crate) struct Stream {
    // Receiving, in the order they must go: the read in flight first.
    read: Pending<ReadOutcome>,
    reader: RefCell<Option<(StreamReader<u8>, FutureReader<Ended>)>>,
    /// What the last read delivered; `pos` is where the app is in it.
    buf: RefCell<Vec<u8>>,
    pos: Cell<usize>,
    /// The peer's side ended (`Err` once, for a reset, then `Ok`).
    ended: RefCell<Option<io::Result<()>>>,
    // Sending.
    sending: Sending<Option<WriteOutcome>>,
    writer: RefCell<Option<StreamWriter<u8>>>,
    spare: RefCell<Vec<u8>>,
    /// Bytes handed to the send in flight.
    in_flight: Cell<usize>,
    /// How the send stream ended, for the error after a failed write.
    sent: RefCell<Option<FutureReader<Ended>>>,
    /// SHUT_WR: set before the send stream's end, which may wait for the
    /// send in flight.
    closing: Rc<Cell<bool>>,
    socket: Rc<StreamSocket>,
    nonblocking: Cell<bool>,
}

impl Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("socket", &self.socket)
            .field("read", &self.read)
            .field("sending", &self.sending)
            .finish()
    }
}

impl Stream {
    fn new(socket: StreamSocket) -> Self {
        let (reader, ended) = socket.receive();
        let (writer, outgoing) = wit_stream::new::<u8>();
        let sent = socket.send(outgoing);
        Self {
            read: Pending::default(),
            reader: RefCell::new(Some((reader, ended))),
            buf: RefCell::new(Vec::new()),
            pos: Cell::new(0),
            ended: RefCell::new(None),
            sending: Sending::default(),
            writer: RefCell::new(Some(writer)),
            spare: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            sent: RefCell::new(Some(sent)),
            closing: Rc::new(Cell::new(false)),
            socket: Rc::new(socket),
            nonblocking: Cell::new(false),
        }
    }

    fn unread(&self) -> usize {
        self.buf.borrow().len() - self.pos.get()
    }

    /// Starts the next read of the receive stream, unless one is in
    /// flight or the stream ended.
    fn start_read(&self) {
        if !self.read.is_idle() || self.unread() > 0 {
            return;
        }
        let Some((mut reader, ended)) = self.reader.borrow_mut().take() else { return };
        let mut buf = std::mem::take(&mut *self.buf.borrow_mut());
        buf.clear();
        buf.reserve(READ_SIZE);
        self.pos.set(0);
        self.read.start(async move {
            let (status, buf) = reader.read(buf).await;
            match status {
                StreamResult::Complete(_) => ReadOutcome::Data(reader, ended, buf),
                StreamResult::Dropped | StreamResult::Cancelled => {
                    drop(reader);
                    ReadOutcome::End(ended.await)
                }
            }
        });
    }

    /// Takes in what the read in flight delivered, if it finished.
    fn absorb_read(&self) {
        match self.read.take() {
            Some(ReadOutcome::Data(reader, ended, buf)) => {
                *self.reader.borrow_mut() = Some((reader, ended));
                *self.buf.borrow_mut() = buf;
                self.pos.set(0);
            }
            Some(ReadOutcome::End(how)) => *self.ended.borrow_mut() = Some(how.map_err(error)),
            None => {}
        }
    }

    /// Waits (or, non-blocking, looks) until the send in flight is done,
    /// and takes its writer back; an error when the peer stopped taking
    /// bytes.
    fn settle_send(&self, nonblocking: bool) -> io::Result<()> {
        if self.sending.is_busy() {
            wait(nonblocking, &self.sending)?;
        }
        let Some(outcome) = self.sending.take() else { return Ok(()) };
        self.in_flight.set(0);
        let Some((writer, unsent, _socket)) = outcome else { return Ok(()) };
        if !unsent.is_empty() {
            drop(writer);
            return Err(self.send_failure());
        }
        *self.writer.borrow_mut() = Some(writer);
        *self.spare.borrow_mut() = unsent;
        Ok(())
    }

    /// Why the send stream stopped: the send future's error code (a reset,
    /// usually), or a broken pipe.
    fn send_failure(&self) -> io::Error {
        let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "vsock: stream closed");
        match self.sent.borrow_mut().take() {
            Some(sent) => match wit_bindgen::block_on(async { sent.await }) {
                Err(code) => error(code),
                Ok(()) => broken(),
            },
            None => broken(),
        }
    }

    /// Ends the send stream (SHUT_WR) once the send in flight, if any, is
    /// done.
    fn close_send(&self) {
        self.closing.set(true);
        drop(self.writer.borrow_mut().take());
    }
}

impl contract::Socket<Wasi3Wait> for Stream {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        if self.unread() > 0 || self.ended.borrow().is_some() {
            return PollRef::Ready;
        }
        self.start_read();
        PollRef::Op(&self.read)
    }
}

impl contract::Connection<Wasi3Wait> for Stream {
    fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        conn::connect::<Kind>(addr, timeout)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_remote_address().map(Into::into).map_err(error)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.socket.shutdown(ShutdownType::Receive).map_err(error)?;
            // As in Linux, what is queued is discarded, and reads see the
            // end.
            self.read.cancel();
            drop(self.reader.borrow_mut().take());
            self.buf.borrow_mut().clear();
            self.pos.set(0);
            *self.ended.borrow_mut() = Some(Ok(()));
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            self.close_send();
        }
        Ok(())
    }

    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        conn::linger(linger)
    }

    fn writable(&self) -> PollRef<'_> {
        if self.sending.is_busy() { PollRef::Op(&self.sending) } else { PollRef::Ready }
    }
}

impl ByteStream<Wasi3Wait> for Stream {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            self.absorb_read();
            let unread = self.unread();
            if unread > 0 {
                let n = unread.min(buf.len());
                let pos = self.pos.get();
                buf[..n].copy_from_slice(&self.buf.borrow()[pos..pos + n]);
                self.pos.set(pos + n);
                return Ok(n);
            }
            if let Some(ended) = &mut *self.ended.borrow_mut() {
                // A reset is reported once; after it, reads see the end.
                return std::mem::replace(ended, Ok(())).map(|()| 0);
            }
            self.start_read();
            wait(self.nonblocking.get(), &self.read)?;
        }
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let nonblocking = self.nonblocking.get();
        self.settle_send(nonblocking)?;
        if self.closing.get() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "vsock: shut down for writing"));
        }
        let mut writer = self.writer.borrow_mut().take().ok_or_else(|| self.send_failure())?;
        let n = buf.len().min(WRITE_SIZE);
        let mut chunk = std::mem::take(&mut *self.spare.borrow_mut());
        chunk.clear();
        chunk.extend_from_slice(&buf[..n]);
        let socket = self.socket.clone();
        let closing = self.closing.clone();
        self.in_flight.set(n);
        self.sending.start(async move {
            let unsent = writer.write_all(chunk).await;
            if closing.get() {
                // Shut down (or dropped) meanwhile: this ends the stream.
                drop(writer);
                return None;
            }
            Some((writer, unsent, socket))
        });
        if !nonblocking {
            self.settle_send(false)?;
        }
        Ok(n)
    }

    /// Blocking, waits until the last write has left; non-blocking, does
    /// nothing (a later write or `writable` waits for it).
    fn flush(&self) -> io::Result<()> {
        if self.nonblocking.get() {
            return Ok(());
        }
        self.settle_send(false)
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.absorb_read();
        let local = self.unread();
        if local == 0 && self.ended.borrow().is_some() {
            return Ok(1);
        }
        let host = if self.reader.borrow().is_some() || !self.read.is_idle() {
            self.socket.pending_input().map(to_usize).map_err(error)?
        } else {
            0
        };
        Ok(local.saturating_add(host))
    }

    fn send_queued(&self) -> io::Result<usize> {
        Ok(if self.sending.is_busy() { self.in_flight.get() } else { 0 })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The send in flight, if any, finishes in the background and then
        // ends the stream; otherwise the stream ends here.
        self.close_send();
    }
}
