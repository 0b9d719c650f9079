//! Sockets: what one socket knows, without the stack's tables.
//!
//! A [`Socket`] is one of two kinds, each with only the state its type
//! needs:
//!
//! - [`ConnectionSocket`] (`connection.rs`): stream and seqpacket. A
//!   connection with credit, buffers, the control packets it owes the
//!   peer, and the application's calls. Its state machine
//!   (`state_machine.rs`) handles its packets, deadlines and close, and
//!   returns an [`Outcome`] for the endpoint. The two types differ only in
//!   whether message boundaries are kept, so they share one state
//!   machine, as Linux's `vsock_connectible_*` calls do.
//! - [`DatagramSocket`] (`datagram.rs`): datagram queues and a default
//!   destination; no connection, no credit, no RST.
//!
//! Both share with the stack the [`SocketHandle`] that names a socket
//! (`handle.rs`), the [`Options`] it carries (`options.rs`), and what a
//! receive hands the application (`recv.rs`: [`RecvInfo`], and the
//! [`DirectReceive`] tap), and a connection's receive queue, which may
//! leave payloads in the driver's buffers (`rx_queue.rs`, [`HeldBuffers`]).
//!
//! Everything here is local to one socket. The socket table, port tables,
//! routing, transmit queue and wakers are the endpoint's: [`crate::Stack`].

mod connection;
mod datagram;
mod handle;
mod options;
mod recv;
mod rx_queue;
mod state_machine;

pub(crate) use connection::{ConnectionSocket, State};
pub(crate) use datagram::{Datagram, DatagramSocket};
pub use handle::SocketHandle;
pub(crate) use options::Options;
pub use recv::{DirectReceive, RecvInfo};
pub use rx_queue::HeldBuffers;
pub(crate) use rx_queue::HoldOffer;
pub(crate) use state_machine::{End, Outcome, Packet, answer};

use crate::addr::VsockAddr;
use crate::readiness::Readiness;
use crate::ring::ByteRing;
use crate::wire::{Header, SocketType};

/// One socket, by type.
#[derive(Debug)]
pub(crate) enum Socket {
    /// A stream or seqpacket socket.
    Connection(ConnectionSocket),
    /// A datagram socket.
    Datagram(DatagramSocket),
}

/// The next packet a socket will send.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Planned {
    Connection(Packet),
    Datagram(Datagram),
}

impl Socket {
    pub fn ty(&self) -> SocketType {
        match self {
            Self::Connection(c) => c.ty,
            Self::Datagram(_) => SocketType::Datagram,
        }
    }

    /// The bound address; the CID may be `VMADDR_CID_ANY`.
    pub fn local(&self) -> Option<VsockAddr> {
        match self {
            Self::Connection(c) => c.local,
            Self::Datagram(d) => d.local,
        }
    }

    pub fn set_local(&mut self, addr: VsockAddr) {
        match self {
            Self::Connection(c) => c.local = Some(addr),
            Self::Datagram(d) => d.local = Some(addr),
        }
    }

    pub fn options(&self) -> &Options {
        match self {
            Self::Connection(c) => &c.options,
            Self::Datagram(d) => &d.options,
        }
    }

    pub fn options_mut(&mut self) -> &mut Options {
        match self {
            Self::Connection(c) => &mut c.options,
            Self::Datagram(d) => &mut d.options,
        }
    }

    pub fn as_connection(&self) -> Option<&ConnectionSocket> {
        match self {
            Self::Connection(c) => Some(c),
            Self::Datagram(_) => None,
        }
    }

    pub fn as_connection_mut(&mut self) -> Option<&mut ConnectionSocket> {
        match self {
            Self::Connection(c) => Some(c),
            Self::Datagram(_) => None,
        }
    }

    pub fn as_datagram_mut(&mut self) -> Option<&mut DatagramSocket> {
        match self {
            Self::Connection(_) => None,
            Self::Datagram(d) => Some(d),
        }
    }

    /// Bytes a receive can return now.
    pub fn readable_bytes(&self) -> usize {
        match self {
            Self::Connection(c) => c.readable_bytes(),
            Self::Datagram(d) => d.rx.len(),
        }
    }

    /// Bytes accepted for sending and not yet handed to the transport.
    pub fn send_queued(&self) -> usize {
        self.send_ring().len()
    }

    pub fn readiness(&self) -> Readiness {
        match self {
            Self::Connection(c) => c.readiness(),
            Self::Datagram(d) => d.readiness(),
        }
    }

    pub fn unblocked(&self) -> Readiness {
        match self {
            Self::Connection(c) => c.unblocked(),
            Self::Datagram(d) => d.unblocked(),
        }
    }

    /// Whether the socket has a packet to hand to the transport now.
    pub fn wants_tx(&self) -> bool {
        match self {
            Self::Connection(c) => c.wants_tx(),
            Self::Datagram(d) => !d.tx_meta.is_empty(),
        }
    }

    /// Bytes of memory this socket's buffers hold, for the memory bound tests.
    pub fn buffered_bytes(&self) -> usize {
        match self {
            Self::Connection(c) => c.conn.rx.capacity() + c.conn.tx.capacity(),
            Self::Datagram(d) => d.rx.capacity() + d.tx.capacity(),
        }
    }

    /// Bytes the application handed over that have not left yet.
    pub fn unsent_bytes(&self) -> usize {
        match self {
            Self::Connection(c) => c.conn.tx.len(),
            Self::Datagram(d) => d.tx.len(),
        }
    }

    /// Decides the socket's next packet, if it has one.
    pub fn next_packet(&self, max_payload: usize) -> Option<Planned> {
        match self {
            Self::Connection(c) => c.next_packet(max_payload).map(Planned::Connection),
            Self::Datagram(d) => d.tx_meta.front().copied().map(Planned::Datagram),
        }
    }

    /// The header of `plan`, sent from a stack whose CID is `stack_cid`.
    pub fn header(&self, plan: Planned, stack_cid: u32) -> Header {
        match (self, plan) {
            (Self::Connection(c), Planned::Connection(p)) => c.header(p),
            (Self::Datagram(d), Planned::Datagram(dgram)) => d.header(dgram, stack_cid),
            _ => unreachable!("a plan is made by the socket it is for"),
        }
    }

    /// The ring whose head holds the payload of the next packet.
    pub fn send_ring(&self) -> &ByteRing {
        match self {
            Self::Connection(c) => &c.conn.tx,
            Self::Datagram(d) => &d.tx,
        }
    }
}
