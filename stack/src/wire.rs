//! The virtio-vsock packet header (virtio spec §5.10.6).
//!
//! Every packet on the rx and tx virtqueues starts with a fixed 44-byte,
//! packed, little-endian header, followed by `len` bytes of payload. This
//! module turns bytes into a [`Header`] and back. Decoding is total: it never
//! panics, and every way in which input can be short or inconsistent has its
//! own [`DecodeError`] variant, so that the stack can count it and, where the
//! protocol asks for it, answer with an RST.
//!
//! Two layers exist on purpose. [`RawHeader`] holds the fields as integers
//! exactly as they travel, so that a packet with an unknown `type` or `op`
//! can still be answered (the spec requires an RST that echoes the type).
//! [`Header`] is the checked form the rest of the stack works with.

use core::fmt;

use crate::addr::VsockAddr;

/// Size of the header on the wire.
pub const HEADER_LEN: usize = 44;

/// Largest payload one packet may carry. Linux's vhost drops larger tx
/// packets, so senders split writes at this size.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// The `type` field: which socket type a packet belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum SocketType {
    /// SOCK_STREAM: a connection carrying a byte stream.
    Stream = 1,
    /// SOCK_SEQPACKET: a connection carrying messages with their boundaries.
    SeqPacket = 2,
    /// Datagrams, from the unmerged virtio-vsock datagram RFC (feature bit 3).
    Datagram = 3,
}

impl SocketType {
    /// The type a `type` field names, or `None` for a type the stack does
    /// not know (which the spec answers with an RST that echoes it).
    pub const fn from_raw(raw: u16) -> Option<Self> {
        match raw {
            1 => Some(Self::Stream),
            2 => Some(Self::SeqPacket),
            3 => Some(Self::Datagram),
            _ => None,
        }
    }

    /// Stream and seqpacket sockets have connections, credit and RSTs;
    /// datagrams have none of these.
    pub const fn is_connectible(self) -> bool {
        !matches!(self, Self::Datagram)
    }
}

/// The `op` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Op {
    /// Never valid on the wire; a connecting socket ignores it (as Linux does).
    Invalid = 0,
    /// Asks to connect: sent by `connect` to a listener's port.
    Request = 1,
    /// Accepts a REQUEST: the connection is established.
    Response = 2,
    /// Ends a connection at once, or refuses one; never answered.
    Rst = 3,
    /// The sender stops receiving and/or sending (see [`shutdown_flags`]).
    Shutdown = 4,
    /// Payload: stream bytes, part of a seqpacket message, or a datagram.
    Rw = 5,
    /// Carries only credit: the receiver's `buf_alloc` and `fwd_cnt` moved.
    CreditUpdate = 6,
    /// Asks the peer for a CREDIT_UPDATE.
    CreditRequest = 7,
}

impl Op {
    /// The op an `op` field names, or `None` for an unknown one (answered
    /// with an RST, unless it came on an RST or a datagram).
    pub const fn from_raw(raw: u16) -> Option<Self> {
        match raw {
            0 => Some(Self::Invalid),
            1 => Some(Self::Request),
            2 => Some(Self::Response),
            3 => Some(Self::Rst),
            4 => Some(Self::Shutdown),
            5 => Some(Self::Rw),
            6 => Some(Self::CreditUpdate),
            7 => Some(Self::CreditRequest),
            _ => None,
        }
    }
}

/// `flags` bits of a SHUTDOWN packet: the sender will receive no more (RCV)
/// or send no more (SEND). They accumulate; a later packet never clears one.
pub mod shutdown_flags {
    /// The sender will receive no more.
    pub const RCV: u32 = 1;
    /// The sender will send no more.
    pub const SEND: u32 = 2;
    /// Both directions: once a side has sent both, the connection ends
    /// with an RST.
    pub const BOTH: u32 = RCV | SEND;
}

/// `flags` bits of a seqpacket RW packet.
pub mod seq_flags {
    /// Last packet of a message.
    pub const EOM: u32 = 1;
    /// Last packet of a record (sent with `MSG_EOR`); only set together with EOM.
    pub const EOR: u32 = 2;
}

