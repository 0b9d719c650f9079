//! The in-process device on real threads: the device loop woken by queue eventfds and
//! running the guest's interrupt handler, the guest thread woken for its
//! timers, the application by wakers.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use pier_device::testing::Testbed;
use pier_device::{EventSource, Relay, Siblings, VsockConfig};
use pier_stack::wire::{Op, RawHeader};
use pier_stack::{
    Error, Instant, Interest, SocketHandle, SocketType, Stack, TxSink, VMADDR_CID_ANY, VsockAddr,
};

/// A host-side echo server on port 7, living in the device loop.
#[derive(Default)]
struct Echo {
    listener: Option<SocketHandle>,
    conns: Vec<SocketHandle>,
}

impl Echo {
    /// Listens on port 7 of the host stack; the device loop calls this
    /// when it builds its backend.
    fn build(stack: &mut Stack, _: &mio::Registry, _: usize) -> std::io::Result<Self> {
        let l = stack.socket(SocketType::Stream).unwrap();
        stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, 7)).unwrap();
        stack.listen(l, 16).unwrap();
        Ok(Self { listener: Some(l), conns: Vec::new() })
    }
}

impl EventSource for Echo {}
impl Siblings for Echo {}

impl Relay for Echo {
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        while let Ok((c, _)) = stack.accept(self.listener.unwrap()) {
            self.conns.push(c);
        }
        let mut buf = vec![0u8; 65536];
        self.conns.retain(|&c| {
            loop {
                let space = 65536;
                match stack.peek(c, &mut buf[..space]) {
                    Ok(info) if info.eof => {
                        let _ = stack.close(c, now);
                        break false;
                    }
                    Ok(info) => match stack.send(c, &buf[..info.len]) {
                        Ok(n) => {
                            let _ = stack.recv(c, &mut buf[..n]);
                            if n < info.len {
                                break true;
                            }
                        }
                        Err(Error::WouldBlock) => break true,
                        Err(_) => break false,
                    },
                    Err(Error::WouldBlock) => break true,
                    Err(_) => break false,
                }
            }
        });
    }
}

#[test]
fn echo_across_threads() {
    let running = Testbed::with_defaults().unwrap().start(Echo::build).unwrap();
    let guest = &running.guest;
    let c = connect_to_echo(guest);
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 7 % 251) as u8).collect();
    assert!(echo(guest, c, &data) == data, "4 MiB echoed intact across threads");
}

/// Sends `data` on `c` to the echo server and returns what came back.
fn echo(guest: &pier_device::GuestThread, c: SocketHandle, data: &[u8]) -> Vec<u8> {
    let mut sent = 0;
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 65536];
    while got.len() < data.len() {
        if sent < data.len() {
            sent += guest.with(|s, _| s.send(c, &data[sent..]).unwrap_or(0));
        }
        let n = guest
            .wait_for(c, Interest::Read, Duration::from_secs(5), |s, _| match s.recv(c, &mut buf) {
                Ok(info) => Some(info.len),
                Err(Error::WouldBlock) if sent < data.len() => Some(0),
                Err(Error::WouldBlock) => None,
                Err(e) => panic!("{e}"),
            })
            .expect("echo arrived in time");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// Wakes a thread parked in [`std::thread::park_timeout`].
struct Unpark(std::thread::Thread, std::sync::atomic::AtomicBool);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.1.store(true, std::sync::atomic::Ordering::Release);
        self.0.unpark();
    }
}

