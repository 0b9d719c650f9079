//! `containerd-shim-pier-v1`: containerd runs pier components through it.
//!
//! containerd starts one shim process per container (per Pod, under
//! Kubernetes) and drives it over its task API: create, start, kill, wait,
//! delete. runwasi's `containerd-shimkit` speaks that API, mounts the
//! container's root filesystem and hands us the bundle; this crate is
//! what a pier container is:
//!
//! - `annotations`: the component's socket name, its CID, and what it may
//!   listen on and connect to, all from the OCI spec's `pier.dev/`
//!   annotations, denied unless granted;
//! - `node_config`: the node operator's file: where Pods' sockets live,
//!   who may reach them, and the most each namespace's Pods may be
//!   granted;
//! - `cpu_cgroup`: the container's CPU limits, by moving the shim into its
//!   cgroup;
//! - `pod_folder` (with `confined_fs`): each Pod's folder of sockets, made
//!   so that no Pod can lead the shim, which runs as root, anywhere else;
//! - `instance`: the container's lifecycle around pier's wasmtime host
//!   (`pier-shim`), which runs the component with WIT vsock sockets in this
//!   process.
//!
//! `docs/kubernetes.md` says how to install it on a node and use it from
//! a cluster.

pub mod annotations;
mod confined_fs;
mod cpu_cgroup;
mod instance;
pub mod node_config;
mod pod_folder;

pub use instance::PierInstance;
