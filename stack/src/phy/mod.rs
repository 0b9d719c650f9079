//! Plumbing that connects stacks without a device: for tests, benchmarks
//! and learning.
//!
//! A real pier stack sits on a virtio driver. Here, [`Loopback`] stands in
//! for the driver and device of *two* stacks and wires them back to back:
//! whatever stack A dispatches, stack B receives as one batch, and the
//! other way round. It owns the clock too, so a test can jump forward eight
//! seconds to watch a close timer fire.
//!
//! Between the two stacks, [`Middleware`] can watch or tamper with every
//! frame, in the spirit of smoltcp's `phy` wrappers:
//!
//! - [`Tracer`] prints each packet as one line, the way a learner wants to
//!   read a protocol exchange;
//! - [`FaultInjector`] drops, corrupts, truncates and duplicates frames
//!   from a seed, to show the stacks survive hostile input;
//! - [`PcapWriter`] records every frame as Linux vsockmon does, so
//!   Wireshark and tshark can decode a test's exchange (the same encoding
//!   serves pier's device for `pier run --pcap`).
//!
//! Without middleware, packets are handed straight from A's transmit sink
//! into B's receive batch (no framing, no extra copy), which is what the
//! throughput benchmark measures. With middleware, each packet is encoded
//! into a frame, passed through the chain, and decoded on arrival, like on a
//! real wire.

mod fault;
mod pcap;
mod tracer;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::convert::Infallible;
use core::time::Duration;

use crate::config::Config;
use crate::readiness::WakeList;
use crate::time::Instant;
use crate::wire::{HEADER_LEN, RawHeader};
use crate::{Error, InPlace, Result, SinkFull, SocketHandle, Stack};

pub use fault::{FaultConfig, FaultCounts, FaultInjector};
pub use pcap::{
    DEFAULT_SNAPLEN, FILE_HEADER_LEN, LINKTYPE_VSOCK, MIN_SNAPLEN, MonitorOp, PcapSink, PcapWriter,
    RECORD_HEADER_LEN, RECORD_PREFIX_LEN, TRANSPORT_VIRTIO, VSOCKMON_HEADER_LEN, file_header,
    record_prefix, vsockmon_header,
};
pub use tracer::{TraceEvent, Tracer};

/// Which stack sent a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The first stack, [`Loopback::a`] (the guest in [`Loopback::guest_and_host`]).
    A,
    /// The second stack, [`Loopback::b`] (the host in [`Loopback::guest_and_host`]).
    B,
}

impl Side {
    /// The other side: where a frame from `self` goes.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// What a middleware decided about one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver the frame (as the middleware left it).
    Pass,
    /// Lose the frame, as a wire that drops it would.
    Drop,
    /// Deliver the frame twice.
    Duplicate,
}

/// Sees every frame between the two stacks and may change it.
///
/// `frame` is the encoded packet: the 44-byte header, then the payload. A
/// middleware may rewrite or truncate it.
pub trait Middleware {
    /// Sees one frame sent by `from` at `now` (the harness's clock); may
    /// change it in place, and says whether it is delivered.
    fn on_frame(&mut self, from: Side, now: Instant, frame: &mut Vec<u8>) -> Verdict;
}

/// Two stacks wired back to back, with a shared clock.
pub struct Loopback {
    /// Side A's stack; call its socket API directly.
    pub a: Stack,
    /// Side B's stack.
    pub b: Stack,
    now: Instant,
    a_to_b: VecDeque<Vec<u8>>,
    b_to_a: VecDeque<Vec<u8>>,
    spare_frames: Vec<Vec<u8>>,
    middleware: Vec<Box<dyn Middleware>>,
    /// Returns how many frames the next receive batch may hold.
    batch_sizes: Option<Box<dyn FnMut() -> usize>>,
    /// Most packets a stack may dispatch per step; more get `SinkFull`.
    tx_capacity: usize,
    wakes: WakeList,
}

impl core::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Loopback")
            .field("a", &self.a)
            .field("b", &self.b)
            .field("now", &self.now)
            .field("in_flight", &(self.a_to_b.len() + self.b_to_a.len()))
            .finish_non_exhaustive()
    }
}

/// Most steps `run` takes before it decides the stacks will never go quiet.
const RUN_STEP_LIMIT: usize = 1_000_000;

