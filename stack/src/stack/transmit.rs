//! Transmitting: [`Stack::dispatch`] moves packets into a [`TxSink`]: the
//! RSTs owed first, then each socket's next packet, round robin. Packets
//! addressed to the stack's own CID, or to CID 1, never reach the sink:
//! they are delivered inside the stack, like Linux's `vsock_loopback`.

use alloc::vec::Vec;
use core::mem;

use super::Stack;
use super::receive::Origin;
use super::wakes::Wake;
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VsockAddr};
use crate::readiness::WakeList;
use crate::socket::{Socket, SocketHandle, State};
use crate::stats::{DropReason, RstReason};
use crate::time::Instant;
use crate::wire::{Header, MAX_PAYLOAD, Op, RawHeader, SocketType, seq_flags};

/// Most packets one `dispatch` call moves, so local loopback traffic cannot
/// keep a caller inside the stack forever.
pub(super) const DISPATCH_BUDGET: usize = 1 << 16;

/// Where packets leave the stack.
///
/// The header comes as a [`RawHeader`] because one kind of reply cannot be
/// typed: the RST that answers a packet of an unknown type must echo that
/// type. Call [`RawHeader::encode`] for the 44 wire bytes, or
/// [`RawHeader::check`] for a typed [`Header`].
///
/// `transmit` copies the header and payload into the transport's own buffer
/// (a virtqueue descriptor, a socket, a test's wire). Returning
/// [`SinkFull`] keeps the packet in the stack for the next `dispatch`; it is
/// not lost and its bytes are not yet charged to the peer's credit.
pub trait TxSink {
    fn transmit(
        &mut self,
        header: &RawHeader,
        payload: &[u8],
    ) -> core::result::Result<(), SinkFull>;
}

/// The sink has no room now; try again after the transport has drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkFull;

impl<F> TxSink for F
where
    F: FnMut(&RawHeader, &[u8]) -> core::result::Result<(), SinkFull>,
{
    fn transmit(
        &mut self,
        header: &RawHeader,
        payload: &[u8],
    ) -> core::result::Result<(), SinkFull> {
        self(header, payload)
    }
}

/// The next packet a socket will send.
#[derive(Clone, Copy, Debug)]
pub(super) enum Planned {
    Request,
    Response,
    Data { len: usize, flags: u32 },
    Shutdown(u32),
    CreditUpdate,
    Datagram { to: VsockAddr, len: usize },
}

