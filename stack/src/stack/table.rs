//! What the endpoint's tables hold: the socket table's rows ([`Entry`],
//! with each socket's [`Wakers`]) and the key of the connection table
//! ([`ConnKey`]).
//!
//! They are apart from the calls that use them (`impl Stack` in
//! `endpoint.rs` and `wakes.rs`) because the [`Stack`](super::Stack)
//! holds them: a file that gave the `Stack` both its parts and its methods
//! would import the `Stack`'s module, which would import it back.

use alloc::boxed::Box;

use crate::addr::VsockAddr;
use crate::readiness::{ReadinessHook, WakerSlot};
use crate::socket::Socket;
use crate::wire::Header;

/// A connection, as the endpoint finds it: our port and the peer's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct ConnKey {
    local_port: u32,
    peer_cid: u32,
    peer_port: u32,
}

impl ConnKey {
    /// The connection between our `local_port` and `peer`.
    pub(super) fn new(local_port: u32, peer: VsockAddr) -> Self {
        Self { local_port, peer_cid: peer.cid, peer_port: peer.port }
    }

    /// The connection a received packet belongs to (the receiver has
    /// checked that its source CID fits 32 bits).
    pub(super) fn of_received(hdr: &Header) -> Self {
        Self { local_port: hdr.dst_port, peer_cid: hdr.src_cid as u32, peer_port: hdr.src_port }
    }
}

/// One row of the socket table: a socket, and what the endpoint keeps
/// about it (who holds it, its port, its place on the transmit queue, its
/// wakers).
pub(super) struct Entry {
    pub(super) socket: Socket,
    /// False once the application has closed its handle; the socket may
    /// live on to finish the close handshake.
    pub(super) app_owned: bool,
    /// Whether this socket holds its local port in a bind table.
    pub(super) owns_port: bool,
    /// Whether the socket is on the transmit queue.
    pub(super) in_tx_queue: bool,
    pub(super) wakers: Wakers,
}

impl Entry {
    pub(super) fn new(socket: Socket, app_owned: bool) -> Self {
        Self { socket, app_owned, owns_port: false, in_tx_queue: false, wakers: Wakers::default() }
    }
}

/// A socket's waiters, and the readiness changes recorded for them.
#[derive(Default)]
pub(super) struct Wakers {
    pub(super) readers: WakerSlot,
    pub(super) writers: WakerSlot,
    /// Replaces the wakers when set (see [`ReadinessHook`]).
    pub(super) hook: Option<Box<dyn ReadinessHook>>,
    pub(super) wake_read: bool,
    pub(super) wake_write: bool,
    /// Whether the socket is on the stack's list of pending wakes.
    pub(super) pending: bool,
}

impl Wakers {
    /// Drops every waker and the hook: the application closed its handle.
    pub(super) fn forget(&mut self) {
        self.readers.take();
        self.writers.take();
        self.hook = None;
    }
}
