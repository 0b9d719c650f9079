//! Datagram sockets: a copy of wasi udp, with the inq hint on receives.
//!
//! The stack's datagram socket is never `connect`ed here: the peer chosen
//! with `%stream` lives in the shim, which checks every outgoing datagram
//! against it and against the grants, and filters incoming ones. That
//! keeps `%stream(none)` after `%stream(some(..))` possible, which the
//! stack alone cannot undo.
//!
//! Which incoming datagrams a component hears: on a port it was granted to
//! listen on, every peer's; on any other port (an ephemeral client port),
//! only those from peers it may send to. A datagram from anyone else is
//! dropped by the host, as the WIT says.
//!
//! Batched receive and the permit rule for sending are `messages.rs`,
//! shared with seqpacket sockets; this module adds the destination and
//! sender checks around them.

use std::sync::{Arc, Weak};

use pier_stack::{
    Error, Interest, Readiness, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VMADDR_PORT_ANY,
    VsockAddr,
};
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynPollable, Pollable};

use crate::bindings::vsock::sockets::datagram_create_socket;
use crate::bindings::vsock::sockets::datagram_socket::{
    self as wit, DatagramBatch, IncomingDatagram, OutgoingDatagram,
};
use crate::bindings::{ErrorCode, VsockAddress, VsockError};
use crate::grants::ComponentGrants;
use crate::host::HostState;
use crate::messages::{self, Outgoing, Sender};
use crate::net::{Network, Sock, VsockCtx, code};

/// The largest vsock datagram payload.
const MAX_DATAGRAM: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unbound,
    BindStarted,
    Bound,
}

/// The `datagram-socket` resource.
pub struct DatagramSocket {
    ctx: VsockCtx,
    sock: Arc<Sock>,
    state: State,
    /// The peer of the newest stream pair (connect(2)), if any.
    peer: Option<VsockAddr>,
    /// Alive while the newest stream pair is: a new pair may only be
    /// opened once the old one is gone.
    pair: Weak<()>,
}

/// What both halves of one stream pair share.
struct Pair {
    sock: Arc<Sock>,
    grants: Arc<ComponentGrants>,
    peer: Option<VsockAddr>,
    local_cid: u32,
    _alive: Arc<()>,
}

/// The `incoming-datagram-stream` resource.
pub struct IncomingDatagramStream {
    pair: Arc<Pair>,
    /// Whether the socket's port is one the component may listen on.
    open_port: bool,
}

/// The `outgoing-datagram-stream` resource.
pub struct OutgoingDatagramStream {
    pair: Arc<Pair>,
    tx: Sender<Datagram>,
}

/// One outgoing datagram, its destination checked against the peer and
/// the grants.
struct Datagram {
    data: Vec<u8>,
    to: VsockAddr,
}

impl Outgoing for Datagram {
    const OVER_PERMIT: &'static str =
        "outgoing-datagram-stream.send: more datagrams than check-send permitted";

    fn send(&self, s: &mut Stack, h: SocketHandle) -> Result<(), Error> {
        s.send_to(h, &self.data, self.to)
    }

    fn error(_sock: &Sock, e: Error) -> ErrorCode {
        match e {
            Error::InvalidArgument => ErrorCode::InvalidArgument,
            Error::BrokenPipe => ErrorCode::InvalidState,
            e => code(e),
        }
    }
}

