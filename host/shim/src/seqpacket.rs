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

use pier_stack::{Error, Interest, Readiness, SocketHandle, SocketType, Stack};
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynPollable, Pollable};

use crate::bindings::vsock::sockets::seqpacket_create_socket;
use crate::bindings::vsock::sockets::seqpacket_socket::{
    self as wit, IncomingMessage, MessageBatch, OutgoingMessage,
};
use crate::bindings::{ErrorCode, VsockError};
use crate::conn::ConnSocket;
use crate::host::HostState;
use crate::messages::{self, Outgoing, Sender};
use crate::net::{Sock, code};

/// The `seqpacket-socket` resource.
pub struct SeqpacketSocket(ConnSocket);

/// The `message-receiver` resource.
pub struct MessageReceiver {
    sock: Arc<Sock>,
    /// An error met after some messages were already batched; reported by
    /// the next `receive` (the stack hands each error out only once).
    pending_error: Option<ErrorCode>,
}

/// The `message-sender` resource.
pub type MessageSender = Sender<OutgoingMessage>;

impl Outgoing for OutgoingMessage {
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
fn halves(
    table: &mut wasmtime::component::ResourceTable,
    socket: &Resource<SeqpacketSocket>,
    sock: &Arc<Sock>,
) -> Result<(Resource<MessageReceiver>, Resource<MessageSender>), VsockError> {
    let rx = MessageReceiver { sock: sock.clone(), pending_error: None };
    let tx = MessageSender::new(sock.clone());
    let rx = table.push_child(rx, socket)?;
    let tx = table.push_child(tx, socket)?;
    Ok((rx, tx))
}

impl seqpacket_create_socket::Host for HostState {
    fn create_seqpacket_socket(&mut self) -> Result<Resource<SeqpacketSocket>, VsockError> {
        let socket = ConnSocket::create(&self.vsock, SocketType::SeqPacket)?;
        Ok(self.table.push(SeqpacketSocket(socket))?)
    }
}

impl wit::Host for HostState {}

impl wit::HostSeqpacketSocket for HostState {
    crate::conn::conn_socket_methods!(SeqpacketSocket, halves -> (MessageReceiver, MessageSender));
}

impl wit::HostMessageReceiver for HostState {
    fn receive(
        &mut self,
        this: Resource<MessageReceiver>,
        max_results: u64,
    ) -> Result<MessageBatch, VsockError> {
        let rx = self.table.get_mut(&this)?;
        if let Some(e) = rx.pending_error.take() {
            return Err(e.into());
        }
        let (batch, closed) = rx.sock.with(|s, h, _| {
            let batch = messages::receive(s, h, max_results, |data, info| {
                Some(IncomingMessage {
                    data,
                    truncated: info.truncated,
                    end_of_record: info.end_of_record,
                })
            });
            // Drained: report end-of-file now rather than on the next call,
            // when the peer is done.
            let closed = batch.eof
                || (batch.error.is_none()
                    && batch.inq == 0
                    && s.readiness(h).is_ok_and(|r| r.contains(Readiness::READ_CLOSED)));
            (batch, closed)
        });
        let messages = batch.items;
        if let Some(e) = batch.error {
            let e = match e {
                Error::NotConnected => ErrorCode::InvalidState,
                e => code(e),
            };
            if messages.is_empty() {
                return Err(e.into());
            }
            rx.pending_error = Some(e);
        }
        Ok(MessageBatch { messages, inq: batch.inq, closed })
    }

    fn subscribe(
        &mut self,
        this: Resource<MessageReceiver>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<MessageReceiver>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl wit::HostMessageSender for HostState {
    fn check_send(&mut self, this: Resource<MessageSender>) -> Result<u64, VsockError> {
        Ok(self.table.get_mut(&this)?.check_send()?)
    }

    fn send(
        &mut self,
        this: Resource<MessageSender>,
        messages: Vec<OutgoingMessage>,
    ) -> Result<u64, VsockError> {
        self.table.get_mut(&this)?.send(messages, Ok)
    }

    fn subscribe(
        &mut self,
        this: Resource<MessageSender>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<MessageSender>) -> wasmtime::Result<()> {
        // A held message still goes out (see `Drop for Sender`).
        self.table.delete(this)?;
        Ok(())
    }
}
