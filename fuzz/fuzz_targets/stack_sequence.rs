//! Fuzz target: a `pier_stack::Stack` fed packet sequences by a hostile
//! device, while its application and one honest peer go about their work.
//!
//! The stack (CID 3) has a stream listener on port 100, a seqpacket
//! listener on 101, a datagram socket on 102 and a catch-all stream
//! listener. Before the fuzzer's input is read, an honest peer at
//! (2, 7000) connects to port 100 and the application accepts it: this is
//! the *driven* connection. The input is then a script of steps: batches
//! of forged packets (from any address except the driven peer's, with any
//! type, op, flags, credit and length), raw frames, dispatches into a sink
//! of random size, clock jumps, and application calls (accept, connect,
//! send, recv, shutdown, close, confirm, refuse) on every other socket.
//! Interleaved with them, the driven peer sends a known byte pattern,
//! within the credit the stack advertised, and the application reads it.
//!
//! Invariants, checked after every batch and step:
//! - no panic, no overflow (the fuzz build checks arithmetic);
//! - at most `max_sockets` sockets, and buffer storage within what the
//!   configured buffer sizes allow for that many sockets;
//! - the driven connection is never reset or shut down (nothing the
//!   hostile device sends may touch another connection), its bytes reach
//!   the application in order, and at the end every byte the peer sent
//!   within credit has arrived: none lost, none invented.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pier_fuzz::Input;
use pier_stack::wire::{HEADER_LEN, Op, RawHeader};
use pier_stack::{
    Config, Error, Instant, Shutdown, SinkFull, SocketHandle, SocketType, Stack, VMADDR_CID_ANY,
    VsockAddr, WakeList,
};

const LOCAL_CID: u32 = 3;
const PEER_CID: u32 = 2;
const STREAM_PORT: u32 = 100;
const SEQPACKET_PORT: u32 = 101;
const DGRAM_PORT: u32 = 102;
/// The driven peer's port; forged packets never come from (2, 7000).
const DRIVEN_PORT: u32 = 7000;
const BUFFER: u32 = 4096;
/// How far a stream's buffer may grow by itself (autotuning), and so the
/// most a stream socket may hold each way.
const AUTOTUNE_MAX: u32 = 4 * BUFFER;
const MAX_SOCKETS: usize = 16;
/// The receive buffer the driven peer advertises: never the limit.
const PEER_BUF: u32 = 1 << 20;

fn config() -> Config {
    let mut c = Config::new(LOCAL_CID);
    c.buffer_size = BUFFER;
    c.max_buffer_size = BUFFER;
    c.buffer_autotune_max = AUTOTUNE_MAX;
    c.datagram_send_buffer = BUFFER;
    c.datagram_receive_buffer = BUFFER;
    c.max_sockets = MAX_SOCKETS;
    c.reply_queue_len = 8;
    c
}

/// Byte `i` of what the driven peer sends.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(i >> 8) % 251) as u8
}

/// The honest peer at the other end of the driven connection.
struct Peer {
    /// The stack's advertised receive buffer and bytes it has consumed.
    buf_alloc: u32,
    fwd_cnt: u32,
    established: bool,
    /// Payload bytes sent.
    sent: u64,
    /// Payload bytes the application has read, in order.
    read: u64,
}

impl Peer {
    fn header(&self, op: Op, len: u32) -> RawHeader {
        RawHeader {
            src_cid: u64::from(PEER_CID),
            dst_cid: u64::from(LOCAL_CID),
            src_port: DRIVEN_PORT,
            dst_port: STREAM_PORT,
            len,
            type_: SocketType::Stream as u16,
            op: op as u16,
            flags: 0,
            buf_alloc: PEER_BUF,
            fwd_cnt: 0,
        }
    }

    fn credit(&self) -> u32 {
        let in_flight = (self.sent as u32).wrapping_sub(self.fwd_cnt);
        self.buf_alloc.saturating_sub(in_flight)
    }

