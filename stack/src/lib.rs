//! pier-stack: the virtio-vsock protocol core.
//!
//! This crate is the part of pier that knows the protocol: the packet
//! format, connections and their credit, the three socket types (stream,
//! seqpacket, datagram), timers, and the Linux semantics every call
//! follows. It is `no_std` with `alloc` and *sans-IO*: it owns no thread,
//! clock, device or lock. The virtio driver, the device model's host
//! endpoint and the tests all drive the same [`Stack`].
//!
//! The modules, from the wire up:
//!
//! - [`wire`]: the 44-byte packet header: decoding, encoding, and the
//!   constructors every header the stack sends is built with.
//! - [`virtio`]: the virtio-vsock device's constants both sides of the
//!   queues use (feature bits, queue indices, events), and which socket
//!   types negotiated features carry.
//! - [`addr`]: socket addresses (`sockaddr_vm`) and the special CIDs and
//!   ports.
//! - [`config`]: a stack's settings and the negotiated socket types.
//! - [`error`]: the errors socket calls return, one Linux errno each.
//! - [`time`]: the caller's clock, as the stack sees it.
//! - [`copy`]: the routine every payload byte is copied with, chosen per
//!   CPU by measurement (the `pier-copy` crate, which holds the one
//!   piece of `unsafe` code the stack relies on).
//! - [`payload`]: a received payload, as bytes the stack may borrow or
//!   as bytes it may only copy out of (a virtual machine's memory).
//! - `ring` (private): the byte ring behind every socket buffer.
//! - `socket` (private): one socket's state, by type, without the tables:
//!   a stream or seqpacket connection and its state machine, or a
//!   datagram socket.
//! - `stack` (private, its types re-exported here): [`Stack`], the
//!   endpoint: socket tables, routing, the socket calls, transmit,
//!   timers, wakes.
//! - [`readiness`]: readiness flags, wakers, deferred wake lists.
//! - [`stats`]: counters that explain every drop and every RST.
//! - [`phy`]: test and benchmark plumbing: two stacks back to back,
//!   with a tracer, a fault injector and a pcap writer in between.
//!
//! With the `log` feature (off by default), drops, RSTs and transport
//! resets are also reported at debug level through the `log` crate.
//!
//! See `docs/stack.md` in the repository for a walkthrough.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

#[macro_use]
mod macros;

pub mod addr;
pub mod config;
pub use pier_copy as copy;
pub mod error;
pub mod payload;
pub mod phy;
pub mod readiness;
mod ring;
mod socket;
mod stack;
pub mod stats;
pub mod time;
pub mod virtio;
pub mod wire;

pub use addr::{
    VMADDR_CID_ANY, VMADDR_CID_HOST, VMADDR_CID_HYPERVISOR, VMADDR_CID_LOCAL, VMADDR_PORT_ANY,
    VsockAddr,
};
pub use config::{Config, DEFAULT_BUFFER_AUTOTUNE_MAX, DEFAULT_BUFFER_SIZE, Features};
pub use error::{Error, Result};
pub use payload::{Payload, SharedPayload};
pub use readiness::{Interest, Readiness, ReadinessEvent, ReadinessHook, WakeList};
pub use socket::{DirectReceive, HeldBuffers, RecvInfo, SocketHandle};
pub use stack::{InPlace, RxBatch, Shutdown, SinkFull, Stack, TxSink};
pub use stats::{DropReason, RstReason, Stats};
pub use time::Instant;
pub use wire::{Header, SocketType};
