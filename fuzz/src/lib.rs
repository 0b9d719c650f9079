//! Helpers shared by pier's fuzz targets (`fuzz_targets/`).
//!
//! Targets that need more than one flat byte string (a sequence of
//! operations, each with its arguments) read them from the fuzzer's input
//! through [`Input`]. Running out of input is not an error: every read then
//! yields zero, so any byte string is a valid program and the fuzzer never
//! wastes executions on inputs a parser would reject up front.

/// A cursor over the fuzzer's input that never fails.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` next bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        taken
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.data)
    }

    /// One of `choices`, picked by the next byte.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[usize::from(self.u8()) % choices.len()]
    }
}
