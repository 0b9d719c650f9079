//! Stream throughput and ping-pong latency over the loopback harness,
//! measured against a kernel Unix-socket pair doing the same work in the
//! same run.
//!
//! `cargo bench -p pier-stack` (add `-- --quick` for a shorter run), or
//! with every other benchmark, `cargo xtask bench`, which turns the JSON
//! lines this writes under `PIER_BENCH_JSON` into `docs/benchmarks.md`'s
//! tables and plots.
//!
//! Both sides run on one thread, so both pay for every copy and for every
//! step of both peers. For throughput the writer writes `size`-byte
//! chunks, from 64 B to 256 KiB; after each write the reader drains what
//! has arrived. pier's writer runs twice: once with `Stack::send`, whose
//! bytes wait in the send ring until the next step, and once with
//! `Loopback::send_in_place`, whose packets go from the writer's chunk
//! straight into the peer's receive ring while credit allows, as pier's
//! driver sends writes of 16 KiB and more. For latency one side sends a
//! message (64 B to 64 KiB), the other echoes it, and the time per round
//! trip is reported.
//!
//! Last, the copy routine (`pier_stack::copy`): the stream cases again at
//! 4 KiB and 64 KiB under each copy strategy, and the two strategies'
//! raw copy speed, so each machine shows what its CPU's choice is worth.
//!
//! `-- --writes=N [--sizes=64,1024]` runs only pier's side of the stream
//! case, N writes of each size, once: a fixed amount of work for an
//! instruction counter, on a host without hardware counters
//! (`valgrind --tool=callgrind BENCH_BINARY --bench --writes=20000
//! --sizes=64`, the binary that `cargo bench -p pier-stack --bench
//! loopback --no-run` names). Instructions divided by writes compare
//! two builds exactly, where their timings would differ by noise.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use pier_stack::copy::{self, CopyStrategy};
use pier_stack::phy::{Loopback, Side};
use pier_stack::{SocketHandle, SocketType, VMADDR_CID_ANY, VMADDR_CID_HOST, VsockAddr};
use pier_testkit::bench::Recorder;

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

/// How pier's writer hands its bytes to the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writer {
    /// `Stack::send`: into the socket's send ring, out at the next step.
    Ring,
    /// `Loopback::send_in_place`: straight to the peer while credit allows,
    /// as pier's virtio driver sends writes of 16 KiB and more.
    InPlace,
}

