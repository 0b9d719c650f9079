//! The three resource types of `vsock:sockets@0.2.0`. The generated
//! bindings name them and the host traits (`stream.rs`, `seqpacket.rs`,
//! `datagram.rs`) serve them; kept apart from both, they let the bindings
//! import this file alone, so no import cycle forms between the bindings
//! and the modules that implement them.

use std::sync::Arc;

use pier_stack::VsockAddr;

use crate::conn::ConnSocket;
use crate::net::{Sock, VsockCtx};

/// The 0.2.0 `stream-socket` resource.
pub struct StreamSocket {
    pub(super) conn: ConnSocket,
    /// `send` was called: its stream is the one way bytes go out.
    pub(super) sending: bool,
    /// `receive` was called.
    pub(super) receiving: bool,
}

/// The 0.2.0 `seqpacket-socket` resource.
pub struct SeqpacketSocket(pub(super) ConnSocket);

/// The 0.2.0 `datagram-socket` resource.
pub struct DatagramSocket {
    pub(super) ctx: VsockCtx,
    pub(super) sock: Arc<Sock>,
    pub(super) bound: bool,
    /// The peer `connect` fixed, if any.
    pub(super) peer: Option<VsockAddr>,
}
