//! The endpoint's tables: creating sockets, binding ports, listening and
//! accepting, and taking sockets out of the tables when they close.
//!
//! Stream and seqpacket sockets share one port table, as in Linux;
//! datagram sockets have a port space of their own (the datagram RFC).
//! A connection is found by its 4-tuple ([`ConnKey`]); a listener by its
//! port, or as the catch-all listener of its type.

use core::mem;

use hashbrown::HashMap;

use super::Stack;
use crate::addr::{
    LAST_RESERVED_PORT, VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr,
};
use crate::error::{Error, Result};
use crate::socket::{Socket, SocketHandle, State};
use crate::time::Instant;
use crate::wire::{Header, SocketType};

/// Linux tries this many successive ports before giving up on an ephemeral bind.
pub(super) const EPHEMERAL_PORT_RETRIES: usize = 24;

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

impl Stack {
    pub fn socket(&mut self, ty: SocketType) -> Result<SocketHandle> {
        if !self.config.features.supports(ty) {
            return Err(Error::SocketTypeNotSupported);
        }
        if self.sockets.len() >= self.config.max_sockets {
            return Err(Error::SocketLimit);
        }
        let mut socket = Socket::new(ty, self.config.buffer_size, self.config.connect_timeout);
        socket.dgram.recv_limit = self.config.datagram_receive_buffer;
        socket.dgram.send_limit = self.config.datagram_send_buffer;
        Ok(self.sockets.insert(socket))
    }

    pub(super) fn app(&self, h: SocketHandle) -> Result<&Socket> {
        match self.sockets.get(h) {
            Some(s) if s.app_owned => Ok(s),
            _ => Err(Error::BadHandle),
        }
    }

    pub(super) fn app_mut(&mut self, h: SocketHandle) -> Result<&mut Socket> {
        match self.sockets.get_mut(h) {
            Some(s) if s.app_owned => Ok(s),
            _ => Err(Error::BadHandle),
        }
    }

    pub fn socket_type(&self, h: SocketHandle) -> Result<SocketType> {
        Ok(self.app(h)?.ty)
    }

    pub fn bind(&mut self, h: SocketHandle, addr: VsockAddr) -> Result<()> {
        let s = self.app(h)?;
        if s.local.is_some() {
            return Err(Error::InvalidArgument);
        }
        if !matches!(s.state, State::Unconnected) {
            return Err(Error::InvalidArgument);
        }
        let connectible = s.ty.is_connectible();
        if addr.cid != VMADDR_CID_ANY && addr.cid != self.local_cid && addr.cid != VMADDR_CID_LOCAL
        {
            return Err(Error::AddressNotAvailable);
        }
        let port = if addr.port == VMADDR_PORT_ANY {
            self.ephemeral_port(connectible)?
        } else {
            if addr.port <= LAST_RESERVED_PORT && !self.config.allow_privileged_ports {
                return Err(Error::PermissionDenied);
            }
            if self.port_table(connectible).contains_key(&addr.port) {
                return Err(Error::AddressInUse);
            }
            addr.port
        };
        self.port_table_mut(connectible).insert(port, h);
        let s = &mut self.sockets[h];
        s.local = Some(VsockAddr::new(addr.cid, port));
        s.owns_port = true;
        Ok(())
    }

    pub(super) fn port_table(&self, connectible: bool) -> &HashMap<u32, SocketHandle> {
        if connectible { &self.bound } else { &self.dgram_bound }
    }

    pub(super) fn port_table_mut(&mut self, connectible: bool) -> &mut HashMap<u32, SocketHandle> {
        if connectible { &mut self.bound } else { &mut self.dgram_bound }
    }

    pub(super) fn ephemeral_port(&mut self, connectible: bool) -> Result<u32> {
        for _ in 0..EPHEMERAL_PORT_RETRIES {
            let port = self.next_ephemeral;
            self.next_ephemeral =
                if port >= VMADDR_PORT_ANY - 1 { LAST_RESERVED_PORT + 1 } else { port + 1 };
            if !self.port_table(connectible).contains_key(&port) {
                return Ok(port);
            }
        }
        Err(Error::AddressNotAvailable)
    }

    pub(super) fn autobind(&mut self, h: SocketHandle) -> Result<()> {
        if self.sockets[h].local.is_none() {
            self.bind(h, VsockAddr::any())?;
        }
        Ok(())
    }

