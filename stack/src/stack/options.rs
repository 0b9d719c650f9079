//! Socket options and queries: addresses, readiness, queued bytes, and
//! the `SO_VM_SOCKETS_*`, `SO_RCVLOWAT` and connect-timeout options.

use core::time::Duration;

use super::Stack;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VsockAddr};
use crate::config::MIN_BUFFER_SIZE;
use crate::error::{Error, Result};
use crate::readiness::Readiness;
use crate::socket::{Socket, SocketHandle, State};

impl Stack {
    /// The socket's own address, as `getsockname(2)`. A connection bound to
    /// [`VMADDR_CID_ANY`] reports the CID it actually uses; a connection from
    /// a catch-all listener reports the port the peer dialled. Fails with
    /// [`Error::InvalidArgument`] (EINVAL) while unbound.
    pub fn local_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let s = self.app(h)?;
        let local = s.local().ok_or(Error::InvalidArgument)?;
        match s {
            Socket::Connection(c) if c.peer.is_some() && local.cid == VMADDR_CID_ANY => {
                Ok(VsockAddr::new(c.local_cid, local.port))
            }
            _ => Ok(local),
        }
    }

    /// The peer, as `getpeername(2)`: the other end of a connection (also
    /// after it ended, while the socket is open), or a datagram socket's
    /// destination. Fails with [`Error::NotConnected`] (ENOTCONN) otherwise.
    pub fn peer_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let peer = match self.app(h)? {
            Socket::Datagram(d) => d.peer,
            Socket::Connection(c) if matches!(c.state, State::Connected | State::Disconnected) => {
                c.peer
            }
            Socket::Connection(_) => None,
        };
        peer.ok_or(Error::NotConnected)
    }

    /// What the socket is ready for now, as Linux's `vsock_poll` reports it,
    /// with POLLRDHUP, POLLHUP and POLLERR. Register a waker to hear of a
    /// change. As in Linux, a socket shut down for sending is not writable
    /// although a send fails at once: see [`Stack::unblocked`].
    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness> {
        Ok(self.app(h)?.readiness())
    }

    /// [`Stack::readiness`] plus the calls that would return at once only
    /// to fail or to report the end: READABLE when a receive would return
    /// EOF or an error, WRITABLE when a send would fail (after SHUT_WR,
    /// the peer's SHUT_RD, a reset). An adapter whose wait must end
    /// whenever its call would not block waits for this: a `wasi:io`
    /// output stream's pollable must be ready once the stream is closed,
    /// where `poll(2)` reports no POLLOUT. A connect under way is never
    /// unblocked (its caller waits for the outcome, `finish_connect`), and
    /// a listener only by a connection to accept. The wakers registered
    /// for readiness hear of these changes too.
    pub fn unblocked(&self, h: SocketHandle) -> Result<Readiness> {
        Ok(self.app(h)?.unblocked())
    }

    /// Whether the socket is a listener (SO_ACCEPTCONN), for adapters that
    /// must tell `accept` from `recv` on a handle.
    pub fn is_listening(&self, h: SocketHandle) -> Result<bool> {
        Ok(self.app(h)?.as_connection().is_some_and(|c| c.state == State::Listening))
    }

    /// Bytes a receive can return now (SIOCINQ): unlike [`RecvInfo::inq`](crate::RecvInfo::inq),
    /// exact, also at EOF.
    pub fn recv_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.readable_bytes())
    }

    /// Whether the peer ended this connection with an RST (false for a
    /// datagram socket, and while the peer has not ended it). A receive
    /// reports such an end as end-of-file, as Linux does; this is how a
    /// caller that must say how the peer ended tells a reset apart.
    pub fn peer_reset(&self, h: SocketHandle) -> Result<bool> {
        Ok(match self.app(h)? {
            Socket::Connection(c) => c.conn.peer_reset,
            Socket::Datagram(_) => false,
        })
    }

    /// Bytes accepted by `send` and not yet handed to the transport
    /// (SIOCOUTQ, as Linux's vsock counts it): what a lingering close waits for.
    pub fn send_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.send_queued())
    }

    /// The receive buffer (SO_VM_SOCKETS_BUFFER_SIZE): what a connection
    /// advertises as `buf_alloc`, and what a datagram socket queues before it
    /// drops.
    pub fn buffer_size(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.options().buffer_size)
    }

    /// Sets the receive buffer (SO_VM_SOCKETS_BUFFER_SIZE), clamped to
    /// `[128, max_buffer_size]` as Linux clamps it; the peer of a connection
    /// hears the new size at once.
    pub fn set_buffer_size(&mut self, h: SocketHandle, size: u64) -> Result<()> {
        let max = self.config.max_buffer_size;
        let size = size.clamp(MIN_BUFFER_SIZE as u64, max as u64) as u32;
        let credit_owed = match self.app_mut(h)? {
            Socket::Connection(c) => c.set_buffer_size(size),
            Socket::Datagram(d) => {
                d.options.buffer_size = size;
                d.recv_limit = size;
                false
            }
        };
        if credit_owed {
            self.enqueue_tx(h);
        }
        Ok(())
    }

    /// SO_RCVLOWAT: how many bytes a stream needs queued to be readable.
    pub fn rcvlowat(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.options().rcvlowat)
    }

    /// Sets SO_RCVLOWAT (0 means 1): a stream is readable only with this
    /// many bytes queued (or at EOF or an error). If the reader would
    /// otherwise wait for bytes the peer has no credit to send, a credit
    /// update goes out. Fails with [`Error::InvalidArgument`] (EINVAL) on a
    /// stream for more than its buffer size.
    pub fn set_rcvlowat(&mut self, h: SocketHandle, bytes: u32) -> Result<()> {
        let s = self.app_mut(h)?;
        let credit_owed = match s {
            Socket::Connection(c) => c.set_rcvlowat(bytes)?,
            Socket::Datagram(d) => {
                d.options.rcvlowat = bytes.max(1);
                false
            }
        };
        let readable = s.readiness().contains(Readiness::READABLE);
        if credit_owed {
            self.enqueue_tx(h);
        }
        if readable {
            self.note(h, Wake::Readable);
        }
        Ok(())
    }

    /// SO_VM_SOCKETS_CONNECT_TIMEOUT: how long a connect waits for the
    /// peer's RESPONSE; on a catch-all listener, how long an accepted
    /// connection waits for `confirm` or `refuse`.
    pub fn connect_timeout(&self, h: SocketHandle) -> Result<Duration> {
        Ok(self.app(h)?.options().connect_timeout)
    }

    /// Sets SO_VM_SOCKETS_CONNECT_TIMEOUT for connects started from now on
    /// (on a catch-all listener, for connections it accepts from now on).
    /// Fails with [`Error::InvalidArgument`] (EINVAL) for zero.
    pub fn set_connect_timeout(&mut self, h: SocketHandle, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument);
        }
        self.app_mut(h)?.options_mut().connect_timeout = timeout;
        Ok(())
    }
}
