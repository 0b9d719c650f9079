//! JSON strings for the few small documents pier writes by hand (the
//! benchmark records, the OCI image's metadata): key order and spacing
//! then stay fixed, with no serialisation library to build.

use std::fmt::Write as _;

/// `s` as a JSON string.
pub(crate) fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