impl Pair {
    /// Where one outgoing datagram goes, or why it may not.
    fn destination(&self, to: Option<VsockAddress>) -> Result<VsockAddr, ErrorCode> {
        let to = to.map(|a| {
            // As in Linux (and the stack), CID_ANY means this side.
            let cid = if a.cid == VMADDR_CID_ANY { self.local_cid } else { a.cid };
            VsockAddr::new(cid, a.port)
        });
        let addr = match (self.peer, to) {
            (Some(peer), None) => peer,
            (Some(peer), Some(to)) if to == peer => peer,
            (None, Some(to)) => to,
            (Some(_), Some(_)) | (None, None) => return Err(ErrorCode::InvalidArgument),
        };
        if addr.port == VMADDR_PORT_ANY {
            return Err(ErrorCode::InvalidArgument);
        }
        self.grants.check_connect("send a datagram", addr)?;
        Ok(addr)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for DatagramSocket {
    /// Binding completes at once, so `finish-bind` never waits.
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl Pollable for IncomingDatagramStream {
    async fn ready(&mut self) {
        self.pair.sock.wait_for(Readiness::READABLE, &[Interest::Read]).await;
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for OutgoingDatagramStream {
    async fn ready(&mut self) {
        self.tx.ready().await;
    }
}

impl datagram_create_socket::Host for HostState {
    fn create_datagram_socket(&mut self) -> Result<Resource<DatagramSocket>, VsockError> {
        let sock = self.vsock.socket(SocketType::Datagram)?;
        let socket = DatagramSocket {
            ctx: self.vsock.clone(),
            sock,
            state: State::Unbound,
            peer: None,
            pair: Weak::new(),
        };
        Ok(self.table.push(socket)?)
    }
}

impl wit::Host for HostState {}

impl wit::HostDatagramSocket for HostState {
    fn start_bind(
        &mut self,
        this: Resource<DatagramSocket>,
        network: Resource<Network>,
        local_address: VsockAddress,
    ) -> Result<(), VsockError> {
        self.table.get(&network)?;
        let socket = self.table.get_mut(&this)?;
        match socket.state {
            State::Unbound => {}
            State::BindStarted => return Err(ErrorCode::ConcurrencyConflict.into()),
            State::Bound => return Err(ErrorCode::InvalidState.into()),
        }
        let port = local_address.port;
        if port != VMADDR_PORT_ANY {
            socket.ctx.grants.check_listen("bind a datagram socket", port)?;
        }
        socket.sock.with(|s, h, _| s.bind(h, local_address.into())).map_err(|e| match e {
            Error::InvalidArgument => ErrorCode::InvalidState,
            e => code(e),
        })?;
        socket.state = State::BindStarted;
        Ok(())
    }

    fn finish_bind(&mut self, this: Resource<DatagramSocket>) -> Result<(), VsockError> {
        let socket = self.table.get_mut(&this)?;
        if socket.state != State::BindStarted {
            return Err(ErrorCode::NotInProgress.into());
        }
        socket.state = State::Bound;
        Ok(())
    }

    fn stream(
        &mut self,
        this: Resource<DatagramSocket>,
        remote_address: Option<VsockAddress>,
    ) -> Result<(Resource<IncomingDatagramStream>, Resource<OutgoingDatagramStream>), VsockError>
    {
        let socket = self.table.get_mut(&this)?;
        if socket.state != State::Bound {
            return Err(ErrorCode::InvalidState.into());
        }
        if socket.pair.strong_count() > 0 {
            return Err(VsockError::trap(
                "datagram-socket.stream: drop the previous stream pair first",
            ));
        }
        let local_cid = socket.ctx.net.local_cid();
        let peer = match remote_address {
            None => None,
            Some(a) if a.port == VMADDR_PORT_ANY => {
                return Err(ErrorCode::InvalidArgument.into());
            }
            Some(a) => {
                let cid = if a.cid == VMADDR_CID_ANY { local_cid } else { a.cid };
                let addr = VsockAddr::new(cid, a.port);
                socket.ctx.grants.check_connect("connect a datagram socket", addr)?;
                Some(addr)
            }
        };
        let local = socket.sock.query(|s, h| s.local_addr(h)).map_err(code)?;
        let alive = Arc::new(());
        socket.pair = Arc::downgrade(&alive);
        socket.peer = peer;
        let pair = Arc::new(Pair {
            sock: socket.sock.clone(),
            grants: socket.ctx.grants.clone(),
            peer,
            local_cid,
            _alive: alive,
        });
        let open_port = socket.ctx.grants.may_listen(local.port);
        let rx = IncomingDatagramStream { pair: pair.clone(), open_port };
        let tx = OutgoingDatagramStream { tx: Sender::new(pair.sock.clone()), pair };
        let rx = self.table.push_child(rx, &this)?;
        let tx = self.table.push_child(tx, &this)?;
        Ok((rx, tx))
    }

    fn local_address(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> Result<VsockAddress, VsockError> {
        let socket = self.table.get(&this)?;
        let addr =
            socket.sock.query(|s, h| s.local_addr(h)).map_err(|_| ErrorCode::InvalidState)?;
        Ok(addr.into())
    }

    fn remote_address(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> Result<VsockAddress, VsockError> {
        let socket = self.table.get(&this)?;
        Ok(socket.peer.ok_or(ErrorCode::InvalidState)?.into())
    }

    fn subscribe(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<DatagramSocket>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl wit::HostIncomingDatagramStream for HostState {
    fn receive(
        &mut self,
        this: Resource<IncomingDatagramStream>,
        max_results: u64,
    ) -> Result<DatagramBatch, VsockError> {
        let rx = self.table.get_mut(&this)?;
        let pair = &rx.pair;
        let open_port = rx.open_port;
        let batch = pair.sock.with(|s, h, _| {
            messages::receive(s, h, max_results, |data, info| {
                let from = info.from?;
                let wanted = match pair.peer {
                    Some(peer) => from == peer,
                    None => open_port || pair.grants.may_connect(from),
                };
                wanted.then(|| IncomingDatagram { data, remote_address: from.into() })
            })
        });
        match batch.error {
            Some(e) if batch.items.is_empty() => Err(code(e).into()),
            _ => Ok(DatagramBatch { datagrams: batch.items, inq: batch.inq }),
        }
    }

    fn subscribe(
        &mut self,
        this: Resource<IncomingDatagramStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<IncomingDatagramStream>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl wit::HostOutgoingDatagramStream for HostState {
    fn check_send(&mut self, this: Resource<OutgoingDatagramStream>) -> Result<u64, VsockError> {
        Ok(self.table.get_mut(&this)?.tx.check_send()?)
    }

    fn send(
        &mut self,
        this: Resource<OutgoingDatagramStream>,
        datagrams: Vec<OutgoingDatagram>,
    ) -> Result<u64, VsockError> {
        let OutgoingDatagramStream { pair, tx } = self.table.get_mut(&this)?;
        tx.send(datagrams, |d| {
            if d.data.len() > MAX_DATAGRAM {
                return Err(ErrorCode::MessageTooLarge);
            }
            Ok(Datagram { to: pair.destination(d.remote_address)?, data: d.data })
        })
    }

    fn subscribe(
        &mut self,
        this: Resource<OutgoingDatagramStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<OutgoingDatagramStream>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}
