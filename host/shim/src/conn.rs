//! The lifecycle that stream and seqpacket sockets share: two-phase bind,
//! listen and connect, accept, addresses, options, shutdown, and the
//! socket's own pollable.
//!
//! The stack's calls complete at once (bind, listen) or report their
//! outcome later (connect), so the `start-*` half does the work and the
//! `finish-*` half reports it; that keeps the WIT's state machine (and its
//! `not-in-progress` / `concurrency-conflict` rules) in one small enum
//! instead of in each socket type. The two socket types differ only in
//! what a connection hands out (byte streams, or a message receiver and
//! sender), which `stream.rs` and `seqpacket.rs` build on top.
//!
//! The WIT gives the two resources the same lifecycle calls, but bindgen
//! makes each its own trait; `host::conn` writes the forwarding from those
//! calls to [`ConnSocket`] once for both.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pier_stack::{
    Error, Interest, Readiness, SocketType, VMADDR_CID_ANY, VMADDR_PORT_ANY, VsockAddr,
};

use crate::net::{Sock, VsockCtx, code};
use crate::network::{ErrorCode, VsockAddress};

/// Backlog when the component sets none (wasi:sockets' default).
const DEFAULT_BACKLOG: usize = 128;
/// Largest backlog a component may ask for: Linux's default
/// `net.core.somaxconn`, which caps `listen(2)` the same way.
const MAX_BACKLOG: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unbound,
    BindStarted,
    Bound,
    ListenStarted,
    Listening,
    Connecting,
    Connected,
}

/// A stream or seqpacket socket, short of its data path.
pub(crate) struct ConnSocket {
    pub(crate) ctx: VsockCtx,
    pub(crate) sock: Arc<Sock>,
    state: State,
    backlog: usize,
}

type Res<T> = Result<T, ErrorCode>;

impl ConnSocket {
    pub(crate) fn create(ctx: &VsockCtx, ty: SocketType) -> Res<Self> {
        let sock = ctx.socket(ty)?;
        Ok(Self { ctx: ctx.clone(), sock, state: State::Unbound, backlog: DEFAULT_BACKLOG })
    }

    /// A connection taken from a listener.
    fn accepted(ctx: &VsockCtx, sock: Arc<Sock>) -> Self {
        Self { ctx: ctx.clone(), sock, state: State::Connected, backlog: DEFAULT_BACKLOG }
    }

    pub(crate) fn start_bind(&mut self, addr: VsockAddress) -> Res<()> {
        match self.state {
            State::Unbound => {}
            State::BindStarted => return Err(ErrorCode::ConcurrencyConflict),
            _ => return Err(ErrorCode::InvalidState),
        }
        if addr.port != VMADDR_PORT_ANY {
            self.ctx.grants.check_listen("bind", addr.port)?;
        }
        self.sock.with(|s, h, _| s.bind(h, addr.into())).map_err(bind_error)?;
        self.state = State::BindStarted;
        Ok(())
    }

    pub(crate) fn finish_bind(&mut self) -> Res<()> {
        if self.state != State::BindStarted {
            return Err(ErrorCode::NotInProgress);
        }
        self.state = State::Bound;
        Ok(())
    }

    pub(crate) fn start_listen(&mut self) -> Res<()> {
        match self.state {
            State::Bound => {}
            State::ListenStarted => return Err(ErrorCode::ConcurrencyConflict),
            _ => return Err(ErrorCode::InvalidState),
        }
        let port =
            self.sock.query(|s, h| s.local_addr(h)).map_err(|_| ErrorCode::InvalidState)?.port;
        self.ctx.grants.check_listen("listen", port)?;
        let backlog = self.backlog;
        self.sock.with(|s, h, _| s.listen(h, backlog)).map_err(|e| match e {
            Error::InvalidArgument => ErrorCode::InvalidState,
            e => code(e),
        })?;
        self.state = State::ListenStarted;
        Ok(())
    }

    pub(crate) fn finish_listen(&mut self) -> Res<()> {
        if self.state != State::ListenStarted {
            return Err(ErrorCode::NotInProgress);
        }
        self.state = State::Listening;
        Ok(())
    }