impl Stack {
    /// Caps the payload of every packet `dispatch` produces, for a transport
    /// whose peer posts receive buffers smaller than 64 KiB (a device model
    /// serving a guest with small buffers). Streams and seqpacket messages are
    /// cut smaller; a datagram that no longer fits is dropped and counted.
    pub fn set_max_payload(&mut self, bytes: usize) {
        self.max_payload = bytes.clamp(1, MAX_PAYLOAD);
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Whether `dispatch` has packets to move.
    pub fn has_pending_tx(&self) -> bool {
        !self.replies.is_empty()
            || self.tx_queue.iter().any(|&h| self.sockets.get(h).is_some_and(Socket::wants_tx))
    }

    pub(super) fn enqueue_tx(&mut self, h: SocketHandle) {
        if let Some(s) = self.sockets.get_mut(h)
            && !s.in_tx_queue
        {
            s.in_tx_queue = true;
            self.tx_queue.push_back(h);
        }
    }

    /// Queues an RST answering `to`, with the addresses swapped and the type echoed.
    pub(super) fn reply_rst(&mut self, to: &RawHeader, reason: RstReason) {
        self.queue_rst(RawHeader::rst_reply(to), reason);
    }

    /// Queues an RST from a socket to its peer. Nothing may follow it.
    pub(super) fn socket_rst(&mut self, h: SocketHandle, reason: RstReason) {
        let s = &mut self.sockets[h];
        if s.conn.finished {
            return;
        }
        s.conn.finished = true;
        let (Some(local), Some(peer)) = (s.local, s.peer) else { return };
        let rst = Header::new(s.ty, Op::Rst, VsockAddr::new(s.local_cid, local.port), peer)
            .with_credit(s.buffer_size, s.conn.fwd_cnt);
        self.queue_rst(rst.to_raw(), reason);
    }

    pub(super) fn queue_rst(&mut self, rst: RawHeader, reason: RstReason) {
        if self.replies.len() >= self.config.reply_queue_len {
            self.stats.count_drop(DropReason::ReplyQueueFull);
            return;
        }
        self.replies.push_back((rst, reason));
    }

    pub(super) fn is_local(&self, dst_cid: u64) -> bool {
        is_local_cid(self.local_cid, dst_cid)
    }

    /// Moves packets out: RSTs owed first, then sockets round robin, one
    /// packet per turn. Packets for our own CID are delivered in place.
    /// Stops when the sink is full or nothing is left; returns the packets
    /// moved. Wakers from loopback deliveries land in `wakes`.
    pub fn dispatch(
        &mut self,
        now: Instant,
        sink: &mut impl TxSink,
        wakes: &mut WakeList,
    ) -> usize {
        let mut moved = 0;
        while moved < DISPATCH_BUDGET {
            if let Some(&(rst, reason)) = self.replies.front() {
                if self.is_local(rst.dst_cid) {
                    self.replies.pop_front();
                    self.stats.count_rst(reason);
                    self.receive_raw(now, &rst, &[], Origin::Loopback, &mut None);
                } else if sink.transmit(&rst, &[]).is_ok() {
                    self.replies.pop_front();
                    self.stats.count_rst(reason);
                    self.stats.tx_packets += 1;
                } else {
                    break;
                }
                moved += 1;
                continue;
            }
            let Some(h) = self.tx_queue.pop_front() else { break };
            let Some(s) = self.sockets.get_mut(h) else { continue };
            s.in_tx_queue = false;
            let Some(plan) = plan_packet(s, self.max_payload) else { continue };
            if let Planned::Datagram { len, .. } = plan
                && len > self.max_payload
            {
                self.stats.count_drop(DropReason::DatagramTooLargeForTransport);
                self.commit(h, plan);
                continue;
            }
            let header = build_header(s, plan, self.local_cid).to_raw();
            let local = is_local_cid(self.local_cid, header.dst_cid);
            let payload_len = header.len as usize;
            if local {
                let mut scratch = mem::take(&mut self.scratch);
                scratch.clear();
                copy_head(s, payload_len, &mut scratch);
                self.commit(h, plan);
                self.receive_raw(now, &header, &scratch, Origin::Loopback, &mut None);
                self.scratch = scratch;
            } else {
                let Self { sockets, scratch, .. } = self;
                let s = &sockets[h];
                let head = head_payload(s, payload_len);
                let payload: &[u8] = if head.len() == payload_len {
                    head
                } else {
                    scratch.clear();
                    copy_head(s, payload_len, scratch);
                    scratch
                };
                if sink.transmit(&header, payload).is_err() {
                    self.sockets[h].in_tx_queue = true;
                    self.tx_queue.push_front(h);
                    break;
                }
                self.stats.tx_packets += 1;
                self.stats.tx_bytes += payload_len as u64;
                self.commit(h, plan);
            }
            moved += 1;
        }
        self.drain_wakes(wakes);
        moved
    }

    /// Records that a packet left: advance counters, clear what it carried.
    pub(super) fn commit(&mut self, h: SocketHandle, plan: Planned) {
        let s = &mut self.sockets[h];
        let c = &mut s.conn;
        if s.ty.is_connectible() {
            // Every packet tells the peer our fwd_cnt, so it is also a credit update.
            c.last_fwd_cnt_sent = c.fwd_cnt;
            c.send_credit_update = false;
        }
        match plan {
            Planned::Request => c.send_request = false,
            Planned::Response => c.send_response = false,
            Planned::Data { len, flags } => {
                c.tx.consume(len);
                c.tx_cnt = c.tx_cnt.wrapping_add(len as u32);
                if s.ty == SocketType::SeqPacket {
                    c.tx_head_sent += len as u32;
                    if flags & seq_flags::EOM != 0 {
                        c.tx_messages.pop_front();
                        c.tx_head_sent = 0;
                    }
                }
            }
            Planned::Shutdown(flags) => c.shutdown_sent |= flags,
            Planned::CreditUpdate => self.stats.credit_updates_sent += 1,
            Planned::Datagram { len, .. } => {
                s.dgram.tx.consume(len);
                s.dgram.tx_meta.pop_front();
            }
        }
        let more = s.wants_tx();
        let freed_space = matches!(plan, Planned::Datagram { .. });
        if more {
            self.enqueue_tx(h);
        }
        if freed_space {
            self.note(h, Wake::Writable);
        }
    }
}

/// Decides the socket's next packet, in protocol order: handshake, data,
/// then SHUTDOWN (only once data is out), then a bare credit update.
pub(super) fn plan_packet(s: &Socket, max_payload: usize) -> Option<Planned> {
    if s.ty == SocketType::Datagram {
        let d = s.dgram.tx_meta.front()?;
        return Some(Planned::Datagram { to: d.addr, len: d.len as usize });
    }
    let c = &s.conn;
    if c.finished {
        return None;
    }
    if c.send_request {
        return Some(Planned::Request);
    }
    if c.send_response {
        return Some(Planned::Response);
    }
    if matches!(s.state, State::Connected | State::Closing) {
        if let Some(plan) = plan_data(s, max_payload) {
            return Some(plan);
        }
        let unsent = c.local_shutdown & !c.shutdown_sent;
        if unsent != 0 && c.tx.is_empty() && c.tx_messages.is_empty() {
            return Some(Planned::Shutdown(c.local_shutdown));
        }
    }
    if c.send_credit_update {
        return Some(Planned::CreditUpdate);
    }
    None
}

pub(super) fn plan_data(s: &Socket, max_payload: usize) -> Option<Planned> {
    let c = &s.conn;
    let window = c.send_window(s.buffer_size) as usize;
    let run = c.tx.contiguous_at(0, max_payload).len();
    if s.ty == SocketType::SeqPacket {
        let msg = c.tx_messages.front()?;
        let remaining = (msg.len - c.tx_head_sent) as usize;
        let len = remaining.min(run).min(window);
        if len == 0 && remaining > 0 {
            return None;
        }
        let mut flags = 0;
        if len == remaining {
            flags = seq_flags::EOM;
            if msg.end_of_record {
                flags |= seq_flags::EOR;
            }
        }
        return Some(Planned::Data { len, flags });
    }
    let len = run.min(window);
    (len > 0).then_some(Planned::Data { len, flags: 0 })
}

/// Whether a packet for `dst_cid` stays inside a stack whose CID is `local_cid`.
pub(super) fn is_local_cid(local_cid: u32, dst_cid: u64) -> bool {
    dst_cid == local_cid as u64 || dst_cid == VMADDR_CID_LOCAL as u64
}

pub(super) fn build_header(s: &Socket, plan: Planned, stack_cid: u32) -> Header {
    let local_port = s.local.map_or(0, |l| l.port);
    let (op, len, flags, to) = match plan {
        Planned::Request => (Op::Request, 0, 0, s.peer),
        Planned::Response => (Op::Response, 0, 0, s.peer),
        Planned::Data { len, flags } => (Op::Rw, len, flags, s.peer),
        Planned::Shutdown(flags) => (Op::Shutdown, 0, flags, s.peer),
        Planned::CreditUpdate => (Op::CreditUpdate, 0, 0, s.peer),
        Planned::Datagram { to, len } => (Op::Rw, len, 0, Some(to)),
    };
    let to = to.expect("packets are only planned for sockets with a peer");
    if s.ty == SocketType::Datagram {
        // A datagram socket has no connection: its source CID is the one it
        // is bound to, or the one that reaches `to` (CID 1 for loopback).
        let cid = match s.local.map(|l| l.cid) {
            Some(cid) if cid != VMADDR_CID_ANY => cid,
            _ if to.cid == VMADDR_CID_LOCAL => VMADDR_CID_LOCAL,
            _ => stack_cid,
        };
        return Header::datagram(VsockAddr::new(cid, local_port), to, len as u32);
    }
    Header::new(s.ty, op, VsockAddr::new(s.local_cid, local_port), to)
        .with_len(len as u32)
        .with_flags(flags)
        .with_credit(s.buffer_size, s.conn.fwd_cnt)
}

/// The payload at the head of the socket's send ring, as far as it runs contiguously.
pub(super) fn head_payload(s: &Socket, len: usize) -> &[u8] {
    let ring = if s.ty == SocketType::Datagram { &s.dgram.tx } else { &s.conn.tx };
    ring.contiguous_at(0, len)
}

pub(super) fn copy_head(s: &Socket, len: usize, out: &mut Vec<u8>) {
    let ring = if s.ty == SocketType::Datagram { &s.dgram.tx } else { &s.conn.tx };
    out.resize(len, 0);
    let copied = ring.peek(0, out);
    debug_assert_eq!(copied, len);
}
