//! 0.2.0 datagram sockets, in `wasi:sockets/types.udp-socket@0.3.0`'s
//! shape: `connect` fixes the peer without waiting, `send` awaits room in
//! the transport rather than dropping, and `receive` awaits the next
//! datagram the component may hear.
//!
//! Who may be sent to and heard from are 0.1.0's rules, shared with
//! `datagram.rs` ([`destination`], [`hears`]); as there, the stack's
//! socket is never `connect`ed, the fixed peer lives here, so
//! `disconnect` can undo it.

use std::sync::Arc;

use pier_stack::{
    Error, Interest, Readiness, SocketType, VMADDR_CID_ANY, VMADDR_PORT_ANY, VsockAddr,
};
use wasmtime::component::{HasSelf, Resource};

use super::conn::{AsyncStore, Outcome};
use super::resources::DatagramSocket;
use super::types::{self, ErrorCode, IncomingDatagram, VsockAddress};
use crate::datagram::{Datagram, MAX_DATAGRAM, destination, hears};
use crate::grants::ComponentGrants;
use crate::host::HostState;
use crate::messages::{self, Outgoing};
use crate::net::{Sock, code};
use crate::network::ErrorCode as V1ErrorCode;

impl DatagramSocket {
    fn bind(&mut self, local: VsockAddress) -> Result<(), V1ErrorCode> {
        if self.bound {
            return Err(V1ErrorCode::InvalidState);
        }
        if local.port != VMADDR_PORT_ANY {
            self.ctx.grants.check_listen("bind a datagram socket", local.port)?;
        }
        self.sock.with(|s, h, _| s.bind(h, VsockAddr::new(local.cid, local.port))).map_err(
            |e| match e {
                Error::InvalidArgument => V1ErrorCode::InvalidState,
                e => code(e),
            },
        )?;
        self.bound = true;
        Ok(())
    }
}

fn get<'a>(
    table: &'a mut wasmtime::component::ResourceTable,
    this: &Resource<DatagramSocket>,
) -> wasmtime::Result<&'a mut DatagramSocket> {
    Ok(table.get_mut(this)?)
}

impl types::HostDatagramSocket for HostState {
    fn create(&mut self) -> Outcome<Resource<DatagramSocket>> {
        let sock = match self.vsock.socket(SocketType::Datagram) {
            Ok(sock) => sock,
            Err(e) => return Ok(Err(e.into())),
        };
        let socket = DatagramSocket { ctx: self.vsock.clone(), sock, bound: false, peer: None };
        Ok(Ok(self.table.push(socket)?))
    }

    fn bind(&mut self, this: Resource<DatagramSocket>, local: VsockAddress) -> Outcome<()> {
        Ok(get(&mut self.table, &this)?.bind(local).map_err(Into::into))
    }

    fn connect(&mut self, this: Resource<DatagramSocket>, remote: VsockAddress) -> Outcome<()> {
        let socket = get(&mut self.table, &this)?;
        if remote.port == VMADDR_PORT_ANY {
            return Ok(Err(ErrorCode::InvalidArgument));
        }
        let local_cid = socket.ctx.net.local_cid();
        let cid = if remote.cid == VMADDR_CID_ANY { local_cid } else { remote.cid };
        let peer = VsockAddr::new(cid, remote.port);
        if let Err(e) = socket.ctx.grants.check_connect("connect a datagram socket", peer) {
            return Ok(Err(e.into()));
        }
        socket.peer = Some(peer);
        Ok(Ok(()))
    }

    fn disconnect(&mut self, this: Resource<DatagramSocket>) -> Outcome<()> {
        let socket = get(&mut self.table, &this)?;
        Ok(socket.peer.take().map(|_| ()).ok_or(ErrorCode::InvalidState))
    }

    fn get_local_address(&mut self, this: Resource<DatagramSocket>) -> Outcome<VsockAddress> {
        let socket = get(&mut self.table, &this)?;
        let addr = socket.sock.query(|s, h| s.local_addr(h));
        Ok(addr
            .map(|a| VsockAddress { cid: a.cid, port: a.port })
            .map_err(|_| ErrorCode::InvalidState))
    }