    pub fn listen(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app_mut(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        match s.state {
            State::Unconnected if s.local.is_some() => {
                s.state = State::Listening;
                s.backlog = backlog;
                Ok(())
            }
            State::Listening => {
                s.backlog = backlog;
                Ok(())
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Takes one established connection off a listener's queue.
    ///
    /// An empty queue returns [`Error::WouldBlock`] at once and arms
    /// nothing: no timer, no packet, as Linux's non-blocking accept
    /// (`docs/linux-behaviours.md#nonblocking-accept`). To wait, register a
    /// read waker on the listener.
    pub fn accept(&mut self, h: SocketHandle) -> Result<(SocketHandle, VsockAddr)> {
        let s = self.app_mut(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        if s.state != State::Listening {
            return Err(Error::InvalidArgument);
        }
        let Some(child) = s.accept_queue.pop_front() else {
            return Err(Error::WouldBlock);
        };
        let c = &mut self.sockets[child];
        c.parent = None;
        c.app_owned = true;
        let peer = c.peer.expect("queued connections have a peer");
        Ok((child, peer))
    }

    /// Makes `h` a catch-all listener: it receives the connection requests
    /// for every port that no other listener holds, for its socket type.
    ///
    /// This is how a host endpoint bridges to services it only discovers
    /// per request (Firecracker's `<uds>_<port>`): connections it accepts
    /// are not answered yet; `local_addr` tells which port the peer dialled,
    /// and the application answers with [`Stack::confirm`] (RESPONSE) or
    /// [`Stack::refuse`] (RST). Unanswered ones are refused when the
    /// listener's connect timeout runs out, so the peer never hangs.
    pub fn listen_catch_all(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app(h)?;
        if !s.ty.is_connectible() {
            return Err(Error::NotSupported);
        }
        if s.state != State::Unconnected || s.local.is_some() {
            return Err(Error::InvalidArgument);
        }
        let slot = catch_all_slot(s.ty);
        if self.catch_all[slot].is_some() {
            return Err(Error::AddressInUse);
        }
        self.catch_all[slot] = Some(h);
        let s = &mut self.sockets[h];
        s.state = State::Listening;
        s.catch_all = true;
        s.backlog = backlog;
        Ok(())
    }

    /// Closes the handle. An established connection closes in the
    /// background: queued data is still sent, then SHUTDOWN, and the socket
    /// lives until the peer's RST or the close timeout.
    pub fn close(&mut self, h: SocketHandle, now: Instant) -> Result<()> {
        let s = self.app_mut(h)?;
        s.app_owned = false;
        s.readers.take();
        s.writers.take();
        s.hook = None;
        match s.state {
            State::Listening => {
                // Connections nobody accepted are closed like any other
                // (Linux's `__vsock_release` of pending children).
                let children = mem::take(&mut s.accept_queue);
                self.free(h);
                for child in children {
                    self.sockets[child].parent = None;
                    self.close_owned(child, now);
                }
            }
            _ => self.close_owned(h, now),
        }
        Ok(())
    }

    /// Removes the socket's 4-tuple from the connection table.
    pub(super) fn detach_connection(&mut self, h: SocketHandle) {
        let s = &self.sockets[h];
        if let (Some(local), Some(peer)) = (s.local, s.peer) {
            let key = ConnKey::new(local.port, peer);
            if self.connected.get(&key) == Some(&h) {
                self.connected.remove(&key);
            }
        }
    }

    /// Removes the socket from every table, so its port and 4-tuple can be reused.
    pub(super) fn detach(&mut self, h: SocketHandle) {
        self.detach_connection(h);
        let s = &mut self.sockets[h];
        if s.owns_port {
            s.owns_port = false;
            let port = s.local.expect("owner of a port is bound").port;
            let table = if s.ty.is_connectible() { &mut self.bound } else { &mut self.dgram_bound };
            if table.get(&port) == Some(&h) {
                table.remove(&port);
            }
        }
    }

    pub(super) fn free(&mut self, h: SocketHandle) {
        if !self.sockets.contains_key(h) {
            return;
        }
        for slot in &mut self.catch_all {
            if *slot == Some(h) {
                *slot = None;
            }
        }
        self.detach(h);
        if let Some(parent) = self.sockets[h].parent
            && let Some(p) = self.sockets.get_mut(parent)
        {
            p.accept_queue.retain(|&c| c != h);
        }
        self.sockets.remove(h);
    }
}

pub(super) fn catch_all_slot(ty: SocketType) -> usize {
    usize::from(ty == SocketType::SeqPacket)
}
