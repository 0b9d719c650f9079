//! Protocol rules seen from the wire: which packets draw an RST and which
//! never do, credit enforcement, timers, transport reset, and hostile input.
mod common;

use std::time::Duration;

use common::*;
use pier_stack::phy::{FaultConfig, FaultInjector, Loopback, Middleware, Side, Verdict};
use pier_stack::wire::{Header, Op, RawHeader, shutdown_flags};
use pier_stack::{
    DropReason, Error, InPlace, Instant, Payload, Readiness, RstReason, SharedPayload, Shutdown,
    SinkFull, SocketType, Stack, VMADDR_CID_ANY, VsockAddr, WakeList,
};
use pier_testkit::pattern::xorshift32_bytes;

fn header(op: Op, src_port: u32, dst_port: u32) -> Header {
    Header {
        src_cid: GUEST as u64,
        dst_cid: HOST as u64,
        src_port,
        dst_port,
        len: 0,
        socket_type: SocketType::Stream,
        op,
        flags: 0,
        buf_alloc: 65536,
        fwd_cnt: 0,
    }
}

/// Feeds frames to `stack` as one batch and returns the packets it sends back.
fn exchange(stack: &mut Stack, frames: &[Vec<u8>]) -> Vec<(RawHeader, Vec<u8>)> {
    let mut wakes = WakeList::new();
    stack.receive_batch(pier_stack::Instant::ZERO, frames.iter().map(|f| &f[..]), &mut wakes);
    let mut out = Vec::new();
    stack.dispatch(
        pier_stack::Instant::ZERO,
        &mut |h: &RawHeader, p: &[u8]| {
            out.push((*h, p.to_vec()));
            Ok::<(), SinkFull>(())
        },
        &mut wakes,
    );
    out
}

fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut f = h.encode().to_vec();
    f.extend_from_slice(payload);
    f
}

#[test]
fn packets_for_unknown_connections_draw_rst() {
    let mut host = Stack::new(pier_stack::Config::new(HOST));
    let mut rw = header(Op::Rw, 1500, 80);
    rw.len = 3;
    let replies = exchange(&mut host, &[frame(&rw, b"abc")]);
    assert_eq!(replies.len(), 1);
    let (rst, payload) = &replies[0];
    assert_eq!(rst.op, Op::Rst as u16);
    assert_eq!((rst.src_cid, rst.src_port, rst.dst_cid, rst.dst_port), (2, 80, 3, 1500));
    assert_eq!(rst.type_, SocketType::Stream as u16);
    assert!(payload.is_empty());
    assert_eq!(host.stats().rst_sent(RstReason::NoSocket), 1);
}

#[test]
fn an_rst_never_draws_an_rst() {
    let mut host = Stack::new(pier_stack::Config::new(HOST));
    let replies = exchange(&mut host, &[frame(&header(Op::Rst, 1500, 80), &[])]);
    assert!(replies.is_empty());
    assert_eq!(host.stats().dropped(DropReason::RstForUnknown), 1);
    assert_eq!(host.stats().rst_received, 1);
}

/// An unknown type gets an RST that echoes the type; an unknown op too.
#[test]
fn unknown_type_and_op_draw_rst_echoing_the_type() {
    let mut host = Stack::new(pier_stack::Config::new(HOST));
    let mut raw = header(Op::Request, 1500, 80).to_raw();
    raw.type_ = 9;
    let mut unknown_op = header(Op::Request, 1501, 80).to_raw();
    unknown_op.op = 42;
    let replies = exchange(&mut host, &[raw.encode().to_vec(), unknown_op.encode().to_vec()]);
    assert_eq!(replies.len(), 2);
    assert_eq!((replies[0].0.type_, replies[0].0.op), (9, Op::Rst as u16));
    assert_eq!((replies[1].0.dst_port, replies[1].0.op), (1501, Op::Rst as u16));
    assert_eq!(host.stats().rst_sent(RstReason::UnsupportedType), 1);
    assert_eq!(host.stats().rst_sent(RstReason::UnknownOp), 1);
}

/// Packets for another CID, short frames and lying lengths are dropped and counted.
#[test]
fn malformed_and_misaddressed_frames_are_counted() {
    let mut host = Stack::new(pier_stack::Config::new(HOST));
    let mut other = header(Op::Request, 1500, 80);
    other.dst_cid = 9;
    let mut liar = header(Op::Rw, 1500, 80);
    liar.len = 100;
    let mut huge_cid = header(Op::Request, 1500, 80);
    huge_cid.src_cid = 1 << 40;
    let replies = exchange(
        &mut host,
        &[frame(&other, &[]), vec![0; 20], frame(&liar, b"short"), frame(&huge_cid, &[])],
    );
    assert!(replies.is_empty());
    let s = host.stats();
    assert_eq!(s.dropped(DropReason::WrongDestination), 1);
    assert_eq!(s.dropped(DropReason::Malformed), 2);
    assert_eq!(s.dropped(DropReason::InvalidCid), 1);
    assert_eq!(s.rx_packets, 4);
}

