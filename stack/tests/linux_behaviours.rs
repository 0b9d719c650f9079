//! Recent Linux vsock behaviours, checked by counting rather than timing:
//! the receive-queue hint, wakeups deferred to the end of a receive batch,
//! and a non-blocking accept that arms nothing; then `Stack::wake_all`,
//! which a host that stops relies on. `docs/linux-behaviours.md` explains
//! each behaviour and why pier follows it; every test links to its section.
//! Datagrams, which come from the same kernel work, are in `datagrams.rs`.
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

use common::*;
use pier_stack::phy::Side;
use pier_stack::wire::{Header, Op};
use pier_stack::{Error, Interest, ReadinessEvent, ReadinessHook, SocketType, VsockAddr, WakeList};
use pier_testkit::pattern::xorshift32_bytes;

const MESSAGES: usize = 5000;
const MESSAGE_LEN: usize = 4096;

/// Ping-pong of 4 KiB messages, the receiver draining the queue between
/// messages. Returns receive calls per delivered message.
fn receive_calls_per_message(stop_on_hint: bool) -> f64 {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let message = xorshift32_bytes(1, MESSAGE_LEN);
    let mut buf = vec![0u8; 2 * MESSAGE_LEN];
    let mut calls = 0usize;
    for _ in 0..MESSAGES {
        assert_eq!(lb.a.send(c, &message).unwrap(), MESSAGE_LEN);
        lb.run();
        let mut got = 0;
        loop {
            calls += 1;
            match lb.b.recv(s, &mut buf) {
                Ok(info) => {
                    got += info.len;
                    if stop_on_hint && info.inq == 0 {
                        break;
                    }
                }
                Err(Error::WouldBlock) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, MESSAGE_LEN);
        lb.b.send(s, b"k").unwrap();
        lb.run();
        lb.a.recv(c, &mut buf).unwrap();
    }
    calls as f64 / MESSAGES as f64
}

/// The receive-queue hint (`docs/linux-behaviours.md#inq-hint`): with it, a
/// drain loop makes exactly one receive per message; without it, the loop
/// needs a second receive to learn the queue is empty.
#[test]
fn inq_hint_halves_receive_calls() {
    assert_eq!(receive_calls_per_message(true), 1.00);
    assert_eq!(receive_calls_per_message(false), 2.00);
}

/// The receive-queue hint's terminal value
/// (`docs/linux-behaviours.md#inq-hint`): once the peer has finished and the
/// queue is empty, the hint is 1, so a loop that stops on 0 still makes the
/// receive that sees EOF.
#[test]
fn inq_hint_is_one_at_eof() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.a.send(c, b"last words").unwrap();
    lb.a.shutdown(c, pier_stack::Shutdown::Write).unwrap();
    lb.run();
    let mut buf = [0u8; 64];
    let info = lb.b.recv(s, &mut buf).unwrap();
    assert_eq!(info.len, 10);
    assert_eq!(info.inq, 1, "terminal hint");
    let eof = lb.b.recv(s, &mut buf).unwrap();
    assert!(eof.eof);
    assert_eq!(eof.len, 0);
}

#[derive(Default)]
struct Counter {
    wakes: AtomicUsize,
    log: Option<Arc<Mutex<Vec<&'static str>>>>,
    name: &'static str,
}

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        if let Some(log) = &self.log {
            log.lock().unwrap().push(self.name);
        }
    }
}

fn counter(name: &'static str, log: &Arc<Mutex<Vec<&'static str>>>) -> (Arc<Counter>, Waker) {
    let c = Arc::new(Counter { name, log: Some(log.clone()), ..Counter::default() });
    let w = Waker::from(c.clone());
    (c, w)
}

/// Builds `n` RW packets from the guest's socket `c` to the host's socket
/// `s`, each moving the guest's `fwd_cnt` on, as a device would deliver them.
fn frames_for(
    lb: &mut pier_stack::phy::Loopback,
    c: pier_stack::SocketHandle,
    n: usize,
) -> Vec<Vec<u8>> {
    let local = lb.a.local_addr(c).unwrap();
    let peer = lb.a.peer_addr(c).unwrap();
    (0..n)
        .map(|i| {
            let header = Header {
                src_cid: local.cid as u64,
                dst_cid: peer.cid as u64,
                src_port: local.port,
                dst_port: peer.port,
                len: 100,
                socket_type: SocketType::Stream,
                op: Op::Rw,
                flags: 0,
                buf_alloc: 256 * 1024,
                fwd_cnt: ((i + 1) * 8192) as u32,
            };
            let mut frame = header.encode().to_vec();
            frame.extend_from_slice(&[i as u8; 100]);
            frame
        })
        .collect()
}

