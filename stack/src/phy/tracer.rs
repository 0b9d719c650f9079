//! A middleware that reports every frame, one line each.
//!
//! A trace of a connection reads top to bottom like the protocol chapter
//! of the virtio spec: REQUEST, RESPONSE, RW with the credit each side
//! advertises, SHUTDOWN, RST.

use core::fmt;

use super::{Middleware, Side, Verdict};
use crate::time::Instant;
use crate::wire::{self, DecodeError, Header};
use alloc::vec::Vec;

/// One observed frame.
#[derive(Clone, Copy, Debug)]
pub struct TraceEvent {
    /// The stack that sent the frame.
    pub from: Side,
    /// Its header, or why it does not decode (after a fault injector, say).
    pub packet: Result<Header, DecodeError>,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arrow = match self.from {
            Side::A => "A -> B",
            Side::B => "B -> A",
        };
        match &self.packet {
            Ok(header) => write!(f, "{arrow}  {header}"),
            Err(err) => write!(f, "{arrow}  undecodable: {err}"),
        }
    }
}

/// Calls `sink` for every frame; passes every frame on unchanged.
pub struct Tracer<F: FnMut(&TraceEvent)> {
    sink: F,
}

impl<F: FnMut(&TraceEvent)> Tracer<F> {
    /// A tracer that gives `sink` every frame, for printing or collecting.
    pub fn new(sink: F) -> Self {
        Self { sink }
    }
}

impl<F: FnMut(&TraceEvent)> fmt::Debug for Tracer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tracer")
    }
}

impl<F: FnMut(&TraceEvent)> Middleware for Tracer<F> {
    fn on_frame(&mut self, from: Side, _now: Instant, frame: &mut Vec<u8>) -> Verdict {
        let packet = wire::decode(frame).map(|(header, _)| header);
        (self.sink)(&TraceEvent { from, packet });
        Verdict::Pass
    }
}
