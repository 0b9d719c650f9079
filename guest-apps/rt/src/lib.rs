//! pier-rt: the SDK for pier apps.
//!
//! An app in `guest-apps/` is written once and built for two targets: as a
//! WASI component that a wasmtime host runs, and as a bootable unikernel
//! image where the same code drives the virtio device itself. pier-rt
//! is what makes that possible: it offers one socket API with familiar
//! names, and picks the implementation at compile time.
//!
//! The names come from `std::net` and tokio-vsock, so there is little to
//! learn:
//!
//! | vsock type | like | for |
//! |---|---|---|
//! | [`VsockListener`], [`VsockStream`] | `TcpListener`, `TcpStream` | byte streams with half-close |
//! | [`SeqpacketListener`], [`SeqpacketStream`] | (none in std) | reliable messages with boundaries and end-of-record |
//! | [`VsockDatagram`] | `UdpSocket` | best-effort datagrams up to 64 KiB |
//! | [`VsockAddr`] | `SocketAddr` | `(cid, port)`, with the `VMADDR_*` constants; pier-stack's type, with [`VsockAddrExt`]'s constructors |
//!
//! Errors are [`io::Error`]s (std's own on WASI) whose kinds follow the Linux errno
//! the situation would produce: `ConnectionRefused` when nothing listens,
//! `ConnectionReset` after a transport reset, `PermissionDenied` for any
//! address or port the host did not grant, `WouldBlock` in non-blocking
//! mode, `Unsupported` when the transport lacks the socket type.
//!
//! # Blocking, non-blocking, and serving many peers
//!
//! Every call blocks by default, the way std's sockets do, and waits
//! without spinning: on WASI it parks the component in the host's
//! `wasi:io/poll` until the socket can make progress.
//!
//! A component has a single thread, so a server that handles several
//! connections at once puts its sockets in non-blocking mode
//! (`set_nonblocking(true)`) and waits for all of them together with a
//! [`Poller`]: list each socket's [`Readiness`] (`readable()` /
//! `writable()`) with a token, call [`Poller::wait`], then service the
//! sockets whose tokens come back until they return `WouldBlock`. The
//! `echo` app is the worked example.
//!
//! Or write the server as `async` code with [`asynch`]: one task per
//! peer, tokio-vsock's shapes (`accept().await`, an `incoming()` stream,
//! `futures-io`'s `AsyncRead`/`AsyncWrite`, `into_split()`), and
//! pier-rt's own single-threaded executor doing the `Poller`'s work
//! (`pier_rt::main!(async serve)`). `echo-async` is the same server as
//! `echo` in a third of the code.
//!
//! # Platforms
//!
//! - `wasm32-wasip2` (`target_os = "wasi"`): calls go to the host through
//!   the `vsock:sockets` WIT imports in the repository's `wit/` folder.
//! - `x86_64-unknown-none` (`target_os = "none"`): the app becomes a
//!   bootable unikernel image (`platform::bare`: PVH boot, ring 3, COM1
//!   console, exit port, interrupts and a timer; `docs/unikernel.md`),
//!   with pier-driver and pier-stack linked in and driven by the app's own
//!   calls. The crate is `no_std` there.
//! - Every other target (the developer's machine): the crate compiles, so
//!   apps can be checked anywhere, but every socket constructor fails with
//!   `io::ErrorKind::Unsupported`. (pier-rt's own tests run there against
//!   an in-memory loopback instead.)
//!
//! # Apps on every target
//!
//! An app that builds for both targets uses pier-rt's names where std has
//! no bare-metal equivalent ([`io`], [`net`], [`process`], [`env`](mod@env),
//! [`time`], [`thread`], [`prelude`], the print macros), and one
//! crate-level attribute. On WASI those names are std's own items, so
//! the app still uses the real std types and traits there:
//!
//! ```ignore
//! #![cfg_attr(target_os = "none", no_std, no_main)]
//!
//! pier_rt::main!(main);
//!
//! fn main() {
//!     pier_rt::println!("hello");
//!     for arg in pier_rt::env::args() { /* &'static str on every target */ }
//!     pier_rt::process::exit(0)
//! }
//! ```
//!
//! On WASI these are std's own (`println!` is `std::println!`, `main!`
//! expands to nothing), so nothing changes there.
//!
//! # Modules
//!
//! Each layer uses only the layers below it in this list, and no module
//! imports one that imports it: the facades reach a platform through the
//! platform contract, and the platforms take their shared types from the
//! leaves at the bottom.
//!
//! The sockets, under std's and tokio-vsock's names:
//!
//! - `stream`: [`VsockListener`], [`Incoming`] and [`VsockStream`], with
//!   a byte stream's own calls (`Read`, `Write`, the queue sizes);
//! - `seqpacket`: [`SeqpacketListener`], [`SeqpacketIncoming`] and
//!   [`SeqpacketStream`], with a message stream's own calls (`send`,
//!   `send_eor`, `recv`);
//! - [`conn`]: the listener and the connection both kinds share, written
//!   once and generic over the kind; the names above are aliases of them;
//! - `datagram`: [`VsockDatagram`];
//! - `poll`: [`Poller`] and [`Readiness`], waiting on many sockets at
//!   once, since a component has one thread;
//! - [`asynch`]: the same sockets as futures, and the executor that runs
//!   them:
//!   - [`asynch::conn`], `asynch::stream`, `asynch::seqpacket`,
//!     `asynch::datagram`: the async twins of the modules above;
//!   - `asynch::io`: [`asynch::AsyncRead`], [`asynch::AsyncWrite`] and
//!     their awaitable extensions;
//!   - `asynch::executor`: [`asynch::block_on`], [`asynch::spawn`] and
//!     [`asynch::JoinHandle`];
//!   - `asynch::reactor`: what each waiting task waits for, and the one
//!     wait on all of it;
//!   - `asynch::budget`: how many ready operations a task makes before
//!     it yields;
//!   - `asynch::local`: the per-thread cells the executor and the reactor
//!     keep their state in.
//!
//! What std gives an app, on every target:
//!
//! - [`io`], [`net`], [`env`](mod@env), [`process`], [`time`],
//!   [`thread`], [`prelude`] and the print and entry macros (`macros`):
//!   I/O traits and errors, `Shutdown`, arguments, exit codes, a monotonic
//!   clock, sleeping, printing, the entry point;
//! - [`diag`]: facts for tests (privilege level, virtio devices);
//! - [`args`]: the command-line parsing the example apps share.
//!
//! The implementation, picked at compile time:
//!
//! - `platform`: names the platform this build runs on (`platform::Active`):
//!   - `platform::contract`: what every platform supplies, as traits;
//!   - `platform::wasi`: the `vsock:sockets` imports made blocking or not:
//!     `bindings` (generated), `network` (the capability, conversions and
//!     error codes), `wait` (pollables), `conn` (the listener, connect
//!     and connection stream and seqpacket sockets share), and `stream`,
//!     `seqpacket` and `datagram`, the data path of each;
//!   - `platform::bare`: the unikernel: `boot`, `traps`, `start`,
//!     `console`, `clock`, `cmdline`, `heap`, `exit`, `virtio`, `irq`,
//!     `hal`, `net` (pier-driver and pier-stack, driven by the app's
//!     calls) and `socket` (the sockets over them);
//!   - `platform::unsupported`: the stand-in for targets without a
//!     platform, so apps still compile there;
//!   - `platform::loopback`: in-memory sockets for pier-rt's own tests.
//!
//! The leaves, plain data that facades and platforms share:
//!
//! - `addr`: [`VsockAddr`] and the `VMADDR_*` constants, which are
//!   pier-stack's so that apps and stacks agree on them, and
//!   [`VsockAddrExt`]'s constructors;
//! - [`kind`]: the two connection kinds, as type parameters;
//! - `message`: [`RecvMessage`], what a seqpacket receive got;
//! - `unikernel`: the panic exit code and [`diag::VirtioDevice`].
//!
//! And `__private`, what the exported macros reach on bare metal; and
//! `tests`, pier-rt's own tests of the facades, run by `cargo test`
//! on the developer's machine against `platform::loopback`.

