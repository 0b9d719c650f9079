//! Integration tests for pier-device, in one binary to keep link time down.

mod bus_neutral;
mod common;
mod conformance;
mod hal;
mod hostile;
mod registers;
mod transport;
mod walk;
