//! Seqpacket sockets: the stream lifecycle, with a message receiver and a
//! message sender instead of byte streams.
//!
//! The receiver hands out whole messages in batches, each with the inq
//! hint (bytes of whole messages still queued) and the end-of-file flag,
//! so a component learns in one call both what arrived and whether asking
//! again would find anything. The sender follows the udp permit rule,
//! holding at most one message that did not fit the peer's credit yet
//! (see `messages.rs`, which datagram sockets share).

use std::sync::Arc;

use pier_stack::{Error, Interest, Readiness, RecvInfo, SocketHandle, SocketType, Stack};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::Pollable;

use crate::conn::ConnSocket;
use crate::messages::{self, Outgoing, Sender};
use crate::net::{Sock, VsockCtx, code};
use crate::network::{ErrorCode, VsockError};

/// The `seqpacket-socket` resource.
pub struct SeqpacketSocket(pub(crate) ConnSocket);

impl SeqpacketSocket {
    pub(crate) fn create(ctx: &VsockCtx) -> Result<Self, ErrorCode> {
        ConnSocket::create(ctx, SocketType::SeqPacket).map(Self)
    }
}

/// The `message-receiver` resource.
pub struct MessageReceiver {
    sock: Arc<Sock>,
    /// An error met after some messages were already batched; reported by
    /// the next `receive` (the stack hands each error out only once).
    pending_error: Option<ErrorCode>,
}

/// The `message-sender` resource.
pub type MessageSender = Sender<Message>;

/// One outgoing message: what the component's `outgoing-message` carries.
pub(crate) struct Message {
    pub(crate) data: Vec<u8>,
    pub(crate) end_of_record: bool,
}

impl Outgoing for Message {
    const OVER_PERMIT: &'static str =
        "message-sender.send: more messages than check-send permitted";

    fn send(&self, s: &mut Stack, h: SocketHandle) -> Result<(), Error> {
        s.send_message(h, &self.data, self.end_of_record)
    }

    fn error(sock: &Sock, e: Error) -> ErrorCode {
        match e {
            // EPIPE after our own shutdown is invalid-state; from the peer,
            // a reset.
            Error::BrokenPipe if sock.send_shut() => ErrorCode::InvalidState,
            Error::NotConnected => ErrorCode::InvalidState,
            e => code(e),
        }
    }

    /// An empty message is checked like any other and never sent.
    fn probe(sock: &Sock) -> Result<(), Error> {
        sock.with(|s, h, _| s.send_message(h, &[], false))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for SeqpacketSocket {
    async fn ready(&mut self) {
        self.0.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for MessageReceiver {
    async fn ready(&mut self) {
        if self.pending_error.is_none() {
            self.sock.wait_for(Readiness::READABLE, &[Interest::Read]).await;
        }
    }
}

/// Pushes a connection's receiver and sender as children of its socket.
pub(crate) fn halves(
    table: &mut ResourceTable,
    socket: &Resource<SeqpacketSocket>,
    sock: &Arc<Sock>,
) -> Result<(Resource<MessageReceiver>, Resource<MessageSender>), VsockError> {
    let rx = MessageReceiver::new(sock.clone());
    let tx = MessageSender::new(sock.clone());
    let rx = table.push_child(rx, socket)?;
    let tx = table.push_child(tx, socket)?;
    Ok((rx, tx))
}

impl MessageReceiver {
    pub(crate) fn new(sock: Arc<Sock>) -> Self {
        Self { sock, pending_error: None }
    }

    /// `receive`: up to `max_results` whole messages, each made into what
    /// the component gets by `message`, the inq hint, and whether the peer
    /// is done (reported with the last messages rather than on the next
    /// call).
    pub(crate) fn receive<T>(
        &mut self,
        max_results: u64,
        mut message: impl FnMut(Vec<u8>, RecvInfo) -> T,
    ) -> Result<(Vec<T>, u64, bool), ErrorCode> {
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        let (batch, closed) = self.sock.with(|s, h, _| {
            let batch =
                messages::receive(s, h, max_results, |data, info| Some(message(data, info)));
            // Drained: report end-of-file now rather than on the next call,
            // when the next receive would end at once.
            let closed = batch.eof
                || (batch.error.is_none()
                    && batch.inq == 0
                    && s.unblocked(h).is_ok_and(|r| r.contains(Readiness::READABLE)));
            (batch, closed)
        });
        let messages = batch.items;
        if let Some(e) = batch.error {
            let e = match e {
                Error::NotConnected => ErrorCode::InvalidState,
                e => code(e),
            };
            if messages.is_empty() {
                return Err(e);
            }
            self.pending_error = Some(e);
        }
        Ok((messages, batch.inq, closed))
    }
}
