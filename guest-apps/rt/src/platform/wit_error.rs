//! `vsock:sockets` error codes as `io::Error`s, for both WASI backends.
//! 0.2.0's codes are 0.1.0's, less the three only two-phase calls return,
//! with the same names and errnos, so the table is one, keyed by the WIT
//! name: an app sees the same error kinds whichever world it was built
//! for. Errors are off the hot path, so a match on the name costs nothing
//! that matters.

use std::io;

/// The `io::Error` a std user would expect from the Linux errno of the
/// WIT error code `name`. The message keeps the name, so logs still show
/// exactly what the host said.
pub(crate) fn error(name: &str) -> io::Error {
    use io::ErrorKind as K;
    let kind = match name {
        "access-denied" => K::PermissionDenied,
        "not-supported" => K::Unsupported,
        "invalid-argument" => K::InvalidInput,
        "out-of-memory" => K::OutOfMemory,
        "timeout" => K::TimedOut,
        "concurrency-conflict" => K::ResourceBusy,
        "would-block" => K::WouldBlock,
        // Every call pier-rt makes in a state where the host can answer
        // invalid-state is a call that needs a connection.
        "invalid-state" => K::NotConnected,
        "address-not-bindable" => K::AddrNotAvailable,
        "address-in-use" => K::AddrInUse,
        "remote-unreachable" => K::HostUnreachable,
        "connection-refused" => K::ConnectionRefused,
        "connection-reset" => K::ConnectionReset,
        "connection-aborted" => K::ConnectionAborted,
        "message-too-large" => K::InvalidInput,
        // unknown, not-in-progress, new-socket-limit
        _ => K::Other,
    };
    io::Error::new(kind, format!("vsock: {name}"))
}

/// Like [`error`], for a send: `invalid-state` there means this side
/// already shut down sending, which std reports as a broken pipe.
pub(crate) fn send_error(name: &str) -> io::Error {
    match name {
        "invalid-state" => io::Error::new(io::ErrorKind::BrokenPipe, "vsock: invalid-state"),
        name => error(name),
    }
}
