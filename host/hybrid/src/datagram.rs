//! The ports header in front of every datagram on the Unix side.
//!
//! One Unix `SOCK_DGRAM` datagram is one vsock datagram with an 8-byte
//! header in front that names the two ports, little-endian:
//!
//! ```text
//!  0        4        8
//!  ┌────────┬────────┬──────────────┐
//!  │guest   │host    │ payload      │
//!  │port    │port    │ (≤ 64 KiB)   │
//!  └────────┴────────┴──────────────┘
//! ```
//!
//! The same header goes both ways: to `<uds>_dgram` it says which guest
//! port the payload is for and which host port it is from; from it, which
//! guest port sent it to which host port.

/// Bytes of the ports header in front of every datagram on the Unix side.
pub const DATAGRAM_HEADER_LEN: usize = 8;

/// The header: guest port, then host port, little-endian.
pub fn encode_datagram_header(guest_port: u32, host_port: u32) -> [u8; DATAGRAM_HEADER_LEN] {
    let mut header = [0u8; DATAGRAM_HEADER_LEN];
    header[..4].copy_from_slice(&guest_port.to_le_bytes());
    header[4..].copy_from_slice(&host_port.to_le_bytes());
    header
}

/// (guest port, host port) from a header read apart from its payload.
pub fn decode_datagram_ports(header: &[u8; DATAGRAM_HEADER_LEN]) -> (u32, u32) {
    let guest_port = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let host_port = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    (guest_port, host_port)
}

/// Splits a Unix-side datagram into (guest port, host port, payload), or
/// `None` if it is shorter than the header.
pub fn decode_datagram_header(datagram: &[u8]) -> Option<(u32, u32, &[u8])> {
    let (header, payload) = datagram.split_first_chunk::<DATAGRAM_HEADER_LEN>()?;
    let (guest_port, host_port) = decode_datagram_ports(header);
    Some((guest_port, host_port, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_the_exact_bytes() {
        assert_eq!(encode_datagram_header(7000, 1234), [0x58, 0x1b, 0, 0, 0xd2, 0x04, 0, 0]);
        assert_eq!(encode_datagram_header(u32::MAX, 0), [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    }

    #[test]
    fn header_round_trips() {
        for (guest, host) in [(0, 0), (7000, 1234), (u32::MAX, 1), (1, u32::MAX)] {
            assert_eq!(decode_datagram_ports(&encode_datagram_header(guest, host)), (guest, host));
        }
        let mut datagram = [0u8; DATAGRAM_HEADER_LEN + 2];
        datagram[..DATAGRAM_HEADER_LEN].copy_from_slice(&encode_datagram_header(7000, 1234));
        datagram[DATAGRAM_HEADER_LEN..].copy_from_slice(b"hi");
        assert_eq!(decode_datagram_header(&datagram), Some((7000, 1234, &b"hi"[..])));
    }

    #[test]
    fn a_datagram_needs_the_whole_header() {
        let header = encode_datagram_header(7000, 1234);
        assert_eq!(decode_datagram_header(&header), Some((7000, 1234, &b""[..])));
        assert_eq!(decode_datagram_header(&header[..7]), None);
        assert_eq!(decode_datagram_header(&[]), None);
    }
}
