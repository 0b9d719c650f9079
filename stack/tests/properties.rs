//! Property tests: random operation sequences, random batching of packets
//! and a device that is randomly full, checked against simple models.
mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use pier_stack::phy::{Loopback, Side};
use pier_stack::{Error, RecvInfo, SocketType, Stack, WakeList, wire};
use pier_testkit::pattern::xorshift32_bytes;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Send this many bytes from A (or B when `back` is set).
    Send {
        len: usize,
        back: bool,
    },
    /// Receive up to this many bytes on B (or A).
    Recv {
        len: usize,
        back: bool,
    },
    Peek {
        len: usize,
    },
    Step,
    SetBuffer {
        size: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..70_000, any::<bool>()).prop_map(|(len, back)| Op::Send { len, back }),
        4 => (1usize..70_000, any::<bool>()).prop_map(|(len, back)| Op::Recv { len, back }),
        1 => (1usize..5000).prop_map(|len| Op::Peek { len }),
        3 => Just(Op::Step),
        1 => (128u32..300_000).prop_map(|size| Op::SetBuffer { size }),
    ]
}

/// Configures random batch sizes and a device that takes few packets per step.
fn chaotic_pair(seed: u64, tx_capacity: usize) -> Loopback {
    let mut lb = pair();
    let state = Rc::new(RefCell::new(seed | 1));
    lb.set_batch_sizes(move || {
        let mut x = state.borrow_mut();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        (*x % 7) as usize + 1
    });
    lb.set_tx_capacity(tx_capacity);
    lb
}

