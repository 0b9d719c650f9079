//! The one line of text a host program sends before its bytes flow:
//! `CONNECT <port>\n`, answered with `OK <port>\n`.
//!
//! Firecracker defined this exchange and existing tooling speaks it, so the
//! grammar here is Firecracker's: the keyword in any case, fields separated
//! by whitespace, a decimal port. pier is stricter in one place (the port is
//! plain ASCII digits, no sign) and more forgiving in how the line arrives
//! (see the stream relay in `conn.rs`): it may come in any number of
//! writes.

/// Longest CONNECT line accepted, newline included. `CONNECT 4294967295\n`
/// is 19 bytes; Firecracker allows 32. Anything longer is not a CONNECT
/// line, and the bridge reads no further than this before deciding.
pub const MAX_CONNECT_LINE: usize = 64;

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
        Ok(p) if p != pier_stack::VMADDR_PORT_ANY => Ok(p),
        _ => Err(LineError::Port),
    }
}

/// `OK <port>\n` into `buf`; returns its length. `port` is the host
/// stack's local port, as in Firecracker (vhost-device-vsock sends the
/// guest's port instead, so clients should only check the `OK ` prefix).
pub fn format_ok(port: u32, buf: &mut [u8; 16]) -> usize {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    // 3 + 10 + 1 bytes at most: it always fits.
    let _ = writeln!(cursor, "OK {port}");
    cursor.position() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_firecracker_grammar() {
        assert_eq!(parse_connect(b"CONNECT 52"), Ok(52));
        assert_eq!(parse_connect(b"connect 52"), Ok(52));
        assert_eq!(parse_connect(b"CoNnEcT\t 52 \r"), Ok(52));
        assert_eq!(parse_connect(b"  CONNECT 4294967294"), Ok(u32::MAX - 1));
        assert_eq!(parse_connect(b"CONNECT 0"), Ok(0));
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
    fn ok_line() {
        let mut buf = [0u8; 16];
        let n = format_ok(1_073_741_824, &mut buf);
        assert_eq!(&buf[..n], b"OK 1073741824\n");
        let n = format_ok(u32::MAX, &mut buf);
        assert_eq!(&buf[..n], b"OK 4294967295\n");
    }
}
