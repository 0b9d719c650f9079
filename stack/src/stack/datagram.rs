//! Datagram sockets (the virtio-vsock datagram RFC, feature bit 3): no
//! connection, no credit, no RST; one packet per datagram.

use super::wakes::Wake;
use super::{RecvInfo, Stack};
use crate::addr::{VMADDR_CID_ANY, VMADDR_PORT_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::socket::{Datagram, SocketHandle};
use crate::stats::DropReason;
use crate::wire::{Header, MAX_PAYLOAD, Op, SocketType, shutdown_flags};

impl Stack {
    /// Queues one datagram for `to`. Each datagram travels as one packet.
    pub fn send_to(&mut self, h: SocketHandle, data: &[u8], to: VsockAddr) -> Result<()> {
        let s = self.app(h)?;
        if s.ty != SocketType::Datagram {
            return Err(Error::NotSupported);
        }
        if s.conn.local_shutdown & shutdown_flags::SEND != 0 {
            return Err(Error::BrokenPipe);
        }
        if to.port == VMADDR_PORT_ANY {
            return Err(Error::InvalidArgument);
        }
        // As in Linux, a datagram to CID_ANY goes to ourselves.
        let to =
            if to.cid == VMADDR_CID_ANY { VsockAddr::new(self.local_cid, to.port) } else { to };
        if data.len() > MAX_PAYLOAD || data.len() > s.dgram.send_limit as usize {
            return Err(Error::MessageTooLarge);
        }
        let free = (s.dgram.send_limit as usize).saturating_sub(s.dgram.tx.len());
        if data.len() > free || s.dgram.tx_meta.len() >= dgram_count_limit(s.dgram.send_limit) {
            return Err(Error::WouldBlock);
        }
        self.autobind(h)?;
        let s = &mut self.sockets[h];
        s.dgram.tx.push(data);
        s.dgram.tx_meta.push_back(Datagram { addr: to, len: data.len() as u32 });
        self.enqueue_tx(h);
        Ok(())
    }

    pub(super) fn recv_datagram<E>(
        &mut self,
        h: SocketHandle,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        let s = self.app_mut(h)?;
        if s.conn.local_shutdown & shutdown_flags::RCV != 0 {
            return Ok(RecvInfo { eof: true, ..RecvInfo::default() });
        }
        let Some(head) = s.dgram.rx_meta.front().copied() else {
            return Err(Error::WouldBlock);
        };
        let len = head.len as usize;
        let (a, b) = s.dgram.rx.front(len);
        let taken = copy(a, b);
        if !peek {
            s.dgram.rx.consume(len);
            s.dgram.rx_meta.pop_front();
        }
        let taken = taken.map_err(|_| Error::Fault)?.min(len);
        Ok(RecvInfo {
            len: taken,
            message_len: len,
            truncated: taken < len,
            end_of_record: false,
            eof: false,
            inq: s.dgram.rx.len(),
            from: Some(head.addr),
        })
    }

    pub(super) fn process_datagram(&mut self, hdr: &Header, payload: &[u8]) {
        if !self.config.features.datagram {
            self.stats.count_drop(DropReason::TypeNotNegotiated);
            return;
        }
        if hdr.op != Op::Rw {
            self.stats.count_drop(DropReason::DatagramBadOp);
            return;
        }
        let Some(&h) = self.dgram_bound.get(&hdr.dst_port) else {
            self.stats.count_drop(DropReason::DatagramNoSocket);
            return;
        };
        let s = &mut self.sockets[h];
        let cid_matches =
            s.local.is_some_and(|l| l.cid == VMADDR_CID_ANY || l.cid as u64 == hdr.dst_cid);
        if !cid_matches {
            self.stats.count_drop(DropReason::DatagramNoSocket);
            return;
        }
        if s.conn.local_shutdown & shutdown_flags::RCV != 0 {
            self.stats.count_drop(DropReason::AfterShutdown);
            return;
        }
        let q = &mut s.dgram;
        if q.rx.len() + payload.len() > q.recv_limit as usize
            || q.rx_meta.len() >= dgram_count_limit(q.recv_limit)
        {
            self.stats.count_drop(DropReason::DatagramReceiveBufferFull);
            return;
        }
        q.rx.push(payload);
        q.rx_meta.push_back(Datagram {
            addr: VsockAddr::new(hdr.src_cid as u32, hdr.src_port),
            len: payload.len() as u32,
        });
        self.note(h, Wake::Readable);
    }
}

/// Most datagrams a queue holds, so empty datagrams cannot grow it without bound.
pub(super) fn dgram_count_limit(bytes: u32) -> usize {
    (bytes as usize / 16).max(1024)
}