/// The header fields exactly as they travel, without any validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawHeader {
    /// The sender's CID; 64 bits on the wire, of which a valid CID uses 32.
    pub src_cid: u64,
    /// The receiver's CID.
    pub dst_cid: u64,
    /// The sender's port.
    pub src_port: u32,
    /// The receiver's port.
    pub dst_port: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// The socket type, as a number: unknown ones must still be echoed.
    pub type_: u16,
    /// The op, as a number.
    pub op: u16,
    /// SHUTDOWN or seqpacket RW flags; 0 for other ops.
    pub flags: u32,
    /// The sender's receive buffer size (credit).
    pub buf_alloc: u32,
    /// Payload bytes the sender's application has consumed, free-running.
    pub fwd_cnt: u32,
}

/// A checked header: the type and op are known values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sender's CID; 64 bits on the wire, of which a valid CID uses 32.
    pub src_cid: u64,
    /// The receiver's CID.
    pub dst_cid: u64,
    /// The sender's port.
    pub src_port: u32,
    /// The receiver's port.
    pub dst_port: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// Which socket type the packet belongs to.
    pub socket_type: SocketType,
    /// What the packet does.
    pub op: Op,
    /// SHUTDOWN flags ([`shutdown_flags`]) or seqpacket RW flags ([`seq_flags`]); 0 otherwise.
    pub flags: u32,
    /// The sender's receive buffer size (credit), valid on every packet.
    pub buf_alloc: u32,
    /// Payload bytes the sender's application has consumed, free-running.
    pub fwd_cnt: u32,
}

/// Why bytes could not be decoded into a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer than 44 bytes.
    Truncated {
        /// Bytes there were.
        available: usize,
    },
    /// `len` claims more payload than the buffer holds.
    LengthMismatch {
        /// The header's `len`.
        declared: u32,
        /// Payload bytes there were.
        available: usize,
    },
    /// `len` is larger than the 64 KiB packet limit.
    PayloadTooLarge {
        /// The header's `len`.
        declared: u32,
    },
    /// The `type` field is not stream, seqpacket or datagram.
    UnknownType {
        /// The header as it came, to answer with an RST that echoes its type.
        header: RawHeader,
    },
    /// The `op` field is not one of the eight defined ops.
    UnknownOp {
        /// The header as it came, to answer with an RST.
        header: RawHeader,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { available } => {
                write!(f, "packet of {available} bytes is shorter than the 44-byte header")
            }
            Self::LengthMismatch { declared, available } => write!(
                f,
                "header declares {declared} payload bytes but only {available} are present"
            ),
            Self::PayloadTooLarge { declared } => {
                write!(f, "header declares {declared} payload bytes, over the 64 KiB limit")
            }
            Self::UnknownType { header } => write!(f, "unknown socket type {}", header.type_),
            Self::UnknownOp { header } => write!(f, "unknown op {}", header.op),
        }
    }
}

impl core::error::Error for DecodeError {}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut v = [0; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}
fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl RawHeader {
    /// Reads the 44 header bytes; fails only when fewer are present.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated { available: bytes.len() });
        }
        Ok(Self {
            src_cid: le_u64(bytes, 0),
            dst_cid: le_u64(bytes, 8),
            src_port: le_u32(bytes, 16),
            dst_port: le_u32(bytes, 20),
            len: le_u32(bytes, 24),
            type_: le_u16(bytes, 28),
            op: le_u16(bytes, 30),
            flags: le_u32(bytes, 32),
            buf_alloc: le_u32(bytes, 36),
            fwd_cnt: le_u32(bytes, 40),
        })
    }

    /// The RST that answers `received`: the addresses swapped, the type
    /// echoed (even a type this stack does not know, as the spec asks), no
    /// payload and no credit. Answering an RST with this is the caller's
    /// mistake to avoid: an RST never draws an RST.
    pub const fn rst_reply(received: &RawHeader) -> Self {
        Self {
            src_cid: received.dst_cid,
            dst_cid: received.src_cid,
            src_port: received.dst_port,
            dst_port: received.src_port,
            len: 0,
            type_: received.type_,
            op: Op::Rst as u16,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        }
    }

    /// The 44 bytes as they travel, little-endian.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        out[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        out[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        out[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        out[24..28].copy_from_slice(&self.len.to_le_bytes());
        out[28..30].copy_from_slice(&self.type_.to_le_bytes());
        out[30..32].copy_from_slice(&self.op.to_le_bytes());
        out[32..36].copy_from_slice(&self.flags.to_le_bytes());
        out[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        out[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        out
    }

    /// Checks the type and op. Length checks need the payload and live in
    /// [`decode`].
    pub fn check(self) -> Result<Header, DecodeError> {
        let Some(socket_type) = SocketType::from_raw(self.type_) else {
            return Err(DecodeError::UnknownType { header: self });
        };
        let Some(op) = Op::from_raw(self.op) else {
            return Err(DecodeError::UnknownOp { header: self });
        };
        Ok(Header {
            src_cid: self.src_cid,
            dst_cid: self.dst_cid,
            src_port: self.src_port,
            dst_port: self.dst_port,
            len: self.len,
            socket_type,
            op,
            flags: self.flags,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt,
        })
    }
}

