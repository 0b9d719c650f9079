//! 0.2.0 seqpacket sockets: the stream lifecycle, and one whole message
//! per `send` and per `receive`, each with its end-of-record mark, and the
//! `inq` hint on what was received.
//!
//! The messages move exactly as 0.1.0's do (`seqpacket.rs`, with the
//! sends and receives of `messages.rs`); what changes is only the
//! waiting: a send that finds no credit awaits it, and a receive that
//! finds nothing awaits the next message.

use std::sync::Arc;

use pier_stack::{Interest, SocketType};
use wasmtime::component::{HasSelf, Resource};

use super::conn::{self, AsyncStore, ConnResource, Outcome, Store, conn_resource_methods, get};
use super::resources::SeqpacketSocket;
use super::types::{self, ErrorCode, Message as Received, VsockAddress};
use crate::conn::ConnSocket;
use crate::host::HostState;
use crate::messages::Outgoing;
use crate::net::Sock;
use crate::seqpacket::{Message, MessageReceiver};

impl ConnResource for SeqpacketSocket {
    fn conn(&mut self) -> &mut ConnSocket {
        &mut self.0
    }

    fn accepted(conn: ConnSocket) -> Self {
        Self(conn)
    }
}

/// The connection's stack socket, for a send or a receive.
fn connected(store: &AsyncStore, this: &Resource<SeqpacketSocket>) -> Outcome<Arc<Sock>> {
    store.with(|mut s| {
        let conn = get(&mut s.get().table, this)?.conn();
        Ok(if conn.is_connected() { Ok(conn.sock.clone()) } else { Err(ErrorCode::InvalidState) })
    })
}

impl types::HostSeqpacketSocket for HostState {
    fn create(&mut self) -> Outcome<Resource<SeqpacketSocket>> {
        match ConnSocket::create(&self.vsock, SocketType::SeqPacket) {
            Ok(conn) => Ok(Ok(self.table.push(SeqpacketSocket(conn))?)),
            Err(e) => Ok(Err(e.into())),
        }
    }

    conn_resource_methods!(SeqpacketSocket);
}

impl types::HostSeqpacketSocketWithStore<HostState> for HasSelf<HostState> {
    async fn connect(
        store: &AsyncStore,
        this: Resource<SeqpacketSocket>,
        remote: VsockAddress,
    ) -> Outcome<()> {
        conn::connect(store, &this, remote).await
    }

    fn listen(
        store: Store<'_>,
        this: Resource<SeqpacketSocket>,
    ) -> Outcome<wasmtime::component::StreamReader<Resource<SeqpacketSocket>>> {
        conn::listen(store, &this)
    }

    async fn send(
        store: &AsyncStore,
        this: Resource<SeqpacketSocket>,
        data: Vec<u8>,
        end_of_record: bool,
    ) -> Outcome<()> {
        let sock = match connected(store, &this)? {
            Ok(sock) => sock,
            Err(e) => return Ok(Err(e)),
        };
        let message = Message { data, end_of_record };
        Ok(match sock.send_when_ready(|s, h| message.send(s, h)).await {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Message::error(&sock, e).into()),
            // The shim stops; the component stops at its next instruction.
            None => Err(ErrorCode::Unknown),
        })
    }

    async fn receive(
        store: &AsyncStore,
        this: Resource<SeqpacketSocket>,
    ) -> Outcome<Option<Received>> {
        let sock = match connected(store, &this)? {
            Ok(sock) => sock,
            Err(e) => return Ok(Err(e)),
        };
        // One message per call, so an error found after it cannot be left
        // over for a later call: the receiver is made afresh each time.
        let mut receiver = MessageReceiver::new(sock.clone());
        loop {
            let (mut messages, inq, closed) = match receiver.receive(1, |data, info| (data, info)) {
                Ok(batch) => batch,
                Err(e) => return Ok(Err(e.into())),
            };
            if let Some((data, info)) = messages.pop() {
                let message = Received {
                    data,
                    truncated: info.truncated,
                    end_of_record: info.end_of_record,
                    inq,
                };
                return Ok(Ok(Some(message)));
            }
            if closed {
                return Ok(Ok(None));
            }
            sock.wait_for(pier_stack::Readiness::READABLE, &[Interest::Read]).await;
            if sock.net.stopping() {
                return Ok(Err(ErrorCode::Unknown));
            }
        }
    }
}