/// A peer that sends more than the credit it was granted is reset, the
/// stats say why, and the data it sent within credit stays readable.
#[test]
fn credit_overrun_is_reset_and_counted() {
    let mut lb = pair();
    // The listener's small buffer is what its connections advertise.
    let (c2, s2) = {
        let l = listener(&mut lb, Side::B, SocketType::Stream, 2000);
        lb.b.set_buffer_size(l, 4096).unwrap();
        let (c2, out) =
            try_connect(&mut lb, Side::A, SocketType::Stream, VsockAddr::new(HOST, 2000));
        out.unwrap();
        (c2, lb.b.accept(l).unwrap().0)
    };
    let local = lb.a.local_addr(c2).unwrap();
    let mut rw = header(Op::Rw, local.port, 2000);
    rw.len = 3000;
    let replies = exchange(&mut lb.b, &[frame(&rw, &[1; 3000]), frame(&rw, &[2; 3000])]);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0.op, Op::Rst as u16);
    assert_eq!(lb.b.stats().rst_sent(RstReason::CreditOverrun), 1);
    let mut buf = [0u8; 8192];
    let info = lb.b.recv(s2, &mut buf).unwrap();
    assert_eq!(info.len, 3000, "what arrived within credit is kept");
    assert_eq!(lb.b.recv(s2, &mut buf), Err(Error::ConnectionReset));
    assert!(lb.b.buffered_bytes() < 64 * 1024);
}

/// A peer that never answers our close gets an RST after the close timeout.
#[test]
fn close_without_answer_sends_rst_after_8s() {
    let mut lb = pair();
    let (c, _s) = connected(&mut lb, SocketType::Stream, 1234);
    struct DropAll;
    impl Middleware for DropAll {
        fn on_frame(&mut self, _: Side, _: Instant, _: &mut Vec<u8>) -> Verdict {
            Verdict::Drop
        }
    }
    lb.add_middleware(DropAll);
    lb.a.close(c, lb.now()).unwrap();
    lb.run();
    assert_eq!(lb.a.socket_count(), 1, "the socket waits for the peer");
    assert_eq!(lb.a.poll_at(), Some(lb.now() + Duration::from_secs(8)));
    lb.advance(Duration::from_millis(7999));
    assert_eq!(lb.a.socket_count(), 1);
    lb.advance(Duration::from_millis(1));
    assert_eq!(lb.a.socket_count(), 0);
    assert_eq!(lb.a.stats().rst_sent(RstReason::CloseTimeout), 1);
}

/// Closing after the peer fully shut down sends RST at once.
#[test]
fn close_after_peer_shutdown_sends_rst_at_once() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.b.send(s, b"unread").unwrap();
    lb.run();
    lb.b.close(s, lb.now()).unwrap();
    lb.run();
    // The guest has unread data, so it did not answer with RST yet.
    assert_eq!(lb.b.socket_count(), 1);
    let mut buf = [0u8; 16];
    assert_eq!(lb.a.recv(c, &mut buf).unwrap().len, 6);
    assert!(lb.a.recv(c, &mut buf).unwrap().eof);
    lb.a.close(c, lb.now()).unwrap();
    lb.run();
    assert_eq!(lb.a.stats().rst_sent(RstReason::CloseAfterPeerShutdown), 1);
    assert_eq!(lb.b.socket_count(), 0, "the host's close finished on our RST");
    assert_eq!(lb.a.socket_count(), 0);
}

/// A peer's RST reads as end-of-file, as in Linux, and `peer_reset` is
/// how a caller tells it from an orderly SHUTDOWN, which it is not.
#[test]
fn peer_reset_tells_a_peers_rst_from_its_orderly_shutdown() {
    let mut lb = pair();
    let (reset_c, reset_s) = connected(&mut lb, SocketType::Stream, 1234);
    let (shut_c, shut_s) = connected(&mut lb, SocketType::Stream, 1235);
    assert_eq!(lb.a.peer_reset(reset_c), Ok(false), "a live connection was not reset");
    lb.b.abort(reset_s, lb.now()).unwrap();
    lb.b.shutdown(shut_s, Shutdown::Both).unwrap();
    lb.run();
    let mut buf = [0u8; 16];
    for c in [reset_c, shut_c] {
        assert!(lb.a.recv(c, &mut buf).unwrap().eof, "both ends read as end-of-file");
    }
    assert_eq!(lb.a.peer_reset(reset_c), Ok(true), "the peer's RST");
    assert_eq!(lb.a.peer_reset(shut_c), Ok(false), "the peer's SHUTDOWN of both directions");
}

/// A transport reset fails every connection with connection-reset, sends
/// nothing, keeps listeners, and adopts the new CID.
#[test]
fn transport_reset_fails_connections_and_keeps_listeners() {
    let mut lb = pair();
    let l = listener(&mut lb, Side::A, SocketType::Stream, 4000);
    let (c, _s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.a.send(c, b"queued before the reset").unwrap();
    let pending = lb.a.socket(SocketType::Stream).unwrap();
    lb.a.connect(pending, VsockAddr::new(HOST, 9), lb.now()).unwrap();
    let mut wakes = WakeList::new();
    lb.a.transport_reset(5, &mut wakes);
    assert!(!lb.a.has_pending_tx(), "nothing is sent after a reset");
    assert!(lb.a.readiness(c).unwrap().contains(Readiness::ERROR));
    assert_eq!(lb.a.send(c, b"x"), Err(Error::ConnectionReset));
    assert_eq!(lb.a.finish_connect(pending), Err(Error::ConnectionReset));
    assert_eq!(lb.a.local_cid(), 5);
    assert!(lb.a.is_listening(l).unwrap());
    // The listener still takes connections, at the new CID.
    let h = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.connect(h, VsockAddr::new(5, 4000), lb.now()).unwrap();
    lb.run();
    lb.b.finish_connect(h).unwrap();
    let (child, peer) = lb.a.accept(l).unwrap();
    assert_eq!(peer.cid, HOST);
    assert_eq!(lb.a.local_addr(child).unwrap().cid, 5);
}

/// Wrapping counters: a connection that moves more than 4 GiB keeps working.
#[test]
fn credit_counters_wrap() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let chunk = vec![9u8; 64 * 1024];
    let mut buf = vec![0u8; 256 * 1024];
    let total: u64 = (4u64 << 30) + (1 << 20);
    let mut moved = 0u64;
    while moved < total {
        let _ = lb.a.send(c, &chunk);
        lb.step();
        while let Ok(info) = lb.b.recv(s, &mut buf) {
            moved += info.len as u64;
            if info.inq == 0 {
                break;
            }
        }
        lb.step();
    }
    lb.a.send(c, b"after the wrap").unwrap();
    lb.run();
    let info = lb.b.recv(s, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"after the wrap");
    assert_eq!(lb.b.stats().dropped_total(), 0);
}

