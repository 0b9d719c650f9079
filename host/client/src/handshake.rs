//! The `CONNECT <port>` / `OK <n>` exchange that opens every host → guest
//! connection, and the errors that describe how it failed. Shared by the
//! blocking and the tokio types (and by streams and seqpacket, which send
//! the same text, as bytes or as one message), so they all accept the same
//! answers and fail with the same words.

use std::io;
use std::path::Path;
use std::time::Duration;

/// Longest answer line accepted, newline included: the same bound the
/// backend puts on the request line; `OK 4294967295\n` is 14 bytes.
pub(crate) const MAX_ANSWER: usize = 64;

/// The request, newline included (seqpacket backends accept the newline
/// too, so both types send the same bytes).
pub(crate) fn request(port: u32) -> String {
    format!("CONNECT {port}\n")
}

/// The port in an `OK <n>` answer (with or without its line end), or
/// `None` for anything else. pier answers with the host-side port it chose
/// for the connection; vhost-device-vsock with the guest port; both are
/// `OK` and one decimal number, which is all that is checked.
pub(crate) fn parse_answer(line: &[u8]) -> Option<u32> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("OK"), Some(port), None) if port.bytes().all(|b| b.is_ascii_digit()) => {
            port.parse().ok()
        }
        _ => None,
    }
}

/// What a finished exchange read: the answer, or nothing at all.
pub(crate) fn answer(path: &Path, port: u32, line: &[u8]) -> io::Result<u32> {
    if line.is_empty() {
        return Err(refused(path, port));
    }
    parse_answer(line).ok_or_else(|| garbage(path, port, line))
}

/// The backend closed (or reset) the connection before `OK`: the
/// protocol's only way to refuse, whatever the reason.
pub(crate) fn refused(path: &Path, port: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        format!(
            "{}: guest port {port} refused: the connection was closed before OK (nothing \
             listens on that port, the guest did not answer in time, or the backend refused \
             it)",
            path.display()
        ),
    )
}

/// An answer that is not `OK <n>`: not a hybrid vsock backend, or a broken
/// one. The line is in the message because it is the only clue.
pub(crate) fn garbage(path: &Path, port: u32, line: &[u8]) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} answered CONNECT {port} with {:?}, not \"OK <port>\"",
            path.display(),
            String::from_utf8_lossy(line)
        ),
    )
}

/// No complete answer within the caller's timeout.
pub(crate) fn timed_out(path: &Path, port: u32, timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{} did not answer CONNECT {port} within {timeout:?}", path.display()),
    )
}

/// `error` from connecting to (or binding) `path`, with the path in the
/// message: a bare "No such file or directory" does not say which of the
/// several socket files was missing.
pub(crate) fn at(path: &Path, error: io::Error) -> io::Error {
    let kind = error.kind();
    let hint = match kind {
        io::ErrorKind::NotFound => " (is the VM running, and is this its socket?)",
        io::ErrorKind::ConnectionRefused => " (the socket file is stale: nobody listens on it)",
        _ => "",
    };
    io::Error::new(kind, format!("{}: {error}{hint}", path.display()))
}

/// The outcome of sending the request: a connection closed before we
/// even finished asking is a refusal (pier closes at once when it is at
/// its connection limit), and a send timeout is the caller's timeout.
pub(crate) fn sent<T>(
    result: io::Result<T>,
    path: &Path,
    port: u32,
    timeout: Option<Duration>,
) -> io::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) =>
        {
            Err(refused(path, port))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            Err(timed_out(path, port, timeout.unwrap_or_default()))
        }
        Err(e) => Err(e),
    }
}

/// Turns the read side's "nothing came in time" into [`timed_out`], and
/// a reset into an empty answer (a refusal), so that every type reports
/// the same kinds.
pub(crate) fn classify_read_error(
    path: &Path,
    port: u32,
    timeout: Option<Duration>,
    error: io::Error,
) -> io::Result<()> {
    match error.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Ok(()),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Err(timed_out(path, port, timeout.unwrap_or_default()))
        }
        _ => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(parse_answer(b"OK 1073741824\n"), Some(1_073_741_824));
        assert_eq!(parse_answer(b"OK 5\r\n"), Some(5));
        assert_eq!(parse_answer(b"OK 5"), Some(5));
        assert_eq!(parse_answer(b"OK 4294967295\n"), Some(u32::MAX));
        for bad in [&b"OK\n"[..], b"OK x\n", b"ok 5\n", b"OK 5 6\n", b"OK +5\n", b"OK 4294967296\n"]
        {
            assert_eq!(parse_answer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn errors_say_what_happened() {
        let path = Path::new("/run/vm.sock");
        let e = answer(path, 7, b"").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        let e = answer(path, 7, b"HELLO\n").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("HELLO") && e.to_string().contains("/run/vm.sock"));
        let e = at(path, io::ErrorKind::NotFound.into());
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("/run/vm.sock"));
    }
}
