//! The one line of text a host program sends before its bytes flow,
//! `CONNECT <port>\n`, and the backend's answer, `OK <port>\n`.
//!
//! Firecracker defined this exchange and existing tooling speaks it, so
//! the grammar of the request is Firecracker's: the keyword in any case,
//! fields separated by whitespace, a decimal port. pier is stricter in one
//! place (the port is plain ASCII digits, no sign). On `<uds>` the line
//! may arrive in any number of writes (the bridge's stream relay gathers
//! it); on `<uds>_seqpacket` it is one message, its newline optional. A
//! client sends the same bytes on both.
//!
//! The backend closes the connection instead of answering when it
//! refuses; there is no error line.

use crate::WireText;

/// Longest CONNECT line accepted, newline included. `CONNECT 4294967295\n`
/// is 19 bytes; Firecracker allows 32. Anything longer is not a CONNECT
/// line, and the bridge reads no further than this before deciding.
pub const MAX_CONNECT_LINE: usize = 64;

/// Longest answer line a client reads, newline included: the same bound
/// the backend puts on the request (`OK 4294967295\n` is 14 bytes).
pub const MAX_OK_LINE: usize = MAX_CONNECT_LINE;

/// vsock's `VMADDR_PORT_ANY` (`-1U` in Linux's `<linux/vm_sockets.h>`):
/// "any port", never one a connection can go to.
const VMADDR_PORT_ANY: u32 = u32::MAX;

/// Why a CONNECT line was refused. The host program only ever sees its
/// socket closed; this is for counters and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    /// Not UTF-8, or not two whitespace-separated fields.
    Shape,
    /// The first field is not `CONNECT` (in any case).
    Keyword,
    /// The port is not a decimal number below 2^32 - 1 (`VMADDR_PORT_ANY`).
    Port,
}

/// The request for guest port `port`, newline included: what a client
/// writes on `<uds>` or sends as one message on `<uds>_seqpacket`.
pub fn connect_line(port: u32) -> WireText {
    WireText::new().push("CONNECT ").push_decimal(port).push("\n")
}

/// Parses the text of a CONNECT line, without its `\n`.
pub fn parse_connect(line: &[u8]) -> Result<u32, LineError> {
    let text = core::str::from_utf8(line).map_err(|_| LineError::Shape)?;
    let mut fields = text.split_ascii_whitespace();
    let (Some(keyword), Some(port), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(LineError::Shape);
    };
    if !keyword.eq_ignore_ascii_case("CONNECT") {
        return Err(LineError::Keyword);
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::Port);
    }
    match port.parse::<u32>() {
        Ok(p) if p != VMADDR_PORT_ANY => Ok(p),
        _ => Err(LineError::Port),
    }
}

/// The answer `OK <port>\n`. `port` is the host stack's local port, as in
/// Firecracker (vhost-device-vsock sends the guest's port instead, so
/// clients should only rely on the `OK`).
pub fn ok_line(port: u32) -> WireText {
    WireText::new().push("OK ").push_decimal(port).push("\n")
}

/// The port in an `OK <n>` answer (with or without its line end), or
/// `None` for anything else. pier answers with the host-side port it chose
/// for the connection; vhost-device-vsock with the guest port; both are
/// `OK` and one decimal number, which is all that is checked.
pub fn parse_ok(line: &[u8]) -> Option<u32> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = core::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("OK"), Some(port), None) if port.bytes().all(|b| b.is_ascii_digit()) => {
            port.parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_line_is_the_exact_request() {
        assert_eq!(connect_line(52).as_bytes(), b"CONNECT 52\n");
        assert_eq!(connect_line(0).as_bytes(), b"CONNECT 0\n");
        assert_eq!(connect_line(u32::MAX - 1).as_bytes(), b"CONNECT 4294967294\n");
        assert!(connect_line(u32::MAX).len() <= MAX_CONNECT_LINE);
    }

    #[test]
    fn connect_line_round_trips_every_connectable_port() {
        for port in [0, 1, 9, 10, 1234, 65_535, 65_536, 1 << 31, u32::MAX - 1] {
            let line = connect_line(port);
            let text = line.as_bytes().strip_suffix(b"\n").expect("ends with a newline");
            assert_eq!(parse_connect(text), Ok(port), "{line:?}");
        }
    }

    #[test]
    fn accepts_firecracker_grammar() {
        assert_eq!(parse_connect(b"CONNECT 52"), Ok(52));
        assert_eq!(parse_connect(b"connect 52"), Ok(52));
        assert_eq!(parse_connect(b"CoNnEcT\t 52 \r"), Ok(52));
        assert_eq!(parse_connect(b"  CONNECT 4294967294"), Ok(u32::MAX - 1));
        assert_eq!(parse_connect(b"CONNECT 0"), Ok(0));
        assert_eq!(parse_connect(b"CONNECT 0052"), Ok(52));
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(parse_connect(b""), Err(LineError::Shape));
        assert_eq!(parse_connect(b"CONNECT"), Err(LineError::Shape));
        assert_eq!(parse_connect(b"CONNECT 1 2"), Err(LineError::Shape));
        assert_eq!(parse_connect(b"CONNEC 1"), Err(LineError::Keyword));
        assert_eq!(parse_connect(b"LISTEN 1"), Err(LineError::Keyword));
        assert_eq!(parse_connect(b"CONNECT +1"), Err(LineError::Port));
        assert_eq!(parse_connect(b"CONNECT -1"), Err(LineError::Port));
        assert_eq!(parse_connect(b"CONNECT 0x10"), Err(LineError::Port));
        assert_eq!(parse_connect(b"CONNECT 4294967295"), Err(LineError::Port));
        assert_eq!(parse_connect(b"CONNECT 4294967296"), Err(LineError::Port));
        assert_eq!(parse_connect(b"CONNECT \xff"), Err(LineError::Shape));
    }

    #[test]
    fn ok_line_is_the_exact_answer() {
        assert_eq!(ok_line(1_073_741_824).as_bytes(), b"OK 1073741824\n");
        assert_eq!(ok_line(u32::MAX).as_bytes(), b"OK 4294967295\n");
        assert_eq!(ok_line(0).as_bytes(), b"OK 0\n");
        assert!(ok_line(u32::MAX).len() <= MAX_OK_LINE);
    }

    #[test]
    fn ok_line_round_trips() {
        for port in [0, 5, 1024, 1_073_741_824, u32::MAX] {
            assert_eq!(parse_ok(ok_line(port).as_bytes()), Some(port));
        }
    }

    #[test]
    fn parse_ok_accepts_any_line_end_and_nothing_but_ok() {
        assert_eq!(parse_ok(b"OK 1073741824\n"), Some(1_073_741_824));
        assert_eq!(parse_ok(b"OK 5\r\n"), Some(5));
        assert_eq!(parse_ok(b"OK 5"), Some(5));
        assert_eq!(parse_ok(b"OK 4294967295\n"), Some(u32::MAX));
        for bad in [&b"OK\n"[..], b"OK x\n", b"ok 5\n", b"OK 5 6\n", b"OK +5\n", b"OK 4294967296\n"]
        {
            assert_eq!(parse_ok(bad), None, "{bad:?}");
        }
    }
}