/// Hostile frames aimed at a live connection (random ops, flags, credit
/// and lengths) never panic and never grow memory past the buffers.
#[test]
fn hostile_frames_on_a_live_connection() {
    let mut lb = pair();
    let (c, _s) = connected(&mut lb, SocketType::SeqPacket, 1234);
    let local = lb.a.local_addr(c).unwrap();
    let mut rng = pier_testkit::pattern::Xorshift32::new(0x9e37_79b9);
    let mut next = || (u64::from(rng.next_u32()) << 32) | u64::from(rng.next_u32());
    for _ in 0..20_000 {
        let r = next();
        let mut raw = header(Op::Rw, local.port, 1234).to_raw();
        raw.socket_type_hostile(r);
        raw.op = (r >> 8) as u16 % 9;
        raw.flags = (r >> 16) as u32 % 8;
        raw.buf_alloc = (r >> 20) as u32;
        raw.fwd_cnt = (r >> 40) as u32;
        let len = (r >> 50) as usize % 5000;
        raw.len = if r % 17 == 0 { (r >> 3) as u32 } else { len as u32 };
        let mut f = raw.encode().to_vec();
        f.extend(std::iter::repeat_n(0xee, len));
        let _ = exchange(&mut lb.b, &[f]);
        assert!(lb.b.buffered_bytes() <= 2 * 256 * 1024 + 4 * 65536);
    }
}

trait Hostile {
    fn socket_type_hostile(&mut self, r: u64);
}
impl Hostile for RawHeader {
    fn socket_type_hostile(&mut self, r: u64) {
        self.type_ = [1, 2, 2, 2, 3, 7][(r % 6) as usize];
    }
}

/// The fault injector's damage never panics either stack, and every frame
/// it damaged is accounted for in some counter.
#[test]
fn fault_injection_never_panics() {
    let mut lb = pair();
    lb.add_middleware(FaultInjector::new(
        7,
        FaultConfig {
            drop_per_mille: 20,
            duplicate_per_mille: 20,
            corrupt_per_mille: 50,
            truncate_per_mille: 20,
        },
    ));
    let l = listener(&mut lb, Side::B, SocketType::Stream, 1234);
    for round in 0..200u32 {
        let h = lb.a.socket(SocketType::Stream).unwrap();
        let _ = lb.a.connect(h, VsockAddr::new(HOST, 1234), lb.now());
        lb.run();
        let _ = lb.a.send(h, &xorshift32_bytes(round, 3000));
        lb.run();
        while let Ok((s, _)) = lb.b.accept(l) {
            let _ = lb.b.recv(s, &mut [0u8; 4096]);
            let _ = lb.b.close(s, lb.now());
        }
        let _ = lb.a.close(h, lb.now());
        lb.advance(Duration::from_secs(3));
    }
    lb.advance(Duration::from_secs(10));
    assert_eq!(lb.a.socket_count(), 0, "every socket finished despite the faults");
    assert_eq!(lb.b.socket_count(), 1, "only the listener is left");
}

/// A SHUTDOWN with SEND only is a half-close: data still flows the other way.
#[test]
fn half_close_keeps_the_other_direction() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.a.shutdown(c, pier_stack::Shutdown::Write).unwrap();
    lb.run();
    assert!(lb.b.recv(s, &mut [0u8; 4]).unwrap().eof);
    assert!(lb.b.readiness(s).unwrap().contains(Readiness::READ_CLOSED));
    lb.b.send(s, b"still talking").unwrap();
    lb.run();
    let mut buf = [0u8; 32];
    let info = lb.a.recv(c, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"still talking");
}

/// SHUTDOWN flags are sticky: a later SHUTDOWN with fewer flags clears nothing.
#[test]
fn shutdown_flags_are_sticky() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let local = lb.a.local_addr(c).unwrap();
    let mut shut = header(Op::Shutdown, local.port, 1234);
    shut.flags = shutdown_flags::RCV;
    let mut none = shut;
    none.flags = 0;
    let _ = exchange(&mut lb.b, &[frame(&shut, &[]), frame(&none, &[])]);
    assert_eq!(lb.b.send(s, b"x"), Err(Error::BrokenPipe), "the peer's SHUT_RD stays");
}

/// A sender that shrinks its own buffer caps its window below what the
/// receiver granted; the receiver must still report consumed credit, or
/// the sender stalls forever (found by the property test).
#[test]
fn sender_shrinking_its_buffer_does_not_stall() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let data = xorshift32_bytes(5, 31023);
    assert_eq!(lb.b.send(s, &data).unwrap(), data.len());
    lb.b.set_buffer_size(s, 128).unwrap();
    let got = recv_exact(&mut lb, Side::A, c, data.len());
    assert!(got == data, "all {} bytes arrive", data.len());
}