fn memory_bound() -> usize {
    // Each socket holds at most its receive buffer and its send window,
    // each rounded up to a power of two by the ring.
    2 * 2 * (256 * 1024) + 64 * 1024
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Every byte accepted by send arrives once and in order, both ways,
    /// whatever the batching and however full the device; memory stays
    /// within the configured buffers.
    #[test]
    fn stream_bytes_arrive_once_in_order(
        ops in prop::collection::vec(op(), 1..120),
        seed in any::<u64>(),
        tx_capacity in 1usize..6,
    ) {
        let mut lb = chaotic_pair(seed, tx_capacity);
        let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
        let mut sent = [Vec::new(), Vec::new()];
        let mut got = [Vec::new(), Vec::new()];
        let mut counter = 0u8;
        for op in &ops {
            match *op {
                Op::Send { len, back } => {
                    let (side, h, dir) = if back { (Side::B, s, 1) } else { (Side::A, c, 0) };
                    let data: Vec<u8> = (0..len).map(|_| { counter = counter.wrapping_add(1); counter }).collect();
                    match lb.stack(side).send(h, &data) {
                        Ok(n) => { sent[dir].extend_from_slice(&data[..n]); counter = counter.wrapping_sub((len - n) as u8); }
                        Err(Error::WouldBlock) => { counter = counter.wrapping_sub(len as u8); }
                        Err(e) => panic!("send: {e}"),
                    }
                }
                Op::Recv { len, back } => {
                    let (side, h, dir) = if back { (Side::A, c, 1) } else { (Side::B, s, 0) };
                    let mut buf = vec![0u8; len];
                    match lb.stack(side).recv(h, &mut buf) {
                        Ok(info) => got[dir].extend_from_slice(&buf[..info.len]),
                        Err(Error::WouldBlock) => {}
                        Err(e) => panic!("recv: {e}"),
                    }
                }
                Op::Peek { len } => {
                    let mut buf = vec![0u8; len];
                    if let Ok(info) = lb.b.peek(s, &mut buf) {
                        let at = got[0].len();
                        prop_assert_eq!(&buf[..info.len], &sent[0][at..at + info.len]);
                    }
                }
                Op::Step => { lb.step(); }
                Op::SetBuffer { size } => { lb.b.set_buffer_size(s, size as u64).unwrap(); }
            }
            for dir in 0..2 {
                prop_assert!(is_prefix(&got[dir], &sent[dir]), "direction {}: {}", dir, mismatch(&got[dir], &sent[dir]));
            }
            prop_assert!(lb.a.buffered_bytes() <= memory_bound());
            prop_assert!(lb.b.buffered_bytes() <= memory_bound());
        }
        // Drain: everything accepted arrives.
        for _ in 0..10_000 {
            if got[0].len() == sent[0].len() && got[1].len() == sent[1].len() { break; }
            lb.step();
            let mut buf = vec![0u8; 65536];
            if let Ok(info) = lb.b.recv(s, &mut buf) { got[0].extend_from_slice(&buf[..info.len]); }
            if let Ok(info) = lb.a.recv(c, &mut buf) { got[1].extend_from_slice(&buf[..info.len]); }
        }
        for dir in 0..2 {
            prop_assert!(got[dir] == sent[dir], "direction {}: {}", dir, mismatch(&got[dir], &sent[dir]));
        }
        prop_assert_eq!(lb.a.stats().dropped_total() + lb.b.stats().dropped_total(), 0);
    }

    /// Seqpacket keeps every message's boundaries and EOR flag.
    #[test]
    fn seqpacket_boundaries_and_eor_are_kept(
        messages in prop::collection::vec((0usize..100_000, any::<bool>()), 1..60),
        seed in any::<u64>(),
        tx_capacity in 1usize..6,
        read_every in 1usize..5,
    ) {
        let mut lb = chaotic_pair(seed, tx_capacity);
        let (c, s) = connected(&mut lb, SocketType::SeqPacket, 1234);
        let mut expected = std::collections::VecDeque::new();
        let mut buf = vec![0u8; 300_000];
        let mut check = |lb: &mut Loopback, expected: &mut std::collections::VecDeque<(Vec<u8>, bool)>| -> Result<(), TestCaseError> {
            loop {
                match lb.b.recv(s, &mut buf) {
                    Ok(RecvInfo { len, truncated, end_of_record, .. }) => {
                        let (want, eor) = expected.pop_front().expect("a message we sent");
                        prop_assert!(!truncated);
                        prop_assert_eq!(&buf[..len], &want[..]);
                        prop_assert_eq!(end_of_record, eor);
                    }
                    Err(Error::WouldBlock) => return Ok(()),
                    Err(e) => panic!("recv: {e}"),
                }
            }
        };
        for (i, &(len, eor)) in messages.iter().enumerate() {
            let data = xorshift32_bytes(i as u32 + 1, len);
            let mut tries = 0;
            loop {
                match lb.a.send_message(c, &data, eor) {
                    Ok(()) => { if !data.is_empty() { expected.push_back((data, eor)); } break; }
                    Err(Error::WouldBlock) => { lb.step(); check(&mut lb, &mut expected)?; }
                    Err(Error::MessageTooLarge) => { prop_assert!(len > 256 * 1024); break; }
                    Err(e) => panic!("send: {e}"),
                }
                tries += 1;
                prop_assert!(tries < 10_000, "sender starved");
            }
            if i % read_every == 0 { lb.step(); check(&mut lb, &mut expected)?; }
        }
        for _ in 0..1000 {
            if expected.is_empty() { break; }
            lb.step();
            check(&mut lb, &mut expected)?;
        }
        prop_assert!(expected.is_empty(), "{} messages never arrived", expected.len());
    }

    /// Random bytes never panic the decoder.
    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = wire::decode(&bytes);
    }

    /// Random frames never panic a stack with live sockets of every type.
    #[test]
    fn random_frames_never_panic(frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..120), 1..50)) {
        let mut lb = pair();
        let (_c, _s) = connected(&mut lb, SocketType::Stream, 1234);
        let _l = listener(&mut lb, Side::B, SocketType::SeqPacket, 1235);
        let mut wakes = WakeList::new();
        let now = lb.now();
        lb.b.receive_batch(now, frames.iter().map(|f| &f[..]), &mut wakes);
        lb.run();
    }

    /// Frames with a valid header and random fields, aimed at the host's
    /// ports, never panic and never break the accounting invariants.
    #[test]
    fn random_headers_never_panic(
        fields in prop::collection::vec((0u16..8, 0u16..10, any::<u32>(), any::<u32>(), any::<u32>(), 0u32..3, 0usize..300), 1..80)
    ) {
        let mut stack = Stack::new(pier_stack::Config::new(HOST));
        let l = stack.socket(SocketType::Stream).unwrap();
        stack.bind(l, pier_stack::VsockAddr::new(pier_stack::VMADDR_CID_ANY, 1)).unwrap();
        stack.listen(l, 4).unwrap();
        let mut wakes = WakeList::new();
        for (ty, op, flags, buf_alloc, fwd_cnt, port, len) in fields {
            let raw = wire::RawHeader {
                src_cid: GUEST as u64, dst_cid: HOST as u64, src_port: port, dst_port: port % 2,
                len: len as u32, type_: ty, op, flags, buf_alloc, fwd_cnt,
            };
            let mut f = raw.encode().to_vec();
            f.resize(f.len() + len, 0xab);
            stack.receive_batch(lb_now(), [&f[..]], &mut wakes);
            let _ = stack.dispatch(lb_now(), &mut |_: &wire::RawHeader, _: &[u8]| Ok::<(), pier_stack::SinkFull>(()), &mut wakes);
            while let Ok((child, _)) = stack.accept(l) {
                let _ = stack.recv(child, &mut [0u8; 64]);
            }
        }
        prop_assert!(stack.buffered_bytes() <= 8 * 256 * 1024);
    }
}

fn is_prefix(got: &[u8], sent: &[u8]) -> bool {
    got.len() <= sent.len() && got == &sent[..got.len()]
}

/// Describes how two byte strings differ without printing them.
fn mismatch(got: &[u8], sent: &[u8]) -> String {
    let at = got.iter().zip(sent).position(|(a, b)| a != b);
    format!("received {} of {} bytes; first differing byte at {:?}", got.len(), sent.len(), at)
}

fn lb_now() -> pier_stack::Instant {
    pier_stack::Instant::ZERO
}
