//! Packet capture in the format Wireshark and tcpdump read for vsock.
//!
//! Linux's `vsockmon` device captures vsock traffic as pcap link type
//! `LINKTYPE_VSOCK` (271), and Wireshark's `vsock` dissector decodes it. A
//! capture in the same format opens in those tools with nothing to
//! configure, so this module writes exactly that: the classic pcap file
//! header, then one record per packet, each record being
//!
//! ```text
//!  pcap record header (16)  timestamp, captured length, original length
//!  af_vsockmon_hdr    (32)  src/dst CID and port, monitor op, transport = virtio, 44
//!  virtio header      (44)  the packet's own header, as it travels
//!  payload                  up to the snap length
//! ```
//!
//! The monitor op groups the virtio ops the way Linux's
//! `virtio_transport_build_skb` does ([`MonitorOp::from_virtio`]).
//!
//! Only the encoding lives here, so it stays `no_std` and runs anywhere a
//! stack runs. Where the bytes go is a [`PcapSink`]'s business: a `Vec<u8>`
//! in tests, a bounded queue to a writer thread in pier's device (which
//! must never block the data path, so it may refuse a record). A sink takes
//! a record whole or not at all, so a capture that dropped records is
//! still a valid file. [`PcapWriter`] is also a [`Middleware`], so the
//! loopback harness can record what passes between its two stacks.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use super::{Middleware, Side, Verdict};
use crate::time::Instant;
use crate::wire::{HEADER_LEN, Op, RawHeader};

/// The pcap link type of Linux vsockmon captures.
pub const LINKTYPE_VSOCK: u32 = 271;
/// Size of `struct af_vsockmon_hdr`, in front of the virtio header.
pub const VSOCKMON_HEADER_LEN: usize = 32;
/// `AF_VSOCK_TRANSPORT_VIRTIO`: the transport header that follows is
/// virtio's 44 bytes.
pub const TRANSPORT_VIRTIO: u16 = 2;
/// Size of the pcap file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Size of a pcap record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Bytes in front of a record's payload: record header, vsockmon header,
/// virtio header.
pub const RECORD_PREFIX_LEN: usize = RECORD_HEADER_LEN + VSOCKMON_HEADER_LEN + HEADER_LEN;
/// The smallest snap length: both headers of every packet, so that a short
/// snap length only ever cuts payload.
pub const MIN_SNAPLEN: u32 = (VSOCKMON_HEADER_LEN + HEADER_LEN) as u32;
/// tcpdump's default snap length, and the largest Wireshark accepts for
/// this link type; more than a 64 KiB packet with its headers.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// Microsecond-resolution pcap, written in this order: readers take the
/// byte order from how this magic number reads.
const PCAP_MAGIC: u32 = 0xa1b2_c3d4;

/// `enum af_vsockmon_op`: the monitor's coarse view of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum MonitorOp {
    /// An op the monitor has no group for (INVALID, or unknown).
    Unknown = 0,
    /// REQUEST or RESPONSE.
    Connect = 1,
    /// RST or SHUTDOWN.
    Disconnect = 2,
    /// CREDIT_UPDATE or CREDIT_REQUEST.
    Control = 3,
    /// RW.
    Payload = 4,
}

impl MonitorOp {
    /// The group Linux's `virtio_transport_build_skb` puts a virtio op in.
    pub const fn from_virtio(op: u16) -> Self {
        match Op::from_raw(op) {
            Some(Op::Request | Op::Response) => Self::Connect,
            Some(Op::Rst | Op::Shutdown) => Self::Disconnect,
            Some(Op::Rw) => Self::Payload,
            Some(Op::CreditUpdate | Op::CreditRequest) => Self::Control,
            Some(Op::Invalid) | None => Self::Unknown,
        }
    }
}

/// The pcap file header for a capture of `snaplen` bytes per record.
pub fn file_header(snaplen: u32) -> [u8; FILE_HEADER_LEN] {
    let mut out = [0u8; FILE_HEADER_LEN];
    out[0..4].copy_from_slice(&PCAP_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&2u16.to_le_bytes()); // version 2.4
    out[6..8].copy_from_slice(&4u16.to_le_bytes());
    // Bytes 8..16: time zone offset and accuracy, both 0 by convention.
    out[16..20].copy_from_slice(&snaplen.to_le_bytes());
    out[20..24].copy_from_slice(&LINKTYPE_VSOCK.to_le_bytes());
    out
}

/// `struct af_vsockmon_hdr` for a packet with `header`.
pub fn vsockmon_header(header: &RawHeader) -> [u8; VSOCKMON_HEADER_LEN] {
    let mut out = [0u8; VSOCKMON_HEADER_LEN];
    out[0..8].copy_from_slice(&header.src_cid.to_le_bytes());
    out[8..16].copy_from_slice(&header.dst_cid.to_le_bytes());
    out[16..20].copy_from_slice(&header.src_port.to_le_bytes());
    out[20..24].copy_from_slice(&header.dst_port.to_le_bytes());
    out[24..26].copy_from_slice(&(MonitorOp::from_virtio(header.op) as u16).to_le_bytes());
    out[26..28].copy_from_slice(&TRANSPORT_VIRTIO.to_le_bytes());
    out[28..30].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    // Bytes 30..32 are reserved and stay zero.
    out
}