    pub(crate) fn start_connect(&mut self, addr: VsockAddress) -> Res<()> {
        match self.state {
            State::Unbound | State::Bound => {}
            State::BindStarted | State::Connecting => return Err(ErrorCode::ConcurrencyConflict),
            State::ListenStarted | State::Listening | State::Connected => {
                return Err(ErrorCode::InvalidState);
            }
        }
        if addr.port == VMADDR_PORT_ANY || addr.cid == VMADDR_CID_ANY {
            return Err(ErrorCode::InvalidArgument);
        }
        self.ctx.grants.check_connect("connect", addr.into())?;
        self.sock.with(|s, h, now| s.connect(h, addr.into(), now)).map_err(|e| match e {
            Error::InvalidArgument => ErrorCode::InvalidArgument,
            Error::IsConnected => ErrorCode::InvalidState,
            e => code(e),
        })?;
        self.state = State::Connecting;
        Ok(())
    }

    /// The outcome of `start-connect`; `Ok` exactly once.
    pub(crate) fn finish_connect(&mut self) -> Res<()> {
        if self.state != State::Connecting {
            return Err(ErrorCode::NotInProgress);
        }
        match self.sock.with(|s, h, _| s.finish_connect(h)) {
            Ok(()) => {
                self.state = State::Connected;
                Ok(())
            }
            Err(Error::WouldBlock) => Err(ErrorCode::WouldBlock),
            Err(e) => {
                // Back to where it was; the stack keeps an implicit bind.
                let bound = self.sock.query(|s, h| s.local_addr(h)).is_ok();
                self.state = if bound { State::Bound } else { State::Unbound };
                Err(match e {
                    // vsock refuses with RST; reset during a connect is a refusal.
                    Error::ConnectionReset | Error::Protocol | Error::NotConnected => {
                        ErrorCode::ConnectionRefused
                    }
                    e => code(e),
                })
            }
        }
    }

    /// Takes one connection off the backlog, as a socket of the same kind.
    pub(crate) fn accept(&mut self) -> Res<(Self, VsockAddr)> {
        if self.state != State::Listening {
            return Err(ErrorCode::InvalidState);
        }
        let Some(lease) = self.ctx.quota.lease() else {
            // Out of quota: refuse the first waiting peer (if any) rather
            // than leave it queued, so the listener does not stay ready
            // for a connection the component can never take.
            let refused = self.sock.with(|s, h, now| match s.accept(h) {
                Ok((child, _)) => {
                    let _ = s.close(child, now);
                    true
                }
                Err(_) => false,
            });
            return Err(if refused { ErrorCode::NewSocketLimit } else { ErrorCode::WouldBlock });
        };
        let (child, peer) = self.sock.with(|s, h, _| s.accept(h)).map_err(|e| match e {
            Error::InvalidArgument => ErrorCode::InvalidState,
            e => code(e),
        })?;
        let sock = Sock::adopt(&self.ctx, child, lease);
        Ok((Self::accepted(&self.ctx, sock), peer))
    }

    pub(crate) fn local_address(&self) -> Res<VsockAddress> {
        self.sock.query(|s, h| s.local_addr(h)).map(Into::into).map_err(|_| ErrorCode::InvalidState)
    }

    pub(crate) fn remote_address(&self) -> Res<VsockAddress> {
        self.sock.query(|s, h| s.peer_addr(h)).map(Into::into).map_err(|_| ErrorCode::InvalidState)
    }

    pub(crate) fn is_listening(&self) -> bool {
        self.state == State::Listening
    }

    pub(crate) fn set_listen_backlog_size(&mut self, value: u64) -> Res<()> {
        if value == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        if matches!(self.state, State::Connecting | State::Connected) {
            return Err(ErrorCode::InvalidState);
        }
        self.backlog = usize::try_from(value).unwrap_or(MAX_BACKLOG).min(MAX_BACKLOG);
        if matches!(self.state, State::ListenStarted | State::Listening) {
            let backlog = self.backlog;
            self.sock.with(|s, h, _| s.listen(h, backlog)).map_err(code)?;
        }
        Ok(())
    }

