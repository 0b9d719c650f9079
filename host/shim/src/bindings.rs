//! Host bindings for the `vsock:sockets` WIT package.
//!
//! `wasi:io` and `wasi:clocks` are wasmtime-wasi's own (sync) bindings, so
//! the streams and pollables this package hands out are exactly the
//! resources wasmtime-wasi's `wasi:io` serves: a component reads a vsock
//! stream with the same `input-stream.read` it uses for stdin. The
//! `network` interface is generated apart (`network`), and each socket
//! resource maps to the Rust type of its module; the host traits are
//! implemented under `host`.
//!
//! Bindings are synchronous: one thread runs one component instance, and
//! waiting happens only inside `wasi:io/poll`, on futures whose wakers the
//! guest stack fires (from the device's interrupt or a timer).

use crate::network::VsockError;

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "vsock:sockets/imports",
    imports: { default: trappable },
    with: {
        "wasi": wasmtime_wasi::p2::bindings::sync,
        "vsock:sockets/network": crate::network::vsock::sockets::network,
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

impl From<vsock::sockets::stream_socket::ShutdownType> for pier_stack::Shutdown {
    fn from(t: vsock::sockets::stream_socket::ShutdownType) -> Self {
        use vsock::sockets::stream_socket::ShutdownType as T;
        match t {
            T::Receive => Self::Read,
            T::Send => Self::Write,
            T::Both => Self::Both,
        }
    }
}
