//! Socket options and queries: addresses, readiness, queued bytes, and
//! the `SO_VM_SOCKETS_*`, `SO_RCVLOWAT` and connect-timeout options.

use core::time::Duration;

use super::Stack;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VsockAddr};
use crate::config::MIN_BUFFER_SIZE;
use crate::error::{Error, Result};
use crate::readiness::Readiness;
use crate::socket::{SocketHandle, State};
use crate::wire::SocketType;

impl Stack {
    pub fn local_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let s = self.app(h)?;
        let local = s.local.ok_or(Error::InvalidArgument)?;
        if s.peer.is_some() && s.ty.is_connectible() && local.cid == VMADDR_CID_ANY {
            return Ok(VsockAddr::new(s.local_cid, local.port));
        }
        Ok(local)
    }

    pub fn peer_addr(&self, h: SocketHandle) -> Result<VsockAddr> {
        let s = self.app(h)?;
        match (s.ty, s.state) {
            (SocketType::Datagram, _) | (_, State::Connected | State::Disconnected) => {
                s.peer.ok_or(Error::NotConnected)
            }
            _ => Err(Error::NotConnected),
        }
    }

    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness> {
        Ok(self.app(h)?.readiness())
    }

    pub fn is_listening(&self, h: SocketHandle) -> Result<bool> {
        Ok(self.app(h)?.state == State::Listening)
    }

    /// Bytes a receive can return now (SIOCINQ).
    pub fn recv_queued(&self, h: SocketHandle) -> Result<usize> {
        Ok(self.app(h)?.readable_bytes())
    }

    /// Bytes accepted by `send` and not yet handed to the transport (SIOCOUTQ).
    pub fn send_queued(&self, h: SocketHandle) -> Result<usize> {
        let s = self.app(h)?;
        Ok(if s.ty == SocketType::Datagram { s.dgram.tx.len() } else { s.conn.tx.len() })
    }

    pub fn buffer_size(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.buffer_size)
    }

    /// Sets the receive buffer (SO_VM_SOCKETS_BUFFER_SIZE), clamped to
    /// `[128, max_buffer_size]`; the peer hears the new size at once.
    pub fn set_buffer_size(&mut self, h: SocketHandle, size: u64) -> Result<()> {
        let max = self.config.max_buffer_size;
        let s = self.app_mut(h)?;
        let size = size.clamp(MIN_BUFFER_SIZE as u64, max as u64) as u32;
        s.buffer_size = size;
        if s.ty == SocketType::Datagram {
            s.dgram.recv_limit = size;
            return Ok(());
        }
        s.conn.rx_limit = s.conn.rx_limit.max(size);
        if s.state == State::Connected {
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        Ok(())
    }

    pub fn rcvlowat(&self, h: SocketHandle) -> Result<u32> {
        Ok(self.app(h)?.rcvlowat)
    }

    /// Sets SO_RCVLOWAT: a stream is readable only with this many bytes
    /// queued (or at EOF or an error). If the reader would otherwise wait
    /// for bytes the peer has no credit to send, a credit update goes out.
    pub fn set_rcvlowat(&mut self, h: SocketHandle, bytes: u32) -> Result<()> {
        let s = self.app_mut(h)?;
        if s.ty == SocketType::Stream && bytes > s.buffer_size {
            return Err(Error::InvalidArgument);
        }
        s.rcvlowat = bytes.max(1);
        if s.state == State::Connected
            && s.conn.credit_update_due(s.buffer_size, s.rcvlowat, s.is_seqpacket())
        {
            s.conn.send_credit_update = true;
            self.enqueue_tx(h);
        }
        if self.sockets[h].readiness().contains(Readiness::READABLE) {
            self.note(h, Wake::Readable);
        }
        Ok(())
    }

    pub fn connect_timeout(&self, h: SocketHandle) -> Result<Duration> {
        Ok(self.app(h)?.connect_timeout)
    }

    pub fn set_connect_timeout(&mut self, h: SocketHandle, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument);
        }
        self.app_mut(h)?.connect_timeout = timeout;
        Ok(())
    }
}
