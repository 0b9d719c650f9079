//! A byte ring that grows on demand up to the limit its owner enforces.
//!
//! Socket buffers hold payload bytes, not packets: a peer that sends a
//! thousand 1-byte packets costs a thousand bytes, which is what the credit
//! it was granted counts, so memory is bounded by credit and never by the
//! number of packets (`docs/linux-behaviours.md#payload-bytes`). Storage
//! starts empty and doubles when needed, so an idle connection costs
//! nothing and a busy one stops allocating once it reaches its working
//! size.

use crate::copy::copy_bytes;
use crate::payload::Payload;
use alloc::vec::Vec;

#[derive(Default)]
pub struct ByteRing {
    storage: Vec<u8>,
    /// Index of the oldest byte.
    head: usize,
    len: usize,
}

impl core::fmt::Debug for ByteRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ByteRing")
            .field("len", &self.len)
            .field("capacity", &self.storage.len())
            .finish()
    }
}

impl ByteRing {
    pub const fn new() -> Self {
        Self { storage: Vec::new(), head: 0, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of storage held, for memory accounting.
    pub fn capacity(&self) -> usize {
        self.storage.len()
    }

    fn mask(&self) -> usize {
        self.storage.len() - 1
    }

    /// Makes room for `extra` more bytes. Every push asks and almost
    /// none needs it, so the check is inlined and the growth is not.
    #[inline]
    fn grow_for(&mut self, extra: usize) {
        let needed = self.len + extra;
        if needed > self.storage.len() {
            self.grow_to(needed);
        }
    }

    #[cold]
    fn grow_to(&mut self, needed: usize) {
        let new_cap = needed.next_power_of_two().max(64);
        let mut storage = alloc::vec![0u8; new_cap];
        let (a, b) = self.as_slices();
        copy_bytes(&mut storage[..a.len()], a);
        copy_bytes(&mut storage[a.len()..a.len() + b.len()], b);
        self.storage = storage;
        self.head = 0;
    }

    /// Appends all of `data`. The owner has already checked its byte limit.
    pub fn push(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.grow_for(data.len());
        let cap = self.storage.len();
        let tail = (self.head + self.len) & self.mask();
        let first = data.len().min(cap - tail);
        copy_bytes(&mut self.storage[tail..tail + first], &data[..first]);
        if first < data.len() {
            copy_bytes(&mut self.storage[..data.len() - first], &data[first..]);
        }
        self.len += data.len();
    }

    /// Appends all of `payload`, copied out of its source when it may
    /// not be borrowed. The owner has already checked its byte limit.
    pub fn push_payload(&mut self, payload: Payload<'_>) {
        if let Some(bytes) = payload.as_bytes() {
            return self.push(bytes);
        }
        let len = payload.len();
        let filled = self.fill_with(len, |first, second| {
            payload.copy_to(first);
            payload.skip(first.len()).copy_to(second);
            Ok::<_, core::convert::Infallible>(len)
        });
        debug_assert_eq!(filled, Ok(len));
    }

    /// Lends `fill` the next `max` bytes of free space (growing as needed),
    /// as at most two slices in order, and keeps as many as it says it
    /// wrote. The owner has already checked its byte limit.
    pub fn fill_with<E>(
        &mut self,
        max: usize,
        fill: impl FnOnce(&mut [u8], &mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        if max == 0 {
            return fill(&mut [], &mut []);
        }
        self.grow_for(max);
        let cap = self.storage.len();
        let tail = (self.head + self.len) & self.mask();
        let first = max.min(cap - tail);
        let (front, back) = self.storage.split_at_mut(tail);
        let n = fill(&mut back[..first], &mut front[..max - first])?.min(max);
        self.len += n;
        Ok(n)
    }

    /// The queued bytes in order, as at most two slices.
    pub fn as_slices(&self) -> (&[u8], &[u8]) {
        if self.len == 0 {
            return (&[], &[]);
        }
        let cap = self.storage.len();
        let first = self.len.min(cap - self.head);
        (&self.storage[self.head..self.head + first], &self.storage[..self.len - first])
    }

    /// The oldest `len` bytes, as at most two slices; `len` is at most
    /// [`Self::len`].
    pub fn front(&self, len: usize) -> (&[u8], &[u8]) {
        let (a, b) = self.as_slices();
        if len <= a.len() { (&a[..len], &[]) } else { (a, &b[..len - a.len()]) }
    }

    /// The longest contiguous run starting `offset` bytes in, at most `max` long.
    pub fn contiguous_at(&self, offset: usize, max: usize) -> &[u8] {
        if offset >= self.len {
            return &[];
        }
        let start = (self.head + offset) & self.mask();
        let run = (self.len - offset).min(self.storage.len() - start).min(max);
        &self.storage[start..start + run]
    }

    /// Copies up to `out.len()` bytes starting `offset` bytes in, without consuming.
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        let mut copied = 0;
        while copied < out.len() {
            let run = self.contiguous_at(offset + copied, out.len() - copied);
            if run.is_empty() {
                break;
            }
            copy_bytes(&mut out[copied..copied + run.len()], run);
            copied += run.len();
        }
        copied
    }

    /// Drops the oldest `n` bytes.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.head = if self.len == 0 { 0 } else { (self.head + n) & self.mask() };
    }

    /// Drops everything and gives the storage back.
    pub fn release(&mut self) {
        *self = Self::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_grows_without_losing_order() {
        let mut ring = ByteRing::new();
        let mut model = alloc::collections::VecDeque::new();
        let mut next = 0u8;
        let mut peak = 0;
        for step in 0..2000usize {
            let n = (step * 7919) % 97;
            let chunk: Vec<u8> = (0..n)
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            ring.push(&chunk);
            model.extend(chunk.iter().copied());
            let take = (step * 104_729) % 101;
            let mut out = alloc::vec![0u8; take];
            let got = ring.peek(0, &mut out);
            ring.consume(got);
            for b in &out[..got] {
                assert_eq!(Some(*b), model.pop_front());
            }
            assert_eq!(ring.len(), model.len());
            peak = peak.max(ring.len() + n);
        }
        let bound = peak.next_power_of_two().max(64);
        assert!(ring.capacity() <= bound, "capacity {} grew past {bound}", ring.capacity());
    }

    #[test]
    fn fill_with_lends_the_free_space_in_order() {
        let mut ring = ByteRing::new();
        ring.push(&[0u8; 40]);
        ring.consume(30);
        // 10 queued at head 30 of 64: the free space runs 40..64, then 0..30.
        let n = ring
            .fill_with(50, |a, b| {
                assert_eq!((a.len(), b.len()), (24, 26));
                a.fill(1);
                b[..6].fill(2);
                Ok::<_, ()>(30)
            })
            .unwrap();
        assert_eq!(n, 30);
        assert_eq!(ring.len(), 40);
        let (a, b) = ring.as_slices();
        let all: Vec<u8> = a.iter().chain(b).copied().collect();
        assert_eq!(&all[10..34], &[1u8; 24][..]);
        assert_eq!(&all[34..40], &[2u8; 6][..]);
        assert_eq!(ring.fill_with(8, |_, _| Err::<usize, _>("failed")), Err("failed"));
        assert_eq!(ring.len(), 40, "a failed fill keeps nothing");
    }

    /// Bytes the ring may only copy out of, as a device's guest memory.
    struct CopyOnly(Vec<u8>);

    impl crate::SharedPayload for CopyOnly {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn copy_out(&self, offset: usize, dst: &mut [u8]) {
            dst.copy_from_slice(&self.0[offset..offset + dst.len()]);
        }
    }

    #[test]
    fn a_shared_payload_is_copied_in_whole_across_the_wrap() {
        let mut ring = ByteRing::new();
        ring.push(&[0u8; 40]);
        ring.consume(30);
        // 10 queued at head 30 of 64: 50 more fill 40..64, then 0..26.
        let source = CopyOnly((1..=50).collect());
        ring.push_payload(Payload::shared(&source));
        assert_eq!(ring.len(), 60);
        let (a, b) = ring.as_slices();
        assert!(!b.is_empty(), "the push wrapped");
        let all: Vec<u8> = a.iter().chain(b).copied().collect();
        assert_eq!(&all[10..], &source.0[..]);
    }

    #[test]
    fn contiguous_runs_stop_at_the_wrap() {
        let mut ring = ByteRing::new();
        ring.push(&[1; 60]);
        ring.consume(50);
        ring.push(&[2; 30]);
        assert_eq!(ring.capacity(), 64);
        assert_eq!(ring.contiguous_at(0, 100).len(), 14);
        assert_eq!(ring.contiguous_at(14, 100), &[2; 26][..]);
        let (a, b) = ring.as_slices();
        assert_eq!(a.len() + b.len(), 40);
    }
}