/// Streams and seqpacket (datagrams are in datagrams.rs) work inside one
/// stack, to CID 1 and to our own CID, without touching the device.
#[test]
fn local_loopback_carries_stream_and_seqpacket() {
    let mut lb = pair();
    for ty in [SocketType::Stream, SocketType::SeqPacket] {
        for (port, cid) in [(3000, pier_stack::VMADDR_CID_LOCAL), (3001, GUEST)] {
            let port = port + ty as u32 * 10;
            let l = listener(&mut lb, Side::A, ty, port);
            let (c, outcome) = try_connect(&mut lb, Side::A, ty, VsockAddr::new(cid, port));
            outcome.unwrap();
            let (s, peer) = lb.a.accept(l).unwrap();
            assert_eq!(peer.cid, cid);
            let data = xorshift32_bytes(port, 100_000);
            if ty == SocketType::Stream {
                let got = transfer(&mut lb, (Side::A, c), (Side::A, s), &data, 8192);
                assert!(got == data);
            } else {
                lb.a.send_message(c, &data, true).unwrap();
                lb.run();
                let mut buf = vec![0u8; 200_000];
                let info = lb.a.recv(s, &mut buf).unwrap();
                assert_eq!((info.len, info.end_of_record), (data.len(), true));
                assert!(buf[..info.len] == data[..]);
            }
            lb.a.close(c, lb.now()).unwrap();
            lb.run();
            assert!(lb.a.recv(s, &mut [0u8; 8]).unwrap().eof);
        }
    }
    assert_eq!(lb.a.stats().tx_packets, 0, "nothing reached the device");
    assert!(lb.a.stats().loopback_packets > 0);
}

/// A listener takes backlog + 1 connections (Linux's strict `>`); the next
/// REQUEST is answered with RST and counted.
#[test]
fn full_backlog_answers_rst() {
    let mut lb = pair();
    let l = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.bind(l, VsockAddr::new(pier_stack::VMADDR_CID_ANY, 80)).unwrap();
    lb.b.listen(l, 2).unwrap();
    let outcomes: Vec<_> = (0..4)
        .map(|_| try_connect(&mut lb, Side::A, SocketType::Stream, VsockAddr::new(HOST, 80)).1)
        .collect();
    assert_eq!(outcomes, [Ok(()), Ok(()), Ok(()), Err(Error::ConnectionReset)]);
    assert_eq!(lb.b.stats().rst_sent(RstReason::BacklogFull), 1);
    assert!(lb.b.readiness(l).unwrap().contains(Readiness::READABLE));
}

/// Records every packet's header as it crosses the wire.
struct Capture(std::rc::Rc<std::cell::RefCell<Vec<Header>>>);
impl Middleware for Capture {
    fn on_frame(&mut self, _: Side, _: Instant, frame: &mut Vec<u8>) -> Verdict {
        if let Ok((h, _)) = pier_stack::wire::decode(frame) {
            self.0.borrow_mut().push(h);
        }
        Verdict::Pass
    }
}

/// Writes are cut into packets of at most 64 KiB and at most the peer's credit.
#[test]
fn packets_respect_64k_and_credit() {
    let mut lb = pair();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    lb.add_middleware(Capture(seen.clone()));
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.b.set_buffer_size(s, 100_000).unwrap();
    lb.run();
    let data = xorshift32_bytes(9, 1 << 20);
    let got = transfer(&mut lb, (Side::A, c), (Side::B, s), &data, 1 << 20);
    assert!(got == data);
    let rw: Vec<_> = seen.borrow().iter().filter(|h| h.op == Op::Rw).map(|h| h.len).collect();
    assert!(rw.iter().all(|&len| len <= 65536), "no packet over 64 KiB");
    assert!(rw.contains(&65536), "full-size packets are used");
    let mut in_flight = 0u64;
    let mut acked = 0u32;
    for h in seen.borrow().iter() {
        if h.src_cid == GUEST as u64 && h.op == Op::Rw {
            in_flight += h.len as u64;
            assert!(in_flight - acked as u64 <= 100_000, "within the peer's credit");
        }
        if h.src_cid == HOST as u64 {
            acked = h.fwd_cnt;
        }
    }
}

/// CREDIT_REQUEST is answered with CREDIT_UPDATE; changing the buffer size
/// sends one unasked.
#[test]
fn credit_request_is_answered_and_buffer_change_announced() {
    let mut lb = pair();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    lb.add_middleware(Capture(seen.clone()));
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    seen.borrow_mut().clear();
    let local = lb.a.local_addr(c).unwrap();
    let replies = exchange(&mut lb.b, &[frame(&header(Op::CreditRequest, local.port, 1234), &[])]);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0.op, Op::CreditUpdate as u16);
    assert_eq!(lb.b.stats().credit_requests_received, 1);
    lb.b.set_buffer_size(s, 4096).unwrap();
    lb.run();
    let updates: Vec<_> =
        seen.borrow().iter().filter(|h| h.op == Op::CreditUpdate).copied().collect();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].buf_alloc, 4096);
}

