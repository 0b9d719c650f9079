//! Errors a socket call can return.
//!
//! Each variant is one Linux errno, so that code written against AF_VSOCK
//! sees the failure it expects, and adapters (the WIT shim, a POSIX layer)
//! can map them one to one. [`Error::errno`] gives the number.
//!
//! There is no EINPROGRESS: every call is non-blocking, `connect` starts
//! the handshake and returns `Ok`, and `finish_connect` reports the outcome.

use core::fmt;

/// Why a socket call failed: one Linux errno per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// EAGAIN: nothing to do right now; wait for readiness.
    WouldBlock,
    /// EALREADY: a connect is already in progress on this socket.
    Already,
    /// EISCONN: the socket is already connected.
    IsConnected,
    /// ENOTCONN: the operation needs a connected socket.
    NotConnected,
    /// EINVAL: the call makes no sense in the socket's state or with these arguments.
    InvalidArgument,
    /// EADDRINUSE: another socket holds the port.
    AddressInUse,
    /// EADDRNOTAVAIL: the CID is not ours, or no ephemeral port is free.
    AddressNotAvailable,
    /// EACCES: binding a port at or below 1023 needs privilege.
    PermissionDenied,
    /// ECONNRESET: the peer reset the connection, or it refused the connect
    /// (vsock answers a connect to a closed port with RST, not a refusal),
    /// or the transport was reset.
    ConnectionReset,
    /// ETIMEDOUT: the peer did not answer the connect in time.
    TimedOut,
    /// EPIPE: writing after our SHUT_WR or the peer's SHUT_RD.
    BrokenPipe,
    /// EMSGSIZE: the message can never fit the peer's buffer, or a datagram
    /// is over 64 KiB.
    MessageTooLarge,
    /// EOPNOTSUPP: the operation does not exist for this socket type.
    NotSupported,
    /// ESOCKTNOSUPPORT: the transport did not negotiate this socket type.
    SocketTypeNotSupported,
    /// EPROTO: the peer broke the protocol during the handshake.
    Protocol,
    /// EMFILE: the stack's socket limit is reached.
    SocketLimit,
    /// EBADF: the handle is closed or was never valid.
    BadHandle,
    /// EFAULT: the caller's copy-out failed (see `recv_with`).
    Fault,
}

impl Error {
    /// The Linux errno this error stands for.
    pub const fn errno(self) -> i32 {
        match self {
            Self::WouldBlock => 11,
            Self::Already => 114,
            Self::IsConnected => 106,
            Self::NotConnected => 107,
            Self::InvalidArgument => 22,
            Self::AddressInUse => 98,
            Self::AddressNotAvailable => 99,
            Self::PermissionDenied => 13,
            Self::ConnectionReset => 104,
            Self::TimedOut => 110,
            Self::BrokenPipe => 32,
            Self::MessageTooLarge => 90,
            Self::NotSupported => 95,
            Self::SocketTypeNotSupported => 94,
            Self::Protocol => 71,
            Self::SocketLimit => 24,
            Self::BadHandle => 9,
            Self::Fault => 14,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::WouldBlock => "operation would block",
            Self::Already => "connect already in progress",
            Self::IsConnected => "socket is already connected",
            Self::NotConnected => "socket is not connected",
            Self::InvalidArgument => "invalid argument",
            Self::AddressInUse => "address in use",
            Self::AddressNotAvailable => "address not available",
            Self::PermissionDenied => "permission denied",
            Self::ConnectionReset => "connection reset by peer",
            Self::TimedOut => "connection timed out",
            Self::BrokenPipe => "broken pipe",
            Self::MessageTooLarge => "message too large",
            Self::NotSupported => "operation not supported",
            Self::SocketTypeNotSupported => "socket type not supported by the transport",
            Self::Protocol => "protocol error",
            Self::SocketLimit => "too many open sockets",
            Self::BadHandle => "bad socket handle",
            Self::Fault => "bad address",
        };
        f.write_str(text)
    }
}

impl core::error::Error for Error {}

/// The result of a socket call.
pub type Result<T> = core::result::Result<T, Error>;
