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
use wasmtime_wasi::p2::Pollable;

use crate::grants::ComponentGrants;
use crate::messages::{self, Outgoing, Sender};
use crate::net::{Sock, VsockCtx, code};
use crate::network::{ErrorCode, VsockAddress, VsockError};

/// The largest vsock datagram payload.
pub(crate) const MAX_DATAGRAM: usize = 64 * 1024;

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
pub(crate) struct Datagram {
    pub(crate) data: Vec<u8>,
    pub(crate) to: VsockAddr,
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
        destination(&self.grants, self.local_cid, self.peer, to)
    }
}

/// Where one outgoing datagram goes: to `to`, or to the fixed `peer`
/// (only to it, once fixed), if the grants let the component send there.
/// Both packages' datagram sockets send by this rule.
pub(crate) fn destination(
    grants: &ComponentGrants,
    local_cid: u32,
    peer: Option<VsockAddr>,
    to: Option<VsockAddress>,
) -> Result<VsockAddr, ErrorCode> {
    let to = to.map(|a| {
        // As in Linux (and the stack), CID_ANY means this side.
        let cid = if a.cid == VMADDR_CID_ANY { local_cid } else { a.cid };
        VsockAddr::new(cid, a.port)
    });
    let addr = match (peer, to) {
        (Some(peer), None) => peer,
        (Some(peer), Some(to)) if to == peer => peer,
        (None, Some(to)) => to,
        (Some(_), Some(_)) | (None, None) => return Err(ErrorCode::InvalidArgument),
    };
    if addr.port == VMADDR_PORT_ANY {
        return Err(ErrorCode::InvalidArgument);
    }
    grants.check_connect("send a datagram", addr)?;
    Ok(addr)
}

/// Whether a component hears a datagram from `from`: only its fixed peer's
/// once it has one; otherwise anyone's on a port it may listen on
/// (`open_port`), and on any other port only those of peers it may send
/// to. Both packages' datagram sockets receive by this rule.
pub(crate) fn hears(
    grants: &ComponentGrants,
    peer: Option<VsockAddr>,
    open_port: bool,
    from: VsockAddr,
) -> bool {
    match peer {
        Some(peer) => from == peer,
        None => open_port || grants.may_connect(from),
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

impl DatagramSocket {
    pub(crate) fn create(ctx: &VsockCtx) -> Result<Self, ErrorCode> {
        let sock = ctx.socket(SocketType::Datagram)?;
        Ok(Self { ctx: ctx.clone(), sock, state: State::Unbound, peer: None, pair: Weak::new() })
    }

    pub(crate) fn start_bind(&mut self, local_address: VsockAddress) -> Result<(), ErrorCode> {
        match self.state {
            State::Unbound => {}
            State::BindStarted => return Err(ErrorCode::ConcurrencyConflict),
            State::Bound => return Err(ErrorCode::InvalidState),
        }
        let port = local_address.port;
        if port != VMADDR_PORT_ANY {
            self.ctx.grants.check_listen("bind a datagram socket", port)?;
        }
        self.sock.with(|s, h, _| s.bind(h, local_address.into())).map_err(|e| match e {
            Error::InvalidArgument => ErrorCode::InvalidState,
            e => code(e),
        })?;
        self.state = State::BindStarted;
        Ok(())
    }

    pub(crate) fn finish_bind(&mut self) -> Result<(), ErrorCode> {
        if self.state != State::BindStarted {
            return Err(ErrorCode::NotInProgress);
        }
        self.state = State::Bound;
        Ok(())
    }

    /// `stream`: a new stream pair, to `remote_address` only or to anyone
    /// the grants allow; the caller pushes both as children of the socket.
    pub(crate) fn stream(
        &mut self,
        remote_address: Option<VsockAddress>,
    ) -> Result<(IncomingDatagramStream, OutgoingDatagramStream), VsockError> {
        if self.state != State::Bound {
            return Err(ErrorCode::InvalidState.into());
        }
        if self.pair.strong_count() > 0 {
            return Err(VsockError::trap(
                "datagram-socket.stream: drop the previous stream pair first",
            ));
        }
        let local_cid = self.ctx.net.local_cid();
        let peer = match remote_address {
            None => None,
            Some(a) if a.port == VMADDR_PORT_ANY => {
                return Err(ErrorCode::InvalidArgument.into());
            }
            Some(a) => {
                let cid = if a.cid == VMADDR_CID_ANY { local_cid } else { a.cid };
                let addr = VsockAddr::new(cid, a.port);
                self.ctx.grants.check_connect("connect a datagram socket", addr)?;
                Some(addr)
            }
        };
        let local = self.sock.query(|s, h| s.local_addr(h)).map_err(code)?;
        let alive = Arc::new(());
        self.pair = Arc::downgrade(&alive);
        self.peer = peer;
        let pair = Arc::new(Pair {
            sock: self.sock.clone(),
            grants: self.ctx.grants.clone(),
            peer,
            local_cid,
            _alive: alive,
        });
        let open_port = self.ctx.grants.may_listen(local.port);
        let rx = IncomingDatagramStream { pair: pair.clone(), open_port };
        let tx = OutgoingDatagramStream { tx: Sender::new(pair.sock.clone()), pair };
        Ok((rx, tx))
    }

    pub(crate) fn local_address(&self) -> Result<VsockAddress, ErrorCode> {
        let addr = self.sock.query(|s, h| s.local_addr(h)).map_err(|_| ErrorCode::InvalidState)?;
        Ok(addr.into())
    }

    pub(crate) fn remote_address(&self) -> Result<VsockAddress, ErrorCode> {
        Ok(self.peer.ok_or(ErrorCode::InvalidState)?.into())
    }
}

impl IncomingDatagramStream {
    /// `receive`: up to `max_results` datagrams the component may hear,
    /// each made into what it gets by `datagram` from the bytes and the
    /// sender; and the inq hint.
    pub(crate) fn receive<T>(
        &mut self,
        max_results: u64,
        mut datagram: impl FnMut(Vec<u8>, VsockAddr) -> T,
    ) -> Result<(Vec<T>, u64), ErrorCode> {
        let pair = &self.pair;
        let open_port = self.open_port;
        // A query, not `with`: taking datagrams off a socket sends nothing
        // (no credit, no acknowledgement), so there is no driver poll to
        // pay for, and the guest lock is held for the copies alone (a
        // device interrupt that finds it taken hands the next datagram's
        // delivery to the guest thread, one more thread on the way).
        let batch = pair.sock.query(|s, h| {
            messages::receive(s, h, max_results, |data, info| {
                let from = info.from?;
                hears(&pair.grants, pair.peer, open_port, from).then(|| datagram(data, from))
            })
        });
        match batch.error {
            Some(e) if batch.items.is_empty() => Err(code(e)),
            _ => Ok((batch.items, batch.inq)),
        }
    }
}

impl OutgoingDatagramStream {
    pub(crate) fn check_send(&mut self) -> Result<u64, ErrorCode> {
        self.tx.check_send()
    }

    /// `send`: `parts` takes each of the component's datagrams apart into
    /// its bytes and its destination, if it names one.
    pub(crate) fn send<I>(
        &mut self,
        datagrams: Vec<I>,
        parts: impl Fn(I) -> (Vec<u8>, Option<VsockAddress>),
    ) -> Result<u64, VsockError> {
        let Self { pair, tx } = self;
        tx.send(datagrams, |d| {
            let (data, to) = parts(d);
            if data.len() > MAX_DATAGRAM {
                return Err(ErrorCode::MessageTooLarge);
            }
            Ok(Datagram { to: pair.destination(to)?, data })
        })
    }
}
