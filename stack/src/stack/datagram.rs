//! Datagram sockets (the virtio-vsock datagram RFC, feature bit 3): no
//! connection, no credit, no RST; one packet per datagram.
//!
//! The socket's own queues are in `crate::socket::DatagramSocket`; here
//! are the calls that need the endpoint (binding on first send, resolving
//! `VMADDR_CID_ANY`) and the delivery of a received datagram to the socket
//! bound to its port.

use super::Stack;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::payload::Payload;
use crate::socket::{Socket, SocketHandle};
use crate::stats::DropReason;
use crate::wire::{Header, Op};

impl Stack {
    /// Queues one datagram for `to`, as `sendto(2)`; it travels as one
    /// packet. The first send binds an ephemeral port, and CID
    /// [`VMADDR_CID_ANY`] means this stack. A datagram the peer cannot take is
    /// dropped there; nothing comes back.
    ///
    /// Fails with [`Error::NotSupported`] (EOPNOTSUPP) on any socket but a
    /// datagram socket, [`Error::BrokenPipe`] (EPIPE) after SHUT_WR,
    /// [`Error::InvalidArgument`] (EINVAL) for port [`VMADDR_PORT_ANY`](crate::VMADDR_PORT_ANY),
    /// [`Error::MessageTooLarge`] (EMSGSIZE) over 64 KiB or the send buffer,
    /// and [`Error::WouldBlock`] (EAGAIN) while the send buffer is full.
    pub fn send_to(&mut self, h: SocketHandle, data: &[u8], to: VsockAddr) -> Result<()> {
        let Socket::Datagram(d) = self.app(h)? else { return Err(Error::NotSupported) };
        d.check_send(data.len(), to)?;
        // As in Linux, a datagram to CID_ANY goes to ourselves.
        let to =
            if to.cid == VMADDR_CID_ANY { VsockAddr::new(self.local_cid, to.port) } else { to };
        self.autobind(h)?;
        self.dgram_mut(h).queue(data, to);
        self.enqueue_tx(h);
        Ok(())
    }

    /// A datagram arrived: it goes to the socket bound to its port, or is
    /// dropped and counted. Datagrams never draw an RST.
    pub(super) fn process_datagram(&mut self, hdr: &Header, payload: Payload<'_>) {
        if !self.config.features.datagram {
            self.stats.count_drop(DropReason::TypeNotNegotiated);
            return;
        }
        if hdr.op != Op::Rw {
            self.stats.count_drop(DropReason::DatagramBadOp);
            return;
        }
        let Some(h) = self.bound_for(false, hdr.dst_port, hdr.dst_cid) else {
            self.stats.count_drop(DropReason::DatagramNoSocket);
            return;
        };
        let from = VsockAddr::new(hdr.src_cid as u32, hdr.src_port);
        match self.dgram_mut(h).deliver(from, payload) {
            Ok(()) => self.note(h, Wake::Readable),
            Err(reason) => self.stats.count_drop(reason),
        }
    }
}
