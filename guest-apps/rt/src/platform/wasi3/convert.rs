//! The host's addresses, units and error codes in pier-rt's terms.

use std::io;
use std::time::Duration;

use super::bindings::vsock::sockets::types::{ErrorCode, VsockAddress};
use crate::addr::VsockAddr;

impl From<VsockAddr> for VsockAddress {
    fn from(a: VsockAddr) -> Self {
        Self { cid: a.cid, port: a.port }
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

/// A WIT byte count as a `usize`.
pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A duration as the WIT's nanoseconds.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
