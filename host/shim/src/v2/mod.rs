//! `vsock:sockets@0.2.0`: the async package, in WASI 0.3's shape, for
//! components built against the component model's async ABI.
//!
//! The sockets are the same stack sockets as 0.1.0's ([`ConnSocket`] and
//! [`Sock`](crate::net::Sock)); only the way a component waits differs.
//! Where 0.1.0 hands out `wasi:io` pollables and two-phase calls, 0.2.0
//! has `async func`s, whose host halves await the same readiness the
//! pollables wait for, and `stream<u8>`s, whose producer and consumer
//! move bytes between the stack's rings and the component's own memory
//! with no buffer between them (`stream.rs`).
//!
//! A component imports this package next to wasmtime-wasi's WASI 0.2
//! (std needs it) and exports `wasi:cli/run@0.3.0`, an `async func`: only
//! an async task may wait on an async import before it returns, so the
//! host calls that export through wasmtime's concurrent event loop
//! (`host::Instance`).
//!
//! [`ConnSocket`]: crate::conn::ConnSocket

mod conn;
mod datagram;
mod resources;
mod seqpacket;
mod stream;

use crate::network::ErrorCode as V1ErrorCode;

wasmtime::component::bindgen!({
    path: "../../wit/v0.2.0",
    world: "vsock:sockets/imports",
    imports: {
        "vsock:sockets/types.[method]stream-socket.connect": async | store | trappable,
        "vsock:sockets/types.[method]stream-socket.listen": store | trappable,
        "vsock:sockets/types.[method]stream-socket.send": store | trappable,
        "vsock:sockets/types.[method]stream-socket.receive": store | trappable,
        "vsock:sockets/types.[method]seqpacket-socket.connect": async | store | trappable,
        "vsock:sockets/types.[method]seqpacket-socket.listen": store | trappable,
        "vsock:sockets/types.[method]seqpacket-socket.send": async | store | trappable,
        "vsock:sockets/types.[method]seqpacket-socket.receive": async | store | trappable,
        "vsock:sockets/types.[method]datagram-socket.send": async | store | trappable,
        "vsock:sockets/types.[method]datagram-socket.receive": async | store | trappable,
        default: trappable,
    },
    with: {
        "vsock:sockets/types.stream-socket": crate::v2::resources::StreamSocket,
        "vsock:sockets/types.seqpacket-socket": crate::v2::resources::SeqpacketSocket,
        "vsock:sockets/types.datagram-socket": crate::v2::resources::DatagramSocket,
    },
    require_store_data_send: true,
});

use vsock::sockets::types::{self, ErrorCode};

pub(crate) use types::add_to_linker;

/// 0.1.0's codes carry over by name. The three that only two-phase calls
/// returned cannot come out of the one-call forms 0.2.0 uses; should one
/// still, it is a state error, which is what each of them meant.
impl From<V1ErrorCode> for ErrorCode {
    fn from(e: V1ErrorCode) -> Self {
        match e {
            V1ErrorCode::Unknown => Self::Unknown,
            V1ErrorCode::AccessDenied => Self::AccessDenied,
            V1ErrorCode::NotSupported => Self::NotSupported,
            V1ErrorCode::InvalidArgument => Self::InvalidArgument,
            V1ErrorCode::OutOfMemory => Self::OutOfMemory,
            V1ErrorCode::Timeout => Self::Timeout,
            V1ErrorCode::ConcurrencyConflict
            | V1ErrorCode::NotInProgress
            | V1ErrorCode::WouldBlock
            | V1ErrorCode::InvalidState => Self::InvalidState,
            V1ErrorCode::NewSocketLimit => Self::NewSocketLimit,
            V1ErrorCode::AddressNotBindable => Self::AddressNotBindable,
            V1ErrorCode::AddressInUse => Self::AddressInUse,
            V1ErrorCode::RemoteUnreachable => Self::RemoteUnreachable,
            V1ErrorCode::ConnectionRefused => Self::ConnectionRefused,
            V1ErrorCode::ConnectionReset => Self::ConnectionReset,
            V1ErrorCode::ConnectionAborted => Self::ConnectionAborted,
            V1ErrorCode::MessageTooLarge => Self::MessageTooLarge,
        }
    }
}

impl From<types::VsockAddress> for crate::network::VsockAddress {
    fn from(a: types::VsockAddress) -> Self {
        Self { cid: a.cid, port: a.port }
    }
}

impl From<crate::network::VsockAddress> for types::VsockAddress {
    fn from(a: crate::network::VsockAddress) -> Self {
        Self { cid: a.cid, port: a.port }
    }
}

impl From<types::ShutdownType> for pier_stack::Shutdown {
    fn from(t: types::ShutdownType) -> Self {
        match t {
            types::ShutdownType::Receive => Self::Read,
            types::ShutdownType::Send => Self::Write,
            types::ShutdownType::Both => Self::Both,
        }
    }
}
