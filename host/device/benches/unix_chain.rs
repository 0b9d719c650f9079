//! Host programs to guest applications through the whole chain: Unix
//! socket, hybrid bridge, host endpoint, virtqueues in DMA memory,
//! pier-driver, guest stack, guest application. Compared in the same run
//! with a plain Unix-socket pair moving the same bytes with the same write
//! size.
//!
//! A second table varies how many receive buffers the driver keeps posted.
//!
//! `cargo bench -p pier-device --bench unix_chain [-- --quick]
//! [--sizes=4096,65536] [--only=to-guest|from-guest|unix]`; `--sizes`
//! runs only those write sizes of the first table and skips the second,
//! for comparing two builds quickly; `--only` runs one path of it alone
//! (the others print as NaN), for a profiler.
//! With `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records every
//! number for `docs/benchmarks.md`.
//!
//! Beside throughput it reports what each path cost the whole process per
//! MiB: CPU time (every thread) and system calls (`perf stat`). The chain
//! and the pair both run in this process, host program included, so the
//! two are counted alike.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pier_device::GuestCid;
use pier_device::bridge::{Bridge, BridgeConfig};
use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_device::testing::apps::{Sink, Source};
use pier_driver::DriverConfig;
use pier_testkit::bench::{Meter, PairedRatio, Usage, median, round_order, rounds};

const SINK_PORT: u32 = 1;
const SOURCE_PORT: u32 = 2;

/// Runs a system whose guest serves a sink and a source of `total` bytes
/// in `write`-byte sends, and calls `f` with the hybrid socket path.
fn with_system<R>(total: u64, write: usize, driver: DriverConfig, f: impl FnOnce(&Path) -> R) -> R {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("bench.vsock");
    let config = BridgeConfig::new(&uds, GuestCid::DEFAULT);
    let running = Testbed::new(VsockConfig::default(), driver)
        .unwrap()
        .start(|stack, registry, token| Bridge::new(config, stack, registry, token))
        .unwrap();
    let running = Arc::new(running);
    let (mut sink, mut source) = running.guest.with(|stack, _| {
        (
            Sink::listen(stack, SINK_PORT).unwrap(),
            Source::listen(stack, SOURCE_PORT, total, write).unwrap(),
        )
    });
    let stop = Arc::new(AtomicBool::new(false));
    let app = {
        let (running, stop) = (running.clone(), stop.clone());
        std::thread::spawn(move || {
            running.guest.serve(&stop, |s, driver, now, w| {
                sink.step(s, now, w);
                source.step(s, driver, now, w);
            })
        })
    };
    let result = f(&uds);
    stop.store(true, Ordering::Release);
    app.join().unwrap();
    result
}

fn dial(uds: &Path, port: u32) -> UnixStream {
    let mut s = UnixStream::connect(uds).unwrap();
    s.write_all(pier_hybrid::connect_line(port).as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        s.read_exact(&mut b).unwrap();
        line.push(b[0]);
    }
    assert!(pier_hybrid::parse_ok(&line).is_some(), "{:?}", String::from_utf8_lossy(&line));
    s
}

/// Host → guest: write `total` bytes, half-close, wait for the guest to close.
fn to_guest(uds: &Path, total: u64, write: usize) -> f64 {
    let mut s = dial(uds, SINK_PORT);
    let chunk = vec![0xa5u8; write];
    let started = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&chunk).unwrap();
        sent += write as u64;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    total as f64 / started.elapsed().as_secs_f64()
}

/// Guest → host: read what the guest source sends until it closes.
fn from_guest(uds: &Path, total: u64, read: usize) -> f64 {
    let mut s = dial(uds, SOURCE_PORT);
    let mut buf = vec![0u8; read];
    let started = Instant::now();
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    assert_eq!(got, total);
    total as f64 / started.elapsed().as_secs_f64()
}

/// The baseline: a Unix-socket pair, a writer thread and a reader.
fn unix_pair(total: u64, write: usize) -> f64 {
    let (mut w, mut r) = UnixStream::pair().unwrap();
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let chunk = vec![0xa5u8; write];
        let mut sent = 0;
        while sent < total {
            w.write_all(&chunk).unwrap();
            sent += write as u64;
        }
    });
    let mut buf = vec![0u8; write];
    let mut got = 0u64;
    while got < total {
        got += r.read(&mut buf).unwrap() as u64;
    }
    writer.join().unwrap();
    total as f64 / started.elapsed().as_secs_f64()
}

fn best(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(0.0, f64::max)
}

/// The chain's cost table: CPU time and system calls per MiB moved, of
/// the whole process, for each path and write size.
fn print_costs(costs: &[(usize, u64, [Usage; 3])], rec: &mut pier_testkit::bench::Recorder) {
    println!(
        "\nwhat each path cost, per MiB moved (this process, every thread)\n\n\
         | write size | CPU ms/MiB, host -> guest | guest -> host | Unix pair \
         | system calls/MiB, host -> guest | guest -> host | Unix pair |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &(write, moved, [to, from, unix]) in costs {
        let cpu = [to, from, unix].map(|u| u.cpu_ms_per_mib(moved));
        let calls = [to, from, unix].map(|u| u.syscalls_per_mib(moved));
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} |",
            size_label(write),
            cpu[0],
            cpu[1],
            cpu[2],
            calls[0],
            calls[1],
            calls[2]
        );
        for (i, path) in ["h2g", "g2h", "unix"].iter().enumerate() {
            rec.record("chain-cost", &format!("{path}-cpu"), write, cpu[i], "ms/MiB");
            rec.record("chain-cost", &format!("{path}-syscalls"), write, calls[i], "calls/MiB");
        }
    }
}

