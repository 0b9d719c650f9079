//! Harnesses for pier-device's own tests and benchmarks, and for anyone
//! who wants to drive the device model by hand (enabled by the `testing`
//! feature; not part of the device model itself):
//!
//! - [`testbed`]: a guest and a device in one thread, stepped by the test;
//! - [`apps`]: tiny guest-side applications (echo, sink, source) written
//!   against the stack's non-blocking calls;
//! - [`pcap`]: captures read back through tshark, for tests of
//!   `pier run --pcap` here and in the CLI;
//! - [`walk`]: the virtqueue walkthrough, one step at a time with the
//!   rings after each (`cargo run -p pier-device --example virtqueue_walk`).

pub mod apps;
pub mod pcap;
pub mod testbed;
pub mod walk;

pub use testbed::Testbed;
