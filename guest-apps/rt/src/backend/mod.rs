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
//! - `bare` (`target_os = "none"`): the app as a bootable unikernel image,
//!   with pier-driver and pier-stack linked in and driven by the app's own
//!   calls.
//! - `unsupported`: every other target (the developer's own machine), so
//!   that apps still compile there.

#[cfg(target_os = "wasi")]
mod wasi;
#[cfg(target_os = "wasi")]
pub(crate) use wasi::*;

#[cfg(target_os = "none")]
pub(crate) mod bare;
#[cfg(target_os = "none")]
pub(crate) use bare::*;

#[cfg(not(any(target_os = "wasi", target_os = "none")))]
mod unsupported;
#[cfg(not(any(target_os = "wasi", target_os = "none")))]
pub(crate) use unsupported::*;
