//! The name of a socket, for the stack's table and everything that
//! reports on a socket (readiness hooks, receive taps).

slotmap::new_key_type! {
    /// Names one socket in a [`crate::Stack`]. A handle stops working when
    /// the socket is closed, even if the stack reuses its slot.
    pub struct SocketHandle;
}
