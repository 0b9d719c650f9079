//! A middleware that damages frames on purpose.
//!
//! It is seeded, so a failing run can be replayed exactly. Every fault it
//! injects is counted, so a test can check that the stacks' own counters
//! account for what happened.

use alloc::vec::Vec;

use super::{Middleware, Side, Verdict};
use crate::time::Instant;

/// Chances, in parts per thousand, of each fault per frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultConfig {
    /// Lose the frame.
    pub drop_per_mille: u32,
    /// Deliver the frame twice.
    pub duplicate_per_mille: u32,
    /// Flip one random bit anywhere in the frame.
    pub corrupt_per_mille: u32,
    /// Cut the frame at a random length.
    pub truncate_per_mille: u32,
}

/// How many faults were injected, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Frames lost.
    pub dropped: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames with one bit flipped.
    pub corrupted: u64,
    /// Frames cut short.
    pub truncated: u64,
}

/// Drops, corrupts, truncates and duplicates frames at the rates of a
/// [`FaultConfig`], from a seed.
#[derive(Debug)]
pub struct FaultInjector {
    config: FaultConfig,
    state: u64,
    counts: FaultCounts,
}

impl FaultInjector {
    /// An injector that damages frames at `config`'s rates; the same `seed`
    /// damages the same frames.
    pub fn new(seed: u64, config: FaultConfig) -> Self {
        Self { config, state: seed.max(1), counts: FaultCounts::default() }
    }

    /// The faults injected so far, to check against the stacks' counters.
    pub fn counts(&self) -> FaultCounts {
        self.counts
    }

    /// xorshift64*: small, fast, and plenty for choosing faults.
    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn roll(&mut self, per_mille: u32) -> bool {
        per_mille > 0 && (self.next() % 1000) < per_mille as u64
    }
}

impl Middleware for FaultInjector {
    fn on_frame(&mut self, _from: Side, _now: Instant, frame: &mut Vec<u8>) -> Verdict {
        if self.roll(self.config.drop_per_mille) {
            self.counts.dropped += 1;
            return Verdict::Drop;
        }
        if !frame.is_empty() && self.roll(self.config.corrupt_per_mille) {
            let bit = (self.next() % (frame.len() as u64 * 8)) as usize;
            frame[bit / 8] ^= 1 << (bit % 8);
            self.counts.corrupted += 1;
        }
        if !frame.is_empty() && self.roll(self.config.truncate_per_mille) {
            let len = (self.next() % frame.len() as u64) as usize;
            frame.truncate(len);
            self.counts.truncated += 1;
        }
        if self.roll(self.config.duplicate_per_mille) {
            self.counts.duplicated += 1;
            return Verdict::Duplicate;
        }
        Verdict::Pass
    }
}