/// A catch-all listener sees requests for any port without a listener;
/// each waits for the application to confirm (RESPONSE) or refuse (RST),
/// and an undecided one is refused at the listener's connect timeout.
#[test]
fn catch_all_listener_confirms_and_refuses() {
    let mut lb = pair();
    let any = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.set_connect_timeout(any, Duration::from_secs(1)).unwrap();
    lb.b.listen_catch_all(any, 16).unwrap();
    let second = lb.b.socket(SocketType::Stream).unwrap();
    assert_eq!(lb.b.listen_catch_all(second, 1), Err(Error::AddressInUse));
    let specific = listener(&mut lb, Side::B, SocketType::Stream, 80);

    let dial = |lb: &mut pier_stack::phy::Loopback, port| {
        let h = lb.a.socket(SocketType::Stream).unwrap();
        lb.a.connect(h, VsockAddr::new(HOST, port), lb.now()).unwrap();
        lb.run();
        h
    };
    let yes = dial(&mut lb, 5001);
    let no = dial(&mut lb, 5002);
    let silent = dial(&mut lb, 5003);
    let normal = dial(&mut lb, 80);
    assert_eq!(lb.a.finish_connect(normal), Ok(()), "a port with a listener is not caught");
    assert!(lb.b.accept(specific).is_ok());
    assert_eq!(lb.a.finish_connect(yes), Err(Error::WouldBlock), "unanswered until confirmed");

    let mut pending = Vec::new();
    while let Ok((h, _)) = lb.b.accept(any) {
        pending.push((lb.b.local_addr(h).unwrap().port, h));
    }
    pending.sort();
    assert_eq!(pending.iter().map(|p| p.0).collect::<Vec<_>>(), [5001, 5002, 5003]);
    assert_eq!(lb.b.send(pending[0].1, b"x"), Err(Error::NotConnected));
    lb.b.confirm(pending[0].1).unwrap();
    lb.b.refuse(pending[1].1).unwrap();
    lb.run();
    assert_eq!(lb.a.finish_connect(yes), Ok(()));
    assert_eq!(lb.a.finish_connect(no), Err(Error::ConnectionReset));
    lb.b.send(pending[0].1, b"hello").unwrap();
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::A, yes, 5), b"hello");

    lb.advance(Duration::from_secs(1));
    assert_eq!(lb.a.finish_connect(silent), Err(Error::ConnectionReset));
    assert_eq!(lb.b.stats().rst_sent(RstReason::Refused), 2);
}

/// A transport with small receive buffers caps packets: streams are cut
/// smaller, datagrams that no longer fit are dropped and counted.
#[test]
fn max_payload_caps_packets() {
    let mut lb = pair();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    lb.add_middleware(Capture(seen.clone()));
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.a.set_max_payload(4000);
    let data = xorshift32_bytes(4, 100_000);
    let got = transfer(&mut lb, (Side::A, c), (Side::B, s), &data, 100_000);
    assert!(got == data);
    assert!(seen.borrow().iter().filter(|h| h.op == Op::Rw).all(|h| h.len <= 4000));
    let d = lb.a.socket(SocketType::Datagram).unwrap();
    lb.a.send_to(d, &[0; 5000], VsockAddr::new(HOST, 9)).unwrap();
    lb.run();
    assert_eq!(lb.a.stats().dropped(DropReason::DatagramTooLargeForTransport), 1);
}

/// A relay that takes at most `per_call` bytes each time it is offered
/// some, as a Unix socket with little room would.
struct Relay {
    out: Vec<u8>,
    per_call: usize,
    offers: usize,
    /// Offers whose bytes could only be copied out ([`SharedPayload`]).
    shared_offers: usize,
}

impl Relay {
    fn new(per_call: usize) -> Self {
        Self { out: Vec::new(), per_call, offers: 0, shared_offers: 0 }
    }
}

impl pier_stack::DirectReceive for Relay {
    fn deliver(&mut self, _: pier_stack::SocketHandle, data: Payload<'_>) -> usize {
        self.offers += 1;
        let n = data.len().min(self.per_call);
        if let Some(bytes) = data.as_bytes() {
            self.out.extend_from_slice(&bytes[..n]);
        } else {
            let (source, range) = data.as_shared().expect("a payload is bytes or shared");
            self.shared_offers += 1;
            let start = self.out.len();
            self.out.resize(start + n, 0);
            source.copy_out(range.start, &mut self.out[start..]);
        }
        n
    }
}

/// Payload bytes a transport may not lend (a virtual machine's memory, in
/// a device): the stack must copy them out, and every copy is counted.
struct CopyOnly {
    bytes: Vec<u8>,
    copied: std::cell::Cell<usize>,
}

impl SharedPayload for CopyOnly {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.bytes[offset..offset + dst.len()]);
        self.copied.set(self.copied.get() + dst.len());
    }
}

/// How side B's stack is handed A's payloads.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Delivery {
    /// As bytes it may borrow.
    Borrowed,
    /// As a [`SharedPayload`] it may only copy out of.
    Shared,
}

/// One round of the pair with side B's stream payloads offered to `relay`
/// first: A's packets to B, then B's answers (credit updates) to A.
fn step_with_relay(lb: &mut pier_stack::phy::Loopback, relay: &mut Relay) -> usize {
    step_with_relay_as(lb, relay, Delivery::Borrowed)
}

/// [`step_with_relay`], with A's payloads handed to B as `delivery` says.
fn step_with_relay_as(
    lb: &mut pier_stack::phy::Loopback,
    relay: &mut Relay,
    delivery: Delivery,
) -> usize {
    let now = lb.now();
    let mut wakes = WakeList::new();
    let mut frames = Vec::new();
    let mut moved = lb.a.dispatch(
        now,
        &mut |h: &RawHeader, p: &[u8]| {
            frames.push((*h, p.to_vec()));
            Ok(())
        },
        &mut wakes,
    );
    let mut batch = lb.b.rx_batch_with_tap(now, relay);
    for (h, p) in frames {
        match delivery {
            Delivery::Borrowed => batch.receive_parts(&h, &p),
            Delivery::Shared => {
                let source = CopyOnly { bytes: p, copied: Default::default() };
                batch.receive_payload(&h, Payload::shared(&source));
                assert!(source.copied.get() <= source.bytes.len(), "each byte copied at most once");
            }
        }
    }
    batch.finish(&mut wakes);
    let mut back = lb.a.rx_batch(now);
    moved += lb.b.dispatch(
        now,
        &mut |h: &RawHeader, p: &[u8]| {
            back.receive_parts(h, p);
            Ok(())
        },
        &mut wakes,
    );
    back.finish(&mut wakes);
    moved
}

