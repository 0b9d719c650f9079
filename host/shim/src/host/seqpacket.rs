//! The host side of `seqpacket-socket` and `seqpacket-create-socket`:
//! forwards to [`SeqpacketSocket`], [`MessageReceiver`] and
//! [`MessageSender`].

use wasmtime::component::Resource;
use wasmtime_wasi::p2::DynPollable;

use super::HostState;
use super::conn::conn_socket_methods;
use crate::bindings::vsock::sockets::seqpacket_create_socket;
use crate::bindings::vsock::sockets::seqpacket_socket::{
    self as wit, IncomingMessage, MessageBatch, OutgoingMessage,
};
use crate::network::VsockError;
use crate::seqpacket::{Message, MessageReceiver, MessageSender, SeqpacketSocket, halves};

impl seqpacket_create_socket::Host for HostState {
    fn create_seqpacket_socket(&mut self) -> Result<Resource<SeqpacketSocket>, VsockError> {
        let socket = SeqpacketSocket::create(&self.vsock)?;
        Ok(self.table.push(socket)?)
    }
}

impl wit::Host for HostState {}

impl wit::HostSeqpacketSocket for HostState {
    conn_socket_methods!(SeqpacketSocket, halves -> (MessageReceiver, MessageSender));
}

impl wit::HostMessageReceiver for HostState {
    fn receive(
        &mut self,
        this: Resource<MessageReceiver>,
        max_results: u64,
    ) -> Result<MessageBatch, VsockError> {
        let rx = self.table.get_mut(&this)?;
        let (messages, inq, closed) = rx.receive(max_results, |data, info| IncomingMessage {
            data,
            truncated: info.truncated,
            end_of_record: info.end_of_record,
        })?;
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
        Ok(self.table.get_mut(&this)?.check_send()?)
    }

    fn send(
        &mut self,
        this: Resource<MessageSender>,
        messages: Vec<OutgoingMessage>,
    ) -> Result<u64, VsockError> {
        self.table
            .get_mut(&this)?
            .send(messages, |m| Ok(Message { data: m.data, end_of_record: m.end_of_record }))
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
