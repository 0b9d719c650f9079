//! Seqpacket sockets over WIT. The host hands messages over in batches to
//! save host calls; the app reads them one at a time. This module keeps the
//! rest of a batch between `recv` calls and uses the batch's inq hint to
//! skip receives that would find nothing.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::Shutdown;
use std::time::Duration;

use wasip2::io::poll::Pollable;

use super::bindings::vsock::sockets::seqpacket_socket::{
    IncomingMessage, MessageReceiver, MessageSender, OutgoingMessage, SeqpacketSocket,
};
use super::stream::shutdown_type;
use super::{PollRef, error, lazy, send_error, to_usize, wait};
use crate::{RecvMessage, VsockAddr};

/// Messages asked for per host call. Enough to amortise the call for small
/// messages; the host bounds the bytes of one batch on its side.
const BATCH: u64 = 16;

pub(crate) type SeqListener = super::conn::Listener<SeqpacketSocket>;

#[derive(Debug)]
pub(crate) struct SeqStream {
    rx_ready: OnceCell<Pollable>,
    tx_ready: OnceCell<Pollable>,
    rx: MessageReceiver,
    tx: MessageSender,
    socket: SeqpacketSocket,
    /// The undelivered rest of the last batch.
    queue: RefCell<VecDeque<IncomingMessage>>,
    /// The last batch's inq hint: bytes still queued at the host.
    inq: Cell<u64>,
    /// Whether a receive has happened yet; before that, `inq` means nothing.
    received: Cell<bool>,
    /// The host reported end-of-file.
    closed: Cell<bool>,
    nonblocking: Cell<bool>,
}

impl SeqStream {
    pub(super) fn new(socket: SeqpacketSocket, rx: MessageReceiver, tx: MessageSender) -> Self {
        Self {
            rx_ready: OnceCell::new(),
            tx_ready: OnceCell::new(),
            rx,
            tx,
            socket,
            queue: RefCell::new(VecDeque::new()),
            inq: Cell::new(0),
            received: Cell::new(false),
            closed: Cell::new(false),
            nonblocking: Cell::new(false),
        }
    }

    pub(crate) fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        super::conn::connect::<SeqpacketSocket>(addr, timeout)
    }

    fn rx_ready(&self) -> &Pollable {
        lazy(&self.rx_ready, || self.rx.subscribe())
    }

    fn tx_ready(&self) -> &Pollable {
        lazy(&self.tx_ready, || self.tx.subscribe())
    }

    pub(crate) fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        let message = OutgoingMessage { data, end_of_record };
        loop {
            match self.tx.check_send() {
                Ok(0) => wait(self.nonblocking.get(), self.tx_ready())?,
                Ok(_) => match self.tx.send(std::slice::from_ref(&message)) {
                    Ok(0) => wait(self.nonblocking.get(), self.tx_ready())?,
                    Ok(_) => return Ok(data.len()),
                    Err(e) => return Err(send_error(e)),
                },
                Err(e) => return Err(send_error(e)),
            }
        }
    }

    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        loop {
            if let Some(m) = self.queue.borrow_mut().pop_front() {
                let n = m.data.len().min(buf.len());
                buf[..n].copy_from_slice(&m.data[..n]);
                return Ok(RecvMessage {
                    len: n,
                    truncated: m.truncated || n < m.data.len(),
                    end_of_record: m.end_of_record,
                });
            }
            if self.closed.get() {
                return Ok(RecvMessage { len: 0, truncated: false, end_of_record: false });
            }
            // The last batch said the host queue was drained: a receive now
            // would most likely come back empty, so wait first.
            let drained = self.received.get() && self.inq.get() == 0;
            if drained && !self.nonblocking.get() {
                self.rx_ready().block();
            }
            self.fill()?;
            if self.queue.borrow().is_empty() && !self.closed.get() {
                wait(self.nonblocking.get(), self.rx_ready())?;
            }
        }
    }

    fn fill(&self) -> io::Result<()> {
        let batch = self.rx.receive(BATCH).map_err(error)?;
        self.received.set(true);
        self.inq.set(batch.inq);
        self.closed.set(batch.closed);
        self.queue.borrow_mut().extend(batch.messages);
        Ok(())
    }

    pub(crate) fn set_linger(&self, linger: Option<core::time::Duration>) -> io::Result<()> {
        let nanos = linger.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.socket.set_linger(nanos).map_err(error)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket.shutdown(shutdown_type(how)).map_err(error)?;
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            // As in Linux, shutting down the receive side discards what is
            // queued, including what this side already fetched.
            self.queue.borrow_mut().clear();
        }
        Ok(())
    }

    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.remote_address().map(Into::into).map_err(error)
    }

    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    /// Bytes fetched but not yet read, plus the host's last inq hint.
    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        let local: usize = self.queue.borrow().iter().map(|m| m.data.len()).sum();
        Ok(local.saturating_add(to_usize(self.inq.get())))
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    pub(crate) fn readable(&self) -> PollRef<'_> {
        if self.closed.get() || !self.queue.borrow().is_empty() {
            PollRef::Ready
        } else {
            PollRef::Pollable(self.rx_ready())
        }
    }

    pub(crate) fn writable(&self) -> PollRef<'_> {
        PollRef::Pollable(self.tx_ready())
    }
}
