//! A received packet's payload, as the stack takes it in.
//!
//! Most transports hand the stack bytes it may borrow: a frame in a
//! buffer nobody else writes meanwhile. A device model serving a virtual
//! machine cannot: the payload lies in guest memory, which a vCPU may
//! write at any moment, and a `&[u8]` over it would promise a stability
//! the guest need not keep. Copying it into a buffer of the device's own
//! first makes it safe to borrow, at the price of a copy of every byte.
//!
//! [`Payload`] lets such a device pass the bytes where they lie, as a
//! [`SharedPayload`]: the stack never borrows them, it only asks for
//! copies (into a socket's receive buffer), and a [`DirectReceive`] tap
//! that relays the bytes elsewhere may hand them to the kernel by address
//! (a `send` straight from guest memory), so each byte is copied once.
//!
//! [`DirectReceive`]: crate::DirectReceive

use core::any::Any;
use core::fmt;

/// Payload bytes that another party may write while the stack reads
/// them, such as a virtual machine's memory: never borrowed, only copied
/// out, and each copy may see the bytes as they are at that moment.
///
/// The stack learns nothing from payload bytes (it copies them, counts
/// them and passes them on), so a source that changes under it only
/// changes what the reader gets, never the stack's own state.
///
/// `Any` lets the transport that made the source recognise it again in
/// its own [`DirectReceive`](crate::DirectReceive) tap and send the bytes
/// from where they lie.
pub trait SharedPayload: Any {
    /// How many bytes the source holds.
    fn len(&self) -> usize;

    /// Whether it holds none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `dst.len()` bytes starting `offset` bytes in into `dst`;
    /// the stack asks only within `len()`.
    fn copy_out(&self, offset: usize, dst: &mut [u8]);
}

/// A packet's payload: bytes the stack may borrow, or a stretch of a
/// [`SharedPayload`] it may only copy out of.
#[derive(Clone, Copy)]
pub struct Payload<'a>(Source<'a>);

#[derive(Clone, Copy)]
enum Source<'a> {
    Bytes(&'a [u8]),
    Shared { source: &'a dyn SharedPayload, start: usize, len: usize },
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Source::Bytes(b) => f.debug_tuple("Bytes").field(&b.len()).finish(),
            Source::Shared { start, len, .. } => {
                f.debug_struct("Shared").field("start", &start).field("len", &len).finish()
            }
        }
    }
}

impl<'a> Payload<'a> {
    /// Bytes the stack may borrow.
    pub const fn bytes(bytes: &'a [u8]) -> Self {
        Self(Source::Bytes(bytes))
    }

    /// All of `source`, which the stack only copies out of.
    pub fn shared(source: &'a dyn SharedPayload) -> Self {
        Self(Source::Shared { source, start: 0, len: source.len() })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self.0 {
            Source::Bytes(b) => b.len(),
            Source::Shared { len, .. } => len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, when they may be borrowed.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match self.0 {
            Source::Bytes(b) => Some(b),
            Source::Shared { .. } => None,
        }
    }

    /// The shared source and the stretch of it this payload is, when the
    /// bytes may not be borrowed.
    pub fn as_shared(&self) -> Option<(&'a dyn SharedPayload, core::ops::Range<usize>)> {
        match self.0 {
            Source::Bytes(_) => None,
            Source::Shared { source, start, len } => Some((source, start..start + len)),
        }
    }

    /// The payload without its first `n` bytes (all of them when `n` is
    /// longer).
    pub fn skip(self, n: usize) -> Self {
        match self.0 {
            Source::Bytes(b) => Self(Source::Bytes(&b[n.min(b.len())..])),
            Source::Shared { source, start, len } => {
                let n = n.min(len);
                Self(Source::Shared { source, start: start + n, len: len - n })
            }
        }
    }

    /// A copy of the bytes, as they are now.
    pub fn to_vec(&self) -> alloc::vec::Vec<u8> {
        let mut bytes = alloc::vec![0; self.len()];
        self.copy_to(&mut bytes);
        bytes
    }

    /// Copies the payload's first `dst.len()` bytes into `dst`; `dst` is
    /// at most [`Self::len`] long.
    pub fn copy_to(&self, dst: &mut [u8]) {
        match self.0 {
            Source::Bytes(b) => crate::copy::copy_bytes(dst, &b[..dst.len()]),
            Source::Shared { source, start, len } => {
                debug_assert!(dst.len() <= len);
                source.copy_out(start, dst);
            }
        }
    }
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Self::bytes(bytes)
    }
}
