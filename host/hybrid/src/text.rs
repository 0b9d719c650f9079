//! [`WireText`]: a few bytes of the protocol's text (a line, or the
//! suffix of a socket name), built on the stack.
//!
//! Every piece of text the wire has is short and bounded (the longest is
//! `CONNECT 4294967295\n`), so none needs an allocation: the bridge names
//! a datagram's receiver for every datagram it forwards.

use core::fmt;
use core::ops::Deref;

/// Bytes of the longest text: `CONNECT 4294967295\n`.
const CAPACITY: usize = "CONNECT 4294967295\n".len();

/// A short piece of protocol text (ASCII), such as the line
/// [`connect_line`](crate::connect_line) returns. It derefs to `str`, so
/// `.as_bytes()` gives what goes on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WireText {
    bytes: [u8; CAPACITY],
    len: usize,
}

impl WireText {
    /// Empty text.
    pub(crate) const fn new() -> Self {
        Self { bytes: [0; CAPACITY], len: 0 }
    }

    /// `self` followed by `text`. Callers build only the wire's bounded
    /// texts, so running out of room is a bug here.
    pub(crate) fn push(mut self, text: &str) -> Self {
        let end = self.len + text.len();
        self.bytes[self.len..end].copy_from_slice(text.as_bytes());
        self.len = end;
        self
    }

    /// `self` followed by `n` in decimal, without leading zeros (the only
    /// way the wire writes a port).
    pub(crate) fn push_decimal(self, mut n: u32) -> Self {
        let mut digits = [0u8; 10];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let digits = core::str::from_utf8(&digits[start..]).expect("decimal digits are ASCII");
        self.push(digits)
    }

    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len]).expect("wire text is ASCII")
    }
}

impl Deref for WireText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<[u8]> for WireText {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<str> for WireText {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for WireText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for WireText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_have_no_leading_zeros_and_reach_u32_max() {
        for (n, want) in
            [(0, "0"), (7, "7"), (10, "10"), (52_000, "52000"), (u32::MAX, "4294967295")]
        {
            assert_eq!(WireText::new().push_decimal(n).as_str(), want);
        }
    }

    #[test]
    fn the_longest_text_fits() {
        let text = WireText::new().push("CONNECT ").push_decimal(u32::MAX).push("\n");
        assert_eq!(text.len(), CAPACITY);
        assert_eq!(text.as_bytes(), b"CONNECT 4294967295\n");
    }
}
