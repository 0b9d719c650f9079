//! The hybrid vsock bridge against real Unix sockets: host programs are
//! this test's threads, the guest is a second stack behind a loopback, and
//! the bridge runs in a loop shaped like the device's (see `driver.rs`).
//! One binary, to keep link time down.

mod apps;
mod datagram;
mod driver;
mod host;
mod limits;
mod seqpacket;
mod setup;
mod stream;