impl Header {
    /// A packet from `src` to `dst` with no payload, no flags and no
    /// credit; the `with_*` methods fill in the rest. Every header the
    /// stack sends is built here or by [`Header::datagram`] (and replies by
    /// [`RawHeader::rst_reply`]), so the field order lives in one place.
    pub const fn new(socket_type: SocketType, op: Op, src: VsockAddr, dst: VsockAddr) -> Self {
        Self {
            src_cid: src.cid as u64,
            dst_cid: dst.cid as u64,
            src_port: src.port,
            dst_port: dst.port,
            len: 0,
            socket_type,
            op,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        }
    }

    /// One datagram of `len` bytes: an RW packet without credit, since
    /// datagrams have none (the datagram RFC leaves both fields zero).
    pub const fn datagram(src: VsockAddr, dst: VsockAddr, len: u32) -> Self {
        Self::new(SocketType::Datagram, Op::Rw, src, dst).with_len(len)
    }

    /// The same header carrying `len` bytes of payload.
    pub const fn with_len(mut self, len: u32) -> Self {
        self.len = len;
        self
    }

    /// The same header with `flags` (SHUTDOWN or seqpacket RW bits).
    pub const fn with_flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }

    /// The same header advertising the sender's credit: its receive
    /// buffer size and the payload bytes its application has consumed.
    pub const fn with_credit(mut self, buf_alloc: u32, fwd_cnt: u32) -> Self {
        self.buf_alloc = buf_alloc;
        self.fwd_cnt = fwd_cnt;
        self
    }

    /// The fields as integers, as a [`crate::TxSink`] receives them.
    pub fn to_raw(&self) -> RawHeader {
        RawHeader {
            src_cid: self.src_cid,
            dst_cid: self.dst_cid,
            src_port: self.src_port,
            dst_port: self.dst_port,
            len: self.len,
            type_: self.socket_type as u16,
            op: self.op as u16,
            flags: self.flags,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// The 44 bytes as they travel, little-endian.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        self.to_raw().encode()
    }

    /// `len` as a buffer length.
    pub fn payload_len(&self) -> usize {
        self.len as usize
    }
}

/// Splits one received buffer into its header and payload.
///
/// Only `len` bytes after the header are payload; a device may hand over a
/// longer buffer (the rest is slack), never a shorter one.
pub fn decode(bytes: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
    let raw = RawHeader::parse(bytes)?;
    let available = bytes.len() - HEADER_LEN;
    if raw.len as usize > MAX_PAYLOAD {
        return Err(DecodeError::PayloadTooLarge { declared: raw.len });
    }
    if raw.len as usize > available {
        return Err(DecodeError::LengthMismatch { declared: raw.len, available });
    }
    let header = raw.check()?;
    Ok((header, &bytes[HEADER_LEN..HEADER_LEN + raw.len as usize]))
}

