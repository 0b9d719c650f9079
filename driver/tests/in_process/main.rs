//! pier-driver's own tests, against pier-device's device model through the
//! in-process transport: the real driver publishing real descriptors in
//! DMA memory that the real device parses, in one thread, so every kick,
//! interrupt and ring index can be counted. One test binary, to keep link
//! time down.

mod common;
mod interrupts;
mod kicks;
mod layout;
mod lending;
mod negotiation;
mod refill;
mod reset;
mod send_in_place;
mod wrap;
