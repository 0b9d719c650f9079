//! The whole chain, end to end: host programs on real Unix sockets, the
//! hybrid bridge and host endpoint in the device thread, virtqueues in DMA
//! memory, pier-driver and a guest stack on the guest thread, and guest
//! applications on their own thread.

#[path = "bridge/host.rs"]
#[allow(dead_code)]
mod host;

mod driver {
    pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
}

use std::io::{Read, Write};
use std::net::Shutdown as NetShutdown;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant as WallClock};

use pier_device::GuestCid;
use pier_device::Running;
use pier_device::bridge::Bridge;
use pier_device::bridge::BridgeConfig;
use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_device::testing::apps::Echo;
use pier_driver::DriverConfig;
use pier_hybrid::{connect_line, parse_ok, seqpacket_path};
use pier_stack::{Error, Instant, Interest, Shutdown, SocketHandle, SocketType, Stack, VsockAddr};
use pier_testkit::pattern::Fnv;

/// A running system with one guest application.
struct System {
    /// Keeps the guest and device threads alive for the test's duration.
    _running: Arc<Running>,
    _dir: tempfile::TempDir,
    uds: PathBuf,
    stop: Arc<AtomicBool>,
    app: Option<JoinHandle<()>>,
}

impl System {
    fn start<A: FnMut(&mut Stack, Instant, &Waker) + Send + 'static>(
        make_app: impl FnOnce(&mut Stack) -> A,
    ) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), make_app)
    }

    /// Starts in `dir`, where the test may already have bound host listeners.
    fn start_in<A: FnMut(&mut Stack, Instant, &Waker) + Send + 'static>(
        dir: tempfile::TempDir,
        make_app: impl FnOnce(&mut Stack) -> A,
    ) -> Self {
        Self::start_with(dir, DriverConfig::default(), make_app)
    }

    /// Starts in `dir` with a guest driver configured as `driver`.
    fn start_with<A: FnMut(&mut Stack, Instant, &Waker) + Send + 'static>(
        dir: tempfile::TempDir,
        driver: DriverConfig,
        make_app: impl FnOnce(&mut Stack) -> A,
    ) -> Self {
        let uds = dir.path().join("vm.vsock");
        let config = BridgeConfig::new(&uds, GuestCid::DEFAULT);
        let running = Testbed::new(VsockConfig::default(), driver)
            .unwrap()
            .start(|stack, registry, token| Bridge::new(config, stack, registry, token))
            .unwrap();
        let running = Arc::new(running);
        let mut app = running.guest.with(|stack, _| make_app(stack));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (running, stop) = (running.clone(), stop.clone());
            std::thread::spawn(move || running.guest.serve(&stop, |s, _, now, w| app(s, now, w)))
        };
        Self { _running: running, _dir: dir, uds, stop, app: Some(handle) }
    }

    fn echo(port: u32) -> Self {
        Self::start(|stack| {
            let mut echo = Echo::listen(stack, port).unwrap();
            move |s: &mut Stack, now: Instant, w: &Waker| echo.step(s, now, w)
        })
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.app.take() {
            let _ = h.join();
        }
    }
}

/// The three ways a host program may send the CONNECT line, each followed
/// by an echo through the guest.
#[test]
fn host_connects_in_three_ways_and_the_guest_echoes() {
    let sys = System::echo(1234);
    // One write.
    let (mut s, _) = host::connect(&sys.uds, 1234);
    s.write_all(b"one write").unwrap();
    let mut buf = [0u8; 9];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"one write");
    // Byte by byte.
    let mut s = host::dial(&sys.uds);
    for b in connect_line(1234).as_bytes() {
        s.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    host::expect_ok(host::read_line(&mut s));
    s.write_all(b"split line").unwrap();
    let mut buf = [0u8; 10];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"split line");
    // Data in the same write as the line.
    let mut s = host::dial(&sys.uds);
    s.write_all(&[connect_line(1234).as_bytes(), b"early bytes"].concat()).unwrap();
    host::expect_ok(host::read_line(&mut s));
    let mut buf = [0u8; 11];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"early bytes");
}

/// 256 MiB each way through the echo, checked with a hash, the host
/// reading slowly so credit stalls and resumes; then half-close from the
/// host: every byte comes back, then EOF.
#[test]
fn quarter_gibibyte_each_way_with_a_slow_reader() {
    const TOTAL: u64 = 256 << 20;
    let sys = System::echo(1234);
    let (s, _) = host::connect(&sys.uds, 1234);
    let mut writer = s.try_clone().unwrap();
    let mut reader = s;
    let sender = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut off = 0u64;
        while off < TOTAL {
            host::fill(off, &mut buf);
            writer.write_all(&buf).unwrap();
            off += buf.len() as u64;
        }
        writer.shutdown(NetShutdown::Write).unwrap();
    });
    let mut got = 0u64;
    let mut buf = vec![0u8; 40 * 1024];
    let mut hash = Fnv::default();
    let mut want_hash = Fnv::default();
    let mut stalls = 0;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(host::matches(got, &buf[..n]), "byte {got} differs");
        hash.update(&buf[..n]);
        want_hash.update(&host::pattern(got, n));
        got += n as u64;
        // Slow down now and then so the guest's send window fills.
        if got % (16 << 20) < n as u64 {
            stalls += 1;
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    sender.join().unwrap();
    assert_eq!(got, TOTAL, "every byte back, then EOF");
    assert_eq!(hash, want_hash);
    assert!(stalls >= 15);
    let endpoint = sys._running.device.stats().expect("device counters").endpoint;
    assert!(
        endpoint.to_guest_in_place > TOTAL / (64 << 10) / 2,
        "the host's bytes went into rx buffers in place: {endpoint:?}"
    );
}