/// Everything of one record but its payload, and how much of the payload
/// the snap length keeps.
pub fn record_prefix(
    timestamp: Instant,
    header: &RawHeader,
    payload_len: usize,
    snaplen: u32,
) -> ([u8; RECORD_PREFIX_LEN], usize) {
    let original = (VSOCKMON_HEADER_LEN + HEADER_LEN).saturating_add(payload_len);
    let original = u32::try_from(original).unwrap_or(u32::MAX);
    let captured = original.min(snaplen.max(MIN_SNAPLEN));
    let micros = timestamp.total_micros();
    // The classic format's seconds field is 32 bits: good until 2106.
    let seconds = (micros / 1_000_000) as u32;
    let fraction = (micros % 1_000_000) as u32;
    let mut out = [0u8; RECORD_PREFIX_LEN];
    out[0..4].copy_from_slice(&seconds.to_le_bytes());
    out[4..8].copy_from_slice(&fraction.to_le_bytes());
    out[8..12].copy_from_slice(&captured.to_le_bytes());
    out[12..16].copy_from_slice(&original.to_le_bytes());
    out[RECORD_HEADER_LEN..RECORD_HEADER_LEN + VSOCKMON_HEADER_LEN]
        .copy_from_slice(&vsockmon_header(header));
    out[RECORD_HEADER_LEN + VSOCKMON_HEADER_LEN..].copy_from_slice(&header.encode());
    (out, captured as usize - (VSOCKMON_HEADER_LEN + HEADER_LEN))
}

/// Where a capture's bytes go.
pub trait PcapSink {
    /// The file header, once, before any record. A sink must take it.
    fn begin(&mut self, file_header: &[u8]);

    /// One record: `prefix` (record, vsockmon and virtio headers) then
    /// `payload`. Takes both, or neither and returns `false` (no room):
    /// a record is never cut, so the file stays readable.
    fn record(&mut self, prefix: &[u8], payload: &[u8]) -> bool;
}

/// A sink in memory that takes everything: for tests and the loopback.
impl PcapSink for Vec<u8> {
    fn begin(&mut self, file_header: &[u8]) {
        self.extend_from_slice(file_header);
    }

    fn record(&mut self, prefix: &[u8], payload: &[u8]) -> bool {
        self.extend_from_slice(prefix);
        self.extend_from_slice(payload);
        true
    }
}

/// A sink shared with whoever reads it, for a writer handed to the
/// loopback harness (which owns its middleware).
impl<S: PcapSink> PcapSink for Rc<RefCell<S>> {
    fn begin(&mut self, file_header: &[u8]) {
        self.borrow_mut().begin(file_header);
    }

    fn record(&mut self, prefix: &[u8], payload: &[u8]) -> bool {
        self.borrow_mut().record(prefix, payload)
    }
}

/// Writes packets as pcap records into a [`PcapSink`]; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct PcapWriter<S: PcapSink> {
    sink: S,
    snaplen: u32,
}

impl<S: PcapSink> PcapWriter<S> {
    /// Starts a capture into `sink`, keeping at most `snaplen` bytes of
    /// each packet (vsockmon header included; raised to [`MIN_SNAPLEN`]
    /// so that headers are never cut).
    pub fn new(mut sink: S, snaplen: u32) -> Self {
        let snaplen = snaplen.max(MIN_SNAPLEN);
        sink.begin(&file_header(snaplen));
        Self { sink, snaplen }
    }

    /// The snap length in force.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Records one packet seen at `timestamp` (microseconds since the Unix
    /// epoch for a wall-clock capture). Returns whether the sink took it.
    pub fn packet(&mut self, timestamp: Instant, header: &RawHeader, payload: &[u8]) -> bool {
        let (prefix, kept) = record_prefix(timestamp, header, payload.len(), self.snaplen);
        self.sink.record(&prefix, &payload[..kept])
    }

    /// Records an encoded frame (header, then payload). A frame too short
    /// for a header is not a packet and is not recorded.
    pub fn frame(&mut self, timestamp: Instant, frame: &[u8]) -> bool {
        match RawHeader::parse(frame) {
            Ok(header) => self.packet(timestamp, &header, &frame[HEADER_LEN..]),
            Err(_) => false,
        }
    }

    /// The sink, to look at what was written.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Ends the capture and hands back the sink.
    pub fn into_sink(self) -> S {
        self.sink
    }
}

/// Records every frame between the two stacks, and passes it on unchanged.
impl<S: PcapSink> Middleware for PcapWriter<S> {
    fn on_frame(&mut self, _from: Side, now: Instant, frame: &mut Vec<u8>) -> Verdict {
        self.frame(now, frame);
        Verdict::Pass
    }
}
