//! Datagram throughput as a host program sees it: pier's vsock datagrams
//! to a WebAssembly component and back, against the kernel's UDP on
//! 127.0.0.1 doing the same echo, in the same run.
//!
//! The pier path is the one `docs/host-sockets.md` gives users: the host
//! program sends each datagram, behind the 8-byte ports header, to
//! `<uds>_dgram`; the bridge hands it to the host endpoint's stack, the
//! device puts it in one of the guest driver's receive buffers, the guest
//! stack delivers it to `msg-echo` (under `pier run`, through the shim's
//! WIT datagram resource), which sends it back to its source, and the
//! bridge delivers the answer to the host program's socket at
//! `<uds>_dgram_<port>`. The baseline is a UDP socket on loopback that a
//! thread of this benchmark echoes.
//!
//! Both sides run the same client loop: send a window of datagrams, then
//! read their echoes, so neither a Unix datagram queue (10 datagrams) nor a
//! UDP receive buffer (about 208 KiB) overflows. The window is 8 datagrams
//! or 128 KiB, whichever is fewer. An echo not back within 200 ms counts as
//! lost; the tables show how many. Throughput is payload bytes echoed per
//! second, in each direction (each byte crosses the path twice). The
//! largest size is 65,507 bytes, the largest UDP payload over IPv4, for
//! both (a vsock datagram may carry 64 KiB).
//!
//! Then a **flood**, the same sizes and counts with no window: one thread
//! sends every datagram as fast as the socket takes it, never waiting for
//! an echo, while another counts the echoes that come back, until none has
//! come for 200 ms after the last send. What it shows is loss under
//! overload: sent against echoed, for pier and for UDP, with the rate of
//! what was echoed. The two are not flow-controlled alike, which is the
//! point of the comparison: a send to a Unix datagram socket whose queue
//! is full waits (so the bridge paces the sender into pier, and loss can
//! only happen past it), where a UDP send never waits and the kernel drops
//! what a full receive buffer cannot take. Loss is reported, never
//! asserted.
//!
//! `cargo bench -p pier-cli --bench datagrams [-- --quick] [--sizes=4096,65507]
//! [--only=window|flood]` (`--sizes` and `--only` run part of it, for
//! comparing two builds quickly); with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records both
//! sweeps.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::datagram_echo::{Echo, LOSS_TIMEOUT, echo_windows, udp_echo};
use common::{pier, size_label};
use pier_hybrid::{
    DATAGRAM_HEADER_LEN, datagram_path, datagram_receiver_path, encode_datagram_header,
};
use pier_testkit::bench::{PairedRatio, median, round_order, rounds};

const GUEST_PORT: u32 = 1235;
const HOST_PORT: u32 = 9000;
/// Datagram sizes of the sweep; the last is the largest UDP payload.
const SIZES: [usize; 6] = [64, 256, 1024, 4096, 16384, 65_507];

fn msg_echo() -> PathBuf {
    pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .join("msg-echo.wasm")
}

/// The host program's socket at `<uds>_dgram_9000`, talking to guest port
/// 1235 through `<uds>_dgram`.
struct Vsock {
    me: UnixDatagram,
    guest: PathBuf,
    /// The datagram being sent, header first: reused, so a send does not
    /// allocate (only the sending thread takes it).
    frame: Mutex<Vec<u8>>,
}

impl Echo for Vsock {
    fn send(&self, payload: &[u8]) {
        self.try_send(payload).expect("sending to <uds>_dgram");
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.me.recv(buf).ok().map(|n| n.saturating_sub(DATAGRAM_HEADER_LEN))
    }
}

impl Vsock {
    /// Sends one datagram; fails while `pier run` has not bound
    /// `<uds>_dgram` yet.
    fn try_send(&self, payload: &[u8]) -> std::io::Result<usize> {
        let mut frame = self.frame.lock().unwrap();
        frame.clear();
        frame.extend_from_slice(&encode_datagram_header(GUEST_PORT, HOST_PORT));
        frame.extend_from_slice(payload);
        self.me.send_to(&frame, &self.guest)
    }
}