/// With a tap that takes everything, a receiver that never calls `recv`
/// still takes sixteen buffers' worth: the tapped bytes count as read, so
/// credit flows back, and nothing is buffered.
#[test]
fn a_direct_receive_tap_takes_bytes_as_read() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7000);
    let data = xorshift32_bytes(7, 16 * 256 * 1024);
    let mut relay = Relay::new(usize::MAX);
    let mut sent = 0;
    for _ in 0..100_000 {
        if sent < data.len() {
            sent += lb.a.send(c, &data[sent..]).unwrap_or(0);
        }
        if step_with_relay(&mut lb, &mut relay) == 0 && sent == data.len() {
            break;
        }
    }
    assert_eq!(relay.out.len(), data.len(), "every byte went through the tap");
    assert!(relay.out == data, "in order");
    assert_eq!(lb.b.stats().rx_bytes_delivered_directly, data.len() as u64);
    assert_eq!(lb.b.recv_queued(s), Ok(0), "nothing was buffered");
    let mut buf = [0u8; 16];
    assert_eq!(lb.b.recv(s, &mut buf), Err(Error::WouldBlock));
}

/// A tap that takes only part of each offer: the rest is buffered, later
/// packets go to the buffer while it holds anything (so order holds), and
/// the tap is offered bytes again once the reader emptied it.
#[test]
fn a_partial_tap_keeps_byte_order() {
    let relay = partial_tap_run(Delivery::Borrowed);
    assert_eq!(relay.shared_offers, 0);
}

/// The same with payloads the stack may only copy out of (a device's guest
/// memory): the tap is offered the shared source itself, never a copy,
/// and what it leaves is copied into the receive buffer, in order.
#[test]
fn a_shared_payload_is_offered_uncopied_and_its_rest_buffered_in_order() {
    let relay = partial_tap_run(Delivery::Shared);
    assert_eq!(relay.shared_offers, relay.offers, "every offer was of the shared source");
}

/// Streams 2 MiB from A to B through a tap that takes 1000 bytes an offer
/// while B's reader empties the buffer behind it; checks the bytes.
fn partial_tap_run(delivery: Delivery) -> Relay {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7001);
    let data = xorshift32_bytes(8, 2 << 20);
    let mut relay = Relay::new(1000);
    let mut sent = 0;
    let mut buf = vec![0u8; 4096];
    for _ in 0..100_000 {
        if sent < data.len() {
            sent += lb.a.send(c, &data[sent..]).unwrap_or(0);
        }
        let moved = step_with_relay_as(&mut lb, &mut relay, delivery);
        // The reader empties the buffer after each round, behind the tap.
        while let Ok(info) = lb.b.recv(s, &mut buf) {
            relay.out.extend_from_slice(&buf[..info.len]);
        }
        if moved == 0 && sent == data.len() && relay.out.len() == data.len() {
            break;
        }
    }
    assert!(relay.out == data, "tap and buffer together deliver the bytes in order");
    let direct = lb.b.stats().rx_bytes_delivered_directly;
    assert_eq!(direct, 1000 * relay.offers as u64, "each offer took 1000 bytes");
    assert!(direct > 0 && direct < data.len() as u64, "some bytes each way: {direct}");
    relay
}

/// Seqpacket payloads are never offered: a message must stay whole, and
/// it reaches the socket's buffer whole whether the stack may borrow its
/// bytes or only copy them out.
#[test]
fn a_tap_is_not_offered_seqpacket_messages() {
    for (delivery, port) in [(Delivery::Borrowed, 7002), (Delivery::Shared, 7005)] {
        let mut lb = pair();
        let (c, s) = connected(&mut lb, SocketType::SeqPacket, port);
        lb.a.send_message(c, b"one message", true).unwrap();
        let mut relay = Relay::new(usize::MAX);
        step_with_relay_as(&mut lb, &mut relay, delivery);
        assert_eq!(relay.offers, 0, "{delivery:?}");
        let mut buf = [0u8; 64];
        let info = lb.b.recv(s, &mut buf).unwrap();
        assert_eq!(&buf[..info.len], b"one message", "{delivery:?}");
    }
}

/// A datagram the stack may only copy out of reaches the socket bound to
/// its port whole.
#[test]
fn a_shared_datagram_reaches_its_socket_whole() {
    let mut lb = pair();
    let mut relay = Relay::new(usize::MAX);
    let rx = lb.b.socket(SocketType::Datagram).unwrap();
    lb.b.bind(rx, VsockAddr::new(VMADDR_CID_ANY, 7006)).unwrap();
    let tx = lb.a.socket(SocketType::Datagram).unwrap();
    lb.a.send_to(tx, b"one datagram", VsockAddr::new(HOST, 7006)).unwrap();
    step_with_relay_as(&mut lb, &mut relay, Delivery::Shared);
    let mut buf = [0u8; 64];
    let info = lb.b.recv(rx, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"one datagram");
}

