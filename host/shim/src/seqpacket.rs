//! Seqpacket sockets: the stream lifecycle, with a message receiver and a
//! message sender instead of byte streams.
//!
//! The receiver hands out whole messages in batches, each with the inq
//! hint (bytes of whole messages still queued) and the end-of-file flag,
//! so a component learns in one call both what arrived and whether asking
//! again would find anything.
//!
//! The sender follows the udp permit rule. A message that does not fit
//! the peer's credit right now is still accepted: the sender holds it (at
//! most one, so memory stays bounded by one message) and `check-send`
//! answers 0 until the credit lets it out. A component therefore never
//! retries a large message in a loop, and never waits on a pollable that
//! cannot fire: the held message is retried on every credit update. A
//! held message outlives its sender: dropped (or the component gone), the
//! sender hands it to a background task that sends it when credit returns.

use std::sync::Arc;

use pier_stack::{Error, Interest, Readiness, SocketType};
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynPollable, Pollable};

use crate::bindings::vsock::sockets::seqpacket_create_socket;
use crate::bindings::vsock::sockets::seqpacket_socket::{
    self as wit, IncomingMessage, MessageBatch, OutgoingMessage,
};
use crate::bindings::vsock::sockets::stream_socket::ShutdownType;
use crate::bindings::{ErrorCode, VsockAddress, VsockError};
use crate::conn::ConnSocket;
use crate::host::HostState;
use crate::net::{Network, Sock, code};

/// Most messages one `receive` returns, whatever the component asks.
const MAX_BATCH_MESSAGES: usize = 256;
/// `receive` stops adding messages once a batch holds this many bytes.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Messages one `check-send` permits.
const SEND_PERMIT: u64 = 64;

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
pub struct MessageSender {
    sock: Arc<Sock>,
    /// Messages the last `check-send` permitted and `send` has not used.
    permit: u64,
    /// A permitted message that did not fit the peer's credit yet.
    held: Option<(Vec<u8>, bool)>,
    /// The failure of a held message, for the next call.
    pending_error: Option<ErrorCode>,
}

impl MessageSender {
    fn error(&self, e: Error) -> ErrorCode {
        match e {
            // EPIPE after our own shutdown is invalid-state; from the peer,
            // a reset.
            Error::BrokenPipe if self.sock.send_shut() => ErrorCode::InvalidState,
            Error::NotConnected => ErrorCode::InvalidState,
            e => code(e),
        }
    }

    /// Tries to send the held message; `Ok(true)` when none is held.
    fn flush_held(&mut self) -> Result<bool, ErrorCode> {
        let Some((data, eor)) = &self.held else { return Ok(true) };
        match self.sock.with(|s, h, _| s.send_message(h, data, *eor)) {
            Ok(()) => {
                self.held = None;
                Ok(true)
            }
            Err(Error::WouldBlock) => Ok(false),
            Err(e) => {
                self.held = None;
                Err(self.error(e))
            }
        }
    }
}

impl Drop for MessageSender {
    /// A held message was accepted, so it is not lost with its sender.
    fn drop(&mut self) {
        let Some((data, eor)) = self.held.take() else { return };
        let sock = self.sock.clone();
        self.sock.net.finish_in_background(async move {
            sock.send_when_ready(|s, h| s.send_message(h, &data, eor)).await;
        });
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

#[wasmtime_wasi::async_trait]
impl Pollable for MessageSender {
    async fn ready(&mut self) {
        if self.pending_error.is_some() {
            return;
        }
        let Some((data, eor)) = &self.held else { return };
        let outcome = self.sock.send_when_ready(|s, h| s.send_message(h, data, *eor)).await;
        match outcome {
            Some(Ok(())) => self.held = None,
            Some(Err(e)) => {
                self.held = None;
                self.pending_error = Some(self.error(e));
            }
            None => {}
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
    let tx = MessageSender { sock: sock.clone(), permit: 0, held: None, pending_error: None };
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
    fn start_bind(
        &mut self,
        this: Resource<SeqpacketSocket>,
        network: Resource<Network>,
        local_address: VsockAddress,
    ) -> Result<(), VsockError> {
        self.table.get(&network)?;
        Ok(self.table.get_mut(&this)?.0.start_bind(local_address)?)
    }

    fn finish_bind(&mut self, this: Resource<SeqpacketSocket>) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.finish_bind()?)
    }

    fn start_connect(
        &mut self,
        this: Resource<SeqpacketSocket>,
        network: Resource<Network>,
        remote_address: VsockAddress,
    ) -> Result<(), VsockError> {
        self.table.get(&network)?;
        Ok(self.table.get_mut(&this)?.0.start_connect(remote_address)?)
    }

    fn finish_connect(
        &mut self,
        this: Resource<SeqpacketSocket>,
    ) -> Result<(Resource<MessageReceiver>, Resource<MessageSender>), VsockError> {
        let socket = self.table.get_mut(&this)?;
        socket.0.finish_connect()?;
        let sock = socket.0.sock.clone();
        halves(&mut self.table, &this, &sock)
    }

    fn start_listen(&mut self, this: Resource<SeqpacketSocket>) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.start_listen()?)
    }

