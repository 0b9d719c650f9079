//! `containerd-shim-pier-v1`: containerd runs pier components through it.
//!
//! containerd starts one shim process per container (per Pod, under
//! Kubernetes) and drives it over its task API: create, start, kill, wait,
//! delete. runwasi's `containerd-shimkit` speaks that API, mounts the
//! container's root filesystem and hands us the bundle; this crate is
//! what a pier container is:
//!
//! - `annotations`: where the component's hybrid vsock socket goes on the
//!   node, its CID, and what it may listen on and connect to, all from the
//!   OCI spec's `pier.dev/` annotations, denied unless granted;
//! - `instance`: the container's lifecycle around pier's wasmtime host
//!   (`pier-shim`), which runs the component with WIT vsock sockets in this
//!   process.
//!
//! `docs/kubernetes.md` says how to install it on a node and use it from
//! a cluster.

pub mod annotations;
mod instance;

pub use instance::PierInstance;
