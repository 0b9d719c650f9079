//! Host bindings for the `vsock:sockets` WIT package, and the error type
//! every binding returns.
//!
//! `wasi:io` and `wasi:clocks` are wasmtime-wasi's own (sync) bindings, so
//! the streams and pollables this package hands out are exactly the
//! resources wasmtime-wasi's `wasi:io` serves: a component reads a vsock
//! stream with the same `input-stream.read` it uses for stdin. Each vsock
//! resource maps to a Rust type of this crate.
//!
//! Bindings are synchronous: one thread runs one component instance, and
//! waiting happens only inside `wasi:io/poll`, on futures whose wakers the
//! guest stack fires (from the device's interrupt or a timer).

use std::fmt;

use wasmtime::component::ResourceTableError;

pub use self::vsock::sockets::network::{ErrorCode, VsockAddress};

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "vsock:sockets/imports",
    imports: { default: trappable },
    with: {
        "wasi": wasmtime_wasi::p2::bindings::sync,
        "vsock:sockets/network.network": crate::net::Network,
        "vsock:sockets/stream-socket.stream-socket": crate::stream::StreamSocket,
        "vsock:sockets/seqpacket-socket.seqpacket-socket": crate::seqpacket::SeqpacketSocket,
        "vsock:sockets/seqpacket-socket.message-receiver": crate::seqpacket::MessageReceiver,
        "vsock:sockets/seqpacket-socket.message-sender": crate::seqpacket::MessageSender,
        "vsock:sockets/datagram-socket.datagram-socket": crate::datagram::DatagramSocket,
        "vsock:sockets/datagram-socket.incoming-datagram-stream": crate::datagram::IncomingDatagramStream,
        "vsock:sockets/datagram-socket.outgoing-datagram-stream": crate::datagram::OutgoingDatagramStream,
    },
    trappable_error_type: {
        "vsock:sockets/network.error-code" => VsockError,
    },
    require_store_data_send: true,
});

/// What a binding that returns `result<_, error-code>` fails with: either
/// an error code for the component, or a trap that ends it (a bad resource
/// handle, a broken permit rule).
///
/// It is our own type, not `wasmtime_wasi::TrappableError<ErrorCode>`,
/// because the orphan rule would not let us convert resource-table errors
/// into that one.
#[derive(Debug)]
pub enum VsockError {
    /// Returned to the component as `error-code`.
    Code(ErrorCode),
    /// Ends the component.
    Trap(wasmtime::Error),
}

impl VsockError {
    pub(crate) fn trap(msg: &str) -> Self {
        Self::Trap(wasmtime::format_err!("{msg}"))
    }
}

impl From<ErrorCode> for VsockError {
    fn from(code: ErrorCode) -> Self {
        Self::Code(code)
    }
}

impl From<ResourceTableError> for VsockError {
    fn from(e: ResourceTableError) -> Self {
        Self::Trap(e.into())
    }
}

impl From<wasmtime::Error> for VsockError {
    fn from(e: wasmtime::Error) -> Self {
        Self::Trap(e)
    }
}

impl fmt::Display for VsockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "vsock: {}", c.name()),
            Self::Trap(e) => write!(f, "trap: {e}"),
        }
    }
}

impl std::error::Error for VsockError {}

/// The error a vsock `input-stream` or `output-stream` carries in
/// `stream-error.last-operation-failed`; `network-error-code` finds it
/// again by downcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFailure(pub ErrorCode);

impl fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vsock: {}", self.0.name())
    }
}

impl std::error::Error for StreamFailure {}

impl From<VsockAddress> for pier_stack::VsockAddr {
    fn from(a: VsockAddress) -> Self {
        pier_stack::VsockAddr::new(a.cid, a.port)
    }
}

impl From<pier_stack::VsockAddr> for VsockAddress {
    fn from(a: pier_stack::VsockAddr) -> Self {
        VsockAddress { cid: a.cid, port: a.port }
    }
}
