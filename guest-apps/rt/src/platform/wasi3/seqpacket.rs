//! Seqpacket sockets over `vsock:sockets@0.2.0`: one message per async
//! call each way. A receive is kept in flight and its message held until
//! `recv` takes it; its inq hint is what `recv_queued` reports. A send
//! copies the message and runs in the background: a blocking send waits
//! for it, a non-blocking one returns at once and the next send (or
//! `writable`) waits. Listening and connecting are `conn`'s.

use std::cell::Cell;
use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use wit_bindgen::StreamReader;

use super::bindings::vsock::sockets::types::{
    ErrorCode, Message, SeqpacketSocket, ShutdownType, VsockAddress,
};
use super::conn::{self, SockKind};
use super::convert::{error, send_error, to_usize};
use super::wait::{Pending, PollRef, Sending, Wasi3Wait, wait};
use crate::addr::VsockAddr;
use crate::message::RecvMessage;
use crate::net::Shutdown;
use crate::platform::contract::{self, MessageStream};

/// The seqpacket socket kind, for `conn`.
#[derive(Debug)]
pub(crate) enum Kind {}

impl SockKind for Kind {
    type Socket = SeqpacketSocket;
    type Conn = SeqStream;

    fn create() -> Result<SeqpacketSocket, ErrorCode> {
        SeqpacketSocket::create()
    }
    fn bind(s: &SeqpacketSocket, local: VsockAddress) -> Result<(), ErrorCode> {
        s.bind(local)
    }
    fn set_listen_backlog_size(s: &SeqpacketSocket, value: u64) -> Result<(), ErrorCode> {
        s.set_listen_backlog_size(value)
    }
    fn listen(s: &SeqpacketSocket) -> Result<StreamReader<SeqpacketSocket>, ErrorCode> {
        s.listen()
    }
    fn connect(
        s: &SeqpacketSocket,
        remote: VsockAddress,
    ) -> impl Future<Output = Result<(), ErrorCode>> + '_ {
        s.connect(remote)
    }
    fn local_address(s: &SeqpacketSocket) -> Result<VsockAddress, ErrorCode> {
        s.get_local_address()
    }
    fn remote_address(s: &SeqpacketSocket) -> Result<VsockAddress, ErrorCode> {
        s.get_remote_address()
    }
    fn connected(socket: SeqpacketSocket) -> SeqStream {
        SeqStream {
            receive: Pending::default(),
            inq: Cell::new(0),
            closed: Cell::new(false),
            send: Sending::default(),
            socket: Rc::new(socket),
            nonblocking: Cell::new(false),
        }
    }
}

/// A connected seqpacket socket.
pub(crate) struct SeqStream {
    receive: Pending<Result<Option<Message>, ErrorCode>>,
    /// The last message's inq hint: bytes still queued at the host.
    inq: Cell<u64>,
    /// The peer ended and every message was read, or this side shut down
    /// receiving.
    closed: Cell<bool>,
    send: Sending<Result<(), ErrorCode>>,
    socket: Rc<SeqpacketSocket>,
    nonblocking: Cell<bool>,
}

impl Debug for SeqStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqStream")
            .field("socket", &self.socket)
            .field("receive", &self.receive)
            .field("send", &self.send)
            .finish()
    }
}

impl SeqStream {
    fn start_receive(&self) {
        if self.receive.is_idle() && !self.closed.get() {
            let socket = self.socket.clone();
            self.receive.start(async move { socket.receive().await });
        }
    }

    /// The outcome of the send in flight, once done: its error, if any.
    fn settle_send(&self, nonblocking: bool) -> io::Result<()> {
        if self.send.is_busy() {
            wait(nonblocking, &self.send)?;
        }
        match self.send.take() {
            Some(Err(code)) => Err(send_error(code)),
            _ => Ok(()),
        }
    }
}

impl contract::Socket<Wasi3Wait> for SeqStream {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        if self.closed.get() {
            return PollRef::Ready;
        }
        self.start_receive();
        PollRef::Op(&self.receive)
    }
}

impl contract::Connection<Wasi3Wait> for SeqStream {
    fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        conn::connect::<Kind>(addr, timeout)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_remote_address().map(Into::into).map_err(error)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let which = match how {
            Shutdown::Read => ShutdownType::Receive,
            Shutdown::Write => ShutdownType::Send,
            Shutdown::Both => ShutdownType::Both,
        };
        self.socket.shutdown(which).map_err(error)?;
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            // As in Linux, what is queued is discarded.
            self.receive.cancel();
            self.closed.set(true);
        }
        Ok(())
    }

    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        conn::linger(linger)
    }

    fn writable(&self) -> PollRef<'_> {
        if self.send.is_busy() { PollRef::Op(&self.send) } else { PollRef::Ready }
    }
}

impl MessageStream<Wasi3Wait> for SeqStream {
    fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        let nonblocking = self.nonblocking.get();
        self.settle_send(nonblocking)?;
        if data.is_empty() {
            // As in Linux: accepted, and nothing is transmitted.
            return Ok(0);
        }
        let socket = self.socket.clone();
        let message = data.to_vec();
        self.send.start(async move { socket.send(message, end_of_record).await });
        // A message the host refuses at once (too large, not connected)
        // fails this call rather than the next.
        if !nonblocking || !self.send.is_busy() {
            self.settle_send(nonblocking)?;
        }
        Ok(data.len())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        loop {
            match self.receive.take() {
                Some(Ok(Some(m))) => {
                    self.inq.set(m.inq);
                    let n = m.data.len().min(buf.len());
                    buf[..n].copy_from_slice(&m.data[..n]);
                    return Ok(RecvMessage {
                        len: n,
                        truncated: m.truncated || n < m.data.len(),
                        end_of_record: m.end_of_record,
                    });
                }
                Some(Ok(None)) => self.closed.set(true),
                Some(Err(code)) => return Err(error(code)),
                None => {}
            }
            if self.closed.get() {
                return Ok(RecvMessage { len: 0, truncated: false, end_of_record: false });
            }
            self.start_receive();
            wait(self.nonblocking.get(), &self.receive)?;
        }
    }

    /// The message held, if one was received and not read, plus the last
    /// inq hint.
    fn recv_queued(&self) -> io::Result<usize> {
        let (held, inq) = self.receive.with_done(|done| match done {
            Some(Ok(Some(m))) => (m.data.len(), to_usize(m.inq)),
            _ => (0, to_usize(self.inq.get())),
        });
        Ok(held.saturating_add(inq))
    }
}
