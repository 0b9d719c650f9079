//! What every call on the imports shares: the network capability, the
//! conversion of addresses and units, and how WIT error codes become the
//! `io::Error`s std users expect.

use std::io;
use std::time::Duration;

use super::bindings::vsock::sockets::instance_network::instance_network;
use super::bindings::vsock::sockets::network::{
    ErrorCode, Network, VsockAddress, network_error_code,
};
use crate::addr::VsockAddr;

thread_local! {
    /// One capability handle serves every socket: it carries the host's
    /// grants and no state of its own.
    static NETWORK: Network = instance_network();
}

pub(super) fn with_network<R>(f: impl FnOnce(&Network) -> R) -> R {
    NETWORK.with(f)
}

impl From<VsockAddr> for VsockAddress {
    fn from(a: VsockAddr) -> Self {
        VsockAddress { cid: a.cid, port: a.port }
    }
}

impl From<VsockAddress> for VsockAddr {
    fn from(a: VsockAddress) -> Self {
        VsockAddr::new(a.cid, a.port)
    }
}

/// Maps a WIT error code to the `io::ErrorKind` a std user would expect
/// from the matching Linux errno. The message keeps the WIT name, so logs
/// still show exactly what the host said.
pub(super) fn error(code: ErrorCode) -> io::Error {
    use io::ErrorKind as K;
    let kind = match code {
        ErrorCode::Unknown => K::Other,
        ErrorCode::AccessDenied => K::PermissionDenied,
        ErrorCode::NotSupported => K::Unsupported,
        ErrorCode::InvalidArgument => K::InvalidInput,
        ErrorCode::OutOfMemory => K::OutOfMemory,
        ErrorCode::Timeout => K::TimedOut,
        ErrorCode::ConcurrencyConflict => K::ResourceBusy,
        ErrorCode::NotInProgress => K::Other,
        ErrorCode::WouldBlock => K::WouldBlock,
        // Every call pier-rt makes in a state where the host can answer
        // invalid-state is a call that needs a connection.
        ErrorCode::InvalidState => K::NotConnected,
        ErrorCode::NewSocketLimit => K::Other,
        ErrorCode::AddressNotBindable => K::AddrNotAvailable,
        ErrorCode::AddressInUse => K::AddrInUse,
        ErrorCode::RemoteUnreachable => K::HostUnreachable,
        ErrorCode::ConnectionRefused => K::ConnectionRefused,
        ErrorCode::ConnectionReset => K::ConnectionReset,
        ErrorCode::ConnectionAborted => K::ConnectionAborted,
        ErrorCode::MessageTooLarge => K::InvalidInput,
    };
    io::Error::new(kind, format!("vsock: {}", code.name()))
}

/// Like `error`, for a send: `invalid-state` there means this side already
/// shut down sending, which std reports as a broken pipe.
pub(super) fn send_error(code: ErrorCode) -> io::Error {
    match code {
        ErrorCode::InvalidState => {
            io::Error::new(io::ErrorKind::BrokenPipe, "vsock: invalid-state")
        }
        code => error(code),
    }
}

/// Turns a wasi:io stream failure into an `io::Error`, recovering the vsock
/// error code (a reset, usually) when the host attached one.
pub(super) fn stream_error(e: wasip2::io::error::Error) -> io::Error {
    match network_error_code(&e) {
        Some(code) => error(code),
        None => io::Error::other(e.to_debug_string()),
    }
}

/// A duration as the WIT's nanoseconds.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A WIT byte count as a `usize`.
pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
