//! What stream and seqpacket sockets share over WIT. The two resources
//! have the same lifecycle calls (two-phase bind, listen and connect,
//! accept, addresses) and differ only in what a connection hands out, so
//! the listener and the connect sequence are written here once, for any
//! [`ConnSocket`].
//!
//! wit-bindgen makes each resource its own type with inherent methods;
//! [`ConnSocket`] names the calls both have, and `conn_socket!`
//! implements it for both by forwarding.

use std::cell::Cell;
use std::io;
use std::time::Duration;

use wasip2::io::poll::Pollable;
use wasip2::io::streams::{InputStream, OutputStream};

use super::bindings::vsock::sockets::network::{ErrorCode, Network, VsockAddress};
use super::bindings::vsock::sockets::seqpacket_create_socket::create_seqpacket_socket;
use super::bindings::vsock::sockets::seqpacket_socket::{
    MessageReceiver, MessageSender, SeqpacketSocket,
};
use super::bindings::vsock::sockets::stream_create_socket::create_stream_socket;
use super::bindings::vsock::sockets::stream_socket::StreamSocket;
use super::seqpacket::SeqStream;
use super::stream::Stream;
use super::{PollRef, error, finish, nanos, wait, with_network};

/// A stream connect under way.
pub(crate) type StreamConnecting = Connecting<StreamSocket>;
/// A seqpacket connect under way.
pub(crate) type SeqConnecting = Connecting<SeqpacketSocket>;
use crate::VsockAddr;

/// A stream or seqpacket socket resource, as the shared code needs it.
pub(crate) trait ConnSocket: Sized {
    /// The receiving half a connection hands out.
    type Rx;
    /// The sending half a connection hands out.
    type Tx;
    /// The backend's connection, built from the socket and its halves.
    type Connection;

    fn create() -> Result<Self, ErrorCode>;
    fn connection(self, rx: Self::Rx, tx: Self::Tx) -> Self::Connection;
    fn subscribe(&self) -> Pollable;
    fn start_bind(&self, network: &Network, local: VsockAddress) -> Result<(), ErrorCode>;
    fn finish_bind(&self) -> Result<(), ErrorCode>;
    fn set_listen_backlog_size(&self, value: u64) -> Result<(), ErrorCode>;
    fn start_listen(&self) -> Result<(), ErrorCode>;
    fn finish_listen(&self) -> Result<(), ErrorCode>;
    fn start_connect(&self, network: &Network, remote: VsockAddress) -> Result<(), ErrorCode>;
    fn finish_connect(&self) -> Result<(Self::Rx, Self::Tx), ErrorCode>;
    fn accept(&self) -> Result<(Self, Self::Rx, Self::Tx), ErrorCode>;
    fn set_connect_timeout(&self, nanos: u64) -> Result<(), ErrorCode>;
    fn local_address(&self) -> Result<VsockAddress, ErrorCode>;
    fn remote_address(&self) -> Result<VsockAddress, ErrorCode>;
}

/// Implements [`ConnSocket`] for a generated socket resource by calling
/// its inherent methods of the same names (inherent methods win over the
/// trait's, so these forward rather than recurse).
macro_rules! conn_socket {
    ($Socket:ty, $create:path, $Rx:ty, $Tx:ty => $Connection:ty) => {
        impl ConnSocket for $Socket {
            type Rx = $Rx;
            type Tx = $Tx;
            type Connection = $Connection;

            fn create() -> Result<Self, ErrorCode> {
                $create()
            }
            fn connection(self, rx: $Rx, tx: $Tx) -> $Connection {
                <$Connection>::new(self, rx, tx)
            }
            fn subscribe(&self) -> Pollable {
                <$Socket>::subscribe(self)
            }
            fn start_bind(&self, network: &Network, local: VsockAddress) -> Result<(), ErrorCode> {
                <$Socket>::start_bind(self, network, local)
            }
            fn finish_bind(&self) -> Result<(), ErrorCode> {
                <$Socket>::finish_bind(self)
            }
            fn set_listen_backlog_size(&self, value: u64) -> Result<(), ErrorCode> {
                <$Socket>::set_listen_backlog_size(self, value)
            }
            fn start_listen(&self) -> Result<(), ErrorCode> {
                <$Socket>::start_listen(self)
            }
            fn finish_listen(&self) -> Result<(), ErrorCode> {
                <$Socket>::finish_listen(self)
            }
            fn start_connect(
                &self,
                network: &Network,
                remote: VsockAddress,
            ) -> Result<(), ErrorCode> {
                <$Socket>::start_connect(self, network, remote)
            }
            fn finish_connect(&self) -> Result<($Rx, $Tx), ErrorCode> {
                <$Socket>::finish_connect(self)
            }
            fn accept(&self) -> Result<(Self, $Rx, $Tx), ErrorCode> {
                <$Socket>::accept(self)
            }
            fn set_connect_timeout(&self, nanos: u64) -> Result<(), ErrorCode> {
                <$Socket>::set_connect_timeout(self, nanos)
            }
            fn local_address(&self) -> Result<VsockAddress, ErrorCode> {
                <$Socket>::local_address(self)
            }
            fn remote_address(&self) -> Result<VsockAddress, ErrorCode> {
                <$Socket>::remote_address(self)
            }
        }
    };
}

