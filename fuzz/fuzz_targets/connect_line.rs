//! Fuzz target: the `CONNECT <port>` line parser the bridge reads the
//! first bytes any host program sends with (`pier_hybrid::parse_connect`).
//!
//! Invariants, besides never panicking:
//! - an accepted port is never `VMADDR_PORT_ANY` (u32::MAX);
//! - an accepted line is UTF-8 with exactly two whitespace-separated
//!   fields, the first `CONNECT` in some case and the second plain digits;
//! - the line a client writes for the accepted port
//!   (`pier_hybrid::connect_line`) parses to the same port, so what the
//!   parser accepts is what a client writing the port means.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pier_hybrid::{connect_line, parse_connect};

fuzz_target!(|data: &[u8]| {
    let Ok(port) = parse_connect(data) else { return };
    assert_ne!(port, pier_stack::VMADDR_PORT_ANY);
    let text = std::str::from_utf8(data).expect("an accepted line is UTF-8");
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    assert_eq!(fields.len(), 2);
    assert!(fields[0].eq_ignore_ascii_case("connect"));
    assert!(fields[1].bytes().all(|b| b.is_ascii_digit()));
    let canonical = connect_line(port);
    let canonical = canonical.as_bytes().strip_suffix(b"\n").expect("a line ends with its newline");
    assert_eq!(parse_connect(canonical), Ok(port));
    assert_eq!(fields[1].trim_start_matches('0').parse::<u32>().unwrap_or(0), port);
});