    pub(crate) fn buffer_size(&self) -> Res<u64> {
        self.sock.query(|s, h| s.buffer_size(h)).map(u64::from).map_err(code)
    }

    pub(crate) fn set_buffer_size(&mut self, value: u64) -> Res<()> {
        if value == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        self.sock.with(|s, h, _| s.set_buffer_size(h, value)).map_err(code)
    }

    pub(crate) fn connect_timeout(&self) -> Res<u64> {
        let t = self.sock.query(|s, h| s.connect_timeout(h)).map_err(code)?;
        Ok(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
    }

    pub(crate) fn set_connect_timeout(&mut self, nanos: u64) -> Res<()> {
        if nanos == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        let t = Duration::from_nanos(nanos);
        self.sock.query(|s, h| s.set_connect_timeout(h, t)).map_err(code)
    }

    /// SO_LINGER: `None` closes in order, `Some(0)` resets; see the WIT.
    pub(crate) fn set_linger(&mut self, nanos: Option<u64>) -> Res<()> {
        match nanos {
            None => self.sock.set_abort_on_close(false),
            Some(0) => self.sock.set_abort_on_close(true),
            Some(_) => return Err(ErrorCode::NotSupported),
        }
        Ok(())
    }

    fn require_connected(&self) -> Res<()> {
        if self.state == State::Connected { Ok(()) } else { Err(ErrorCode::InvalidState) }
    }

    /// SIOCINQ, with the terminal hint: 1 once everything was read and a
    /// receive would report the end (or an error, such as a transport
    /// reset's) at once, so a loop that reads while it is non-zero still
    /// makes the read that reports it.
    pub(crate) fn receive_queued(&self) -> Res<u64> {
        self.require_connected()?;
        let (queued, unblocked) = self
            .sock
            .query(|s, h| Ok::<_, Error>((s.recv_queued(h)?, s.unblocked(h)?)))
            .map_err(code)?;
        if queued == 0 && unblocked.contains(Readiness::READABLE) {
            return Ok(1);
        }
        Ok(queued as u64)
    }

    pub(crate) fn send_queued(&self) -> Res<u64> {
        self.require_connected()?;
        self.sock.query(|s, h| s.send_queued(h)).map(|n| n as u64).map_err(code)
    }

    pub(crate) fn shutdown(&mut self, how: pier_stack::Shutdown) -> Res<()> {
        self.require_connected()?;
        self.sock.with(|s, h, _| s.shutdown(h, how)).map_err(|_| ErrorCode::InvalidState)?;
        self.sock.note_shutdown(how);
        Ok(())
    }

    /// The socket pollable: ready when a `finish-*` call will not answer
    /// `would-block`, and on a listener while `accept` has something.
    pub(crate) async fn ready(&self) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await;
    }

    /// [`Self::ready`] as a poll, for 0.2.0's async `connect` and listener
    /// stream.
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.state {
            State::Connecting => {
                // A connect ends in `Connected` (write-space wake) or back in
                // `Unconnected` with an error (both wakes). While it runs,
                // the stack reports no readiness at all and no peer.
                self.sock.poll_wait(cx, &[Interest::Read, Interest::Write], &mut |s, h| {
                    s.readiness(h).map_or(true, |r| !r.is_empty()) || s.peer_addr(h).is_ok()
                })
            }
            State::Listening => self.sock.poll_wait_for(cx, Readiness::READABLE, &[Interest::Read]),
            _ => Poll::Ready(()),
        }
    }

    /// A second handle on a listening socket that can take connections
    /// off its backlog: what 0.2.0's stream of accepted connections
    /// holds, apart from the socket resource.
    pub(crate) fn acceptor(&self) -> Option<Self> {
        self.is_listening().then(|| Self {
            ctx: self.ctx.clone(),
            sock: self.sock.clone(),
            state: State::Listening,
            backlog: self.backlog,
        })
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.state == State::Connected
    }
}

fn bind_error(e: Error) -> ErrorCode {
    match e {
        // Already bound, or not in a state that can bind.
        Error::InvalidArgument => ErrorCode::InvalidState,
        e => code(e),
    }
}
