//! Fuzz target: the bridge's `CONNECT <port>` line parser
//! (`pier_device::bridge::parse_connect`), which reads the first bytes any
//! host program sends.
//!
//! Invariants, besides never panicking:
//! - an accepted port is never `VMADDR_PORT_ANY` (u32::MAX);
//! - an accepted line is UTF-8 with exactly two whitespace-separated
//!   fields, the first `CONNECT` in some case and the second plain digits;
//! - the canonical line for the accepted port parses to the same port, so
//!   what the parser accepts is what a client writing the port means.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pier_device::bridge::parse_connect;

fuzz_target!(|data: &[u8]| {
    let Ok(port) = parse_connect(data) else { return };
    assert_ne!(port, pier_stack::VMADDR_PORT_ANY);
    let text = std::str::from_utf8(data).expect("an accepted line is UTF-8");
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    assert_eq!(fields.len(), 2);
    assert!(fields[0].eq_ignore_ascii_case("connect"));
    assert!(fields[1].bytes().all(|b| b.is_ascii_digit()));
    assert_eq!(parse_connect(format!("CONNECT {port}").as_bytes()), Ok(port));
    assert_eq!(fields[1].trim_start_matches('0').parse::<u32>().unwrap_or(0), port);
});
