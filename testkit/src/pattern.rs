//! Deterministic test data and its checksum: a test names its bytes by a
//! seed and a length, and compares what arrived by hash or byte for byte.
//!
//! - [`Pattern`] and [`data`]: xorshift64*, eight bytes a step. The Linux
//!   test guest's program generates the same stream from the same seed
//!   (it compiles the same source file), so host and guest agree on data
//!   neither sends the other.
//! - [`Fnv`]: FNV-1a 64, fed in pieces; also the stable hash behind
//!   [`crate::cache_dir`]'s folder names.
//! - [`Xorshift32`] and [`xorshift32_bytes`]: xorshift32, one byte a step,
//!   for the protocol core's tests (whose kernel cases stand in for the
//!   C `rand()` of Linux's `vsock_test`). Every non-zero seed gives its own
//!   bytes, where xorshift64* from `seed | 1` gives seeds 2 and 3 the same.

mod shared_with_guest;

pub use shared_with_guest::{Fnv, Pattern, data};

impl Fnv {
    /// The hash of `bytes`, in one piece.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.update(bytes);
        h.0
    }
}

/// xorshift32 (shifts 13, 17, 5).
#[derive(Clone, Debug)]
pub struct Xorshift32(u32);

impl Xorshift32 {
    /// The generator from `seed`; 0, which xorshift would never leave,
    /// starts as 1.
    pub fn new(seed: u32) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    /// A number below `n`, as C's `rand() % n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n
    }
}

/// `len` bytes from `seed`: the low byte of each [`Xorshift32`] step.
pub fn xorshift32_bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut rng = Xorshift32::new(seed);
    (0..len).map(|_| rng.next_u32() as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_in_pieces_is_hashing_at_once() {
        let bytes = data(3, 1000);
        let mut h = Fnv::default();
        for chunk in bytes.chunks(7) {
            h.update(chunk);
        }
        assert_eq!(h.0, Fnv::of(&bytes));
        assert_ne!(Fnv::of(&bytes), Fnv::of(&bytes[1..]));
    }

    /// The guest apps hash with FNV-1a of their own (`probe`), so this
    /// must be the published function, not merely a stable one.
    #[test]
    fn fnv_matches_the_published_test_vectors() {
        assert_eq!(Fnv::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv::of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn every_nonzero_xorshift32_seed_gives_its_own_bytes() {
        assert_ne!(xorshift32_bytes(2, 64), xorshift32_bytes(3, 64));
        assert_eq!(xorshift32_bytes(0, 64), xorshift32_bytes(1, 64));
    }
}
