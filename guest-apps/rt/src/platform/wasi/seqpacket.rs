//! Seqpacket sockets over WIT. The host hands messages over in batches to
//! save host calls; the app reads them one at a time. This module keeps the
//! rest of a batch between `recv` calls ([`Batch`]) and uses the batch's
//! inq hint to skip receives that would find nothing; listening,
//! connecting and the rest of the connection are `conn`'s, shared with
//! streams.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;

use super::bindings::vsock::sockets::seqpacket_create_socket::create_seqpacket_socket;
use super::bindings::vsock::sockets::seqpacket_socket::{
    IncomingMessage, MessageReceiver, MessageSender, OutgoingMessage, SeqpacketSocket,
};
use super::conn::{self, Conn, Received, conn_socket};
use super::network::{error, to_usize};
use super::wait::{WasiPoll, send_whole, wait};
use crate::message::RecvMessage;
use crate::platform::contract::MessageStream;

/// Messages asked for per host call. Enough to amortise the call for small
/// messages; the host bounds the bytes of one batch on its side.
const BATCH: u64 = 16;

conn_socket!(SeqpacketSocket, create_seqpacket_socket, MessageReceiver, MessageSender, Batch);

/// A listening seqpacket socket.
pub(crate) type Listener = conn::Listener<SeqpacketSocket>;
/// A seqpacket connect under way.
pub(crate) type Connecting = conn::Connecting<SeqpacketSocket>;
/// A connected seqpacket socket.
pub(crate) type SeqStream = Conn<SeqpacketSocket>;

/// The last batch the host handed over, as far as it was not read yet.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// The undelivered rest of the last batch.
    queue: RefCell<VecDeque<IncomingMessage>>,
    /// The last batch's inq hint: bytes still queued at the host.
    inq: Cell<u64>,
    /// Whether a receive has happened yet; before that, `inq` means nothing.
    received: Cell<bool>,
    /// The host reported end-of-file.
    closed: Cell<bool>,
}

impl Received for Batch {
    fn holds(&self) -> bool {
        self.closed.get() || !self.queue.borrow().is_empty()
    }

    fn discard(&self) {
        self.queue.borrow_mut().clear();
    }
}

impl MessageStream<WasiPoll> for SeqStream {
    fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        let message = OutgoingMessage { data, end_of_record };
        send_whole(
            self.nonblocking.get(),
            self.tx_ready(),
            || self.tx.check_send(),
            || self.tx.send(std::slice::from_ref(&message)),
        )?;
        Ok(data.len())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        let batch = &self.received;
        loop {
            if let Some(m) = batch.queue.borrow_mut().pop_front() {
                let n = m.data.len().min(buf.len());
                buf[..n].copy_from_slice(&m.data[..n]);
                return Ok(RecvMessage {
                    len: n,
                    truncated: m.truncated || n < m.data.len(),
                    end_of_record: m.end_of_record,
                });
            }
            if batch.closed.get() {
                return Ok(RecvMessage { len: 0, truncated: false, end_of_record: false });
            }
            // The last batch said the host queue was drained: a receive now
            // would most likely come back empty, so wait first.
            let drained = batch.received.get() && batch.inq.get() == 0;
            if drained && !self.nonblocking.get() {
                self.rx_ready().block();
            }
            let got = self.rx.receive(BATCH).map_err(error)?;
            batch.received.set(true);
            batch.inq.set(got.inq);
            batch.closed.set(got.closed);
            batch.queue.borrow_mut().extend(got.messages);
            if batch.queue.borrow().is_empty() && !batch.closed.get() {
                wait(self.nonblocking.get(), self.rx_ready())?;
            }
        }
    }

    /// Bytes fetched but not yet read, plus the host's last inq hint.
    fn recv_queued(&self) -> io::Result<usize> {
        let batch = &self.received;
        let local: usize = batch.queue.borrow().iter().map(|m| m.data.len()).sum();
        Ok(local.saturating_add(to_usize(batch.inq.get())))
    }
}
