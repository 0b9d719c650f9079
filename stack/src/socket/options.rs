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
    /// How far a stream's buffer may grow by itself
    /// ([`crate::Config::buffer_autotune_max`]); 0 once the application
    /// has set the buffer size, which it then keeps.
    pub autotune_max: u32,
}

impl Options {
    /// The options of a new socket: the stack's defaults, SO_RCVLOWAT 1.
    pub fn new(buffer_size: u32, connect_timeout: Duration, autotune_max: u32) -> Self {
        Self { buffer_size, rcvlowat: 1, connect_timeout, autotune_max }
    }

    /// The most a connection may have sent and not yet seen consumed, by
    /// its own side: its buffer size, or the autotuning limit while that
    /// applies, so that a peer whose buffer grew is sent as much as it
    /// takes. Either way a bound, so a peer advertising a huge buffer
    /// cannot make the socket queue unbounded data.
    pub fn send_cap(&self) -> u32 {
        self.buffer_size.max(self.autotune_max)
    }
}
