//! pier-rt's own tests of its public facades, on the developer's machine:
//! there the platform is `platform::loopback`, where the sockets of the test
//! process connect to each other, so the shells, the `Poller`, the async
//! types and the executor run for real. Each module tests one facade
//! through the public API, as an app uses it.

mod asynch;
mod datagram;
mod poller;
mod seqpacket;
mod stream;

use crate::addr::{VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::io;
use crate::stream::{VsockListener, VsockStream};

/// A listener on a free port, and the address to dial it at.
fn listening() -> (VsockListener, VsockAddr) {
    let listener = VsockListener::bind(VsockAddr::new(VMADDR_CID_LOCAL, VMADDR_PORT_ANY))
        .expect("binding a free port");
    let addr = dialable(listener.local_addr().expect("the listener's address"));
    (listener, addr)
}

/// Where a peer reaches a socket bound to `bound`.
fn dialable(bound: VsockAddr) -> VsockAddr {
    assert_ne!(bound.port, VMADDR_PORT_ANY, "bound to a real port");
    VsockAddr::new(VMADDR_CID_LOCAL, bound.port)
}

/// A connected pair: (client, server).
fn stream_pair() -> (VsockStream, VsockStream) {
    let (listener, addr) = listening();
    let client = VsockStream::connect(addr).expect("connecting");
    let (server, _) = listener.accept().expect("accepting");
    (client, server)
}

/// An address nothing listens on: a port that was just given back.
fn nobody() -> VsockAddr {
    let (_listener, addr) = listening();
    addr
}

#[track_caller]
fn assert_kind<T: core::fmt::Debug>(result: io::Result<T>, kind: io::ErrorKind) {
    match result {
        Err(e) => assert_eq!(e.kind(), kind, "{e}"),
        Ok(v) => panic!("expected {kind:?}, got Ok({v:?})"),
    }
}