/// `send_with` lends the send buffer up to the credit, sends what the
/// filler wrote, sends nothing when it fails, and refuses message sockets.
#[test]
fn send_with_fills_the_buffer_in_place() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7003);
    let space = lb.a.send_space(c).unwrap();
    let n =
        lb.a.send_with(c, |a, b| {
            assert_eq!(a.len() + b.len(), space, "exactly the credit is lent");
            a[..5].copy_from_slice(b"hello");
            Ok::<_, ()>(5)
        })
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(lb.a.send_with(c, |_, _| Err("source failed")), Err(Error::Fault));
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::B, s, 5), b"hello");
    assert_eq!(lb.b.recv_queued(s), Ok(0), "the failed fill sent nothing");
    let (m, _) = connected(&mut lb, SocketType::SeqPacket, 7004);
    assert_eq!(lb.a.send_with(m, |_, _| Ok::<_, ()>(0)), Err(Error::NotSupported));
}

/// An abortive close (`Stack::abort`, `close` with `SO_LINGER` 0) resets
/// the connection at once: the peer gets an RST instead of SHUTDOWN, bytes
/// queued but not yet sent are discarded, and the handle is gone.
#[test]
fn an_abortive_close_resets_the_peer_and_discards_queued_data() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7300);
    // Queued, not yet handed to the transport: a close would still send
    // it; an abort discards it.
    let queued = lb.a.send(c, &[7u8; 64 * 1024]).unwrap();
    assert!(queued > 0);
    let now = lb.now();
    lb.a.abort(c, now).unwrap();
    lb.run();
    assert_eq!(lb.a.stats().rst_sent(RstReason::Aborted), 1);
    assert_eq!(lb.b.stats().rst_received, 1);
    assert_eq!(lb.a.send(c, b"x"), Err(Error::BadHandle));
    // The peer reads what had arrived, then the end; never all it was sent.
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match lb.b.recv(s, &mut buf) {
            Ok(info) if info.len == 0 => break,
            Ok(info) => got += info.len,
            Err(e) => panic!("reading after the reset: {e:?}"),
        }
    }
    assert_eq!(got, 0, "{got} of the {queued} queued bytes were sent after the abort");
    assert_eq!(lb.b.send(s, b"x"), Err(Error::BrokenPipe));
}

/// Hands a packet the transport took in place (`send_in_place`) to side B,
/// as a device would after writing it into a receive buffer.
fn deliver_to_b(lb: &mut Loopback, header: &RawHeader, payload: &[u8]) {
    let now = lb.now();
    let mut wakes = WakeList::new();
    let mut batch = lb.b.rx_batch(now);
    batch.receive_parts(header, payload);
    batch.finish(&mut wakes);
}

/// `send_in_place` offers the credit (capped by the room and the largest
/// payload), counts what the filler wrote against the peer's credit, and
/// the header it returns carries those bytes to the peer like any RW.
#[test]
fn send_in_place_counts_the_bytes_against_the_peers_credit() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7400);
    let space = lb.a.send_space(c).unwrap();
    let max = lb.a.max_payload();
    assert!(space > 10, "a fresh connection has credit: {space}");
    let mut offered = 0;
    let sent = lb.a.send_in_place(c, 1 << 20, |limit| {
        offered = limit;
        Ok::<_, ()>(5)
    });
    assert_eq!(offered, space.min(max), "the credit, capped by the largest payload");
    let Ok(InPlace::Packet(header)) = sent else { panic!("not sent in place: {sent:?}") };
    assert_eq!(header.len, 5);
    assert_eq!(header.op, Op::Rw as u16);
    assert_eq!(lb.a.send_space(c).unwrap(), space - 5, "the five bytes hold credit");
    assert_eq!(lb.a.stats().tx_bytes, 5);
    let sent = lb.a.send_in_place(c, 3, |limit| {
        assert_eq!(limit, 3, "no more than the room");
        Ok::<_, ()>(3)
    });
    let Ok(InPlace::Packet(second)) = sent else { panic!("not sent in place: {sent:?}") };
    deliver_to_b(&mut lb, &header, b"hello");
    deliver_to_b(&mut lb, &second, b"abc");
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::B, s, 8), b"helloabc");
    // B's next packet reports what it read: the window is whole again.
    lb.b.send(s, b"!").unwrap();
    lb.run();
    assert_eq!(lb.a.send_space(c).unwrap(), space);
}

/// Once the credit is used up, in place or not, `send_in_place` says
/// EAGAIN until the peer reads; a failed or empty fill counts nothing.
#[test]
fn send_in_place_stops_at_the_credit_and_counts_nothing_for_a_failed_fill() {
    let mut lb = pair_with(|c| c.buffer_size = 4096);
    let (c, s) = connected(&mut lb, SocketType::Stream, 7401);
    assert_eq!(lb.a.send_in_place(c, 4096, |_| Err("source failed")), Err(Error::Fault));
    assert_eq!(lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(0)), Ok(InPlace::Empty));
    assert_eq!(lb.a.send_space(c).unwrap(), 4096, "nothing was counted");
    let sent = lb.a.send_in_place(c, 8192, Ok::<_, ()>);
    let Ok(InPlace::Packet(header)) = sent else { panic!("not sent in place: {sent:?}") };
    assert_eq!(header.len, 4096);
    assert_eq!(
        lb.a.send_in_place(c, 8192, |_| -> Result<usize, ()> { panic!("no credit") }),
        Err(Error::WouldBlock)
    );
    assert_eq!(lb.a.send(c, b"x"), Err(Error::WouldBlock), "send agrees");
    deliver_to_b(&mut lb, &header, &[7u8; 4096]);
    assert_eq!(recv_exact(&mut lb, Side::B, s, 4096), vec![7u8; 4096]);
    lb.run();
    assert!(lb.a.send_space(c).unwrap() > 0, "the read gave the credit back");
}

