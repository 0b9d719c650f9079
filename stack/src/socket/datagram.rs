//! A datagram socket (the virtio-vsock datagram RFC, feature bit 3): two
//! queues of whole datagrams and a default destination. There is no
//! connection, no credit and no RST: a datagram that does not fit the
//! receiver's queue is dropped, and a sender throttles itself on its own
//! send queue.

use alloc::collections::VecDeque;

use super::{Options, RecvInfo};
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::error::{Error, Result};
use crate::payload::Payload;
use crate::readiness::Readiness;
use crate::ring::ByteRing;
use crate::stats::DropReason;
use crate::wire::{Header, MAX_PAYLOAD, shutdown_flags};

/// One queued datagram: who it is from (rx) or for (tx), and its size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Datagram {
    pub addr: VsockAddr,
    pub len: u32,
}

/// A datagram socket.
#[derive(Debug)]
pub(crate) struct DatagramSocket {
    /// The bound address; the CID may be `VMADDR_CID_ANY`.
    pub local: Option<VsockAddr>,
    /// The default destination, set by `connect`.
    pub peer: Option<VsockAddr>,
    /// The directions the application shut down (sticky). Nothing goes on
    /// the wire: a datagram socket has no peer to tell.
    pub shutdown: u32,
    /// Bytes of received datagrams kept before new ones are dropped.
    pub recv_limit: u32,
    /// Bytes of unsent datagrams kept before `send_to` would block.
    pub send_limit: u32,
    pub rx: ByteRing,
    pub rx_meta: VecDeque<Datagram>,
    pub tx: ByteRing,
    pub tx_meta: VecDeque<Datagram>,
    pub options: Options,
}

impl DatagramSocket {
    /// A new, unbound datagram socket whose queues hold `recv_limit` and
    /// `send_limit` bytes.
    pub fn new(options: Options, recv_limit: u32, send_limit: u32) -> Self {
        Self {
            local: None,
            peer: None,
            shutdown: 0,
            recv_limit,
            send_limit,
            rx: ByteRing::new(),
            rx_meta: VecDeque::new(),
            tx: ByteRing::new(),
            tx_meta: VecDeque::new(),
            options,
        }
    }

    /// Readable with a datagram queued or after SHUT_RD (a receive returns
    /// EOF at once); writable until SHUT_WR while a datagram of the largest
    /// size would fit the send queue. SHUT_RD also reads as closed, and both
    /// directions shut as a hangup, as Linux's `vsock_poll` reports for
    /// every socket type (`docs/linux-behaviours.md#readiness`). A datagram
    /// socket has no peer to shut down, so these come from our own shutdown
    /// only.
    pub fn readiness(&self) -> Readiness {
        let mut r = Readiness::EMPTY;
        let read_shut = self.shutdown & shutdown_flags::RCV != 0;
        if !self.rx_meta.is_empty() || read_shut {
            r |= Readiness::READABLE;
        }
        if read_shut {
            r |= Readiness::READ_CLOSED;
        }
        if self.shutdown == shutdown_flags::BOTH {
            r |= Readiness::HANGUP;
        }
        let limit = self.send_limit as usize;
        if !self.send_shut() && limit.saturating_sub(self.tx.len()) >= MAX_PAYLOAD.min(limit) {
            r |= Readiness::WRITABLE;
        }
        r
    }

    /// [`Self::readiness`] plus WRITABLE after SHUT_WR, when a send fails
    /// at once (see `ConnectionSocket::unblocked`).
    pub fn unblocked(&self) -> Readiness {
        let mut r = self.readiness();
        if self.send_shut() {
            r |= Readiness::WRITABLE;
        }
        r
    }

    fn send_shut(&self) -> bool {
        self.shutdown & shutdown_flags::SEND != 0
    }

