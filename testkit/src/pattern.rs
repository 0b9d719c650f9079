//! Deterministic test data and its checksum: a test names its bytes by a
//! seed and a length, and compares what arrived by hash or byte for byte.
//!
//! - [`Pattern`] and [`data`]: xorshift64*, eight bytes a step. The Linux
//!   test guest's program generates the same stream from the same seed
//!   (it compiles the same source file), so host and guest agree on data
//!   neither sends the other.
//! - [`Fnv`]: FNV-1a 64, fed in pieces; also the stable hash behind
//!   [`crate::cache_dir`]'s folder names.
//! - [`WordChecksum`]: a Fletcher checksum over 64-bit words, for checking
//!   a transfer whose speed is measured: the `probe` guest app compiles
//!   the same file, and FNV's multiply per byte would bound the figure.
//! - [`Xorshift32`] and [`xorshift32_bytes`]: xorshift32, one byte a step,
//!   for the protocol core's tests (whose kernel cases stand in for the
//!   C `rand()` of Linux's `vsock_test`). Every non-zero seed gives its own
//!   bytes, where xorshift64* from `seed | 1` gives seeds 2 and 3 the same.

mod shared_with_guest;
mod word_checksum;

pub use shared_with_guest::{Fnv, Pattern, data};
pub use word_checksum::WordChecksum;

impl Fnv {
    /// The hash of `bytes`, in one piece.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.update(bytes);
        h.0
    }
}

impl WordChecksum {
    /// The checksum of `bytes`, in one piece.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut c = Self::new();
        c.update(bytes);
        c.value()
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

    /// The Linux test guest hashes with FNV-1a (the same source file) and
    /// the cache folders are named by it, so this must be the published
    /// function, not merely a stable one.
    #[test]
    fn fnv_matches_the_published_test_vectors() {
        assert_eq!(Fnv::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv::of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn checksumming_in_pieces_is_checksumming_at_once() {
        let bytes = data(5, 1003);
        for piece in [1, 3, 7, 8, 9, 64, 1003] {
            let mut c = WordChecksum::new();
            for chunk in bytes.chunks(piece) {
                c.update(chunk);
            }
            assert_eq!(c.value(), WordChecksum::of(&bytes), "pieces of {piece}");
        }
    }

    /// What the check is for: a transfer that lost, repeated, reordered or
    /// changed bytes, or added zeros, must not pass.
    #[test]
    fn the_word_checksum_changes_when_bytes_are_lost_reordered_or_changed() {
        let bytes = data(9, 4096);
        let good = WordChecksum::of(&bytes);
        let mut swapped_words = bytes.clone();
        swapped_words[..16].rotate_left(8);
        let mut swapped_bytes = bytes.clone();
        swapped_bytes.swap(100, 101);
        let mut flipped = bytes.clone();
        flipped[4000] ^= 0x80;
        let mut repeated = bytes.clone();
        repeated[8..16].copy_from_slice(&bytes[..8]);
        let lost_word = [&bytes[..800], &bytes[808..]].concat();
        let padded = [&bytes[..], &[0u8; 3]].concat();
        for (what, changed) in [
            ("two words swapped", &swapped_words[..]),
            ("two bytes swapped", &swapped_bytes),
            ("a bit flipped", &flipped),
            ("a word repeated", &repeated),
            ("a word lost", &lost_word),
            ("the last byte lost", &bytes[..4095]),
            ("zeros appended", &padded),
        ] {
            assert_ne!(WordChecksum::of(changed), good, "{what}");
        }
        assert_ne!(WordChecksum::of(&[0; 8]), WordChecksum::of(&[]), "zeros count");
    }

    #[test]
    fn every_nonzero_xorshift32_seed_gives_its_own_bytes() {
        assert_ne!(xorshift32_bytes(2, 64), xorshift32_bytes(3, 64));
        assert_eq!(xorshift32_bytes(0, 64), xorshift32_bytes(1, 64));
    }
}