    /// A packet the stack sent: the driven peer looks at its own.
    fn observe(&mut self, h: &RawHeader) {
        if h.dst_cid != u64::from(PEER_CID) || h.dst_port != DRIVEN_PORT {
            return;
        }
        assert_eq!(h.src_port, STREAM_PORT);
        assert_eq!(h.type_, SocketType::Stream as u16);
        assert_ne!(h.op, Op::Rst as u16, "the driven connection was reset");
        assert_ne!(h.op, Op::Shutdown as u16, "the driven connection was shut down");
        if h.op == Op::Response as u16 {
            self.established = true;
        }
        self.buf_alloc = h.buf_alloc;
        self.fwd_cnt = h.fwd_cnt;
    }
}

struct Harness {
    stack: Stack,
    now: Instant,
    wakes: WakeList,
    peer: Peer,
    driven: SocketHandle,
    listeners: [SocketHandle; 3],
    app: Vec<SocketHandle>,
    scratch: Vec<u8>,
}

impl Harness {
    fn new() -> Self {
        let mut stack = Stack::new(config());
        let any = |port| VsockAddr::new(VMADDR_CID_ANY, port);
        let stream = stack.socket(SocketType::Stream).unwrap();
        stack.bind(stream, any(STREAM_PORT)).unwrap();
        stack.listen(stream, 4).unwrap();
        let seq = stack.socket(SocketType::SeqPacket).unwrap();
        stack.bind(seq, any(SEQPACKET_PORT)).unwrap();
        stack.listen(seq, 4).unwrap();
        let catch_all = stack.socket(SocketType::Stream).unwrap();
        stack.listen_catch_all(catch_all, 4).unwrap();
        let dgram = stack.socket(SocketType::Datagram).unwrap();
        stack.bind(dgram, any(DGRAM_PORT)).unwrap();

        let peer = Peer { buf_alloc: 0, fwd_cnt: 0, established: false, sent: 0, read: 0 };
        let mut h = Harness {
            stack,
            now: Instant::ZERO,
            wakes: WakeList::new(),
            peer,
            driven: stream,
            listeners: [stream, seq, catch_all],
            app: vec![dgram],
            scratch: vec![0; 2 * BUFFER as usize],
        };
        let request = h.peer.header(Op::Request, 0);
        let mut batch = h.stack.rx_batch(h.now);
        batch.receive_parts(&request, &[]);
        batch.finish(&mut h.wakes);
        h.dispatch(usize::MAX);
        assert!(h.peer.established);
        let (driven, from) = h.stack.accept(stream).unwrap();
        assert_eq!(from, VsockAddr::new(PEER_CID, DRIVEN_PORT));
        h.driven = driven;
        h
    }

    /// Moves up to `room` packets out of the stack, as a device whose TX
    /// ring has that many free entries.
    fn dispatch(&mut self, room: usize) {
        let mut out: Vec<RawHeader> = Vec::new();
        let mut sink = |h: &RawHeader, payload: &[u8]| {
            if out.len() >= room {
                return Err(SinkFull);
            }
            assert_eq!(h.len as usize, payload.len());
            out.push(*h);
            Ok(())
        };
        self.stack.dispatch(self.now, &mut sink, &mut self.wakes);
        for h in &out {
            self.peer.observe(h);
        }
    }

