//! A connection's receive queue: payloads left in the driver's receive
//! buffers, then bytes copied into a ring.
//!
//! Copying every payload out of its receive buffer into the socket's ring
//! costs a copy per byte on whatever thread runs the driver, and the
//! application copies the bytes out again when it reads. A driver that
//! lends its buffers ([`HeldBuffers`]) lets the queue keep a stream payload
//! where it arrived instead: the buffer stays out of the device's ring
//! while its bytes are unread, the application's receive copies straight
//! from it, and the buffer goes back to the driver (`released`) once read.
//!
//! Order: the held payloads come first, the ring after them. A payload is
//! held only while the ring is empty; once one is copied (no buffer could
//! be spared, or the payload is small), everything after it is copied too
//! until the ring drains. Credit does not change: held bytes count as
//! queued, and `fwd_cnt` moves when the application reads them.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::payload::Payload;
use crate::ring::ByteRing;

/// The driver's receive buffers, lent to the stack so that received
/// payloads can be read where they arrived (see
/// `Stack::set_held_buffers`).
pub trait HeldBuffers {
    /// The whole buffer `id`, as the device filled it. Called only for a
    /// buffer the stack holds: one the driver gave it in
    /// `RxBatch::receive_held` and has not had back.
    fn buffer(&self, id: u16) -> &[u8];
}

/// A received packet's buffer, offered for holding its payload: buffer
/// `id`, the payload starting at `start` in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldOffer {
    pub id: u16,
    pub start: usize,
}

/// Smallest payload worth keeping a whole receive buffer out of the
/// device's ring for; smaller ones are copied, which costs little, while a
/// held buffer is one fewer for the device to fill (a 64 KiB buffer held
/// for 1 KiB leaves the device short of room for the next 63).
pub(crate) const MIN_HELD: usize = 8192;

/// One payload left in receive buffer `id`, at `start..end`.
#[derive(Clone, Copy, Debug)]
struct Held {
    id: u16,
    start: u32,
    end: u32,
}

impl Held {
    fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    fn bytes<'a>(&self, buffers: &'a dyn HeldBuffers) -> &'a [u8] {
        &buffers.buffer(self.id)[self.start as usize..self.end as usize]
    }
}

/// Received bytes the application has not read.
#[derive(Debug, Default)]
pub(crate) struct RxQueue {
    held: VecDeque<Held>,
    held_len: usize,
    ring: ByteRing,
}

