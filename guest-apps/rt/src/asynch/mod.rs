//! Async sockets and the executor that runs them: tokio-vsock's API on
//! pier's one thread, on every target.
//!
//! A WASI component (and the unikernel) has one thread, so serving many
//! peers means waiting on all of them at once. [`Poller`](crate::Poller)
//! does that by hand; this module does it for `async` code: each peer
//! gets a task that reads like blocking code, and the executor waits on
//! all their sockets together.
//!
//! ```no_run
//! # #[cfg(any())] mod app {
//! #![cfg_attr(target_os = "none", no_std, no_main)]
//! pier_rt::main!(async serve);
//! # }
//! use pier_rt::asynch::{self, AsyncReadExt, AsyncWriteExt, VsockListener};
//! use pier_rt::{VsockAddr, VsockAddrExt};
//!
//! async fn serve() -> std::io::Result<()> {
//!     let listener = VsockListener::bind(VsockAddr::any_cid(1234))?;
//!     loop {
//!         let (mut conn, _peer) = listener.accept().await?;
//!         asynch::spawn(async move {
//!             let mut buf = vec![0; 16 * 1024];
//!             while let Ok(n @ 1..) = conn.read(&mut buf).await {
//!                 if conn.write_all(&buf[..n]).await.is_err() {
//!                     return;
//!                 }
//!             }
//!             let _ = conn.close().await; // the half-close
//!         });
//!     }
//! }
//! ```
//!
//! | async type | like | awaits |
//! |---|---|---|
//! | [`VsockListener`], [`Incoming`] | tokio-vsock's `VsockListener` | `accept()`; `incoming()` is a `futures_core::Stream` |
//! | [`VsockStream`], [`OwnedReadHalf`], [`OwnedWriteHalf`] | tokio-vsock's `VsockStream` | [`AsyncRead`] / [`AsyncWrite`] (`futures-io`'s on WASI), `into_split()` |
//! | [`SeqpacketListener`], [`SeqpacketStream`] and halves | the blocking seqpacket types | `accept()`, `send()`, `send_eor()`, `recv()` |
//! | [`VsockDatagram`] | the blocking `VsockDatagram` | `send_to()`, `recv_from()`, `send()`, `recv()` |
//!
//! Blocking types stay as they are; `from_blocking` turns one into its
//! async twin (making it non-blocking).
//!
//! # The executor
//!
//! pier-rt has its own small single-threaded executor rather than a
//! crate's. `wstd` (the Bytecode Alliance's async runtime for WASI 0.2)
//! has a reactor over the same `wasi:io/poll`, but it takes ownership of
//! each pollable it waits on, while pier-rt's pollables are children of
//! its sockets and must be dropped before them (the host traps
//! otherwise); and it exists only for WASI, while the same API must run
//! on bare metal, where the reactor is the driver and the halt
//! instruction. One executor for both targets keeps their behaviour the
//! same.
//!
//! - [`block_on`] runs a future to completion, running the [`spawn`]ed
//!   tasks meanwhile; [`main!`](crate::main)`(async f)` makes it the app's
//!   entry.
//! - A task is a boxed future in a slot; its waker is the slot number,
//!   so waking never allocates. Tasks need not be `Send`.
//! - When no task can run, the reactor collects what every waiting task
//!   waits for (one slot per socket direction) and makes one blocking
//!   wait: `wasi:io/poll::poll` over the sockets' pollables on WASI;
//!   on bare metal, the driver is pumped and the CPU halts until the
//!   device's interrupt or the stack's next timer (`platform/bare/net.rs`,
//!   the same wait blocking calls use).
//! - Built for WASI 0.3 (the `wasi-0-3` feature), none of this is
//!   pier-rt's: the executor is wit-bindgen's, in the export's task, and
//!   waiting is the component model's (`executor_p3`, `reactor_p3`).
//! - A task yields after 64 ready socket operations, so a peer that
//!   always has data cannot starve the others.

mod budget;
pub mod conn;
mod datagram;
#[cfg(not(all(target_os = "wasi", feature = "wasi-0-3")))]
mod executor;
#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
#[path = "executor_p3.rs"]
mod executor;
mod io;
mod join;
pub(crate) mod local;
#[cfg(not(all(target_os = "wasi", feature = "wasi-0-3")))]
mod reactor;
#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
#[path = "reactor_p3.rs"]
mod reactor;
mod seqpacket;
mod stream;

pub use datagram::VsockDatagram;
pub use executor::{JoinHandle, block_on, spawn};
pub use futures_core::Stream;
pub use io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
pub use seqpacket::{
    SeqpacketIncoming, SeqpacketListener, SeqpacketReadHalf, SeqpacketStream, SeqpacketWriteHalf,
};
pub use stream::{Incoming, OwnedReadHalf, OwnedWriteHalf, VsockListener, VsockStream};