/// Bytes queued in the send buffer go first: while any wait,
/// `send_in_place` answers `Queued` without calling the filler, and once
/// they left, new bytes go in place and arrive after them.
#[test]
fn send_in_place_never_overtakes_queued_bytes() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7402);
    lb.a.send(c, b"first ").unwrap();
    let queued =
        lb.a.send_in_place(c, 4096, |_| -> Result<usize, ()> { panic!("queued bytes first") });
    assert_eq!(queued, Ok(InPlace::Queued));
    lb.run();
    let sent = lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(6));
    let Ok(InPlace::Packet(header)) = sent else { panic!("not sent in place: {sent:?}") };
    deliver_to_b(&mut lb, &header, b"second");
    assert_eq!(recv_exact(&mut lb, Side::B, s, 12), b"first second");
}

/// A shutdown after bytes sent in place reaches the peer after them, and
/// once this side shut its writes (or the peer its reads) `send_in_place`
/// fails with EPIPE as `send` does.
#[test]
fn send_in_place_bytes_come_before_a_later_shutdown_and_none_after_it() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 7403);
    let sent = lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(4));
    let Ok(InPlace::Packet(header)) = sent else { panic!("not sent in place: {sent:?}") };
    deliver_to_b(&mut lb, &header, b"last");
    lb.a.shutdown(c, Shutdown::Write).unwrap();
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::B, s, 4), b"last");
    let mut buf = [0u8; 8];
    assert!(lb.b.recv(s, &mut buf).unwrap().eof, "then end-of-file");
    assert_eq!(lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(1)), Err(Error::BrokenPipe));

    let (c, s) = connected(&mut lb, SocketType::Stream, 7404);
    lb.b.shutdown(s, Shutdown::Read).unwrap();
    lb.run();
    assert_eq!(lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(1)), Err(Error::BrokenPipe));
}

/// A credit update owed to the peer is carried by the data packet sent in
/// place (it tells the same `fwd_cnt`), so no separate update follows it;
/// message sockets are refused.
#[test]
fn send_in_place_carries_an_owed_credit_update_and_refuses_seqpacket() {
    let mut lb = pair_with(|c| c.buffer_size = 8192);
    let (c, s) = connected(&mut lb, SocketType::Stream, 7405);
    // B fills A's buffer, and A reads it all without running the
    // transport: A owes B a credit update.
    assert_eq!(lb.b.send(s, &[1u8; 8192]).unwrap(), 8192);
    lb.run();
    let mut buf = vec![0u8; 8192];
    let mut got = 0;
    while got < buf.len() {
        got += lb.a.recv(c, &mut buf[got..]).unwrap().len;
    }
    assert_eq!(buf, vec![1u8; 8192]);
    let updates = lb.a.stats().credit_updates_sent;
    let sent = lb.a.send_in_place(c, 4096, |_| Ok::<_, ()>(2));
    let Ok(InPlace::Packet(header)) = sent else { panic!("not sent in place: {sent:?}") };
    assert_eq!(header.fwd_cnt, 8192, "the packet reports what A read");
    lb.run();
    assert_eq!(lb.a.stats().credit_updates_sent, updates, "no separate update went out");
    let (m, _) = connected(&mut lb, SocketType::SeqPacket, 7406);
    assert_eq!(lb.a.send_in_place(m, 4096, |_| Ok::<_, ()>(1)), Err(Error::NotSupported));
}

/// Moves 4 MiB from the guest to the host in one connection, the host
/// reading in `read_chunk`s, and returns the host socket's buffer size
/// after it.
fn host_buffer_after_transfer(lb: &mut Loopback, read_chunk: usize, explicit: Option<u64>) -> u32 {
    let (c, s) = connected(lb, SocketType::Stream, 1234);
    if let Some(size) = explicit {
        lb.b.set_buffer_size(s, size).unwrap();
    }
    let data = xorshift32_bytes(7, 4 << 20);
    let got = transfer(lb, (Side::A, c), (Side::B, s), &data, read_chunk);
    assert!(got == data, "every byte arrives in order");
    lb.b.buffer_size(s).unwrap()
}

/// A reader that takes everything at once leaves the sender held back by
/// the buffer alone: it doubles, up to the autotuning limit, as TCP's
/// receive buffer grows.
#[test]
fn stream_buffer_grows_to_the_autotune_limit_while_the_reader_keeps_up() {
    let mut lb = pair();
    let size = host_buffer_after_transfer(&mut lb, 8 << 20, None);
    assert_eq!(size, pier_stack::DEFAULT_BUFFER_AUTOTUNE_MAX);
}

/// A reader slower than the sender leaves bytes queued whenever credit
/// goes out: the buffer stays as it was, so a slow reader holds no more.
#[test]
fn stream_buffer_stays_when_the_reader_falls_behind() {
    let mut lb = pair();
    let size = host_buffer_after_transfer(&mut lb, 1024, None);
    assert_eq!(size, pier_stack::DEFAULT_BUFFER_SIZE);
}

/// SO_VM_SOCKETS_BUFFER_SIZE set by the application is kept, as an
/// explicit SO_RCVBUF turns TCP's autotuning off.
#[test]
fn an_explicit_buffer_size_turns_autotuning_off() {
    let mut lb = pair();
    let size = host_buffer_after_transfer(&mut lb, 8 << 20, Some(200_000));
    assert_eq!(size, 200_000);
}

/// A stack configured with `buffer_autotune_max` at its buffer size keeps
/// Linux's fixed buffers.
#[test]
fn autotuning_is_off_when_its_limit_is_the_buffer_size() {
    let mut lb = pair_with(|c| c.buffer_autotune_max = c.buffer_size);
    let size = host_buffer_after_transfer(&mut lb, 8 << 20, None);
    assert_eq!(size, pier_stack::DEFAULT_BUFFER_SIZE);
}