/// The guest's timers fire while the application sleeps on its waker: the
/// application's own call armed the timer and then never touches the stack
/// again, so only the guest thread (asleep with no deadline when the timer
/// was armed) can fire it.
#[test]
fn guest_timer_fires_while_the_application_waits() {
    use std::sync::atomic::Ordering;
    let running = Testbed::with_defaults().unwrap().start(Echo::build).unwrap();
    let guest = &running.guest;
    // Give the guest thread time to go to sleep with no deadline.
    std::thread::sleep(Duration::from_millis(50));
    let unpark = std::sync::Arc::new(Unpark(
        std::thread::current(),
        std::sync::atomic::AtomicBool::new(false),
    ));
    let waker = std::task::Waker::from(unpark.clone());
    let c = guest.with(|s, now| {
        let c = s.socket(SocketType::Stream).unwrap();
        s.set_connect_timeout(c, Duration::from_millis(300)).unwrap();
        // Nothing answers CID 9: the device drops packets for other CIDs.
        s.connect(c, VsockAddr::new(9, 7), now).unwrap();
        s.register_waker(c, Interest::Write, &waker).unwrap();
        c
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !unpark.1.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(100));
    }
    assert!(unpark.1.load(Ordering::Acquire), "the connect timer woke the application");
    assert_eq!(guest.with(|s, _| s.finish_connect(c)), Err(Error::TimedOut));
}

/// Connects the guest to the echo server on the host stack.
fn connect_to_echo(guest: &pier_device::GuestThread) -> SocketHandle {
    connect_to_host(guest, 7)
}

/// Connects the guest to `port` on the host stack.
fn connect_to_host(guest: &pier_device::GuestThread, port: u32) -> SocketHandle {
    let c = guest.with(|s, now| {
        let c = s.socket(SocketType::Stream).unwrap();
        s.connect(c, VsockAddr::new(2, port), now).unwrap();
        c
    });
    guest
        .wait_for(c, Interest::Write, Duration::from_secs(5), |s, _| match s.finish_connect(c) {
            Err(Error::WouldBlock) => None,
            other => Some(other),
        })
        .expect("connect finished in time")
        .expect("connected");
    c
}

/// A guest that restarts its driver under a running stack (the old driver
/// resets the device, a new one sets it up) keeps the bytes it had
/// received but not read, although the stack held them in the old
/// driver's receive buffers, which are gone; the connection then reports
/// the reset, and the new driver carries new connections.
#[test]
fn bytes_received_before_a_driver_restart_stay_readable_and_new_connections_work() {
    let running = Testbed::with_defaults().unwrap().start(Echo::build).unwrap();
    let guest = &running.guest;
    let c = connect_to_echo(guest);
    let data: Vec<u8> = (0..128 << 10).map(|i| (i * 7 % 251) as u8).collect();
    let mut sent = 0;
    while sent < data.len() {
        sent += guest.with(|s, _| s.send(c, &data[sent..]).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(1));
    }
    // The whole echo arrives, unread; large payloads stay in the driver's
    // buffers.
    let mut peeked = vec![0u8; data.len()];
    guest
        .wait_for(c, Interest::Read, Duration::from_secs(5), |s, _| {
            (s.peek(c, &mut peeked).map_or(0, |i| i.len) == data.len()).then_some(())
        })
        .expect("the echo arrived in time");
    assert!(guest.stats().stack.rx_bytes_held > 0, "no payload was held in a driver buffer");

    guest.restart_driver().expect("the new driver started");

    let mut got = vec![0u8; data.len()];
    let mut read = 0;
    while read < data.len() {
        match guest.with(|s, _| s.recv(c, &mut got[read..])) {
            Ok(info) if info.len > 0 => read += info.len,
            other => panic!("after {read} of {} bytes: {other:?}", data.len()),
        }
    }
    assert!(got == data, "the bytes received before the restart changed");
    assert_eq!(
        guest.with(|s, _| s.recv(c, &mut got)).map(|i| i.len),
        Err(Error::ConnectionReset),
        "the connection did not report the reset"
    );

    let c = connect_to_echo(guest);
    let back = echo(guest, c, &data);
    assert!(back == data, "a connection through the new driver echoed intact");
}

/// A host-side sink on port 8 that records which thread took each batch
/// of guest bytes.
#[derive(Default)]
struct ThreadRecorder {
    listener: Option<SocketHandle>,
    conns: Vec<SocketHandle>,
    /// `(thread, bytes)` for every read that found bytes.
    reads: std::sync::Arc<std::sync::Mutex<Vec<(std::thread::ThreadId, usize)>>>,
}