    /// A forged packet: any address but the driven peer's.
    fn forged(&self, input: &mut Input<'_>) -> (RawHeader, Vec<u8>) {
        let src_cid = match input.u8() % 6 {
            0 => input.u64(),
            1 => u64::from(LOCAL_CID),
            2 => 1,
            3 => u64::from(u32::MAX),
            _ => u64::from(PEER_CID),
        };
        let dst_cid = match input.u8() % 6 {
            0 => input.u64(),
            1 => u64::from(PEER_CID),
            _ => u64::from(LOCAL_CID),
        };
        let mut src_port = match input.u8() % 4 {
            0 => input.u32(),
            1 => STREAM_PORT,
            _ => DRIVEN_PORT + u32::from(input.u8() % 8),
        };
        if src_cid as u32 == PEER_CID && src_port == DRIVEN_PORT {
            src_port += 1;
        }
        let dst_port = match input.u8() % 6 {
            0 => input.u32(),
            1 => SEQPACKET_PORT,
            2 => DGRAM_PORT,
            3 => 1024 + u32::from(input.u8() % 4),
            _ => STREAM_PORT,
        };
        let type_ = u16::from(input.u8() % 5);
        let op = u16::from(input.u8() % 10);
        let flags = u32::from(input.u8() % 8);
        let buf_alloc = match input.u8() % 4 {
            0 => input.u32(),
            1 => 0,
            2 => u32::MAX,
            _ => BUFFER,
        };
        let fwd_cnt = input.u32();
        let n = usize::from(input.u8()) * 4;
        let payload = input.bytes(n).to_vec();
        let len = match input.u8() % 8 {
            0 => input.u32(),
            _ => payload.len() as u32,
        };
        let header = RawHeader {
            src_cid,
            dst_cid,
            src_port,
            dst_port,
            len,
            type_,
            op,
            flags,
            buf_alloc,
            fwd_cnt,
        };
        (header, payload)
    }

    /// One batch of forged packets (and raw frames), then the invariants.
    fn batch(&mut self, input: &mut Input<'_>) {
        let count = 1 + input.u8() % 8;
        let packets: Vec<(RawHeader, Vec<u8>, u8)> = (0..count)
            .map(|_| {
                let how = input.u8() % 4;
                if how == 0 {
                    // A raw frame: any bytes, decoded by the stack itself.
                    // Their first 24 bytes must not forge the driven peer.
                    let n = usize::from(input.u8());
                    let mut frame = input.bytes(n).to_vec();
                    if frame.len() >= HEADER_LEN
                        && let Ok(raw) = RawHeader::parse(&frame)
                        && raw.src_cid as u32 == PEER_CID
                        && raw.src_port == DRIVEN_PORT
                    {
                        frame[16] ^= 1;
                    }
                    (RawHeader::default(), frame, how)
                } else {
                    let (h, p) = self.forged(input);
                    (h, p, how)
                }
            })
            .collect();
        let mut batch = self.stack.rx_batch(self.now);
        for (header, payload, how) in &packets {
            match how {
                0 => batch.receive(payload),
                1 => {
                    let mut frame = header.encode().to_vec();
                    frame.extend_from_slice(payload);
                    batch.receive(&frame);
                }
                _ => batch.receive_parts(header, payload),
            }
        }
        batch.finish(&mut self.wakes);
        self.check();
    }

    /// The driven peer sends up to `n` bytes of its pattern, within credit.
    fn peer_send(&mut self, n: usize) {
        let n = n.min(self.peer.credit() as usize);
        if n == 0 {
            return;
        }
        let data: Vec<u8> = (0..n as u64).map(|i| pattern(self.peer.sent + i)).collect();
        let header = self.peer.header(Op::Rw, n as u32);
        let mut batch = self.stack.rx_batch(self.now);
        batch.receive_parts(&header, &data);
        batch.finish(&mut self.wakes);
        self.peer.sent += n as u64;
        self.check();
    }

    /// The application reads the driven connection; the bytes must be
    /// the pattern, in order.
    fn app_read_driven(&mut self, n: usize) {
        let n = n.clamp(1, self.scratch.len());
        match self.stack.recv(self.driven, &mut self.scratch[..n]) {
            Ok(info) => {
                assert!(!info.eof, "the driven connection ended");
                for (i, &b) in self.scratch[..info.len].iter().enumerate() {
                    assert_eq!(b, pattern(self.peer.read + i as u64), "byte out of order");
                }
                self.peer.read += info.len as u64;
                assert!(self.peer.read <= self.peer.sent, "bytes nobody sent");
            }
            Err(Error::WouldBlock) => {}
            Err(e) => panic!("recv on the driven connection: {e:?}"),
        }
    }

