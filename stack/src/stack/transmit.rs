//! Transmitting: [`Stack::dispatch`] moves packets into a [`TxSink`]: the
//! RSTs owed first, then each socket's next packet, round robin. Packets
//! addressed to the stack's own CID, or to CID 1, never reach the sink:
//! they are delivered inside the stack, like Linux's `vsock_loopback`.

use alloc::vec::Vec;
use core::mem;

use super::Stack;
use super::receive::Origin;
use super::wakes::Wake;
use crate::addr::VMADDR_CID_LOCAL;
use crate::payload::Payload;
use crate::readiness::WakeList;
use crate::ring::ByteRing;
use crate::socket::{Packet, Planned, Socket, SocketHandle};
use crate::stats::{DropReason, RstReason};
use crate::time::Instant;
use crate::wire::{MAX_PAYLOAD, RawHeader};

/// Most packets one `dispatch` call moves, so local loopback traffic cannot
/// keep a caller inside the stack forever.
pub(super) const DISPATCH_BUDGET: usize = 1 << 16;

/// Where packets leave the stack.
///
/// The header comes as a [`RawHeader`] because one kind of reply cannot be
/// typed: the RST that answers a packet of an unknown type must echo that
/// type. Call [`RawHeader::encode`] for the 44 wire bytes, or
/// [`RawHeader::check`] for a typed [`Header`](crate::Header).
///
/// `transmit` copies the header and payload into the transport's own buffer
/// (a virtqueue descriptor, a socket, a test's wire). Returning
/// [`SinkFull`] keeps the packet in the stack for the next `dispatch`; it is
/// not lost and its bytes are not yet charged to the peer's credit.
pub trait TxSink {
    /// Hands one packet to the transport: copies `header` and `payload`
    /// into its own buffer and returns `Ok`, or returns [`SinkFull`] to keep
    /// the packet in the stack for the next `dispatch`.
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

impl Stack {
    /// Caps the payload of every packet `dispatch` produces, for a transport
    /// whose peer posts receive buffers smaller than 64 KiB (a device model
    /// serving a guest with small buffers). Streams and seqpacket messages are
    /// cut smaller; a datagram that no longer fits is dropped and counted.
    pub fn set_max_payload(&mut self, bytes: usize) {
        self.max_payload = bytes.clamp(1, MAX_PAYLOAD);
    }

    /// The largest payload one packet from `dispatch` carries (see
    /// [`Stack::set_max_payload`]).
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Whether `dispatch` has packets to move.
    pub fn has_pending_tx(&self) -> bool {
        !self.replies.is_empty()
            || self
                .tx_queue
                .iter()
                .any(|&h| self.sockets.get(h).is_some_and(|e| e.socket.wants_tx()))
    }

    /// Puts socket `h` at the back of the transmit queue, unless it is on it.
    pub(super) fn enqueue_tx(&mut self, h: SocketHandle) {
        if let Some(e) = self.sockets.get_mut(h)
            && !e.in_tx_queue
        {
            e.in_tx_queue = true;
            self.tx_queue.push_back(h);
        }
    }

    /// Queues an RST answering `to`, with the addresses swapped and the type echoed.
    pub(super) fn reply_rst(&mut self, to: &RawHeader, reason: RstReason) {
        self.queue_rst(RawHeader::rst_reply(to), reason);
    }

    /// Queues an RST to go out before any socket's packet; when the queue is
    /// full it is dropped and counted, so a flood cannot grow memory.
    pub(super) fn queue_rst(&mut self, rst: RawHeader, reason: RstReason) {
        if self.replies.len() >= self.config.reply_queue_len {
            self.stats.count_drop(DropReason::ReplyQueueFull);
            return;
        }
        self.replies.push_back((rst, reason));
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
                if is_local_cid(self.local_cid, rst.dst_cid) {
                    self.replies.pop_front();
                    log_rst(&rst, reason);
                    self.stats.count_rst(reason);
                    self.receive_raw(now, &rst, Payload::bytes(&[]), Origin::Loopback, &mut None);
                } else if sink.transmit(&rst, &[]).is_ok() {
                    self.replies.pop_front();
                    log_rst(&rst, reason);
                    self.stats.count_rst(reason);
                    self.stats.tx_packets += 1;
                } else {
                    break;
                }
                moved += 1;
                continue;
            }
            let Some(h) = self.tx_queue.pop_front() else { break };
            let Some(e) = self.sockets.get_mut(h) else { continue };
            e.in_tx_queue = false;
            let s = &e.socket;
            let Some(plan) = s.next_packet(self.max_payload) else { continue };
            if let Planned::Datagram(d) = plan
                && d.len as usize > self.max_payload
            {
                self.stats.count_drop(DropReason::DatagramTooLargeForTransport);
                self.commit(h, plan);
                continue;
            }
            let header = s.header(plan, self.local_cid).to_raw();
            let local = is_local_cid(self.local_cid, header.dst_cid);
            let payload_len = header.len as usize;
            if local {
                let mut scratch = mem::take(&mut self.scratch);
                scratch.clear();
                copy_head(s.send_ring(), payload_len, &mut scratch);
                self.commit(h, plan);
                self.receive_raw(
                    now,
                    &header,
                    Payload::bytes(&scratch),
                    Origin::Loopback,
                    &mut None,
                );
                self.scratch = scratch;
            } else {
                let Self { sockets, scratch, .. } = self;
                let ring = sockets[h].socket.send_ring();
                let head = ring.contiguous_at(0, payload_len);
                let payload: &[u8] = if head.len() == payload_len {
                    head
                } else {
                    scratch.clear();
                    copy_head(ring, payload_len, scratch);
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
    fn commit(&mut self, h: SocketHandle, plan: Planned) {
        let s = &mut self.sockets[h].socket;
        match (&mut *s, plan) {
            (Socket::Connection(c), Planned::Connection(packet)) => {
                c.sent(packet);
                if let Packet::CreditUpdate = packet {
                    self.stats.credit_updates_sent += 1;
                }
            }
            (Socket::Datagram(d), Planned::Datagram(_)) => d.sent(),
            _ => unreachable!("a plan is made by the socket it is for"),
        }
        let more = s.wants_tx();
        let freed_space = matches!(plan, Planned::Datagram(_));
        if more {
            self.enqueue_tx(h);
        }
        if freed_space {
            self.note(h, Wake::Writable);
        }
    }
}

/// Whether a packet for `dst_cid` stays inside a stack whose CID is `local_cid`.
pub(super) fn is_local_cid(local_cid: u32, dst_cid: u64) -> bool {
    dst_cid == local_cid as u64 || dst_cid == VMADDR_CID_LOCAL as u64
}

/// Copies the first `len` bytes of `ring` into `out`, for a payload that
/// wraps around the ring or is delivered inside the stack.
fn copy_head(ring: &ByteRing, len: usize, out: &mut Vec<u8>) {
    out.resize(len, 0);
    let copied = ring.peek(0, out);
    debug_assert_eq!(copied, len);
}

/// Reports an RST the stack answered with, and why (with the `log` feature).
fn log_rst(rst: &RawHeader, reason: RstReason) {
    net_debug!(
        "RST {}:{} > {}:{}: {}",
        rst.src_cid,
        rst.src_port,
        rst.dst_cid,
        rst.dst_port,
        reason
    );
}
