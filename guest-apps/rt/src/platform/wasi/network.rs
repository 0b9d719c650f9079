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

/// A WIT error code as the `io::Error` std would report for its errno
/// (the table is `platform::wit_error`'s, shared by both packages).
pub(super) fn error(code: ErrorCode) -> io::Error {
    crate::platform::wit_error::error(code.name())
}

/// Like `error`, for a send: `invalid-state` there means this side already
/// shut down sending, which std reports as a broken pipe.
pub(super) fn send_error(code: ErrorCode) -> io::Error {
    crate::platform::wit_error::send_error(code.name())
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
