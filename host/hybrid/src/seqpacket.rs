//! The flags byte in front of every seqpacket data message on the Unix
//! side, both directions, after `OK`.
//!
//! Linux's `SOCK_SEQPACKET` Unix sockets keep message boundaries but drop
//! `MSG_EOR`: `send` accepts the flag and `recv` never reports it. vsock
//! seqpacket carries EOR, so every data message starts with one flags
//! byte, bit 0 = end of record, the other bits zero. The byte also keeps
//! an empty vsock message (just the byte) distinct from end-of-file,
//! which on a `SOCK_SEQPACKET` socket both read as 0 bytes. The `CONNECT`
//! and `OK` messages carry no flags byte.

/// Bit 0 of the flags byte: the message ends a record (vsock `EOR`).
pub const SEQPACKET_EOR: u8 = 0x01;

/// Bytes of the flags in front of each message.
pub const SEQPACKET_FLAGS_LEN: usize = 1;

/// Why a Unix-side seqpacket message is not a framed vsock message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqpacketFrameError {
    /// No flags byte: an empty message (which reads as end-of-file).
    Empty,
    /// The flags byte sets bits other than [`SEQPACKET_EOR`]; they are
    /// refused rather than ignored, so they stay free for later use.
    UnknownFlags(u8),
}

/// The flags byte in front of a message.
pub const fn seqpacket_flags(end_of_record: bool) -> u8 {
    if end_of_record { SEQPACKET_EOR } else { 0 }
}

/// Whether a flags byte marks the end of a record, or the unknown bits it
/// sets (for a receiver that reads the byte apart from the message).
pub const fn decode_seqpacket_flags(flags: u8) -> Result<bool, SeqpacketFrameError> {
    if flags & !SEQPACKET_EOR != 0 {
        return Err(SeqpacketFrameError::UnknownFlags(flags));
    }
    Ok(flags & SEQPACKET_EOR != 0)
}

/// Splits a framed message into (end of record, payload).
pub fn decode_seqpacket_message(message: &[u8]) -> Result<(bool, &[u8]), SeqpacketFrameError> {
    let (&flags, payload) = message.split_first().ok_or(SeqpacketFrameError::Empty)?;
    Ok((decode_seqpacket_flags(flags)?, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_the_exact_byte_and_round_trip() {
        assert_eq!(seqpacket_flags(true), 0x01);
        assert_eq!(seqpacket_flags(false), 0x00);
        for eor in [false, true] {
            assert_eq!(decode_seqpacket_flags(seqpacket_flags(eor)), Ok(eor));
        }
    }

    #[test]
    fn messages_split_into_eor_and_payload() {
        assert_eq!(decode_seqpacket_message(b"\x01hello"), Ok((true, &b"hello"[..])));
        assert_eq!(decode_seqpacket_message(b"\x00hello"), Ok((false, &b"hello"[..])));
        assert_eq!(decode_seqpacket_message(b"\x00"), Ok((false, &b""[..])), "an empty message");
        assert_eq!(decode_seqpacket_message(b""), Err(SeqpacketFrameError::Empty));
    }

    #[test]
    fn every_unknown_bit_is_refused() {
        for bit in 1..8 {
            let flags = SEQPACKET_EOR | 1 << bit;
            assert_eq!(
                decode_seqpacket_flags(flags),
                Err(SeqpacketFrameError::UnknownFlags(flags))
            );
            assert_eq!(
                decode_seqpacket_message(&[1 << bit, b'x']),
                Err(SeqpacketFrameError::UnknownFlags(1 << bit))
            );
        }
    }
}
