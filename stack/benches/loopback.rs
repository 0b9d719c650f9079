//! Stream throughput and ping-pong latency over the loopback harness,
//! measured against a kernel Unix-socket pair doing the same work in the
//! same run.
//!
//! `cargo bench -p pier-stack` (add `-- --quick` for a shorter run).
//!
//! Both sides run on one thread, so both pay for every copy and for every
//! step of both peers. For throughput the writer writes `size`-byte
//! chunks; after each write the reader drains what has arrived. For
//! latency one side sends 64 bytes, the other echoes them, and the time per
//! round trip is reported.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use pier_stack::phy::Loopback;
use pier_stack::{SocketHandle, SocketType, VMADDR_CID_ANY, VMADDR_CID_HOST, VsockAddr};

fn connected() -> (Loopback, SocketHandle, SocketHandle) {
    let mut lb = Loopback::guest_and_host();
    let l = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.bind(l, VsockAddr::new(VMADDR_CID_ANY, 1234)).unwrap();
    lb.b.listen(l, 1).unwrap();
    let c = lb.a.socket(SocketType::Stream).unwrap();
    let now = lb.now();
    lb.a.connect(c, VsockAddr::new(VMADDR_CID_HOST, 1234), now).unwrap();
    lb.run();
    lb.a.finish_connect(c).unwrap();
    let (s, _) = lb.b.accept(l).unwrap();
    (lb, c, s)
}

/// Bytes per second moving `total` bytes in `size`-byte writes over pier.
fn pier_throughput(size: usize, total: usize) -> f64 {
    let (mut lb, c, s) = connected();
    let chunk = vec![0xa5u8; size];
    let mut buf = vec![0u8; size.max(64 * 1024)];
    let (mut sent, mut received) = (0, 0);
    let started = Instant::now();
    while received < total {
        if sent < total
            && let Ok(n) = lb.a.send(c, &chunk)
        {
            sent += n;
        }
        lb.step();
        while let Ok(info) = lb.b.recv(s, &mut buf[..size]) {
            if info.len == 0 {
                break;
            }
            received += info.len;
            if info.inq == 0 {
                break;
            }
        }
        lb.step();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// The same work on a kernel Unix-socket pair.
fn unix_throughput(size: usize, total: usize) -> f64 {
    let (mut w, mut r) = UnixStream::pair().unwrap();
    r.set_nonblocking(true).unwrap();
    let chunk = vec![0xa5u8; size];
    let mut buf = vec![0u8; size];
    let (mut sent, mut received) = (0, 0);
    let started = Instant::now();
    while received < total {
        if sent < total {
            w.write_all(&chunk).unwrap();
            sent += size;
        }
        loop {
            match r.read(&mut buf) {
                Ok(n) => {
                    received += n;
                    if n < size {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    total as f64 / started.elapsed().as_secs_f64()
}

const PING: usize = 64;

fn pier_latency(rounds: usize) -> Duration {
    let (mut lb, c, s) = connected();
    let msg = [1u8; PING];
    let mut buf = [0u8; PING];
    let started = Instant::now();
    for _ in 0..rounds {
        lb.a.send(c, &msg).unwrap();
        lb.step();
        let got = lb.b.recv(s, &mut buf).unwrap();
        lb.b.send(s, &buf[..got.len]).unwrap();
        lb.step();
        assert_eq!(lb.a.recv(c, &mut buf).unwrap().len, PING);
    }
    started.elapsed() / rounds as u32
}

fn unix_latency(rounds: usize) -> Duration {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let msg = [1u8; PING];
    let mut buf = [0u8; PING];
    let started = Instant::now();
    for _ in 0..rounds {
        a.write_all(&msg).unwrap();
        b.read_exact(&mut buf).unwrap();
        b.write_all(&buf).unwrap();
        a.read_exact(&mut buf).unwrap();
    }
    started.elapsed() / rounds as u32
}

/// Best of `runs`, to keep scheduler noise out of the ratio.
fn best(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(f64::MIN, f64::max)
}

fn gbits(bytes_per_sec: f64) -> f64 {
    bytes_per_sec * 8.0 / 1e9
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let total = if quick { 64 << 20 } else { 512 << 20 };
    let runs = if quick { 1 } else { 3 };
    println!("pier-stack loopback benchmark: {} MiB per case, best of {runs}\n", total >> 20);
    println!("| case | pier loopback | Unix socket pair | pier / Unix |");
    println!("|---|---|---|---|");
    for size in [64usize, 4096, 65536] {
        // Small writes move fewer bytes so every case takes similar time.
        let bytes = if size == 64 { total / 16 } else { total };
        let pier = best(runs, || pier_throughput(size, bytes));
        let unix = best(runs, || unix_throughput(size, bytes));
        let label = if size >= 1024 { format!("{} KiB", size / 1024) } else { format!("{size} B") };
        println!(
            "| stream, {label} writes | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
            gbits(pier),
            gbits(unix),
            pier / unix
        );
    }
    let rounds = if quick { 20_000 } else { 200_000 };
    let pier = (0..runs).map(|_| pier_latency(rounds)).min().unwrap();
    let unix = (0..runs).map(|_| unix_latency(rounds)).min().unwrap();
    println!(
        "| ping-pong, 64 B, round trip | {:.2} us | {:.2} us | {:.2}x faster |",
        pier.as_secs_f64() * 1e6,
        unix.as_secs_f64() * 1e6,
        unix.as_secs_f64() / pier.as_secs_f64()
    );
}
