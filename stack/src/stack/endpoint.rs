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
use super::table::{ConnKey, Entry};
use crate::addr::{
    LAST_RESERVED_PORT, VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr,
};
use crate::error::{Error, Result};
use crate::socket::{ConnectionSocket, DatagramSocket, Options, Socket, SocketHandle, State};
use crate::time::Instant;
use crate::wire::SocketType;

/// Linux tries this many successive ports before giving up on an ephemeral bind.
pub(super) const EPHEMERAL_PORT_RETRIES: usize = 24;

impl Stack {
    /// Creates an unbound, unconnected socket of type `ty`, as
    /// `socket(AF_VSOCK, ty, 0)`.
    ///
    /// Fails with [`Error::SocketTypeNotSupported`] (ESOCKTNOSUPPORT) when the
    /// transport did not negotiate `ty`, and [`Error::SocketLimit`] (EMFILE)
    /// once [`Config::max_sockets`](crate::Config::max_sockets) sockets are
    /// alive (unaccepted and closing ones count).
    pub fn socket(&mut self, ty: SocketType) -> Result<SocketHandle> {
        if !self.config.features.supports(ty) {
            return Err(Error::SocketTypeNotSupported);
        }
        if self.sockets.len() >= self.config.max_sockets {
            return Err(Error::SocketLimit);
        }
        let options = Options::new(
            self.config.buffer_size,
            self.config.connect_timeout,
            self.config.buffer_autotune_max,
        );
        let socket = match ty {
            SocketType::Stream | SocketType::SeqPacket => {
                Socket::Connection(ConnectionSocket::new(ty, options))
            }
            SocketType::Datagram => Socket::Datagram(DatagramSocket::new(
                options,
                self.config.datagram_receive_buffer,
                self.config.datagram_send_buffer,
            )),
        };
        Ok(self.sockets.insert(Entry::new(socket, true)))
    }

    /// Adds a connection a listener accepted; the application gets it from `accept`.
    pub(super) fn insert_accepted(&mut self, child: ConnectionSocket) -> SocketHandle {
        self.sockets.insert(Entry::new(Socket::Connection(child), false))
    }

    /// The socket behind a handle the application holds.
    pub(super) fn app(&self, h: SocketHandle) -> Result<&Socket> {
        match self.sockets.get(h) {
            Some(e) if e.app_owned => Ok(&e.socket),
            _ => Err(Error::BadHandle),
        }
    }

    pub(super) fn app_mut(&mut self, h: SocketHandle) -> Result<&mut Socket> {
        Ok(&mut self.app_entry(h)?.socket)
    }

    /// The table row of a handle the application holds.
    pub(super) fn app_entry(&mut self, h: SocketHandle) -> Result<&mut Entry> {
        match self.sockets.get_mut(h) {
            Some(e) if e.app_owned => Ok(e),
            _ => Err(Error::BadHandle),
        }
    }

    /// The application's stream or seqpacket socket; not-supported for a
    /// datagram socket.
    pub(super) fn app_conn(&mut self, h: SocketHandle) -> Result<&mut ConnectionSocket> {
        self.app_mut(h)?.as_connection_mut().ok_or(Error::NotSupported)
    }

    /// The stream or seqpacket socket `h`, which the stack knows is one (it
    /// is in the connection table, a listener's queue or the timer list).
    pub(super) fn conn(&self, h: SocketHandle) -> &ConnectionSocket {
        self.sockets[h].socket.as_connection().expect("a stream or seqpacket socket")
    }

    /// [`Self::conn`], to change it.
    pub(super) fn conn_mut(&mut self, h: SocketHandle) -> &mut ConnectionSocket {
        self.sockets[h].socket.as_connection_mut().expect("a stream or seqpacket socket")
    }

