//! What stream and seqpacket sockets share over WIT. The two resources
//! have the same lifecycle calls (two-phase bind, listen and connect,
//! accept, addresses, linger and shutdown) and differ only in the halves
//! a connection hands out and in what it keeps of received data, so the
//! listener, the connect sequence and the connection are written here
//! once, for any [`ConnSocket`]; `stream` and `seqpacket` add each kind's
//! data calls.
//!
//! wit-bindgen makes each resource its own type with inherent methods;
//! [`ConnSocket`] names the calls both have, and `conn_socket!`
//! implements it for each by forwarding.
//!
//! Resource order matters to the host: streams, receivers, senders and
//! pollables are children of their socket, and dropping a socket before
//! its children traps. Every struct here therefore declares its children
//! before the socket, since Rust drops fields in declaration order.

use std::cell::{Cell, OnceCell};
use std::fmt::Debug;
use std::io;
use std::time::Duration;

use wasip2::io::poll::Pollable;

use super::bindings::vsock::sockets::network::{ErrorCode, Network, VsockAddress};
use super::bindings::vsock::sockets::stream_socket::ShutdownType;
use super::network::{error, nanos, with_network};
use super::wait::{PollRef, WasiPoll, finish, lazy, wait};
use crate::addr::VsockAddr;
use crate::net::Shutdown;
use crate::platform::contract::{self, Connecting as _};

/// A stream or seqpacket socket resource, as the shared code needs it.
pub(crate) trait ConnSocket: Sized + Debug {
    /// The receiving half a connection hands out.
    type Rx: Debug;
    /// The sending half a connection hands out.
    type Tx: Debug;
    /// What a connection keeps of received data between calls.
    type Received: Received;

    fn create() -> Result<Self, ErrorCode>;
    fn subscribe(&self) -> Pollable;
    fn subscribe_rx(rx: &Self::Rx) -> Pollable;
    fn subscribe_tx(tx: &Self::Tx) -> Pollable;
    fn start_bind(&self, network: &Network, local: VsockAddress) -> Result<(), ErrorCode>;
    fn finish_bind(&self) -> Result<(), ErrorCode>;
    fn set_listen_backlog_size(&self, value: u64) -> Result<(), ErrorCode>;
    fn start_listen(&self) -> Result<(), ErrorCode>;
    fn finish_listen(&self) -> Result<(), ErrorCode>;
    fn start_connect(&self, network: &Network, remote: VsockAddress) -> Result<(), ErrorCode>;
    fn finish_connect(&self) -> Result<(Self::Rx, Self::Tx), ErrorCode>;
    fn accept(&self) -> Result<(Self, Self::Rx, Self::Tx), ErrorCode>;
    fn set_connect_timeout(&self, nanos: u64) -> Result<(), ErrorCode>;
    fn set_linger(&self, nanos: Option<u64>) -> Result<(), ErrorCode>;
    fn shutdown(&self, how: ShutdownType) -> Result<(), ErrorCode>;
    fn local_address(&self) -> Result<VsockAddress, ErrorCode>;
    fn remote_address(&self) -> Result<VsockAddress, ErrorCode>;
}

/// What a connection keeps of received data between calls: nothing for a
/// stream (its bytes wait in the host's input stream), the rest of the
/// last batch for seqpacket.
pub(crate) trait Received: Default + Debug {
    /// Whether something a receive returns without waiting (data, or the
    /// end) is held already.
    fn holds(&self) -> bool;
    /// Drops what is held: as in Linux, shutting down the receive side
    /// discards what is queued, including what this side already fetched.
    fn discard(&self);
}

impl Received for () {
    fn holds(&self) -> bool {
        false
    }
    fn discard(&self) {}
}

/// Implements [`ConnSocket`] for a generated socket resource by calling
/// its inherent methods of the same names (inherent methods win over the
/// trait's, so these forward rather than recurse). `stream` and
/// `seqpacket` each invoke it for their resource; the impl sits in a
/// `const _` block with its own imports, so they need none of its names.
macro_rules! conn_socket {
    ($Socket:ty, $create:path, $Rx:ty, $Tx:ty, $Received:ty) => {
        const _: () = {
            use wasip2::io::poll::Pollable;
            use $crate::platform::wasi::bindings::vsock::sockets::network::{
                ErrorCode, Network, VsockAddress,
            };
            use $crate::platform::wasi::bindings::vsock::sockets::stream_socket::ShutdownType;

            impl $crate::platform::wasi::conn::ConnSocket for $Socket {
                type Rx = $Rx;
                type Tx = $Tx;
                type Received = $Received;

                fn create() -> Result<Self, ErrorCode> {
                    $create()
                }
                fn subscribe(&self) -> Pollable {
                    <$Socket>::subscribe(self)
                }
                fn subscribe_rx(rx: &$Rx) -> Pollable {
                    rx.subscribe()
                }
                fn subscribe_tx(tx: &$Tx) -> Pollable {
                    tx.subscribe()
                }
                fn start_bind(
                    &self,
                    network: &Network,
                    local: VsockAddress,
                ) -> Result<(), ErrorCode> {
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
                fn set_linger(&self, nanos: Option<u64>) -> Result<(), ErrorCode> {
                    <$Socket>::set_linger(self, nanos)
                }
                fn shutdown(&self, how: ShutdownType) -> Result<(), ErrorCode> {
                    <$Socket>::shutdown(self, how)
                }
                fn local_address(&self) -> Result<VsockAddress, ErrorCode> {
                    <$Socket>::local_address(self)
                }
                fn remote_address(&self) -> Result<VsockAddress, ErrorCode> {
                    <$Socket>::remote_address(self)
                }
            }
        };
    };
}
pub(super) use conn_socket;

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

impl<S: ConnSocket> contract::Socket<WasiPoll> for Listener<S> {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        PollRef::Pollable(&self.ready)
    }
}

