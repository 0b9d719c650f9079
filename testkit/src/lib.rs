//! What pier's tests, benchmarks and `cargo xtask` share: the builds of
//! the guests and images, the programs from outside Rust the tests need,
//! the processes they run against (QEMU, vhost-user backends, a private
//! containerd), and the test data both ends of a connection agree on.
//!
//! It is a dev-dependency of the product crates and a dependency of
//! xtask, which keeps only the commands. It depends on nothing of pier's
//! but pier-client (no pier-stack), so pier-stack's own tests and
//! benchmarks use it without building pier-stack twice.
//!
//! The modules:
//!
//! - [`workspace`]: the checkout's root, target and cache folders, its
//!   `cargo`, and running a command with its output shown or kept for the
//!   error;
//! - [`targets`]: builds for the other targets (the guest components for
//!   `wasm32-wasip2`, the unikernel images and the `no_std` check for
//!   `x86_64-unknown-none`), adding a missing Rust target first;
//! - [`tools`]: the programs from outside Rust (tshark, QEMU, socat,
//!   containerd, protoc, vhost-device-vsock), installed when missing;
//! - [`qemu`]: a unikernel image under QEMU's microvm with a vhost-user
//!   vsock backend, the cross-check against the world's vsock stack;
//! - [`linux_guest`]: the Linux test guest (Debian's kernel and an
//!   initramfs with `guest-linux/vsock-test`);
//! - [`linux_vm`]: that guest under QEMU, and the vhost-user backend
//!   process (`pier vhost-user` or `vhost-device-vsock`) serving it;
//! - [`kernel_vsock_test`]: the guest that runs Linux's own `vsock_test`
//!   (built from Debian's kernel source) against a sibling guest;
//! - [`containerd`]: building `containerd-shim-pier-v1`, and a containerd
//!   of the tests' own that runs it;
//! - [`oci_image`]: a guest component packed as an OCI image archive;
//! - [`registry`]: a read-only OCI registry on loopback serving those
//!   images, for pulls;
//! - [`bench`]: the JSON lines benchmarks record for `cargo xtask bench`,
//!   written and read back, and the quick-mode switch;
//! - [`pattern`]: deterministic test data (xorshift64*, xorshift32) and
//!   its checksum (FNV-1a);
//! - `json`: JSON strings for the documents written by hand.
//!
//! What nearly every test calls is also here at the top:
//! [`build_guest_components`], [`build_guest_image`], [`cache_dir`] and
//! their kin.

pub mod bench;
pub mod containerd;
mod json;
pub mod kernel_vsock_test;
pub mod linux_guest;
pub mod linux_vm;
pub mod oci_image;
pub mod pattern;
pub mod qemu;
pub mod registry;
pub mod targets;
pub mod tools;
pub mod workspace;

pub use targets::{
    BARE_METAL_TARGET, WASI_0_3_APPS, WASM_TARGET, build_bare_metal, build_guest_components,
    build_guest_image, built_guest_components, ensure_target, guest_component,
};
pub use workspace::{Output, cache_dir, cargo, repo_root, run, run_visibly, target_dir};