    /// The datagram socket `h`, which the stack knows is one (it is in the
    /// datagram port table, or the application's call checked its type).
    pub(super) fn dgram_mut(&mut self, h: SocketHandle) -> &mut DatagramSocket {
        self.sockets[h].socket.as_datagram_mut().expect("a datagram socket")
    }

    /// The type the socket was created with (SO_TYPE), for adapters that keep
    /// sockets of every type in one table.
    pub fn socket_type(&self, h: SocketHandle) -> Result<SocketType> {
        Ok(self.app(h)?.ty())
    }

    /// Gives the socket its local address, as `bind(2)`. The CID must be
    /// this stack's, [`VMADDR_CID_LOCAL`] or [`VMADDR_CID_ANY`]; the port
    /// [`VMADDR_PORT_ANY`] picks a free one above 1023. Stream and seqpacket
    /// sockets share one port space; datagram sockets have their own.
    ///
    /// Fails with [`Error::InvalidArgument`] (EINVAL) on a socket already bound
    /// or connected, [`Error::AddressNotAvailable`] (EADDRNOTAVAIL) for another
    /// CID or when 24 ephemeral ports in a row are taken (Linux's retries),
    /// [`Error::PermissionDenied`] (EACCES) for a port at or below 1023 unless
    /// [`Config::allow_privileged_ports`](crate::Config::allow_privileged_ports),
    /// and [`Error::AddressInUse`] (EADDRINUSE) for a port another socket holds.
    pub fn bind(&mut self, h: SocketHandle, addr: VsockAddr) -> Result<()> {
        let s = self.app(h)?;
        if s.local().is_some() {
            return Err(Error::InvalidArgument);
        }
        if s.as_connection().is_some_and(|c| c.state != State::Unconnected) {
            return Err(Error::InvalidArgument);
        }
        let connectible = s.ty().is_connectible();
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
        let e = &mut self.sockets[h];
        e.socket.set_local(VsockAddr::new(addr.cid, port));
        e.owns_port = true;
        Ok(())
    }

    fn port_table(&self, connectible: bool) -> &HashMap<u32, SocketHandle> {
        if connectible { &self.bound } else { &self.dgram_bound }
    }

    fn port_table_mut(&mut self, connectible: bool) -> &mut HashMap<u32, SocketHandle> {
        if connectible { &mut self.bound } else { &mut self.dgram_bound }
    }

