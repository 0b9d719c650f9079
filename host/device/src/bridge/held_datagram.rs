//! The one host datagram the bridge holds while the guest has no room
//! for it (`datagram.rs` receives it and offers it again): a type of its
//! own, so that the bridge can own one without `mod.rs` and
//! `datagram.rs` importing each other.

use pier_hybrid::DATAGRAM_HEADER_LEN;
use pier_stack::wire::MAX_PAYLOAD;
use virtio_drivers::PAGE_SIZE;

/// The one host datagram the bridge takes off `<uds>_dgram` at a time:
/// received whole with a single `recv`, and kept here while the guest has
/// no receive buffer for it. Holding at most one keeps the back-pressure
/// of the kernel queue (every other datagram waits there, and a full
/// queue blocks its senders) without a peek and a second call to consume.
#[derive(Debug)]
pub(super) struct HeldDatagram {
    /// Room for the header and the largest vsock payload, and a page more
    /// so that [`Self::buf`] can start where its payload is page-aligned.
    storage: Box<[u8]>,
    /// Where [`Self::buf`] starts in `storage`.
    start: usize,
    /// The datagram's length (as `recv` with `MSG_TRUNC` reported it, so
    /// possibly more than the buffer), while one is held.
    pub(super) len: Option<usize>,
}

impl HeldDatagram {
    /// The buffer a datagram is received into: its payload, after the
    /// ports header, starts on a page boundary, as it does in pier-driver's
    /// receive buffers. The device's copy of the payload into the guest's
    /// buffer then has source and destination at the same offset in their
    /// pages, where a copy is fastest; at offsets that differ by a few
    /// bytes a copy on AMD Zen CPUs runs many times slower.
    pub(super) fn buf(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + DATAGRAM_HEADER_LEN + MAX_PAYLOAD]
    }
}

impl Default for HeldDatagram {
    fn default() -> Self {
        let storage = vec![0; PAGE_SIZE + DATAGRAM_HEADER_LEN + MAX_PAYLOAD].into_boxed_slice();
        let payload = storage.as_ptr() as usize + DATAGRAM_HEADER_LEN;
        let start = (PAGE_SIZE - payload % PAGE_SIZE) % PAGE_SIZE;
        Self { storage, start, len: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_payload_starts_on_a_page_boundary_and_holds_the_largest_datagram() {
        for _ in 0..8 {
            let mut held = HeldDatagram::default();
            let buf = held.buf();
            assert_eq!(buf.len(), DATAGRAM_HEADER_LEN + MAX_PAYLOAD);
            let payload = buf[DATAGRAM_HEADER_LEN..].as_ptr() as usize;
            assert_eq!(
                payload % PAGE_SIZE,
                0,
                "payload {} bytes into its page",
                payload % PAGE_SIZE
            );
        }
    }
}
