//! A checksum of a stream cheap enough that the code checking a transfer
//! never bounds how fast the transfer goes: Fletcher's two running sums,
//! over 64-bit little-endian words with wrapping arithmetic, fed in
//! pieces of any length. pier-testkit's `pattern` module on the host and
//! the `probe` guest app (its own workspace, which includes this file by
//! path) compile the same source, so a benchmark checks what the guest
//! read without the guest sending it back.
//!
//! Why not FNV-1a (`Fnv`, beside this in pier-testkit): it takes a multiply per byte, a
//! dependent chain of about 4 cycles a byte, which caps a guest at a few
//! Gbit/s, under what the path it checks can carry. Here a word costs two
//! additions. The first sum changes when any word does; the second weighs
//! each word by how many came after it, so it changes when words are
//! lost, repeated or swapped; and the length, mixed in last, tells a
//! stream from the same stream with zeros appended. Not a hash against an
//! adversary: a check of test data.
//!
//! Only `core`, so that it compiles the same in a `no_std` guest.

/// The running checksum; [`WordChecksum::value`] gives it so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WordChecksum {
    sum: u64,
    weighted: u64,
    len: u64,
    /// Bytes of a word not yet complete, in its low bytes first.
    partial: [u8; 8],
    partial_len: usize,
}

impl WordChecksum {
    pub const fn new() -> Self {
        Self { sum: 0, weighted: 0, len: 0, partial: [0; 8], partial_len: 0 }
    }

    /// Adds the next bytes of the stream; pieces of any size give the same
    /// value as the whole.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len = self.len.wrapping_add(bytes.len() as u64);
        if self.partial_len > 0 {
            let take = bytes.len().min(8 - self.partial_len);
            self.partial[self.partial_len..self.partial_len + take].copy_from_slice(&bytes[..take]);
            self.partial_len += take;
            bytes = &bytes[take..];
            if self.partial_len < 8 {
                return;
            }
            self.add_word(u64::from_le_bytes(self.partial));
            self.partial_len = 0;
        }
        let (words, rest) = bytes.as_chunks::<8>();
        for word in words {
            self.add_word(u64::from_le_bytes(*word));
        }
        self.partial[..rest.len()].copy_from_slice(rest);
        self.partial_len = rest.len();
    }

    fn add_word(&mut self, word: u64) {
        self.sum = self.sum.wrapping_add(word);
        self.weighted = self.weighted.wrapping_add(self.sum);
    }

    /// The checksum of everything fed so far: a last partial word counts
    /// as if padded with zeros, and the length is mixed in.
    pub fn value(&self) -> u64 {
        let mut end = *self;
        if end.partial_len > 0 {
            end.partial[end.partial_len..].fill(0);
            end.add_word(u64::from_le_bytes(end.partial));
        }
        // Multiplying by an odd constant spreads each sum over all 64 bits
        // before they are combined, so neither cancels the other's change.
        let mix = |v: u64| v.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        mix(end.weighted) ^ mix(end.sum).rotate_left(17) ^ end.len
    }
}