    fn finish_listen(&mut self, this: Resource<SeqpacketSocket>) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.finish_listen()?)
    }

    fn accept(
        &mut self,
        this: Resource<SeqpacketSocket>,
    ) -> Result<
        (Resource<SeqpacketSocket>, Resource<MessageReceiver>, Resource<MessageSender>),
        VsockError,
    > {
        let (conn, _peer) = self.table.get_mut(&this)?.0.accept()?;
        let sock = conn.sock.clone();
        let socket = self.table.push(SeqpacketSocket(conn))?;
        let (rx, tx) = halves(&mut self.table, &socket, &sock)?;
        Ok((socket, rx, tx))
    }

    fn local_address(
        &mut self,
        this: Resource<SeqpacketSocket>,
    ) -> Result<VsockAddress, VsockError> {
        Ok(self.table.get(&this)?.0.local_address()?)
    }

    fn remote_address(
        &mut self,
        this: Resource<SeqpacketSocket>,
    ) -> Result<VsockAddress, VsockError> {
        Ok(self.table.get(&this)?.0.remote_address()?)
    }

    fn is_listening(&mut self, this: Resource<SeqpacketSocket>) -> wasmtime::Result<bool> {
        Ok(self.table.get(&this)?.0.is_listening())
    }

    fn set_listen_backlog_size(
        &mut self,
        this: Resource<SeqpacketSocket>,
        value: u64,
    ) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.set_listen_backlog_size(value)?)
    }

    fn buffer_size(&mut self, this: Resource<SeqpacketSocket>) -> Result<u64, VsockError> {
        Ok(self.table.get(&this)?.0.buffer_size()?)
    }

    fn set_buffer_size(
        &mut self,
        this: Resource<SeqpacketSocket>,
        value: u64,
    ) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.set_buffer_size(value)?)
    }

    fn connect_timeout(&mut self, this: Resource<SeqpacketSocket>) -> Result<u64, VsockError> {
        Ok(self.table.get(&this)?.0.connect_timeout()?)
    }

    fn set_connect_timeout(
        &mut self,
        this: Resource<SeqpacketSocket>,
        value: u64,
    ) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.set_connect_timeout(value)?)
    }

    fn subscribe(
        &mut self,
        this: Resource<SeqpacketSocket>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn shutdown(
        &mut self,
        this: Resource<SeqpacketSocket>,
        shutdown_type: ShutdownType,
    ) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.0.shutdown(shutdown_type.into())?)
    }

    fn drop(&mut self, this: Resource<SeqpacketSocket>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
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
        let max = usize::try_from(max_results).unwrap_or(usize::MAX).min(MAX_BATCH_MESSAGES);
        let (messages, inq, closed, error) = rx.sock.with(|s, h, _| {
            let mut messages = Vec::new();
            let mut bytes = 0;
            let mut closed = false;
            let mut error = None;
            while messages.len() < max && bytes < MAX_BATCH_BYTES {
                let mut data = Vec::new();
                let received = s.recv_with(h, false, |a, b| {
                    data.reserve_exact(a.len() + b.len());
                    data.extend_from_slice(a);
                    data.extend_from_slice(b);
                    Ok::<_, std::convert::Infallible>(data.len())
                });
                match received {
                    Ok(info) if info.eof => {
                        closed = true;
                        break;
                    }
                    Ok(info) => {
                        bytes += data.len();
                        messages.push(IncomingMessage {
                            data,
                            truncated: info.truncated,
                            end_of_record: info.end_of_record,
                        });
                    }
                    Err(Error::WouldBlock) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let inq = s.recv_queued(h).unwrap_or(0) as u64;
            if !closed && error.is_none() && inq == 0 {
                // Drained: report end-of-file now rather than on the next
                // call, when the peer is done.
                closed = s.readiness(h).is_ok_and(|r| r.contains(Readiness::READ_CLOSED));
            }
            (messages, inq, closed, error)
        });
        if let Some(e) = error {
            let e = match e {
                Error::NotConnected => ErrorCode::InvalidState,
                e => code(e),
            };
            if messages.is_empty() {
                return Err(e.into());
            }
            rx.pending_error = Some(e);
        }
        Ok(MessageBatch { messages, inq, closed })
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
        let tx = self.table.get_mut(&this)?;
        tx.permit = 0;
        if let Some(e) = tx.pending_error.take() {
            return Err(e.into());
        }
        if !tx.flush_held()? {
            return Ok(0);
        }
        // An empty message is checked like any other and never sent: it
        // tells whether a send would fail, without sending anything.
        tx.sock.with(|s, h, _| s.send_message(h, &[], false)).map_err(|e| tx.error(e))?;
        tx.permit = SEND_PERMIT;
        Ok(SEND_PERMIT)
    }

    fn send(
        &mut self,
        this: Resource<MessageSender>,
        messages: Vec<OutgoingMessage>,
    ) -> Result<u64, VsockError> {
        let tx = self.table.get_mut(&this)?;
        let count = messages.len() as u64;
        if count > tx.permit {
            return Err(VsockError::trap(
                "message-sender.send: more messages than check-send permitted",
            ));
        }
        tx.permit -= count;
        let mut accepted = 0u64;
        let mut failure = None;
        let mut held = None;
        tx.sock.with(|s, h, _| {
            for m in messages {
                match s.send_message(h, &m.data, m.end_of_record) {
                    Ok(()) => accepted += 1,
                    Err(Error::WouldBlock) => {
                        // Permitted, so accepted: held until credit allows.
                        held = Some((m.data, m.end_of_record));
                        accepted += 1;
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        });
        tx.held = held;
        if tx.held.is_some() {
            tx.permit = 0;
        }
        match failure {
            // The failure, if it persists, reaches the next call.
            Some(e) if accepted == 0 => Err(tx.error(e).into()),
            _ => Ok(accepted),
        }
    }

    fn subscribe(
        &mut self,
        this: Resource<MessageSender>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<MessageSender>) -> wasmtime::Result<()> {
        // A held message still goes out (see `Drop for MessageSender`).
        self.table.delete(this)?;
        Ok(())
    }
}
