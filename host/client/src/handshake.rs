//! The `CONNECT <port>` / `OK <n>` exchange that opens every host → guest
//! connection, and the errors that describe how it failed. Shared by the
//! blocking and the tokio types (and by streams and seqpacket, which send
//! the same text, as bytes or as one message), so they all accept the same
//! answers and fail with the same words. The lines themselves are
//! `pier_hybrid`'s ([`pier_hybrid::connect_line`], [`pier_hybrid::parse_ok`]).

use std::io;
use std::path::Path;
use std::time::Duration;

/// What a finished exchange read: the answer, or nothing at all.
pub(crate) fn answer(path: &Path, port: u32, line: &[u8]) -> io::Result<u32> {
    if line.is_empty() {
        return Err(refused(path, port));
    }
    pier_hybrid::parse_ok(line).ok_or_else(|| garbage(path, port, line))
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
