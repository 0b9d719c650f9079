//! The options a socket carries, whatever its type.

use core::time::Duration;

/// The options every socket type has, set by the application.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    /// The receive buffer (SO_VM_SOCKETS_BUFFER_SIZE); a connection
    /// advertises it to the peer as `buf_alloc`.
    pub buffer_size: u32,
    /// SO_RCVLOWAT: bytes a stream needs queued to be readable.
    pub rcvlowat: u32,
    /// SO_VM_SOCKETS_CONNECT_TIMEOUT.
    pub connect_timeout: Duration,
}

impl Options {
    /// The options of a new socket: the stack's defaults, SO_RCVLOWAT 1.
    pub fn new(buffer_size: u32, connect_timeout: Duration) -> Self {
        Self { buffer_size, rcvlowat: 1, connect_timeout }
    }
}