impl EventSource for ThreadRecorder {}
impl Siblings for ThreadRecorder {}

impl Relay for ThreadRecorder {
    fn service(&mut self, stack: &mut Stack, _: Instant) {
        while let Ok((c, _)) = stack.accept(self.listener.unwrap()) {
            self.conns.push(c);
        }
        let mut buf = [0u8; 4096];
        for &c in &self.conns {
            while let Ok(info) = stack.recv(c, &mut buf) {
                if info.len == 0 {
                    break;
                }
                self.reads.lock().unwrap().push((std::thread::current().id(), info.len));
            }
        }
    }
}

/// When the device loop is idle, the application's kick (sent as it
/// releases the guest lock) runs the device's round on the application's
/// own thread: the bytes have reached the host side, taken on that
/// thread, by the time the send returns, and no eventfd woke the loop.
/// The loop may be busy for a moment (a credit update, a timer), so each
/// send waits for quiet first, and one inline send in five suffices;
/// every byte must arrive whichever thread took it.
#[test]
fn a_kick_while_the_device_loop_is_idle_runs_the_round_on_the_kicking_thread() {
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let host_reads = reads.clone();
    let running = Testbed::with_defaults()
        .unwrap()
        .start(move |stack: &mut Stack, _: &mio::Registry, _: usize| {
            let l = stack.socket(SocketType::Stream).unwrap();
            stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, 8)).unwrap();
            stack.listen(l, 4).unwrap();
            Ok(ThreadRecorder { listener: Some(l), conns: Vec::new(), reads: host_reads })
        })
        .unwrap();
    let guest = &running.guest;
    let c = connect_to_host(guest, 8);
    let me = std::thread::current().id();
    let mut inline_sends = 0;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(50));
        let before = reads.lock().unwrap().len();
        assert_eq!(guest.with(|s, _| s.send(c, &[7u8; 100])), Ok(100));
        let taken_here = reads.lock().unwrap()[before..]
            .iter()
            .filter(|(thread, _)| *thread == me)
            .map(|(_, n)| n)
            .sum::<usize>();
        if taken_here == 100 {
            inline_sends += 1;
        }
    }
    assert!(inline_sends > 0, "no send was taken by the device on the application's thread");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while reads.lock().unwrap().iter().map(|(_, n)| n).sum::<usize>() < 500 {
        assert!(std::time::Instant::now() < deadline, "not every byte reached the host side");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A device that asks its driver for a reset (DEVICE_NEEDS_RESET, what
/// `pier boot --inject-resets-on-sigusr2` sets off) says so in its status
/// and serves no queue until the driver resets it: a byte sent meanwhile
/// is not echoed. Once the driver restarts, the request is gone, the old
/// connection reports the reset, the device counted one driver reset and
/// a new connection echoes.
#[test]
fn a_device_that_asks_for_a_reset_serves_nothing_until_its_driver_restarts() {
    use pier_device::device::status::NEEDS_RESET;

    let bed = Testbed::with_defaults().unwrap();
    let mmio = bed.mmio.clone();
    let status = || mmio.lock().unwrap().device().status();
    let running = bed.start(Echo::build).unwrap();
    let guest = &running.guest;
    let c = connect_to_echo(guest);
    let resets_before = running.device.stats().unwrap().endpoint.driver_resets;

    running.device.request_reset().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while status() & NEEDS_RESET == 0 {
        assert!(std::time::Instant::now() < deadline, "the device never asked for a reset");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(guest.with(|s, _| s.send(c, b"x")), Ok(1));
    let mut byte = [0u8; 1];
    let echoed = guest.wait_for(c, Interest::Read, Duration::from_millis(300), |s, _| {
        s.peek(c, &mut byte).ok().filter(|i| i.len > 0)
    });
    assert!(echoed.is_none(), "a device that asked for a reset still served the queues");

    guest.restart_driver().expect("the new driver started");
    assert_eq!(status() & NEEDS_RESET, 0, "the reset did not clear the request");
    assert_eq!(guest.with(|s, _| s.send(c, b"y")), Err(Error::ConnectionReset));
    let c = connect_to_echo(guest);
    let data = vec![5u8; 4096];
    assert!(echo(guest, c, &data) == data, "a connection after the reset echoed intact");
    let resets = running.device.stats().unwrap().endpoint.driver_resets;
    assert_eq!(resets - resets_before, 1, "driver resets the device counted");
}

/// One connection request from a sibling guest (CID 5) waiting for the
/// guest's port 9, as a vhost-user router's inbox holds it, and the
/// threads on which the device loop's round delivered such requests.
struct WaitingSiblingPacket {
    request: Arc<Mutex<Option<RawHeader>>>,
    delivered_on: Arc<Mutex<Vec<ThreadId>>>,
}

impl EventSource for WaitingSiblingPacket {}
impl Relay for WaitingSiblingPacket {}

impl Siblings for WaitingSiblingPacket {
    fn guest_packet_elsewhere(&mut self, _: &RawHeader, _: &[u8]) -> bool {
        // The guest's answers to CID 5 end here.
        true
    }

    fn packets_from_elsewhere(&mut self, sink: &mut dyn TxSink, _: usize) {
        let mut waiting = self.request.lock().unwrap();
        if let Some(request) = *waiting
            && sink.transmit(&request, &[]).is_ok()
        {
            *waiting = None;
            self.delivered_on.lock().unwrap().push(std::thread::current().id());
        }
    }
}

/// A packet another thread leaves for the guest (a sibling guest's, on the
/// vhost-user bus) is delivered by a round of this device run on that
/// thread when the loop sleeps (`InlineKick::try_deliver`), so no thread
/// is woken for it; the guest then accepts the connection it asked for.
/// The loop may be busy for a moment, so each delivery waits for quiet
/// first and one of five on the delivering thread suffices; every request
/// must be accepted, whichever thread delivered it. Once the loop has
/// ended, a delivery says so, and the caller falls back to the eventfd.
#[test]
fn a_packet_left_for_a_sleeping_device_loop_is_delivered_on_the_leaving_thread() {
    let request = Arc::new(Mutex::new(None));
    let delivered_on = Arc::new(Mutex::new(Vec::new()));
    let (waiting, delivered) = (request.clone(), delivered_on.clone());
    let running = Testbed::with_defaults()
        .unwrap()
        .start(move |_: &mut Stack, _: &mio::Registry, _: usize| {
            Ok(WaitingSiblingPacket { request: waiting, delivered_on: delivered })
        })
        .unwrap();
    let guest = &running.guest;
    let listener = guest.with(|s, _| {
        let l = s.socket(SocketType::Stream).unwrap();
        s.bind(l, VsockAddr::new(VMADDR_CID_ANY, 9)).unwrap();
        s.listen(l, 8).unwrap();
        l
    });
    let guest_cid = VsockConfig::default().guest_cid;
    let deliver = running.device.inline_kick();
    let me = std::thread::current().id();
    let mut delivered_here = 0;
    for sibling_port in 1000..1005 {
        std::thread::sleep(Duration::from_millis(50));
        *request.lock().unwrap() = Some(RawHeader {
            src_cid: 5,
            dst_cid: guest_cid,
            src_port: sibling_port,
            dst_port: 9,
            type_: SocketType::Stream as u16,
            op: Op::Request as u16,
            buf_alloc: 65536,
            ..RawHeader::default()
        });
        let before = delivered_on.lock().unwrap().len();
        let taken = deliver.try_deliver();
        if taken && delivered_on.lock().unwrap()[before..].contains(&me) {
            delivered_here += 1;
        }
        let accepted = guest.wait_for(listener, Interest::Read, Duration::from_secs(5), |s, _| {
            match s.accept(listener) {
                Err(Error::WouldBlock) => None,
                other => Some(other),
            }
        });
        let (_, peer) = accepted.expect("accepted in time").expect("accepted");
        assert_eq!(peer, VsockAddr::new(5, sibling_port), "the sibling's request was accepted");
    }
    assert!(delivered_here > 0, "no packet was delivered on the thread that left it");
    running.device.stop().unwrap();
    assert!(!deliver.try_deliver(), "a loop that has ended takes no delivery");
}

/// A device whose host stack holds guest bytes for a host program that
/// has read nothing: the guest sent until the host's credit ran out, the
/// program's Unix socket is full and the stack holds the rest.
struct HeldForAProgram {
    running: pier_device::inprocess::Running,
    program: std::os::unix::net::UnixStream,
    /// What the guest sent; the device took all of it.
    sent: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn guest_bytes_held_for_a_program() -> HeldForAProgram {
    use std::os::unix::net::UnixListener;

    use pier_device::GuestCid;
    use pier_device::bridge::{Bridge, BridgeConfig};

    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let listener = UnixListener::bind(pier_hybrid::listener_path(&uds, 5000)).unwrap();
    let config = BridgeConfig::new(&uds, GuestCid::DEFAULT);
    let running = Testbed::with_defaults()
        .unwrap()
        .start(move |stack, registry, token| Bridge::new(config, stack, registry, token))
        .unwrap();
    let guest = &running.guest;
    let c = connect_to_host(guest, 5000);
    let (program, _) = listener.accept().unwrap();

    let data: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let mut sent = 0;
    while let Some(n) = guest.wait_for(c, Interest::Write, Duration::from_millis(500), |s, _| {
        match s.send(c, &data[sent..]) {
            Ok(n) => Some(n),
            Err(Error::WouldBlock) => None,
            Err(e) => panic!("{e}"),
        }
    }) {
        sent += n;
    }
    assert!(sent < data.len(), "the credit ran out before the data did");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let stats = loop {
        let stats = running.device.stats().expect("the device loop answers");
        if stats.host_stack.rx_bytes == sent as u64 || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(stats.host_stack.rx_bytes, sent as u64, "the device took every byte sent");
    let written = stats.bridge.expect("a bridge").bytes_from_guest;
    assert!(written < sent as u64, "the host stack holds bytes when the stop comes");
    HeldForAProgram { running, program, sent: data[..sent].to_vec(), _dir: dir }
}

/// Guest bytes the device has taken are delivered even when the device
/// stops at once: the guest got its buffers back for them and counts them
/// as sent (a unikernel app that writes and exits ends its VM right
/// after). Here the host program reads nothing until the stop is under
/// way, so when it comes the host stack holds what the full Unix socket
/// could not take; the stop waits while the program reads it all.
#[test]
fn a_stopping_device_delivers_the_guest_bytes_its_host_stack_holds() {
    use std::io::Read;

    let HeldForAProgram { running, mut program, sent, _dir } = guest_bytes_held_for_a_program();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut got = Vec::new();
        program.read_to_end(&mut got).unwrap();
        got
    });
    running.device.stop().unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), sent.len(), "every byte the device took reached the host program");
    assert!(got == sent, "the bytes are intact");
}

/// A stop made urgent (a user's second Ctrl-C) does not wait for a host
/// program that reads nothing, which would hold it for 5 s: it drops the
/// bytes the host stack holds, and the program then reads only what its
/// Unix socket had taken before the end.
#[test]
fn an_urgent_stop_drops_the_held_guest_bytes_without_waiting_for_the_program() {
    use std::io::Read;

    let HeldForAProgram { running, mut program, sent, _dir } = guest_bytes_held_for_a_program();
    running.device.make_stop_urgent().unwrap();
    let asked = std::time::Instant::now();
    running.device.stop().unwrap();
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(2), "the stop waited {took:?} for the program");
    let mut got = Vec::new();
    program.read_to_end(&mut got).unwrap();
    assert!(got.len() < sent.len(), "the held bytes were dropped ({} arrived)", got.len());
    assert!(got == sent[..got.len()], "what arrived is intact");
}
