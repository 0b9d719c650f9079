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

    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness> {
        Ok(self.app(h)?.readiness())
    }

    pub fn is_listening(&self, h: SocketHandle) -> Result<bool> {
        Ok(self.app(h)?.as_connection().is_some_and(|c| c.state == State::Listening))
    }

    /// Bytes a receive can return now (SIOCINQ).
    pub fn recv_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.readable_bytes())
    }

    /// Bytes accepted by `send` and not yet handed to the transport (SIOCOUTQ).
    pub fn send_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.send_queued())
    }

    pub fn buffer_size(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.options().buffer_size)
    }

    /// Sets the receive buffer (SO_VM_SOCKETS_BUFFER_SIZE), clamped to
    /// `[128, max_buffer_size]`; the peer hears the new size at once.
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

    pub fn rcvlowat(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.options().rcvlowat)
    }

    /// Sets SO_RCVLOWAT: a stream is readable only with this many bytes
    /// queued (or at EOF or an error). If the reader would otherwise wait
    /// for bytes the peer has no credit to send, a credit update goes out.
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

    pub fn connect_timeout(&self, h: SocketHandle) -> Result<Duration> {
        Ok(self.app(h)?.options().connect_timeout)
    }

    pub fn set_connect_timeout(&mut self, h: SocketHandle, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument);
        }
        self.app_mut(h)?.options_mut().connect_timeout = timeout;
        Ok(())
    }
}
