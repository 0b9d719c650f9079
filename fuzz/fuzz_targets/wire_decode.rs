//! Fuzz target: the virtio-vsock header decoder (`pier_stack::wire`).
//!
//! Every byte string is a packet a hostile device could hand the driver.
//! Invariants, besides never panicking:
//! - `RawHeader::parse` fails exactly when fewer than 44 bytes are there,
//!   and its `encode` gives back those 44 bytes (the raw layer is lossless);
//! - `decode` succeeds only when `RawHeader::parse` and `check` do, the
//!   payload is exactly the `len` bytes after the header, never over
//!   `MAX_PAYLOAD`, and the checked header encodes back to the same bytes;
//! - every error formats (`Display`) without panicking.
#![no_main]

use std::fmt::Write;

use libfuzzer_sys::fuzz_target;
use pier_stack::wire::{DecodeError, HEADER_LEN, MAX_PAYLOAD, RawHeader, decode};

fuzz_target!(|data: &[u8]| {
    let mut text = String::new();
    match RawHeader::parse(data) {
        Ok(raw) => {
            assert!(data.len() >= HEADER_LEN);
            assert_eq!(raw.encode()[..], data[..HEADER_LEN]);
            assert_eq!(RawHeader::parse(&raw.encode()), Ok(raw));
            // The RST answering any header is itself a well-formed packet.
            let rst = RawHeader::rst_reply(&raw);
            assert_eq!(rst.len, 0);
            if let Ok(checked) = raw.check() {
                assert_eq!(checked.to_raw(), raw);
                let _ = write!(text, "{checked}");
            }
        }
        Err(e) => {
            assert_eq!(e, DecodeError::Truncated { available: data.len() });
            assert!(data.len() < HEADER_LEN);
        }
    }
    match decode(data) {
        Ok((header, payload)) => {
            assert_eq!(payload.len(), header.payload_len());
            assert!(payload.len() <= MAX_PAYLOAD);
            assert_eq!(header.encode()[..], data[..HEADER_LEN]);
            assert_eq!(payload, &data[HEADER_LEN..HEADER_LEN + payload.len()]);
            assert_eq!(RawHeader::parse(data).and_then(RawHeader::check), Ok(header));
        }
        Err(e) => {
            let _ = write!(text, "{e}");
            if let DecodeError::UnknownType { header } | DecodeError::UnknownOp { header } = e {
                assert_eq!(header.encode()[..], data[..HEADER_LEN]);
            }
        }
    }
});