impl Loopback {
    /// Two stacks made from `a` and `b`, wired to each other, with the clock
    /// at zero and nothing in between.
    pub fn new(a: Config, b: Config) -> Self {
        Self {
            a: Stack::new(a),
            b: Stack::new(b),
            now: Instant::ZERO,
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            spare_frames: Vec::new(),
            middleware: Vec::new(),
            batch_sizes: None,
            tx_capacity: usize::MAX,
            wakes: WakeList::new(),
        }
    }

    /// The usual pair: a guest at CID 3 and a host at CID 2.
    pub fn guest_and_host() -> Self {
        Self::new(Config::new(3), Config::new(2))
    }

    /// The shared clock: pass it to calls that take `now`.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The stack on `side`, for code that works on either.
    pub fn stack(&mut self, side: Side) -> &mut Stack {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Puts `middleware` between the stacks, after those added before it;
    /// from now on every frame is encoded, passed through the chain and
    /// decoded on arrival.
    pub fn add_middleware(&mut self, middleware: impl Middleware + 'static) {
        self.middleware.push(Box::new(middleware));
    }

    /// Splits arriving frames into receive batches of the sizes `sizes`
    /// returns (at least 1), instead of one batch per step.
    pub fn set_batch_sizes(&mut self, sizes: impl FnMut() -> usize + 'static) {
        self.batch_sizes = Some(Box::new(sizes));
    }

    /// Lets each stack dispatch at most `packets` per step, so the
    /// transmit path sees a full device.
    pub fn set_tx_capacity(&mut self, packets: usize) {
        self.tx_capacity = packets.max(1);
    }

    fn framed(&self) -> bool {
        !self.middleware.is_empty() || self.batch_sizes.is_some()
    }

    /// One round: each stack dispatches, and what it sent is received by
    /// the other. Returns the packets moved.
    pub fn step(&mut self) -> usize {
        let moved = if self.framed() { self.step_framed() } else { self.step_direct() };
        self.wakes.wake_all();
        moved
    }

    fn step_direct(&mut self) -> usize {
        let now = self.now;
        let mut moved = 0;
        for from in [Side::A, Side::B] {
            let (sender, receiver) = match from {
                Side::A => (&mut self.a, &mut self.b),
                Side::B => (&mut self.b, &mut self.a),
            };
            let mut budget = self.tx_capacity;
            let mut batch = receiver.rx_batch(now);
            let mut sink = |header: &RawHeader, payload: &[u8]| {
                if budget == 0 {
                    return Err(SinkFull);
                }
                budget -= 1;
                batch.receive_parts(header, payload);
                Ok(())
            };
            let mut sender_wakes = WakeList::new();
            moved += sender.dispatch(now, &mut sink, &mut sender_wakes);
            batch.finish(&mut self.wakes);
            sender_wakes.wake_all();
        }
        moved
    }

    fn step_framed(&mut self) -> usize {
        let now = self.now;
        let mut moved = 0;
        for from in [Side::A, Side::B] {
            let mut budget = self.tx_capacity;
            let (sender, queue, spare) = match from {
                Side::A => (&mut self.a, &mut self.a_to_b, &mut self.spare_frames),
                Side::B => (&mut self.b, &mut self.b_to_a, &mut self.spare_frames),
            };
            let mut sink = |header: &RawHeader, payload: &[u8]| {
                if budget == 0 {
                    return Err(SinkFull);
                }
                budget -= 1;
                queue.push_back(encode_frame(spare, header, payload));
                Ok(())
            };
            moved += sender.dispatch(now, &mut sink, &mut self.wakes);
        }
        for to in [Side::B, Side::A] {
            self.deliver_frames(to);
        }
        moved
    }

    fn deliver_frames(&mut self, to: Side) {
        let now = self.now;
        let from = to.peer();
        let mut queue = match from {
            Side::A => core::mem::take(&mut self.a_to_b),
            Side::B => core::mem::take(&mut self.b_to_a),
        };
        let mut passed: VecDeque<Vec<u8>> = VecDeque::with_capacity(queue.len());
        while let Some(mut frame) = queue.pop_front() {
            let mut verdict = Verdict::Pass;
            for m in &mut self.middleware {
                match m.on_frame(from, now, &mut frame) {
                    Verdict::Pass => {}
                    other => verdict = other,
                }
                if verdict == Verdict::Drop {
                    break;
                }
            }
            match verdict {
                Verdict::Pass => passed.push_back(frame),
                Verdict::Duplicate => {
                    passed.push_back(frame.clone());
                    passed.push_back(frame);
                }
                Verdict::Drop => self.spare_frames.push(frame),
            }
        }
        let receiver = match to {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        };
        while !passed.is_empty() {
            let size = self.batch_sizes.as_mut().map_or(usize::MAX, |f| f().max(1));
            let mut batch = receiver.rx_batch(now);
            for frame in passed.drain(..size.min(passed.len())) {
                batch.receive(&frame);
                self.spare_frames.push(frame);
            }
            batch.finish(&mut self.wakes);
        }
        match from {
            Side::A => self.a_to_b = queue,
            Side::B => self.b_to_a = queue,
        }
    }

    /// Sends stream bytes from `from`'s socket `h` as [`Stack::send`] does,
    /// but the way pier's virtio driver sends large writes
    /// ([`Stack::send_in_place`]): each packet the peer's credit allows goes
    /// from `data` straight to the other stack, skipping the send ring, so
    /// a byte is copied twice (into the peer's receive ring, out to its
    /// reader) instead of three times. What cannot go so, because bytes of
    /// the connection are queued ahead or the socket is not a stream, goes
    /// through [`Stack::send`].
    ///
    /// Without middleware the peer receives each packet at once. With
    /// middleware it is framed and queued behind what was dispatched before
    /// it, like any other. Under [`Loopback::set_tx_capacity`] everything
    /// goes through `send`, so the transmit path keeps seeing the full
    /// device the test asked for.
    pub fn send_in_place(&mut self, from: Side, h: SocketHandle, data: &[u8]) -> Result<usize> {
        if self.tx_capacity != usize::MAX {
            return self.stack(from).send(h, data);
        }
        let now = self.now;
        let framed = self.framed();
        let (sender, receiver, queue) = match from {
            Side::A => (&mut self.a, &mut self.b, &mut self.a_to_b),
            Side::B => (&mut self.b, &mut self.a, &mut self.b_to_a),
        };
        let mut batch = (!framed).then(|| receiver.rx_batch(now));
        let mut sent = 0;
        let mut failure = None;
        while sent < data.len() {
            let rest = &data[sent..];
            match sender.send_in_place(h, rest.len(), Ok::<_, Infallible>) {
                Ok(InPlace::Packet(header)) => {
                    let payload = &rest[..header.len as usize];
                    match batch.as_mut() {
                        Some(batch) => batch.receive_parts(&header, payload),
                        None => {
                            queue.push_back(encode_frame(&mut self.spare_frames, &header, payload))
                        }
                    }
                    sent += payload.len();
                }
                Ok(InPlace::Queued | InPlace::Empty) | Err(Error::NotSupported) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(batch) = batch {
            batch.finish(&mut self.wakes);
            self.wakes.wake_all();
        }
        sender.finish_in_place(h, data, sent, failure)
    }

    /// Steps until neither stack has anything to send. Returns the packets moved.
    pub fn run(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..RUN_STEP_LIMIT {
            let moved = self.step();
            total += moved;
            if moved == 0 && !self.a.has_pending_tx() && !self.b.has_pending_tx() {
                return total;
            }
        }
        panic!("the two stacks never went quiet after {RUN_STEP_LIMIT} steps");
    }

    /// Moves the clock forward, fires due timers on both stacks, and runs.
    pub fn advance(&mut self, by: Duration) -> usize {
        self.now = self.now + by;
        self.a.handle_timeout(self.now, &mut self.wakes);
        self.b.handle_timeout(self.now, &mut self.wakes);
        self.run()
    }
}

/// One packet as a frame on the harness's wire (the 44 header bytes, then
/// the payload), in a buffer a delivered frame left behind where there is
/// one, so framed traffic does not allocate per packet.
fn encode_frame(spare: &mut Vec<Vec<u8>>, header: &RawHeader, payload: &[u8]) -> Vec<u8> {
    let mut frame = spare.pop().unwrap_or_default();
    frame.clear();
    frame.reserve(HEADER_LEN + payload.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(payload);
    frame
}