/// Write sizes of the sweep: powers of 4, 64 B to 256 KiB.
const WRITE_SIZES: [usize; 7] = [64, 256, 1024, 4096, 16384, 65536, 262_144];

fn size_label(size: usize) -> String {
    if size >= 1024 { format!("{} KiB", size / 1024) } else { format!("{size} B") }
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let sizes = pier_testkit::bench::chosen_sizes();
    let runs_path = pier_testkit::bench::runs_part;
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total: u64 = if quick { 128 << 20 } else { 1 << 30 };
    // A system call costs microseconds on a nested host: small writes
    // move fewer bytes, so every case takes similar time.
    let max_writes: u64 = if quick { 32 << 10 } else { 256 << 10 };
    let runs = rounds();
    println!(
        "host program <-> guest app through the whole in-process chain, up to {} MiB per case, \
         median of {runs} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        total >> 20
    );
    println!(
        "| direction, write size | pier chain | Unix socket pair | pier / Unix | lowest, highest round |"
    );
    println!("|---|---|---|---|---|");
    // What each path cost this process (every thread: the host program's
    // end, the device loop and the guest app for the chain; both ends for
    // the pair), by write size.
    let mut costs: Vec<(usize, u64, [Usage; 3])> = Vec::new();
    for write in sizes.clone().unwrap_or(WRITE_SIZES.to_vec()) {
        let bytes = total.min(write as u64 * max_writes);
        // Host -> guest, guest -> host, the pair: one of each per round,
        // back to back, each metered alone; the pair first in even rounds,
        // the chain's two first in odd ones.
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut usage = [Usage::default(); 3];
        let mut metered = |path: usize, f: &mut dyn FnMut() -> f64| {
            if runs_path(["to-guest", "from-guest", "unix"][path]) {
                let meter = Meter::start(std::process::id());
                rates[path].push(f());
                usage[path].add(meter.stop());
            }
        };
        for round in 0..runs {
            for part in round_order(round, 2) {
                if part == 0 {
                    metered(2, &mut || unix_pair(bytes, write));
                } else {
                    with_system(bytes, write, DriverConfig::default(), |uds| {
                        metered(0, &mut || to_guest(uds, bytes, write));
                        metered(1, &mut || from_guest(uds, bytes, write));
                    });
                }
            }
        }
        costs.push((write, bytes * runs as u64, usage));
        let gbit = |path: usize| median(&rates[path]) * 8.0 / 1e9;
        let against_pair = [0, 1].map(|path| PairedRatio::of(&rates[path], &rates[2]));
        for (path, label) in ["host -> guest", "guest -> host"].into_iter().enumerate() {
            let ratio = against_pair[path];
            println!(
                "| {label}, {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x | {:.2}x, {:.2}x |",
                size_label(write),
                gbit(path),
                gbit(2),
                ratio.median,
                ratio.lowest,
                ratio.highest
            );
        }
        let [h2g, g2h] = against_pair;
        for (case, value, unit) in [
            ("host-to-guest", gbit(0), "Gbit/s"),
            ("guest-to-host", gbit(1), "Gbit/s"),
            ("unix", gbit(2), "Gbit/s"),
            ("h2g/unix", h2g.median, "x"),
            ("g2h/unix", g2h.median, "x"),
            ("h2g/unix-lowest", h2g.lowest, "x"),
            ("h2g/unix-highest", h2g.highest, "x"),
            ("g2h/unix-lowest", g2h.lowest, "x"),
            ("g2h/unix-highest", g2h.highest, "x"),
        ] {
            rec.record("chain", case, write, value, unit);
        }
    }
    print_costs(&costs, &mut rec);
    if sizes.is_some() {
        return;
    }
    // How many receive buffers the driver should keep posted: fewer is a
    // smaller working set for the device's writes and the guest's reads
    // (the device fills them in ring order), more rides out a guest that
    // is slow to take them.
    let counts = [64usize, 32, 16, 8];
    let runs = if quick { 1 } else { 3 };
    println!("\nhost -> guest by receive buffers posted (64 KiB each), best of {runs}\n");
    println!("| write size | {} |", counts.map(|c| format!("{c} buffers")).join(" | "));
    println!("|---|{}", "---|".repeat(counts.len()));
    for write in [4096usize, 65536] {
        let rates = counts.map(|rx_buffers| {
            let driver = DriverConfig { rx_buffers, ..DriverConfig::default() };
            with_system(total, write, driver, |uds| best(runs, || to_guest(uds, total, write)))
        });
        let base = rates[0];
        let cells: Vec<String> = rates
            .iter()
            .map(|r| format!("{:.2} Gbit/s ({:.2}x)", r * 8.0 / 1e9, r / base))
            .collect();
        println!("| {} KiB | {} |", write / 1024, cells.join(" | "));
        for (count, rate) in counts.iter().zip(rates) {
            rec.record("chain-rx-count", &count.to_string(), write, rate * 8.0 / 1e9, "Gbit/s");
            if *count != counts[0] {
                rec.record(
                    "chain-rx-count",
                    &format!("{count}/{}", counts[0]),
                    write,
                    rate / base,
                    "x",
                );
            }
        }
    }
    println!("\n(ratios against {} buffers)", counts[0]);
}