/// Bytes per second moving `total` bytes in `size`-byte writes over pier.
fn pier_throughput(size: usize, total: usize, how: Writer) -> f64 {
    let (mut lb, c, s) = connected();
    let chunk = vec![0xa5u8; size];
    let mut buf = vec![0u8; size.max(64 * 1024)];
    let (mut sent, mut received) = (0, 0);
    let started = Instant::now();
    while received < total {
        if sent < total {
            let written = match how {
                Writer::Ring => lb.a.send(c, &chunk),
                Writer::InPlace => lb.send_in_place(Side::A, c, &chunk),
            };
            sent += written.unwrap_or(0);
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

/// The same work on a kernel Unix-socket pair. The writer does not block:
/// a chunk larger than the socket buffer (256 KiB) would wait forever for
/// a reader on the same thread; it goes in pieces instead, as pier's does.
fn unix_throughput(size: usize, total: usize) -> f64 {
    let (mut w, mut r) = UnixStream::pair().unwrap();
    r.set_nonblocking(true).unwrap();
    w.set_nonblocking(true).unwrap();
    let chunk = vec![0xa5u8; size];
    let mut buf = vec![0u8; size];
    let (mut sent, mut received, mut offset) = (0, 0, 0);
    let started = Instant::now();
    while received < total {
        if sent < total {
            match w.write(&chunk[offset..]) {
                Ok(n) => {
                    sent += n;
                    offset = (offset + n) % size;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
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

/// Sends all of `msg` from `from`, stepping the loopback until it fits.
fn send_all(lb: &mut Loopback, a_side: bool, h: SocketHandle, msg: &[u8]) {
    let mut off = 0;
    while off < msg.len() {
        let stack = if a_side { &mut lb.a } else { &mut lb.b };
        off += stack.send(h, &msg[off..]).unwrap_or(0);
        lb.step();
    }
}

/// Receives exactly `buf.len()` bytes on `h`, stepping when short.
fn recv_all(lb: &mut Loopback, a_side: bool, h: SocketHandle, buf: &mut [u8]) {
    let mut got = 0;
    while got < buf.len() {
        let stack = if a_side { &mut lb.a } else { &mut lb.b };
        match stack.recv(h, &mut buf[got..]) {
            Ok(info) => got += info.len,
            Err(_) => {
                lb.step();
            }
        }
    }
}

/// Round trip of a `size`-byte message over pier: A sends, B echoes. A
/// message that fits in one packet costs two steps, as before the sweep.
fn pier_latency(size: usize, rounds: usize) -> Duration {
    let (mut lb, c, s) = connected();
    let msg = vec![1u8; size];
    let mut buf = vec![0u8; size];
    let started = Instant::now();
    for _ in 0..rounds {
        send_all(&mut lb, true, c, &msg);
        recv_all(&mut lb, false, s, &mut buf);
        send_all(&mut lb, false, s, &buf);
        recv_all(&mut lb, true, c, &mut buf);
    }
    started.elapsed() / rounds as u32
}

fn unix_latency(size: usize, rounds: usize) -> Duration {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let msg = vec![1u8; size];
    let mut buf = vec![0u8; size];
    let started = Instant::now();
    for _ in 0..rounds {
        a.write_all(&msg).unwrap();
        b.read_exact(&mut buf).unwrap();
        b.write_all(&buf).unwrap();
        a.read_exact(&mut buf).unwrap();
    }
    started.elapsed() / rounds as u32
}

/// Bytes per second of `copy::copy_bytes` moving `size`-byte copies
/// through a 256 KiB window, about what a socket ring holds, so the copies
/// run from cache as a ring's do. The destination is 44 bytes off the
/// source's alignment, as a payload behind a packet header is.
fn copy_speed(size: usize, total: usize) -> f64 {
    const WINDOW: usize = 256 << 10;
    const SKEW: usize = 44;
    let source: Vec<u8> = (0..WINDOW).map(|i| i as u8).collect();
    let mut dest = vec![0u8; WINDOW + SKEW];
    let mut offset = 0;
    let started = Instant::now();
    for _ in 0..total / size {
        if offset + size > WINDOW {
            offset = 0;
        }
        copy::copy_bytes(
            std::hint::black_box(&mut dest[offset + SKEW..offset + SKEW + size]),
            std::hint::black_box(&source[offset..offset + size]),
        );
        offset += size;
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// The copy strategy's table: pier's loopback and the raw copy under each.
fn compare_copy_strategies(rec: &mut Recorder, quick: bool, runs: usize) {
    let chosen = copy::copy_strategy();
    let stores = if copy::vector_stores_aligned() { "aligned" } else { "where the bytes fall" };
    println!("\ncopy strategy this CPU uses: {chosen:?} (the vector loop's stores: {stores})\n");
    if copy::set_copy_strategy(CopyStrategy::Vector).is_err() {
        println!("(no AVX2 here: only memcpy can run, so there is nothing to compare)");
        return;
    }
    println!("| case | memcpy | vector loop | vector / memcpy |");
    println!("|---|---|---|---|");
    let total = if quick { 64 << 20 } else { 512 << 20 };
    for size in [4096, 65536] {
        let measure = |strategy, f: &dyn Fn() -> f64| {
            copy::set_copy_strategy(strategy).expect("checked above");
            best(runs, f)
        };
        let stream = |strategy| measure(strategy, &|| pier_throughput(size, total, Writer::Ring));
        let (memcpy, vector) = (stream(CopyStrategy::Memcpy), stream(CopyStrategy::Vector));
        let raw = |strategy| measure(strategy, &|| copy_speed(size, total * 4));
        let (raw_memcpy, raw_vector) = (raw(CopyStrategy::Memcpy), raw(CopyStrategy::Vector));
        println!(
            "| pier loopback, {} writes | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
            size_label(size),
            gbits(memcpy),
            gbits(vector),
            vector / memcpy
        );
        println!(
            "| {} copies | {:.1} GB/s | {:.1} GB/s | {:.2}x |",
            size_label(size),
            raw_memcpy / 1e9,
            raw_vector / 1e9,
            raw_vector / raw_memcpy
        );
        for (case, value, unit) in [
            ("stream-memcpy", gbits(memcpy), "Gbit/s"),
            ("stream-vector", gbits(vector), "Gbit/s"),
            ("stream-vector/memcpy", vector / memcpy, "x"),
            ("copy-memcpy", raw_memcpy / 1e9, "GB/s"),
            ("copy-vector", raw_vector / 1e9, "GB/s"),
            ("copy-vector/memcpy", raw_vector / raw_memcpy, "x"),
        ] {
            rec.record("copy-strategy", case, size, value, unit);
        }
    }
    copy::set_copy_strategy(chosen).expect("the CPU's own choice runs here");
}

/// Best of `runs`, to keep scheduler noise out of the ratio.
fn best(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(f64::MIN, f64::max)
}

fn gbits(bytes_per_sec: f64) -> f64 {
    bytes_per_sec * 8.0 / 1e9
}

/// "64 B", "4 KiB".
fn size_label(size: usize) -> String {
    if size >= 1024 { format!("{} KiB", size / 1024) } else { format!("{size} B") }
}

/// Write sizes of the throughput sweep: powers of 4, 64 B to 256 KiB.
const WRITE_SIZES: [usize; 7] = [64, 256, 1024, 4096, 16384, 65536, 262_144];
/// Message sizes of the ping-pong sweep.
const PING_SIZES: [usize; 6] = [64, 256, 1024, 4096, 16384, 65536];

/// `--writes=N`: pier's stream case alone, N writes per chosen size.
fn count_writes(writes: usize) {
    for size in pier_testkit::bench::chosen_sizes().unwrap_or(vec![64]) {
        let rate = pier_throughput(size, size * writes, Writer::Ring);
        println!(
            "pier loopback, {writes} writes of {}: {:.2} Gbit/s",
            size_label(size),
            gbits(rate)
        );
    }
}

fn main() {
    if let Some(writes) = pier_testkit::bench::arg("writes") {
        count_writes(writes.parse().expect("--writes takes a count"));
        return;
    }
    let quick = pier_testkit::bench::quick();
    let mut rec = Recorder::from_env();
    let total = if quick { 64 << 20 } else { 512 << 20 };
    // Small writes move fewer bytes, so every case takes similar time.
    let max_writes = if quick { 256 << 10 } else { 2 << 20 };
    let runs = if quick { 1 } else { 3 };
    println!("pier-stack loopback benchmark: up to {} MiB per case, best of {runs}\n", total >> 20);
    println!(
        "| case | pier loopback, send | pier loopback, in place | Unix socket pair \
         | send / Unix | in place / Unix |"
    );
    println!("|---|---|---|---|---|---|");
    for size in WRITE_SIZES {
        let bytes = total.min(size * max_writes);
        let pier = best(runs, || pier_throughput(size, bytes, Writer::Ring));
        let in_place = best(runs, || pier_throughput(size, bytes, Writer::InPlace));
        let unix = best(runs, || unix_throughput(size, bytes));
        println!(
            "| stream, {} writes | {:.2} Gbit/s | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x | {:.2}x |",
            size_label(size),
            gbits(pier),
            gbits(in_place),
            gbits(unix),
            pier / unix,
            in_place / unix
        );
        for (case, value, unit) in [
            ("pier", gbits(pier), "Gbit/s"),
            ("pier-in-place", gbits(in_place), "Gbit/s"),
            ("unix", gbits(unix), "Gbit/s"),
            ("pier/unix", pier / unix, "x"),
            ("pier-in-place/unix", in_place / unix, "x"),
        ] {
            rec.record("loopback-stream", case, size, value, unit);
        }
    }
    let base_rounds = if quick { 20_000 } else { 200_000 };
    for size in PING_SIZES {
        // Fewer rounds for big messages: each costs about a copy per 4 KiB.
        let rounds = (base_rounds * 4096 / (4096 + size)).max(1000);
        let pier = (0..runs).map(|_| pier_latency(size, rounds)).min().unwrap();
        let unix = (0..runs).map(|_| unix_latency(size, rounds)).min().unwrap();
        let (pier_us, unix_us) = (pier.as_secs_f64() * 1e6, unix.as_secs_f64() * 1e6);
        println!(
            "| ping-pong, {}, round trip | {pier_us:.2} us | {unix_us:.2} us | {:.2}x faster |",
            size_label(size),
            unix_us / pier_us
        );
        for (case, value, unit) in [
            ("pier", pier_us, "us"),
            ("unix", unix_us, "us"),
            ("unix/pier", unix_us / pier_us, "x"),
        ] {
            rec.record("loopback-pingpong", case, size, value, unit);
        }
    }
    compare_copy_strategies(&mut rec, quick, runs);
}