impl<S: ConnSocket> contract::Listener<WasiPoll> for Listener<S> {
    type Conn = Conn<S>;

    fn bind(addr: VsockAddr) -> io::Result<Self> {
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

    fn accept(&self) -> io::Result<(Conn<S>, VsockAddr)> {
        loop {
            match self.socket.accept() {
                Ok((socket, rx, tx)) => {
                    let peer = socket.remote_address();
                    // Built before `peer` is checked, so that a failure
                    // drops the halves before their socket.
                    let connection = Conn::new(socket, rx, tx);
                    return Ok((connection, peer.map_err(error)?.into()));
                }
                Err(ErrorCode::WouldBlock) => wait(self.nonblocking.get(), &self.ready)?,
                Err(e) => return Err(error(e)),
            }
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

impl<S: ConnSocket> contract::Connecting<WasiPoll> for Connecting<S> {
    type Conn = Conn<S>;

    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let socket = S::create().map_err(error)?;
        if let Some(t) = timeout {
            socket.set_connect_timeout(nanos(t)).map_err(error)?;
        }
        let ready = socket.subscribe();
        with_network(|n| socket.start_connect(n, addr.into())).map_err(error)?;
        Ok(Self { ready, socket: Some(socket) })
    }

    fn finish(&mut self) -> io::Result<Conn<S>> {
        let socket = self.socket.as_ref().ok_or(io::ErrorKind::NotConnected)?;
        match socket.finish_connect() {
            Ok((rx, tx)) => {
                let socket = self.socket.take().expect("checked above");
                Ok(Conn::new(socket, rx, tx))
            }
            Err(ErrorCode::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(error(e)),
        }
    }

    fn ready(&self) -> PollRef<'_> {
        PollRef::Pollable(&self.ready)
    }
}

/// A connected stream or seqpacket socket.
#[derive(Debug)]
pub(crate) struct Conn<S: ConnSocket> {
    // Children first, in the order they must be dropped: each pollable
    // before its half, the halves before the socket.
    rx_ready: OnceCell<Pollable>,
    tx_ready: OnceCell<Pollable>,
    pub(super) rx: S::Rx,
    pub(super) tx: S::Tx,
    pub(super) socket: S,
    pub(super) received: S::Received,
    pub(super) nonblocking: Cell<bool>,
}

impl<S: ConnSocket> Conn<S> {
    fn new(socket: S, rx: S::Rx, tx: S::Tx) -> Self {
        Self {
            rx_ready: OnceCell::new(),
            tx_ready: OnceCell::new(),
            rx,
            tx,
            socket,
            received: S::Received::default(),
            nonblocking: Cell::new(false),
        }
    }

    pub(super) fn rx_ready(&self) -> &Pollable {
        lazy(&self.rx_ready, || S::subscribe_rx(&self.rx))
    }

    pub(super) fn tx_ready(&self) -> &Pollable {
        lazy(&self.tx_ready, || S::subscribe_tx(&self.tx))
    }
}

impl<S: ConnSocket> contract::Socket<WasiPoll> for Conn<S> {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        if self.received.holds() { PollRef::Ready } else { PollRef::Pollable(self.rx_ready()) }
    }
}

impl<S: ConnSocket> contract::Connection<WasiPoll> for Conn<S> {
    fn connect(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        let mut connecting = Connecting::<S>::start(addr, timeout)?;
        loop {
            match connecting.finish() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => connecting.ready.block(),
                result => return result,
            }
        }
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.remote_address().map(Into::into).map_err(error)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let which = match how {
            Shutdown::Read => ShutdownType::Receive,
            Shutdown::Write => ShutdownType::Send,
            Shutdown::Both => ShutdownType::Both,
        };
        self.socket.shutdown(which).map_err(error)?;
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.received.discard();
        }
        Ok(())
    }

    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.socket.set_linger(linger.map(nanos)).map_err(error)
    }

    fn writable(&self) -> PollRef<'_> {
        PollRef::Pollable(self.tx_ready())
    }
}