conn_socket!(StreamSocket, create_stream_socket, InputStream, OutputStream => Stream);
conn_socket!(SeqpacketSocket, create_seqpacket_socket, MessageReceiver, MessageSender => SeqStream);

/// The backlog every listener asks for: Linux's default somaxconn.
const LISTEN_BACKLOG: u64 = 4096;

/// A listening stream or seqpacket socket.
#[derive(Debug)]
pub(crate) struct Listener<S> {
    // Declared before `socket`: a child must be dropped first.
    ready: Pollable,
    socket: S,
    nonblocking: Cell<bool>,
}

impl<S: ConnSocket> Listener<S> {
    pub(crate) fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = S::create().map_err(error)?;
        let ready = socket.subscribe();
        with_network(|n| socket.start_bind(n, addr.into())).map_err(error)?;
        finish(&ready, || socket.finish_bind())?;
        // As std's `TcpListener::bind` on Linux: ask for the most the host
        // allows (Linux caps it at somaxconn, 4096 by default; so does the
        // shim). vsock refuses a connection whose listener's backlog is
        // full, so a small default would refuse bursts a server could
        // take.
        socket.set_listen_backlog_size(LISTEN_BACKLOG).map_err(error)?;
        socket.start_listen().map_err(error)?;
        finish(&ready, || socket.finish_listen())?;
        Ok(Self { ready, socket, nonblocking: Cell::new(false) })
    }

    pub(crate) fn accept(&self) -> io::Result<(S::Connection, VsockAddr)> {
        loop {
            match self.socket.accept() {
                Ok((socket, rx, tx)) => {
                    let peer = socket.remote_address();
                    // Built before `peer` is checked, so that a failure
                    // drops the halves before their socket.
                    let connection = socket.connection(rx, tx);
                    return Ok((connection, peer.map_err(error)?.into()));
                }
                Err(ErrorCode::WouldBlock) => wait(self.nonblocking.get(), &self.ready)?,
                Err(e) => return Err(error(e)),
            }
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    pub(crate) fn readable(&self) -> PollRef<'_> {
        PollRef::Pollable(&self.ready)
    }
}

/// Connects a new socket to `addr`, waiting for the outcome, and returns
/// the connection.
pub(crate) fn connect<S: ConnSocket>(
    addr: VsockAddr,
    timeout: Option<Duration>,
) -> io::Result<S::Connection> {
    let mut connecting = Connecting::<S>::start(addr, timeout)?;
    loop {
        match connecting.finish() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => connecting.ready.block(),
            result => return result,
        }
    }
}

/// A connect under way, so that an async connect can wait for it without
/// blocking: `finish` reports `WouldBlock` until the peer has answered.
#[derive(Debug)]
pub(crate) struct Connecting<S> {
    // Declared before `socket`: a child must be dropped first.
    ready: Pollable,
    /// Taken by the connection once the connect succeeds.
    socket: Option<S>,
}

impl<S: ConnSocket> Connecting<S> {
    pub(crate) fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = S::create().map_err(error)?;
        if let Some(t) = timeout {
            socket.set_connect_timeout(nanos(t)).map_err(error)?;
        }
        let ready = socket.subscribe();
        with_network(|n| socket.start_connect(n, addr.into())).map_err(error)?;
        Ok(Self { ready, socket: Some(socket) })
    }

    /// The connection once the peer accepted, `WouldBlock` until it has
    /// answered, or why it failed.
    pub(crate) fn finish(&mut self) -> io::Result<S::Connection> {
        let socket = self.socket.as_ref().ok_or(io::ErrorKind::NotConnected)?;
        match socket.finish_connect() {
            Ok((rx, tx)) => {
                let socket = self.socket.take().expect("checked above");
                Ok(socket.connection(rx, tx))
            }
            Err(ErrorCode::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(error(e)),
        }
    }

    /// Ready when `finish` will not report `WouldBlock`.
    pub(crate) fn ready(&self) -> PollRef<'_> {
        PollRef::Pollable(&self.ready)
    }
}
