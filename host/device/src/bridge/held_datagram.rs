//! The one host datagram the bridge holds while the guest has no room
//! for it (`datagram.rs` receives it and offers it again): a type of its
//! own, so that the bridge can own one without `mod.rs` and
//! `datagram.rs` importing each other.

use pier_hybrid::DATAGRAM_HEADER_LEN;
use pier_stack::wire::MAX_PAYLOAD;

/// The one host datagram the bridge takes off `<uds>_dgram` at a time:
/// received whole with a single `recv`, and kept here while the guest has
/// no receive buffer for it. Holding at most one keeps the back-pressure
/// of the kernel queue (every other datagram waits there, and a full
/// queue blocks its senders) without a peek and a second call to consume.
#[derive(Debug)]
pub(super) struct HeldDatagram {
    /// Room for the header and the largest vsock payload.
    pub(super) buf: Box<[u8]>,
    /// The datagram's length (as `recv` with `MSG_TRUNC` reported it, so
    /// possibly more than `buf`), while one is held.
    pub(super) len: Option<usize>,
}

impl Default for HeldDatagram {
    fn default() -> Self {
        Self { buf: vec![0; DATAGRAM_HEADER_LEN + MAX_PAYLOAD].into_boxed_slice(), len: None }
    }
}