impl fmt::Display for Header {
    /// One line per packet, in the order a reader follows a trace:
    /// who talks to whom, what it is, and the credit it advertises.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match self.socket_type {
            SocketType::Stream => "stream",
            SocketType::SeqPacket => "seqpacket",
            SocketType::Datagram => "dgram",
        };
        let op = match self.op {
            Op::Invalid => "INVALID",
            Op::Request => "REQUEST",
            Op::Response => "RESPONSE",
            Op::Rst => "RST",
            Op::Shutdown => "SHUTDOWN",
            Op::Rw => "RW",
            Op::CreditUpdate => "CREDIT_UPDATE",
            Op::CreditRequest => "CREDIT_REQUEST",
        };
        write!(
            f,
            "{}:{} > {}:{} {ty} {op}",
            self.src_cid, self.src_port, self.dst_cid, self.dst_port
        )?;
        if self.len > 0 {
            write!(f, " len={}", self.len)?;
        }
        if self.flags != 0 {
            match (self.op, self.socket_type) {
                (Op::Shutdown, _) => {
                    let rcv = self.flags & shutdown_flags::RCV != 0;
                    let send = self.flags & shutdown_flags::SEND != 0;
                    write!(
                        f,
                        " flags={}{}",
                        if rcv { "RCV" } else { "" },
                        if send { if rcv { "|SEND" } else { "SEND" } } else { "" }
                    )?;
                }
                (Op::Rw, SocketType::SeqPacket) => {
                    let eom = self.flags & seq_flags::EOM != 0;
                    let eor = self.flags & seq_flags::EOR != 0;
                    write!(
                        f,
                        " flags={}{}",
                        if eom { "EOM" } else { "" },
                        if eor { "|EOR" } else { "" }
                    )?;
                }
                _ => write!(f, " flags={:#x}", self.flags)?,
            }
        }
        write!(f, " buf_alloc={} fwd_cnt={}", self.buf_alloc, self.fwd_cnt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 1025,
            dst_port: 1234,
            len: 5,
            socket_type: SocketType::Stream,
            op: Op::Rw,
            flags: 0,
            buf_alloc: 262_144,
            fwd_cnt: 7,
        }
    }

    #[test]
    fn round_trips_and_matches_the_spec_layout() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(&bytes[0..8], &3u64.to_le_bytes());
        assert_eq!(&bytes[16..20], &1025u32.to_le_bytes());
        assert_eq!(&bytes[28..30], &1u16.to_le_bytes());
        assert_eq!(&bytes[30..32], &5u16.to_le_bytes());
        let mut frame = bytes.to_vec();
        frame.extend_from_slice(b"hello slack");
        let (back, payload) = decode(&frame).unwrap();
        assert_eq!(back, h);
        assert_eq!(payload, b"hello");
    }

    #[test]
    fn rejects_short_and_inconsistent_input() {
        assert_eq!(decode(&[0u8; 43]), Err(DecodeError::Truncated { available: 43 }));
        let h = sample();
        let frame = h.encode();
        assert_eq!(decode(&frame), Err(DecodeError::LengthMismatch { declared: 5, available: 0 }));
        let mut big = h;
        big.len = 70_000;
        assert_eq!(decode(&big.encode()), Err(DecodeError::PayloadTooLarge { declared: 70_000 }));
        let mut raw = h.to_raw();
        raw.len = 0;
        raw.type_ = 9;
        assert!(matches!(decode(&raw.encode()), Err(DecodeError::UnknownType { .. })));
        raw.type_ = 1;
        raw.op = 8;
        assert!(matches!(decode(&raw.encode()), Err(DecodeError::UnknownOp { .. })));
    }

    #[test]
    fn constructors_fill_every_field() {
        let a = VsockAddr::new(3, 1025);
        let b = VsockAddr::new(2, 1234);
        let h = Header::new(SocketType::Stream, Op::Rw, a, b).with_len(5).with_credit(262_144, 7);
        assert_eq!(h, sample());
        let d = Header::datagram(a, b, 9);
        assert_eq!(
            (d.socket_type, d.op, d.len, d.buf_alloc, d.fwd_cnt),
            (SocketType::Datagram, Op::Rw, 9, 0, 0)
        );
        let mut unknown = h.with_flags(1).to_raw();
        unknown.type_ = 9;
        let rst = RawHeader::rst_reply(&unknown);
        assert_eq!((rst.src_cid, rst.src_port, rst.dst_cid, rst.dst_port), (2, 1234, 3, 1025));
        assert_eq!((rst.type_, rst.op, rst.len, rst.flags), (9, Op::Rst as u16, 0, 0));
        assert_eq!((rst.buf_alloc, rst.fwd_cnt), (0, 0));
    }

    #[test]
    fn display_reads_like_a_trace_line() {
        let mut h = sample();
        h.socket_type = SocketType::SeqPacket;
        h.flags = seq_flags::EOM | seq_flags::EOR;
        let line = alloc::format!("{h}");
        assert_eq!(
            line,
            "3:1025 > 2:1234 seqpacket RW len=5 flags=EOM|EOR buf_alloc=262144 fwd_cnt=7"
        );
    }
}
