//! The public socket types are thin shells over one backend picked at
//! compile time, so an app's source never changes between targets.
//!
//! Each backend provides the same crate-private items with the same
//! signatures: `Listener`, `Stream`, `SeqListener`, `SeqStream`,
//! `Datagram`, `PollRef`, `poll` and `local_cid`. Nothing from a backend
//! appears in a public signature; the shells in the parent modules wrap
//! them.
//!
//! - `wasi`: a WASI component; every call goes to the host through the
//!   `vsock:sockets` WIT imports, and waiting is `wasi:io/poll`.
//! - `unsupported`: every other target, for now. The bare-metal backend
//!   (pier-driver and pier-stack linked into the app) will take its place.

#[cfg(target_os = "wasi")]
mod wasi;
#[cfg(target_os = "wasi")]
pub(crate) use wasi::*;

#[cfg(not(target_os = "wasi"))]
mod unsupported;
#[cfg(not(target_os = "wasi"))]
pub(crate) use unsupported::*;