    fn get_remote_address(&mut self, this: Resource<DatagramSocket>) -> Outcome<VsockAddress> {
        let socket = get(&mut self.table, &this)?;
        Ok(socket
            .peer
            .map(|a| VsockAddress { cid: a.cid, port: a.port })
            .ok_or(ErrorCode::InvalidState))
    }

    fn get_buffer_size(&mut self, this: Resource<DatagramSocket>) -> Outcome<u64> {
        let socket = get(&mut self.table, &this)?;
        Ok(socket.sock.query(|s, h| s.buffer_size(h)).map(u64::from).map_err(|e| code(e).into()))
    }

    fn set_buffer_size(&mut self, this: Resource<DatagramSocket>, value: u64) -> Outcome<()> {
        if value == 0 {
            return Ok(Err(ErrorCode::InvalidArgument));
        }
        let socket = get(&mut self.table, &this)?;
        Ok(socket.sock.with(|s, h, _| s.set_buffer_size(h, value)).map_err(|e| code(e).into()))
    }

    fn drop(&mut self, this: Resource<DatagramSocket>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl types::HostDatagramSocketWithStore<HostState> for HasSelf<HostState> {
    async fn send(
        store: &AsyncStore,
        this: Resource<DatagramSocket>,
        data: Vec<u8>,
        remote: Option<VsockAddress>,
    ) -> Outcome<()> {
        if data.len() > MAX_DATAGRAM {
            return Ok(Err(ErrorCode::MessageTooLarge));
        }
        let prepared = store.with(|mut s| -> Outcome<(Arc<Sock>, VsockAddr)> {
            let socket = get(&mut s.get().table, &this)?;
            let local_cid = socket.ctx.net.local_cid();
            let remote = remote.map(|a| crate::network::VsockAddress { cid: a.cid, port: a.port });
            let to = match destination(&socket.ctx.grants, local_cid, socket.peer, remote) {
                Ok(to) => to,
                Err(e) => return Ok(Err(e.into())),
            };
            // Sending binds an unbound socket first, to an ephemeral port.
            if !socket.bound {
                let any = VsockAddress { cid: VMADDR_CID_ANY, port: VMADDR_PORT_ANY };
                if let Err(e) = socket.bind(any) {
                    return Ok(Err(e.into()));
                }
            }
            Ok(Ok((socket.sock.clone(), to)))
        })?;
        let (sock, to) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => return Ok(Err(e)),
        };
        let datagram = Datagram { data, to };
        Ok(match sock.send_when_ready(|s, h| datagram.send(s, h)).await {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Datagram::error(&sock, e).into()),
            // The shim stops; the component stops at its next instruction.
            None => Err(ErrorCode::Unknown),
        })
    }

    async fn receive(
        store: &AsyncStore,
        this: Resource<DatagramSocket>,
    ) -> Outcome<IncomingDatagram> {
        type Receiver = (Arc<Sock>, Arc<ComponentGrants>, Option<VsockAddr>, bool);
        let (sock, grants, peer, open_port) = match store.with(|mut s| -> Outcome<Receiver> {
            let socket = get(&mut s.get().table, &this)?;
            if !socket.bound {
                return Ok(Err(ErrorCode::InvalidState));
            }
            let port = socket.sock.query(|s, h| s.local_addr(h)).map(|a| a.port).unwrap_or(0);
            let open_port = socket.ctx.grants.may_listen(port);
            Ok(Ok((socket.sock.clone(), socket.ctx.grants.clone(), socket.peer, open_port)))
        })? {
            Ok(found) => found,
            Err(e) => return Ok(Err(e)),
        };
        loop {
            let batch = sock.query(|s, h| {
                messages::receive(s, h, 1, |data, info| {
                    let from = info.from?;
                    hears(&grants, peer, open_port, from).then_some((data, from))
                })
            });
            if let Some((data, from)) = batch.items.into_iter().next() {
                let remote_address = VsockAddress { cid: from.cid, port: from.port };
                return Ok(Ok(IncomingDatagram { data, remote_address, inq: batch.inq }));
            }
            if let Some(e) = batch.error {
                return Ok(Err(code(e).into()));
            }
            sock.wait_for(Readiness::READABLE, &[Interest::Read]).await;
            if sock.net.stopping() {
                return Ok(Err(ErrorCode::Unknown));
            }
        }
    }
}