    fn ephemeral_port(&mut self, connectible: bool) -> Result<u32> {
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

    /// Binds an unbound socket to an ephemeral port, as a first connect or
    /// send does.
    pub(super) fn autobind(&mut self, h: SocketHandle) -> Result<()> {
        if self.sockets[h].socket.local().is_none() {
            self.bind(h, VsockAddr::any())?;
        }
        Ok(())
    }

    /// The socket bound to `port` that takes packets for `dst_cid`: its
    /// bound CID is that one, or any.
    pub(super) fn bound_for(
        &self,
        connectible: bool,
        port: u32,
        dst_cid: u64,
    ) -> Option<SocketHandle> {
        let &h = self.port_table(connectible).get(&port)?;
        let local = self.sockets[h].socket.local()?;
        (local.cid == VMADDR_CID_ANY || local.cid as u64 == dst_cid).then_some(h)
    }

    /// Makes a bound stream or seqpacket socket accept connections to its
    /// port, as `listen(2)`. A REQUEST is answered at once and the connection
    /// waits for [`Stack::accept`]; with more than `backlog` waiting (Linux's
    /// rule), further REQUESTs are reset. Calling it again changes the backlog.
    ///
    /// Fails with [`Error::NotSupported`] (EOPNOTSUPP) on a datagram socket and
    /// [`Error::InvalidArgument`] (EINVAL) on one that is unbound (listen does
    /// not bind, as in Linux) or connected.
    pub fn listen(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app_conn(h)?;
        match s.state {
            State::Unconnected if s.local.is_some() => {
                s.state = State::Listening;
                s.listener.backlog = backlog;
                Ok(())
            }
            State::Listening => {
                s.listener.backlog = backlog;
                Ok(())
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Takes one established connection off a listener's queue, as
    /// `accept(2)`, with the peer's address. The new handle is the
    /// application's from now on.
    ///
    /// An empty queue returns [`Error::WouldBlock`] (EAGAIN) at once and arms
    /// nothing: no timer, no packet, as Linux's non-blocking accept
    /// (`docs/linux-behaviours.md#nonblocking-accept`). To wait, register a
    /// read waker on the listener. Fails with [`Error::NotSupported`]
    /// (EOPNOTSUPP) on a datagram socket and [`Error::InvalidArgument`]
    /// (EINVAL) on one that is not listening.
    pub fn accept(&mut self, h: SocketHandle) -> Result<(SocketHandle, VsockAddr)> {
        let s = self.app_conn(h)?;
        if s.state != State::Listening {
            return Err(Error::InvalidArgument);
        }
        let Some(child) = s.listener.queue.pop_front() else {
            return Err(Error::WouldBlock);
        };
        self.sockets[child].app_owned = true;
        let c = self.conn_mut(child);
        c.parent = None;
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
    ///
    /// Fails with [`Error::NotSupported`] (EOPNOTSUPP) on a datagram socket,
    /// [`Error::InvalidArgument`] (EINVAL) on a bound or connected one, and
    /// [`Error::AddressInUse`] (EADDRINUSE) while another socket is the
    /// catch-all listener of this type.
    pub fn listen_catch_all(&mut self, h: SocketHandle, backlog: usize) -> Result<()> {
        let s = self.app_conn(h)?;
        if s.state != State::Unconnected || s.local.is_some() {
            return Err(Error::InvalidArgument);
        }
        let slot = catch_all_slot(s.ty);
        if self.catch_all[slot].is_some() {
            return Err(Error::AddressInUse);
        }
        self.catch_all[slot] = Some(h);
        let s = self.conn_mut(h);
        s.state = State::Listening;
        s.listener.catch_all = true;
        s.listener.backlog = backlog;
        Ok(())
    }

    /// Closes a socket abortively, as `close(2)` with `SO_LINGER` set to 0
    /// does for TCP: a connection (connecting, established or closing) is
    /// reset at once, with an RST, and what was queued either way is
    /// discarded, so the peer sees `ConnectionReset` instead of an orderly
    /// end of stream. Other sockets close as with [`Stack::close`]. Use it
    /// when the application knows the exchange failed (a relay whose other
    /// side was reset). `BadHandle` if `h` is not the application's.
    pub fn abort(&mut self, h: SocketHandle, now: Instant) -> Result<()> {
        let e = self.app_entry(h)?;
        if !matches!(&e.socket, Socket::Connection(c) if c.state != State::Listening) {
            return self.close(h, now);
        }
        e.app_owned = false;
        e.wakers.forget();
        let outcome = self.conn_mut(h).abort_by_app();
        self.apply(h, outcome);
        Ok(())
    }

    /// Closes the handle, as `close(2)`; every later call on it fails with
    /// [`Error::BadHandle`] (EBADF). An established connection closes in the
    /// background: queued data is still sent, then SHUTDOWN, and the socket
    /// lives until the peer's RST or the close timeout (`now` starts it).
    /// Closing a listener closes the connections nobody accepted, each as
    /// if it had been accepted and closed.
    pub fn close(&mut self, h: SocketHandle, now: Instant) -> Result<()> {
        let e = self.app_entry(h)?;
        e.app_owned = false;
        e.wakers.forget();
        match &mut e.socket {
            Socket::Datagram(_) => self.free(h),
            Socket::Connection(c) if c.state == State::Listening => {
                // Connections nobody accepted are closed like any other
                // (Linux's `__vsock_release` of pending children).
                let children = mem::take(&mut c.listener.queue);
                self.free(h);
                for child in children {
                    self.conn_mut(child).parent = None;
                    self.close_connection(child, now);
                }
            }
            Socket::Connection(_) => self.close_connection(h, now),
        }
        Ok(())
    }

    /// Removes the connection's 4-tuple from the connection table.
    pub(super) fn detach_connection(&mut self, h: SocketHandle) {
        let Socket::Connection(c) = &self.sockets[h].socket else { return };
        if let (Some(local), Some(peer)) = (c.local, c.peer) {
            let key = ConnKey::new(local.port, peer);
            if self.connected.get(&key) == Some(&h) {
                self.connected.remove(&key);
            }
        }
    }

    /// Removes the socket from every table, so its port and 4-tuple can be reused.
    pub(super) fn detach(&mut self, h: SocketHandle) {
        self.detach_connection(h);
        let e = &mut self.sockets[h];
        if e.owns_port {
            e.owns_port = false;
            let port = e.socket.local().expect("owner of a port is bound").port;
            let table = if e.socket.ty().is_connectible() {
                &mut self.bound
            } else {
                &mut self.dgram_bound
            };
            if table.get(&port) == Some(&h) {
                table.remove(&port);
            }
        }
    }

    /// Forgets the socket: out of every table and its listener's queue.
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
        if let Some(parent) = self.sockets[h].socket.as_connection().and_then(|c| c.parent)
            && let Some(p) = self.sockets.get_mut(parent)
            && let Some(p) = p.socket.as_connection_mut()
        {
            p.listener.queue.retain(|&c| c != h);
        }
        self.release_received(h);
        self.sockets.remove(h);
    }

    /// Drops what connection `h` received and nobody will read; the
    /// driver's buffers it held go back to the driver.
    pub(super) fn release_received(&mut self, h: SocketHandle) {
        if let Some(c) = self.sockets[h].socket.as_connection_mut() {
            c.conn.rx.release(&mut self.released);
        }
    }
}

/// Which catch-all listener takes requests of type `ty`.
pub(super) fn catch_all_slot(ty: SocketType) -> usize {
    usize::from(ty == SocketType::SeqPacket)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::error::Error;
    use crate::time::Instant;
    use crate::wire::SocketType;
    use crate::{Stack, VMADDR_CID_ANY, VsockAddr};

    /// A non-blocking accept on an empty backlog returns would-block and
    /// changes nothing else: no timer (an epoll server ends every
    /// readiness event with such an accept; Linux's vsock once armed a
    /// timeout for each, `docs/linux-behaviours.md#nonblocking-accept`),
    /// no packet, no socket. A connect in progress holds a deadline, so
    /// the check is that accept leaves the timers exactly as they were,
    /// not merely that there are none. How fast it is belongs to
    /// `benches/accept.rs`.
    #[test]
    fn empty_backlog_accept_arms_nothing() {
        let mut s = Stack::new(Config::new(2));
        let l = s.socket(SocketType::Stream).unwrap();
        s.bind(l, VsockAddr::new(VMADDR_CID_ANY, 1234)).unwrap();
        s.listen(l, 8).unwrap();
        let c = s.socket(SocketType::Stream).unwrap();
        let _ = s.connect(c, VsockAddr::new(3, 99), Instant::ZERO);
        let deadline = s.poll_at();
        assert!(deadline.is_some(), "the connect holds a deadline");
        let (timers, sockets, tx) = (s.timers.clone(), s.socket_count(), s.tx_queue.len());
        let replies = s.replies.len();
        for _ in 0..3 {
            assert_eq!(s.accept(l), Err(Error::WouldBlock));
        }
        assert_eq!(s.poll_at(), deadline, "no deadline moved or added");
        assert_eq!(s.timers, timers, "no timer armed");
        assert_eq!(s.socket_count(), sockets, "no socket made");
        assert_eq!((s.tx_queue.len(), s.replies.len()), (tx, replies), "nothing to send");
    }
}