/// What one flood measured.
#[derive(Debug, Default)]
struct Flood {
    sent: usize,
    echoed: usize,
    /// Payload bytes echoed per second, from the first send to the last
    /// echo.
    rate: f64,
}

/// Sends `count` datagrams of `size` bytes without waiting for any echo,
/// while a second thread counts the echoes, until [`LOSS_TIMEOUT`] passes
/// with none after the last send (`recv` gives up after that long).
fn flood(side: &dyn Echo, size: usize, count: usize) -> Flood {
    let payload = vec![0xa5u8; size];
    let done_sending = AtomicBool::new(false);
    let started = Instant::now();
    let (echoed, last_echo) = std::thread::scope(|scope| {
        let receiver = scope.spawn(|| {
            let mut buf = vec![0u8; 65536 + DATAGRAM_HEADER_LEN];
            let (mut echoed, mut last_echo) = (0, started);
            while echoed < count {
                match side.recv(&mut buf) {
                    // A straggler of an earlier size is not this flood's.
                    Some(n) if n == size => {
                        echoed += 1;
                        last_echo = Instant::now();
                    }
                    Some(_) => {}
                    None if done_sending.load(Ordering::Acquire) => break,
                    None => {}
                }
            }
            (echoed, last_echo)
        });
        for _ in 0..count {
            side.send(&payload);
        }
        done_sending.store(true, Ordering::Release);
        receiver.join().unwrap()
    });
    let elapsed = last_echo.duration_since(started).as_secs_f64();
    let rate = if echoed > 0 { (echoed * size) as f64 / elapsed } else { 0.0 };
    Flood { sent: count, echoed, rate }
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let (total, max_count): (usize, usize) =
        if quick { (32 << 20, 8 << 10) } else { (256 << 20, 64 << 10) };
    let runs = if quick { 1 } else { 3 };
    let rounds = rounds();
    let wasm = msg_echo();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("dgram.vsock");
    let port = GUEST_PORT.to_string();
    let _pier = pier(&[
        "run",
        wasm.to_str().unwrap(),
        "--uds",
        uds.to_str().unwrap(),
        "--listen",
        &port,
        "--connect",
        "2:*",
        "--",
        "--port",
        &port,
    ]);
    let me = loop {
        if let Ok(me) = UnixDatagram::bind(datagram_receiver_path(&uds, HOST_PORT)) {
            break me;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    me.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let vsock = Vsock { me, guest: datagram_path(&uds), frame: Default::default() };
    // msg-echo may still be starting: ping until the first echo.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![0u8; 65536 + DATAGRAM_HEADER_LEN];
    loop {
        if vsock.try_send(&[0]).is_ok() && vsock.recv(&mut buf).is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "msg-echo never answered");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stragglers from the pings.
    while vsock.recv(&mut buf).is_some() {}
    vsock.me.set_read_timeout(Some(LOSS_TIMEOUT)).unwrap();
    let (udp, udp_thread) = udp_echo();

    println!(
        "datagram echo, host program <-> msg-echo component, up to {} MiB per case, \
         median of {rounds} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        total >> 20
    );
    println!(
        "| datagram size | pier run msg-echo | kernel UDP, 127.0.0.1 | pier / UDP \
         | lowest, highest round | lost (pier, UDP) |"
    );
    println!("|---|---|---|---|---|---|");
    let sizes = pier_testkit::bench::chosen_sizes().unwrap_or(SIZES.to_vec());
    for &size in sizes.iter().filter(|_| pier_testkit::bench::runs_part("window")) {
        let count = (total / size).min(max_count);
        let (mut pier_rates, mut udp_rates, mut pier_lost, mut udp_lost) =
            (Vec::new(), Vec::new(), 0, 0);
        for round in 0..rounds {
            for side in round_order(round, 2) {
                let (echo, rates, lost): (&dyn Echo, _, _) = match side {
                    0 => (&vsock, &mut pier_rates, &mut pier_lost),
                    _ => (&udp, &mut udp_rates, &mut udp_lost),
                };
                let (rate, lost_now) = echo_windows(echo, size, count);
                rates.push(rate);
                *lost += lost_now;
            }
        }
        let (pier_mb, udp_mb) = (median(&pier_rates) / 1e6, median(&udp_rates) / 1e6);
        let ratio = PairedRatio::of(&pier_rates, &udp_rates);
        println!(
            "| {} | {pier_mb:.1} MB/s | {udp_mb:.1} MB/s | {:.2}x | {:.2}x, {:.2}x | {pier_lost}, {udp_lost} of {} |",
            size_label(size),
            ratio.median,
            ratio.lowest,
            ratio.highest,
            count * rounds
        );
        rec.record("datagrams", "pier", size, pier_mb, "MB/s");
        rec.record("datagrams", "udp", size, udp_mb, "MB/s");
        rec.record("datagrams", "pier/udp", size, ratio.median, "x");
        rec.record("datagrams", "pier/udp-lowest", size, ratio.lowest, "x");
        rec.record("datagrams", "pier/udp-highest", size, ratio.highest, "x");
        rec.record("datagrams", "pier-lost", size, pier_lost as f64, "count");
        rec.record("datagrams", "udp-lost", size, udp_lost as f64, "count");
    }

    println!(
        "\nflood (no window: send all, count the echoes), the same counts, best rate of {runs}, loss summed\n"
    );
    println!(
        "| datagram size | pier run msg-echo | kernel UDP, 127.0.0.1 | pier / UDP | lost (pier) | lost (UDP) |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in sizes.iter().filter(|_| pier_testkit::bench::runs_part("flood")) {
        let count = (total / size).min(max_count);
        let (mut pier_best, mut udp_best) = (Flood::default(), Flood::default());
        let (mut pier_lost, mut udp_lost) = (0, 0);
        for _ in 0..runs {
            for (side, best, lost) in [
                (&vsock as &dyn Echo, &mut pier_best, &mut pier_lost),
                (&udp, &mut udp_best, &mut udp_lost),
            ] {
                let f = flood(side, size, count);
                *lost += f.sent - f.echoed;
                if f.rate >= best.rate {
                    *best = f;
                }
            }
        }
        let sent = count * runs;
        let percent = |lost: usize| lost as f64 * 100.0 / sent as f64;
        let (pier_mb, udp_mb) = (pier_best.rate / 1e6, udp_best.rate / 1e6);
        println!(
            "| {} | {pier_mb:.1} MB/s | {udp_mb:.1} MB/s | {:.2}x | {pier_lost} of {sent} ({:.1} %) | {udp_lost} of {sent} ({:.1} %) |",
            size_label(size),
            pier_best.rate / udp_best.rate,
            percent(pier_lost),
            percent(udp_lost),
        );
        rec.record("datagrams-flood", "pier", size, pier_mb, "MB/s");
        rec.record("datagrams-flood", "udp", size, udp_mb, "MB/s");
        rec.record("datagrams-flood", "pier/udp", size, pier_best.rate / udp_best.rate, "x");
        rec.record("datagrams-flood", "sent", size, sent as f64, "count");
        rec.record("datagrams-flood", "pier-lost", size, pier_lost as f64, "count");
        rec.record("datagrams-flood", "udp-lost", size, udp_lost as f64, "count");
        rec.record("datagrams-flood", "pier-lost-share", size, percent(pier_lost), "%");
        rec.record("datagrams-flood", "udp-lost-share", size, percent(udp_lost), "%");
    }
    udp.0.send(&[1]).unwrap();
    udp_thread.join().unwrap();
}
