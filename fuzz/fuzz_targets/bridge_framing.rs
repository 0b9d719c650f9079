//! Fuzz target: the framings the bridge reads from host programs on its
//! Unix sockets (`pier_hybrid`): the 8-byte ports header in front of every
//! datagram and the flags byte in front of every seqpacket message.
//!
//! The same bytes go to both decoders. Invariants, besides never panicking:
//! - a datagram decodes exactly when it holds the 8-byte header; the ports
//!   re-encode to the same 8 bytes and the payload is the rest, unchanged;
//! - a seqpacket message decodes exactly when its flags byte is 0 or EOR;
//!   the payload is the rest, unchanged, and the flags byte the sender
//!   would write for that EOR bit is the one that was read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pier_hybrid::{
    DATAGRAM_HEADER_LEN, SEQPACKET_EOR, SeqpacketFrameError, decode_datagram_header,
    decode_seqpacket_message, encode_datagram_header, seqpacket_flags,
};

fuzz_target!(|data: &[u8]| {
    match decode_datagram_header(data) {
        Some((guest_port, host_port, payload)) => {
            assert_eq!(
                encode_datagram_header(guest_port, host_port)[..],
                data[..DATAGRAM_HEADER_LEN]
            );
            assert_eq!(payload, &data[DATAGRAM_HEADER_LEN..]);
        }
        None => assert!(data.len() < DATAGRAM_HEADER_LEN),
    }

    match decode_seqpacket_message(data) {
        Ok((eor, payload)) => {
            assert_eq!(seqpacket_flags(eor), data[0]);
            assert_eq!(payload, &data[1..]);
        }
        Err(SeqpacketFrameError::Empty) => assert!(data.is_empty()),
        Err(SeqpacketFrameError::UnknownFlags(flags)) => {
            assert_eq!(flags, data[0]);
            assert_ne!(flags & !SEQPACKET_EOR, 0);
        }
    }
});
