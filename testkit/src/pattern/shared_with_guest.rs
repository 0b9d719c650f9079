//! The test data and its checksum, in one file that both ends of a test
//! compile: pier-testkit's `pattern` module on the host, and the program
//! inside the Linux test guest (`guest-linux/vsock-test`, its own
//! workspace, which includes this file by path). A host test can then
//! name data by `(seed, length)` and check an answer by its hash, without
//! either side sending the other the expected bytes.
//!
//! Nothing from the crate around it (`core`, and `Vec` from the prelude),
//! so that it compiles the same as a module of either.

/// xorshift64* from `seed | 1`: each step gives eight bytes, little-endian.
#[derive(Debug)]
pub struct Pattern {
    x: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Self { x: seed | 1, word: [0; 8], used: 8 }
    }

    /// Fills `buf` with the next bytes of the sequence.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for byte in buf {
            if self.used == 8 {
                self.x ^= self.x >> 12;
                self.x ^= self.x << 25;
                self.x ^= self.x >> 27;
                self.word = self.x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
                self.used = 0;
            }
            *byte = self.word[self.used];
            self.used += 1;
        }
    }
}

/// The first `len` bytes of the [`Pattern`] from `seed`.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    Pattern::new(seed).fill(&mut out);
    out
}

/// FNV-1a, 64-bit, fed in pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_make_the_same_sequence() {
        let whole = data(7, 1000);
        let mut pieces = vec![0; 1000];
        let mut p = Pattern::new(7);
        for chunk in pieces.chunks_mut(13) {
            p.fill(chunk);
        }
        assert_eq!(whole, pieces);
    }
}