    /// An application call on one of the other sockets.
    fn app_step(&mut self, input: &mut Input<'_>) {
        let pick = |input: &mut Input<'_>, app: &[SocketHandle]| {
            app.get(usize::from(input.u8()) % app.len().max(1)).copied()
        };
        match input.u8() % 9 {
            0 => {
                let l = self.listeners[usize::from(input.u8()) % 3];
                if let Ok((h, _)) = self.stack.accept(l) {
                    self.app.push(h);
                }
            }
            1 => {
                let ty = input.pick(&[SocketType::Stream, SocketType::SeqPacket]);
                if let Ok(h) = self.stack.socket(ty) {
                    let port = 1024 + u32::from(input.u8() % 4);
                    let _ = self.stack.connect(h, VsockAddr::new(PEER_CID, port), self.now);
                    self.app.push(h);
                }
            }
            2 => {
                if let Some(h) = pick(input, &self.app) {
                    let n = usize::from(input.u8()) * 16;
                    let data = vec![0x5A; n];
                    let _ = self.stack.send(h, &data);
                    let _ = self.stack.finish_connect(h);
                }
            }
            3 => {
                if let Some(h) = pick(input, &self.app) {
                    let n = usize::from(input.u8()) * 16;
                    let _ = self.stack.recv(h, &mut self.scratch[..n]);
                }
            }
            4 => {
                if let Some(h) = pick(input, &self.app) {
                    let how = input.pick(&[Shutdown::Read, Shutdown::Write, Shutdown::Both]);
                    let _ = self.stack.shutdown(h, how);
                }
            }
            5 => {
                if let Some(h) = pick(input, &self.app) {
                    let _ = self.stack.close(h, self.now);
                    self.app.retain(|&x| x != h);
                }
            }
            6 => {
                if let Some(h) = pick(input, &self.app) {
                    let _ = if input.u8() & 1 == 0 {
                        self.stack.confirm(h)
                    } else {
                        self.stack.refuse(h)
                    };
                }
            }
            7 => {
                if let Some(h) = pick(input, &self.app) {
                    let n = usize::from(input.u8()) * 16;
                    let to = VsockAddr::new(PEER_CID, 1024 + u32::from(input.u8() % 4));
                    let _ = self.stack.send_to(h, &self.scratch[..n], to);
                }
            }
            _ => {
                if let Some(h) = pick(input, &self.app) {
                    let _ = self.stack.set_buffer_size(h, u64::from(input.u32()));
                }
            }
        }
        self.check();
    }

    fn advance(&mut self, micros: u64) {
        self.now = Instant::from_micros(self.now.total_micros() + micros);
        self.stack.handle_timeout(self.now, &mut self.wakes);
        self.check();
    }

    /// The memory bound, after every step.
    fn check(&mut self) {
        let sockets = self.stack.socket_count();
        assert!(sockets <= MAX_SOCKETS, "{sockets} sockets");
        // Each socket holds a receive and a send ring, each at most the
        // largest buffer a stream may grow to, rounded up to a power of two.
        let per_socket = 2 * (AUTOTUNE_MAX.max(BUFFER) as usize).next_power_of_two();
        let bytes = self.stack.buffered_bytes();
        assert!(bytes <= sockets * per_socket, "{bytes} bytes buffered in {sockets} sockets");
        self.wakes = WakeList::new();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mut h = Harness::new();
    let mut steps = 0;
    while !input.is_empty() && steps < 256 {
        steps += 1;
        match input.u8() % 8 {
            0 | 1 => h.batch(&mut input),
            2 => {
                let room = usize::from(input.u8() % 9);
                h.dispatch(room);
            }
            3 => {
                let micros = u64::from(input.u16()) * 1000;
                h.advance(micros);
            }
            4 => h.peer_send(usize::from(input.u16() % 8192)),
            5 => h.app_read_driven(usize::from(input.u16())),
            _ => h.app_step(&mut input),
        }
    }
    // Flush: every byte the peer sent within credit reaches the application.
    for _ in 0..64 {
        h.dispatch(usize::MAX);
        h.app_read_driven(usize::MAX);
        if h.peer.read == h.peer.sent {
            break;
        }
    }
    assert_eq!(h.peer.read, h.peer.sent, "bytes sent within credit were lost");
});