/// Wakeups after the batch (`docs/linux-behaviours.md#deferred-wakeups`): a
/// batch of N packets for one socket yields at most one data-ready wake and
/// one write-space wake, delivered only after the batch, write-space first.
/// The write-space wake comes from nothing but the `fwd_cnt` in RW headers
/// (`docs/linux-behaviours.md#credit-from-every-header`).
#[test]
fn batch_wakes_each_kind_once_after_the_batch() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    // Fill the guest's window so the host's writer is blocked on credit.
    let filler = vec![7u8; 512 * 1024];
    let mut sent = 0;
    while let Ok(n) = lb.b.send(s, &filler[sent..]) {
        sent += n;
    }
    assert_eq!(sent, 256 * 1024, "the window is the guest's buffer");
    lb.run();
    assert_eq!(lb.b.send(s, b"x"), Err(Error::WouldBlock));

    let log = Arc::new(Mutex::new(Vec::new()));
    let (reader, read_waker) = counter("data-ready", &log);
    let (writer, write_waker) = counter("write-space", &log);
    lb.b.register_waker(s, Interest::Read, &read_waker).unwrap();
    lb.b.register_waker(s, Interest::Write, &write_waker).unwrap();

    let frames = frames_for(&mut lb, c, 32);
    let mut wakes = WakeList::new();
    let now = lb.now();
    let mut batch = lb.b.rx_batch(now);
    for frame in &frames {
        batch.receive(frame);
        assert_eq!(reader.wakes.load(Ordering::SeqCst), 0, "woken inside the batch");
        assert_eq!(writer.wakes.load(Ordering::SeqCst), 0, "woken inside the batch");
    }
    batch.finish(&mut wakes);
    assert_eq!(wakes.len(), 2, "one wake of each kind for 32 packets");
    assert_eq!(reader.wakes.load(Ordering::SeqCst), 0, "woken before the caller asked");
    wakes.wake_all();
    assert_eq!(reader.wakes.load(Ordering::SeqCst), 1);
    assert_eq!(writer.wakes.load(Ordering::SeqCst), 1);
    assert_eq!(*log.lock().unwrap(), ["write-space", "data-ready"]);
    assert_eq!(lb.b.recv_queued(s).unwrap(), 3200);
}

struct CountingHook(Arc<Mutex<Vec<ReadinessEvent>>>);

impl ReadinessHook for CountingHook {
    fn notify(&mut self, _socket: pier_stack::SocketHandle, event: ReadinessEvent) {
        self.0.lock().unwrap().push(event);
    }
}

/// Wakeups after the batch, the fallback
/// (`docs/linux-behaviours.md#deferred-wakeups`): a socket whose
/// notification hook was replaced declines batching and is told per packet,
/// inside the batch.
#[test]
fn replaced_hook_falls_back_to_per_packet_delivery() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let events = Arc::new(Mutex::new(Vec::new()));
    lb.b.set_readiness_hook(s, Some(Box::new(CountingHook(events.clone())))).unwrap();
    let frames = frames_for(&mut lb, c, 8);
    let now = lb.now();
    let mut batch = lb.b.rx_batch(now);
    for (i, frame) in frames.iter().enumerate() {
        batch.receive(frame);
        let ready =
            events.lock().unwrap().iter().filter(|e| **e == ReadinessEvent::DataReady).count();
        assert_eq!(ready, i + 1, "hook called per packet, inside the batch");
    }
    let mut wakes = WakeList::new();
    batch.finish(&mut wakes);
    assert!(wakes.is_empty(), "nothing deferred for a hooked socket");
}

/// Non-blocking accept (`docs/linux-behaviours.md#nonblocking-accept`): on
/// an empty backlog it returns would-block at once and arms no timer.
#[test]
fn nonblocking_accept_arms_nothing() {
    let mut lb = pair();
    let l = listener(&mut lb, Side::B, SocketType::Stream, 1234);
    let sockets = lb.b.socket_count();
    for _ in 0..100 {
        assert_eq!(lb.b.accept(l), Err(Error::WouldBlock));
    }
    assert_eq!(lb.b.poll_at(), None, "no deadline armed");
    assert!(!lb.b.has_pending_tx());
    assert_eq!(lb.b.socket_count(), sockets);
    // And it returns the connection as soon as there is one.
    let (_c, outcome) =
        try_connect(&mut lb, Side::A, SocketType::Stream, VsockAddr::new(HOST, 1234));
    outcome.unwrap();
    assert!(lb.b.accept(l).is_ok());
}

/// `wake_all` hands back every parked waker once, whatever the readiness,
/// so a host shutting down can make every waiting task look again.
#[test]
fn wake_all_hands_back_every_parked_waker_once() {
    let mut lb = common::pair();
    let (c, _s) = common::connected(&mut lb, SocketType::Stream, 9000);
    let log = Arc::new(Mutex::new(Vec::new()));
    let (reader, reader_waker) = counter("reader", &log);
    let (acceptor, acceptor_waker) = counter("acceptor", &log);
    let l = common::listener(&mut lb, Side::B, SocketType::Stream, 9001);
    // Nothing to read, nothing to accept: both park.
    lb.a.register_waker(c, Interest::Read, &reader_waker).unwrap();
    lb.b.register_waker(l, Interest::Read, &acceptor_waker).unwrap();
    let mut wakes = WakeList::new();
    lb.a.wake_all(&mut wakes);
    assert_eq!(wakes.len(), 1, "only side A's parked reader");
    wakes.wake_all();
    assert_eq!(reader.wakes.load(Ordering::SeqCst), 1);
    assert_eq!(acceptor.wakes.load(Ordering::SeqCst), 0);
    lb.a.wake_all(&mut wakes);
    assert!(wakes.is_empty(), "a waker is handed back once");
    lb.b.wake_all(&mut wakes);
    wakes.wake_all();
    assert_eq!(acceptor.wakes.load(Ordering::SeqCst), 1);
}