/// Receive buffers too small to be worth a read system call each (a Linux
/// guest's 4 KiB ones) are not lent to the bridge: the host's bytes go
/// through the host stack, and every one arrives.
#[test]
fn small_rx_buffers_are_not_lent_and_the_bytes_still_arrive() {
    const TOTAL: usize = 4 << 20;
    let driver = DriverConfig { rx_buffer_size: 4096, rx_buffers: 64, ..DriverConfig::default() };
    let sys = System::start_with(tempfile::tempdir().unwrap(), driver, |stack| {
        let mut echo = Echo::listen(stack, 1234).unwrap();
        move |s: &mut Stack, now: Instant, w: &Waker| echo.step(s, now, w)
    });
    let (s, _) = host::connect(&sys.uds, 1234);
    let mut writer = s.try_clone().unwrap();
    let mut reader = s;
    let sender = std::thread::spawn(move || {
        writer.write_all(&host::pattern(0, TOTAL)).unwrap();
        writer.shutdown(NetShutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    reader.read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    assert!(
        back == host::pattern(0, TOTAL),
        "every byte back in order ({} of {TOTAL})",
        back.len()
    );
    let endpoint = sys._running.device.stats().expect("device counters").endpoint;
    assert_eq!(endpoint.to_guest_in_place, 0, "{endpoint:?}");
    assert!(endpoint.to_guest > (TOTAL / 4096) as u64, "{endpoint:?}");
}

/// What a [`Caller`] received, whether it saw EOF, and how its connect failed.
type Received = Arc<std::sync::Mutex<(Vec<u8>, bool, Option<Error>)>>;

/// A guest application that connects out to `port` on the host, sends
/// `data`, half-closes, and then collects what the host sends back.
struct Caller {
    socket: Option<SocketHandle>,
    port: u32,
    data: Vec<u8>,
    sent: usize,
    shut: bool,
    received: Received,
}

impl Caller {
    fn step(&mut self, stack: &mut Stack, now: Instant, waker: &Waker) {
        let s = match self.socket {
            Some(s) => s,
            None => {
                let s = stack.socket(SocketType::Stream).unwrap();
                stack.connect(s, VsockAddr::new(2, self.port), now).unwrap();
                self.socket = Some(s);
                s
            }
        };
        match stack.finish_connect(s) {
            Ok(()) => {}
            Err(Error::WouldBlock) => {
                let _ = stack.register_waker(s, Interest::Write, waker);
                return;
            }
            Err(e) => {
                self.received.lock().unwrap().2 = Some(e);
                return;
            }
        }
        while self.sent < self.data.len() {
            match stack.send(s, &self.data[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(_) => break,
            }
        }
        if self.sent == self.data.len() && !self.shut {
            stack.shutdown(s, Shutdown::Write).unwrap();
            self.shut = true;
        }
        let mut buf = [0u8; 4096];
        let mut shared = self.received.lock().unwrap();
        loop {
            match stack.recv(s, &mut buf) {
                Ok(info) if info.eof => {
                    shared.1 = true;
                    break;
                }
                Ok(info) => shared.0.extend_from_slice(&buf[..info.len]),
                Err(_) => break,
            }
        }
        let _ = stack.register_waker(s, Interest::Read, waker);
        let _ = stack.register_waker(s, Interest::Write, waker);
    }
}

/// Starts a system whose guest runs a [`Caller`] to host `port`; `prepare`
/// may bind host listeners in the directory first.
fn caller(port: u32, data: &[u8], prepare: impl FnOnce(&std::path::Path)) -> (System, Received) {
    let dir = tempfile::tempdir().unwrap();
    prepare(&dir.path().join("vm.vsock"));
    let received: Received = Default::default();
    let shared = received.clone();
    let data = data.to_vec();
    let sys = System::start_in(dir, move |_| {
        let mut c = Caller { socket: None, port, data, sent: 0, shut: false, received: shared };
        move |s: &mut Stack, now: Instant, w: &Waker| c.step(s, now, w)
    });
    (sys, received)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = WallClock::now() + Duration::from_secs(20);
    while !f() {
        assert!(WallClock::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The guest connects out to a host listener at `<uds>_<port>`; the guest
/// half-closes, the host still answers, then closes: half-close works in
/// the guest → host direction too.
#[test]
fn guest_connects_out_and_half_closes() {
    let mut listener = None;
    let (_sys, received) = caller(5000, b"request from the guest", |uds| {
        listener = Some(host::listen(uds, 5000));
    });
    let mut conn = host::accept(listener.as_ref().unwrap());
    let request = host::read_to_end(&mut conn);
    assert_eq!(request, b"request from the guest", "then EOF: the guest's half-close");
    conn.write_all(b"the host's answer").unwrap();
    conn.shutdown(NetShutdown::Write).unwrap();
    wait_until("the answer and EOF in the guest", || received.lock().unwrap().1);
    assert_eq!(received.lock().unwrap().0, b"the host's answer");
}

/// Connecting to a port with nothing behind it fails fast both ways: the
/// host's socket is closed without OK, the guest's connect is reset.
#[test]
fn connects_to_nothing_are_refused_fast() {
    let (sys, received) = caller(4321, b"", |_| {});
    let started = WallClock::now();
    wait_until("the guest's connect to fail", || received.lock().unwrap().2.is_some());
    assert_eq!(received.lock().unwrap().2, Some(Error::ConnectionReset));
    assert!(started.elapsed() < Duration::from_millis(500), "guest → host refused fast");
    let started = WallClock::now();
    let mut s = host::dial(&sys.uds);
    s.write_all(connect_line(9).as_bytes()).unwrap();
    assert_eq!(host::read_line(&mut s), None, "closed without OK");
    assert!(started.elapsed() < Duration::from_millis(500), "host → guest refused fast");
}

/// Resets from either side: a guest that closes with unread data and
/// never reads again; a host program that closes with unread data.
#[test]
fn resets_from_either_side() {
    let sys = System::echo(1234);
    // Host side goes away abruptly while the guest still sends.
    let (mut s, _) = host::connect(&sys.uds, 1234);
    s.write_all(&vec![7u8; 64 * 1024]).unwrap();
    drop(s);
    // The system stays healthy: a new connection still echoes.
    let (mut s, _) = host::connect(&sys.uds, 1234);
    s.write_all(b"still alive").unwrap();
    let mut buf = [0u8; 11];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still alive");
    // Guest side resets: a guest app that accepts and closes at once, unread.
    let sys2 = System::start(|stack| {
        let l = stack.socket(SocketType::Stream).unwrap();
        stack.bind(l, VsockAddr::new(pier_stack::VMADDR_CID_ANY, 80)).unwrap();
        stack.listen(l, 4).unwrap();
        move |s: &mut Stack, now: Instant, w: &Waker| {
            while let Ok((c, _)) = s.accept(l) {
                let _ = s.close(c, now);
            }
            let _ = s.register_waker(l, Interest::Read, w);
        }
    });
    let (mut s, _) = host::connect(&sys2.uds, 80);
    let mut rest = Vec::new();
    let n = s.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "the guest's close reads as EOF on the host");
}

/// Seqpacket across the bridge keeps message boundaries and EOR, both ways,
/// through a guest seqpacket echo.
#[test]
fn seqpacket_boundaries_survive_the_whole_chain() {
    let sys = System::start(|stack| {
        let l = stack.socket(SocketType::SeqPacket).unwrap();
        stack.bind(l, VsockAddr::new(pier_stack::VMADDR_CID_ANY, 77)).unwrap();
        stack.listen(l, 4).unwrap();
        let mut conns: Vec<SocketHandle> = Vec::new();
        let mut buf = vec![0u8; 300_000];
        move |s: &mut Stack, now: Instant, w: &Waker| {
            while let Ok((c, _)) = s.accept(l) {
                conns.push(c);
            }
            let _ = s.register_waker(l, Interest::Read, w);
            conns.retain(|&c| {
                loop {
                    match s.peek(c, &mut buf) {
                        Ok(info) if info.eof => {
                            let _ = s.close(c, now);
                            break false;
                        }
                        Ok(info) => match s.send_message(c, &buf[..info.len], info.end_of_record) {
                            Ok(()) => {
                                let _ = s.recv(c, &mut buf);
                            }
                            Err(_) => {
                                let _ = s.register_waker(c, Interest::Write, w);
                                break true;
                            }
                        },
                        Err(_) => {
                            let _ = s.register_waker(c, Interest::Read, w);
                            break true;
                        }
                    }
                }
            });
        }
    });
    let sock = host::seq_dial(&seqpacket_path(&sys.uds));
    host::seq_send_raw(&sock, connect_line(77).as_bytes());
    let ok = host::seq_recv_raw(&sock).expect("OK message");
    assert!(parse_ok(&ok).is_some(), "{:?}", String::from_utf8_lossy(&ok));
    let messages: Vec<(Vec<u8>, bool)> =
        (0..30).map(|i| (host::pattern(i as u64, 1 + i * 7000), i % 4 == 1)).collect();
    for (m, eor) in &messages {
        host::seq_send(&sock, m, *eor);
        let (got, got_eor) = host::seq_recv(&sock).expect("echoed message");
        assert_eq!((got.len(), got_eor), (m.len(), *eor));
        assert!(got == *m);
    }
}
