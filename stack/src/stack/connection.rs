//! Stream and seqpacket sockets: their calls, and the endpoint's side of
//! the connection state machine.
//!
//! A connection goes Unconnected → Connecting (REQUEST sent) → Connected
//! → Closing (SHUTDOWN sent after queued data) or Disconnected (the peer
//! shut down or reset, the application still reads what is queued). The
//! machine itself is `crate::socket::ConnectionSocket`
//! (`socket/state_machine.rs`); it returns an [`Outcome`], and
//! [`Stack::apply`] does what the outcome asks of the tables, queues,
//! counters and wakers.

use super::Stack;
use super::table::ConnKey;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::socket::{ConnectionSocket, End, Outcome, Socket, SocketHandle, State};
use crate::time::Instant;
use crate::wire::{RawHeader, shutdown_flags};

/// Which direction [`Stack::shutdown`] ends, as `shutdown(2)`'s `how`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// SHUT_RD: receive no more. Receives see EOF at once, even with data
    /// queued, and the peer's sends fail with broken-pipe.
    Read,
    /// SHUT_WR: send no more. The peer reads EOF after what was queued.
    Write,
    /// SHUT_RDWR: both.
    Both,
}

/// What [`Stack::send_in_place`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// Something of this connection is queued ahead of new bytes, which
    /// must queue behind it ([`Stack::send_with`]); `fill` was not called.
    Queued,
    /// `fill` wrote nothing; nothing was counted.
    Empty,
    /// The bytes `fill` wrote (`len` of them) were counted as sent: this
    /// header goes in front of them to the transport, now.
    Packet(RawHeader),
}

impl Shutdown {
    fn flags(self) -> u32 {
        match self {
            Self::Read => shutdown_flags::RCV,
            Self::Write => shutdown_flags::SEND,
            Self::Both => shutdown_flags::BOTH,
        }
    }
}

impl Stack {
    /// Answers a connection accepted from a catch-all listener with RESPONSE:
    /// the peer's connect succeeds and the connection works as any other.
    /// Fails with [`Error::InvalidArgument`] (EINVAL) on any other socket.
    pub fn confirm(&mut self, h: SocketHandle) -> Result<()> {
        let outcome = self.awaiting_confirmation(h)?.confirm();
        self.apply(h, outcome);
        Ok(())
    }

    /// Refuses a connection accepted from a catch-all listener with RST (the
    /// peer's connect fails with connection-reset), and closes the handle.
    /// Fails with [`Error::InvalidArgument`] (EINVAL) on any other socket.
    pub fn refuse(&mut self, h: SocketHandle) -> Result<()> {
        let outcome = self.awaiting_confirmation(h)?.refuse();
        self.apply(h, outcome);
        Ok(())
    }