    /// Whether a datagram of `len` bytes for `to` may be queued now: not
    /// after SHUT_WR, not to port `VMADDR_PORT_ANY`, never over 64 KiB or
    /// the send buffer, and only while the send buffer has room for it.
    pub fn check_send(&self, len: usize, to: VsockAddr) -> Result<()> {
        if self.send_shut() {
            return Err(Error::BrokenPipe);
        }
        if to.port == VMADDR_PORT_ANY {
            return Err(Error::InvalidArgument);
        }
        if len > MAX_PAYLOAD || len > self.send_limit as usize {
            return Err(Error::MessageTooLarge);
        }
        let free = (self.send_limit as usize).saturating_sub(self.tx.len());
        if len > free || self.tx_meta.len() >= count_limit(self.send_limit) {
            return Err(Error::WouldBlock);
        }
        Ok(())
    }

    /// Queues a datagram that [`Self::check_send`] accepted; `to` has a
    /// concrete CID.
    pub fn queue(&mut self, data: &[u8], to: VsockAddr) {
        self.tx.push(data);
        self.tx_meta.push_back(Datagram { addr: to, len: data.len() as u32 });
    }

    /// Receives the oldest datagram by lending it to `copy` (see
    /// `Stack::recv_with`); a peek leaves it queued.
    pub fn recv_with<E>(
        &mut self,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        if self.shutdown & shutdown_flags::RCV != 0 {
            return Ok(RecvInfo { eof: true, ..RecvInfo::default() });
        }
        let Some(head) = self.rx_meta.front().copied() else {
            return Err(Error::WouldBlock);
        };
        let len = head.len as usize;
        let (a, b) = self.rx.front(len);
        let taken = copy(a, b);
        if !peek {
            self.rx.consume(len);
            self.rx_meta.pop_front();
        }
        let taken = taken.map_err(|_| Error::Fault)?.min(len);
        Ok(RecvInfo {
            len: taken,
            message_len: len,
            truncated: taken < len,
            end_of_record: false,
            eof: false,
            inq: self.rx.len(),
            from: Some(head.addr),
        })
    }

    /// A datagram from `from` arrived: queue it, or say why it is dropped
    /// (after SHUT_RD, or when the receive buffer has no room for it).
    pub fn deliver(
        &mut self,
        from: VsockAddr,
        payload: Payload<'_>,
    ) -> core::result::Result<(), DropReason> {
        if self.shutdown & shutdown_flags::RCV != 0 {
            return Err(DropReason::AfterShutdown);
        }
        if self.rx.len() + payload.len() > self.recv_limit as usize
            || self.rx_meta.len() >= count_limit(self.recv_limit)
        {
            return Err(DropReason::DatagramReceiveBufferFull);
        }
        self.rx.push_payload(payload);
        self.rx_meta.push_back(Datagram { addr: from, len: payload.len() as u32 });
        Ok(())
    }

    /// Ends directions of a connected datagram socket (sticky): sends fail
    /// with broken-pipe, receives see EOF and arriving datagrams are
    /// dropped. Never tells a peer, so it returns `false` like a
    /// connection's `shutdown` that owes no SHUTDOWN.
    pub fn shutdown(&mut self, flags: u32) -> Result<bool> {
        if self.peer.is_none() {
            return Err(Error::NotConnected);
        }
        self.shutdown |= flags;
        Ok(false)
    }

    /// The header of `datagram`, sent from a stack whose CID is `stack_cid`.
    pub fn header(&self, datagram: Datagram, stack_cid: u32) -> Header {
        let to = datagram.addr;
        // A datagram socket has no connection: its source CID is the one it
        // is bound to, or the one that reaches `to` (CID 1 for loopback).
        let cid = match self.local.map(|l| l.cid) {
            Some(cid) if cid != VMADDR_CID_ANY => cid,
            _ if to.cid == VMADDR_CID_LOCAL => VMADDR_CID_LOCAL,
            _ => stack_cid,
        };
        let local_port = self.local.map_or(0, |l| l.port);
        Header::datagram(VsockAddr::new(cid, local_port), to, datagram.len)
    }

    /// Drops the datagram at the head of the send queue: it left, or it
    /// could never leave.
    pub fn sent(&mut self) {
        if let Some(d) = self.tx_meta.pop_front() {
            self.tx.consume(d.len as usize);
        }
    }
}

/// Most datagrams a queue holds, so empty datagrams cannot grow it without bound.
fn count_limit(bytes: u32) -> usize {
    (bytes as usize / 16).max(1024)
}