impl RxQueue {
    pub fn len(&self) -> usize {
        self.held_len + self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of storage the stack holds (held payloads are the driver's).
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Whether a new payload may stay in its buffer: only while nothing is
    /// in the ring, which would have to be read first.
    pub fn can_hold(&self) -> bool {
        self.ring.is_empty()
    }

    /// Queues `len` bytes left at `start` in receive buffer `id`; the
    /// caller checked [`Self::can_hold`].
    pub fn hold(&mut self, id: u16, start: usize, len: usize) {
        self.held.push_back(Held { id, start: start as u32, end: (start + len) as u32 });
        self.held_len += len;
    }

    /// Copies `data` in, after everything queued.
    pub fn push(&mut self, data: Payload<'_>) {
        self.ring.push_payload(data);
    }

    /// The oldest bytes, at most `len`, as at most two slices: the first
    /// two held payloads, a held payload and the start of the ring, or the
    /// ring. `buffers` is needed only when something is held.
    pub fn front<'a>(
        &'a self,
        len: usize,
        buffers: Option<&'a dyn HeldBuffers>,
    ) -> (&'a [u8], &'a [u8]) {
        let Some(first) = self.held.front() else {
            return self.ring.front(len.min(self.ring.len()));
        };
        let buffers = buffers.expect("held payloads need the buffers they are held in");
        let a = first.bytes(buffers);
        let a = &a[..a.len().min(len)];
        let rest = len - a.len();
        let b = match self.held.get(1) {
            Some(second) => second.bytes(buffers),
            None => self.ring.front(rest.min(self.ring.len())).0,
        };
        (a, &b[..b.len().min(rest)])
    }

    /// Drops the oldest `n` bytes; buffers read to the end go to `released`.
    pub fn consume(&mut self, mut n: usize, released: &mut Vec<u16>) {
        while n > 0
            && let Some(first) = self.held.front_mut()
        {
            let take = n.min(first.len());
            first.start += take as u32;
            self.held_len -= take;
            n -= take;
            if first.start == first.end {
                released.push(first.id);
                self.held.pop_front();
            }
        }
        self.ring.consume(n);
    }

    /// Copies the held payloads into the ring, in front of what it holds,
    /// so that the bytes stay readable once the buffers they were held in
    /// go away (the driver that lent them is being replaced). Those
    /// buffers are not released: they belong to the driver that goes.
    pub fn copy_out_held(&mut self, buffers: &dyn HeldBuffers) {
        if self.held.is_empty() {
            return;
        }
        let mut ring = ByteRing::new();
        for held in self.held.drain(..) {
            ring.push(held.bytes(buffers));
        }
        let (a, b) = self.ring.as_slices();
        ring.push(a);
        ring.push(b);
        self.ring = ring;
        self.held_len = 0;
    }

    /// Drops everything: held buffers go to `released`, the ring's storage
    /// is given back.
    pub fn release(&mut self, released: &mut Vec<u16>) {
        released.extend(self.held.drain(..).map(|h| h.id));
        self.held_len = 0;
        self.ring.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers whose byte `i` of buffer `id` is `id * 16 + i`.
    struct Numbered;

    impl HeldBuffers for Numbered {
        fn buffer(&self, id: u16) -> &[u8] {
            const ALL: [[u8; 16]; 4] = {
                let mut all = [[0u8; 16]; 4];
                let mut id = 0;
                while id < 4 {
                    let mut i = 0;
                    while i < 16 {
                        all[id][i] = (id * 16 + i) as u8;
                        i += 1;
                    }
                    id += 1;
                }
                all
            };
            &ALL[id as usize]
        }
    }

    fn read_all(q: &mut RxQueue, released: &mut Vec<u16>, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while !q.is_empty() {
            let (a, b) = q.front(step, Some(&Numbered));
            assert!(a.len() + b.len() <= step);
            out.extend_from_slice(a);
            out.extend_from_slice(b);
            q.consume(a.len() + b.len(), released);
        }
        out
    }

    #[test]
    fn copied_out_held_payloads_stay_readable_in_order_without_the_buffers() {
        let mut q = RxQueue::default();
        q.hold(1, 4, 8);
        q.hold(3, 0, 16);
        q.push(Payload::bytes(&[200, 201, 202]));
        q.copy_out_held(&Numbered);
        let mut released = Vec::new();
        let mut out = Vec::new();
        while !q.is_empty() {
            // No buffers: reading must not need them.
            let (a, b) = q.front(5, None);
            out.extend_from_slice(a);
            out.extend_from_slice(b);
            q.consume(a.len() + b.len(), &mut released);
        }
        let want: Vec<u8> = (20..28).chain(48..64).chain([200, 201, 202]).collect();
        assert_eq!(out, want);
        assert!(released.is_empty(), "the old driver's buffers are not handed back");
    }

    #[test]
    fn held_payloads_read_in_order_before_the_ring() {
        let mut q = RxQueue::default();
        q.hold(1, 4, 8);
        q.hold(3, 0, 16);
        q.push(Payload::bytes(&[200, 201, 202]));
        assert_eq!(q.len(), 27);
        let mut released = Vec::new();
        let all = read_all(&mut q, &mut released, 5);
        let mut want: Vec<u8> = (20..28).chain(48..64).collect();
        want.extend([200, 201, 202]);
        assert_eq!(all, want);
        assert_eq!(released, [1, 3], "each buffer goes back once, when read to its end");
    }

    #[test]
    fn a_payload_is_held_only_while_the_ring_is_empty() {
        let mut q = RxQueue::default();
        assert!(q.can_hold());
        q.hold(0, 0, 4);
        assert!(q.can_hold(), "held payloads do not stop the next from being held");
        q.push(Payload::bytes(&[9]));
        assert!(!q.can_hold(), "a copied byte must be read before anything held after it");
        let mut released = Vec::new();
        q.consume(5, &mut released);
        assert!(q.can_hold());
    }

    #[test]
    fn release_returns_every_held_buffer() {
        let mut q = RxQueue::default();
        q.hold(2, 0, 16);
        q.hold(0, 8, 2);
        let mut released = Vec::new();
        q.consume(3, &mut released);
        assert!(released.is_empty(), "a partly read buffer stays held");
        q.release(&mut released);
        assert_eq!(released, [2, 0]);
        assert!(q.is_empty());
    }
}