    /// The application's connection `h` from a catch-all listener, while
    /// it waits for `confirm` or `refuse`; invalid-argument otherwise.
    fn awaiting_confirmation(&mut self, h: SocketHandle) -> Result<&mut ConnectionSocket> {
        match self.app_mut(h)? {
            Socket::Connection(c) if c.awaiting_confirmation => Ok(c),
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Starts connecting to `addr`, as a non-blocking `connect(2)` (there is
    /// no EINPROGRESS: `Ok` means started). An unbound socket gets an
    /// ephemeral port; REQUEST goes out and the connect timeout starts at
    /// `now`. [`Stack::finish_connect`] reports how it ended; the socket turns
    /// writable then. On a datagram socket it only sets the destination of
    /// [`Stack::send`] (and binds).
    ///
    /// Fails with [`Error::InvalidArgument`] (EINVAL) for port
    /// [`VMADDR_PORT_ANY`], for CID [`VMADDR_CID_ANY`] on a stream or seqpacket
    /// socket, and on a listener; [`Error::Already`] (EALREADY) while a connect
    /// runs; [`Error::IsConnected`] (EISCONN) once connected;
    /// [`Error::AddressInUse`] (EADDRINUSE) when this port already has a
    /// connection to `addr`; and as [`Stack::bind`] when binding fails.
    pub fn connect(&mut self, h: SocketHandle, addr: VsockAddr, now: Instant) -> Result<()> {
        let s = self.app(h)?;
        if addr.port == VMADDR_PORT_ANY || (addr.cid == VMADDR_CID_ANY && s.ty().is_connectible()) {
            return Err(Error::InvalidArgument);
        }
        let Socket::Connection(c) = s else {
            self.autobind(h)?;
            self.dgram_mut(h).peer = Some(addr);
            return Ok(());
        };
        match c.state {
            State::Unconnected => {}
            State::Listening => return Err(Error::InvalidArgument),
            State::Connecting => return Err(Error::Already),
            State::Connected | State::Closing | State::Disconnected => {
                return Err(Error::IsConnected);
            }
        }
        self.autobind(h)?;
        let local_port = self.conn(h).local.expect("bound").port;
        let key = ConnKey::new(local_port, addr);
        if self.connected.contains_key(&key) {
            return Err(Error::AddressInUse);
        }
        self.connected.insert(key, h);
        let local_cid =
            if addr.cid == VMADDR_CID_LOCAL { VMADDR_CID_LOCAL } else { self.local_cid };
        let outcome = self.conn_mut(h).start_connect(addr, local_cid, now);
        self.apply(h, outcome);
        Ok(())
    }

    /// How `connect` ended, as SO_ERROR after a non-blocking connect: `Ok`
    /// once established (also if it has ended since), [`Error::WouldBlock`]
    /// (EAGAIN) while the handshake runs, and the failure exactly once:
    /// [`Error::ConnectionReset`] (ECONNRESET) when the peer refused or reset,
    /// [`Error::TimedOut`] (ETIMEDOUT), [`Error::Protocol`] (EPROTO). After
    /// that, or with no connect, [`Error::NotConnected`] (ENOTCONN); on a
    /// listener [`Error::InvalidArgument`] (EINVAL).
    pub fn finish_connect(&mut self, h: SocketHandle) -> Result<()> {
        match self.app_mut(h)? {
            Socket::Connection(c) => c.finish_connect(),
            Socket::Datagram(_) => Err(Error::NotConnected),
        }
    }

    /// The stream part of [`Stack::send`].
    pub(super) fn send_stream(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize> {
        let n = self.app_conn(h)?.send(data)?;
        if n > 0 {
            self.enqueue_tx(h);
        }
        Ok(n)
    }

    /// Sends on a stream by lending `fill` the socket's buffer space for up
    /// to [`Self::send_space`] bytes, as at most two slices; `fill` writes
    /// the bytes to send at their start and returns how many. This is how a
    /// relay reads from its source straight into the stack (no bounce
    /// buffer). If `fill` fails, nothing is sent and the call returns
    /// [`Error::Fault`] (EFAULT); the caller keeps its own error. Otherwise
    /// fails as [`Stack::send`], and with [`Error::NotSupported`]
    /// (EOPNOTSUPP) on any socket but a stream.
    pub fn send_with<E>(
        &mut self,
        h: SocketHandle,
        fill: impl FnOnce(&mut [u8], &mut [u8]) -> core::result::Result<usize, E>,
    ) -> Result<usize> {
        let n = self.app_conn(h)?.send_with(fill)?;
        if n > 0 {
            self.enqueue_tx(h);
        }
        Ok(n)
    }

    /// Sends stream bytes that go from their source straight into the
    /// transport's buffer, so that they are copied once instead of twice
    /// (into the send buffer, then out to the transport). A device model
    /// offers a receive buffer of `room` payload bytes; `fill` gets the
    /// most it may write there (the peer's credit, `room` and
    /// [`Stack::max_payload`] allow), writes the bytes and returns how
    /// many. The stack counts them as sent and returns the header of their
    /// packet, [`InPlace::Packet`], which the caller must put in front of
    /// them and hand to the transport now: the bytes already left as far as
    /// the credit, the counters and the order of packets are concerned.
    ///
    /// Only when nothing of this connection is queued ahead (bytes in the
    /// send buffer, the handshake's packets, a SHUTDOWN owed):
    /// [`InPlace::Queued`] otherwise, without calling `fill`, and the bytes
    /// go through [`Stack::send_with`] behind the rest. A connection to our
    /// own CID always answers `Queued` (its packets never reach a
    /// transport). `fill` writing nothing is [`InPlace::Empty`], and nothing
    /// is counted.
    ///
    /// Fails as [`Stack::send_space`] (EPIPE, ENOTCONN, EOPNOTSUPP), with
    /// [`Error::WouldBlock`] (EAGAIN) when the peer has no credit left,
    /// [`Error::InvalidArgument`] (EINVAL) for a `room` of 0, and with
    /// [`Error::Fault`] (EFAULT), nothing sent, when `fill` fails.
    pub fn send_in_place<E>(
        &mut self,
        h: SocketHandle,
        room: usize,
        fill: impl FnOnce(usize) -> core::result::Result<usize, E>,
    ) -> Result<InPlace> {
        if room == 0 {
            return Err(Error::InvalidArgument);
        }
        let (local_cid, max_payload) = (self.local_cid, self.max_payload);
        let c = self.app_conn(h)?;
        let space = c.send_space()?;
        let to_ourselves =
            c.peer.is_some_and(|p| super::transmit::is_local_cid(local_cid, u64::from(p.cid)));
        if !c.can_send_in_place() || to_ourselves {
            return Ok(InPlace::Queued);
        }
        if space == 0 {
            return Err(Error::WouldBlock);
        }
        let limit = space.min(room).min(max_payload);
        let written = fill(limit).map_err(|_| Error::Fault)?.min(limit);
        if written == 0 {
            return Ok(InPlace::Empty);
        }
        let header = c.sent_in_place(written).to_raw();
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += written as u64;
        Ok(InPlace::Packet(header))
    }

    /// Ends a run of [`Stack::send_in_place`] calls that moved the first
    /// `sent` bytes of `data` and stopped with `failure`, if one did: with
    /// no failure, what is left goes through [`Stack::send`]. Returns what
    /// one `send` of all of `data` would: the bytes taken, or the error
    /// only when none were, so a caller never loses count of bytes that
    /// already left.
    pub fn finish_in_place(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        sent: usize,
        failure: Option<Error>,
    ) -> Result<usize> {
        match failure {
            Some(e) if sent == 0 => Err(e),
            Some(_) => Ok(sent),
            None if sent == data.len() => Ok(sent),
            None => match self.send(h, &data[sent..]) {
                Ok(n) => Ok(sent + n),
                Err(_) if sent > 0 => Ok(sent),
                Err(e) => Err(e),
            },
        }
    }

    /// Bytes `send` would take now on a stream: the peer's credit less what
    /// is already queued. Lets a relay read exactly that much from its
    /// source, so nothing has to be read twice or held back. Fails as
    /// [`Stack::send`] would (EPIPE, ENOTCONN, ...), and with
    /// [`Error::NotSupported`] (EOPNOTSUPP) on any socket but a stream.
    pub fn send_space(&mut self, h: SocketHandle) -> Result<usize> {
        self.app_conn(h)?.send_space()
    }

    /// Queues one whole seqpacket message, or nothing, as `send(2)` on a
    /// SOCK_SEQPACKET socket; `end_of_record` is MSG_EOR. A message is never
    /// split across a lack of credit: it waits until the peer has room for all
    /// of it. An empty message is accepted and never sent, as in Linux.
    ///
    /// Fails with [`Error::NotSupported`] (EOPNOTSUPP) on any socket but
    /// seqpacket, [`Error::MessageTooLarge`] (EMSGSIZE) for a message larger
    /// than the peer's buffer or ours (it could never be sent),
    /// [`Error::WouldBlock`] (EAGAIN) until there is room, and as
    /// [`Stack::send`] on a connection that cannot send.
    pub fn send_message(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        end_of_record: bool,
    ) -> Result<()> {
        if self.app_conn(h)?.send_message(data, end_of_record)? {
            self.enqueue_tx(h);
        }
        Ok(())
    }

    /// Ends one or both directions, as `shutdown(2)`; it cannot be undone.
    /// Our own receives see EOF at once and our sends fail with broken-pipe;
    /// the peer hears SHUTDOWN once queued data has gone out. On a datagram
    /// socket it only stops local sends and receives.
    ///
    /// Fails with [`Error::NotConnected`] (ENOTCONN) on a stream or seqpacket
    /// socket that is not connected, and on a datagram socket without a
    /// destination.
    pub fn shutdown(&mut self, h: SocketHandle, how: Shutdown) -> Result<()> {
        let tell_peer = match self.app_mut(h)? {
            Socket::Connection(c) => c.shutdown(how.flags())?,
            Socket::Datagram(d) => d.shutdown(how.flags())?,
        };
        if tell_peer {
            self.enqueue_tx(h);
        }
        self.note(h, Wake::Both);
        Ok(())
    }

    /// The application (or its listener's close) let go of connection `h`.
    pub(super) fn close_connection(&mut self, h: SocketHandle, now: Instant) {
        // Nobody can read what is queued any more: held buffers go back now,
        // not when the close handshake ends.
        self.release_received(h);
        let close_timeout = self.config.close_timeout;
        let outcome = self.conn_mut(h).close(now, close_timeout);
        self.apply(h, outcome);
    }

    /// Does what the connection state machine asked of the endpoint after
    /// it handled an event on connection `h` (see [`Outcome`] for the order).
    pub(super) fn apply(&mut self, h: SocketHandle, o: Outcome) {
        if o.established {
            self.stats.connections_established += 1;
        }
        if o.credit_requested {
            self.stats.credit_requests_received += 1;
        }
        if let Some(reason) = o.dropped {
            self.stats.count_drop(reason);
        }
        self.stats.rx_bytes_delivered_directly += o.delivered_directly as u64;
        self.stats.rx_bytes_held += o.held as u64;
        if let Some((rst, reason)) = o.rst {
            self.queue_rst(rst, reason);
        }
        if o.arm_timer {
            self.timers.push(h);
        }
        if o.transmit {
            self.enqueue_tx(h);
        }
        if o.writable || o.established {
            self.note(h, Wake::Writable);
        }
        if o.readable {
            self.note(h, Wake::Readable);
        }
        if o.shut_down {
            self.note(h, Wake::Both);
        }
        match o.end {
            End::Open => {}
            End::ConnectFailed => {
                self.detach_connection(h);
                self.note(h, Wake::Both);
            }
            End::Disconnected => {
                let e = &self.sockets[h];
                let orphan =
                    !e.app_owned && e.socket.as_connection().is_some_and(|c| c.parent.is_none());
                self.detach(h);
                if orphan {
                    self.free(h);
                } else {
                    self.note(h, Wake::Both);
                }
            }
            End::Closed => self.free(h),
        }
    }
}