#![cfg_attr(target_os = "none", no_std)]
#![warn(missing_docs)]

extern crate alloc;

mod addr;
pub mod args;
pub mod asynch;
pub mod conn;
mod datagram;
pub mod diag;
pub mod env;
pub mod io;
pub mod kind;
mod macros;
mod message;
pub mod net;
mod platform;
mod poll;
pub mod prelude;
pub mod process;
mod seqpacket;
mod stream;
#[cfg(all(test, not(any(target_os = "wasi", target_os = "none"))))]
mod tests;
pub mod thread;
pub mod time;
mod unikernel;

/// What the exported macros reach on bare metal; not part of the API.
#[cfg(target_os = "none")]
#[doc(hidden)]
pub mod __private {
    pub use crate::platform::bare::console::print;
}

/// What `main!` reaches in a WASI 0.3 build: the bindings, whose export
/// macro the app's crate invokes, and the entries it wraps `main` in.
#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
#[doc(hidden)]
pub mod __private {
    pub use crate::platform::wasi3::bindings as wasi3;
    pub use crate::platform::wasi3::wait::{run_async_main, run_main, wrong_world};
}

pub use addr::{
    VMADDR_CID_ANY, VMADDR_CID_HOST, VMADDR_CID_HYPERVISOR, VMADDR_CID_LOCAL, VMADDR_PORT_ANY,
    VsockAddr, VsockAddrExt,
};
pub use datagram::VsockDatagram;
pub use message::RecvMessage;
pub use net::Shutdown;
pub use poll::{Poller, Readiness};
pub use seqpacket::{SeqpacketIncoming, SeqpacketListener, SeqpacketStream};
pub use stream::{Incoming, VsockListener, VsockStream};

/// This side's CID: the address peers use to reach the app
/// (IOCTL_VM_SOCKETS_GET_LOCAL_CID).
pub fn local_cid() -> io::Result<u32> {
    <platform::Active as platform::contract::Platform>::local_cid()
}
