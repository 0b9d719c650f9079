//! `pier vhost-user` against rust-vmm's vhost-device-vsock, each serving
//! the same Linux guest (Debian's kernel and `guest-linux/vsock-test`,
//! booted by the same QEMU command line under TCG): echo throughput
//! between a host program and the guest's stream echo server at 4 KiB and
//! 64 KiB writes, and the host CPU each side spends per MiB.
//!
//! Why both throughput and CPU: under TCG one QEMU thread emulates the
//! guest, and it is the bottleneck for either backend, so MiB/s mostly
//! says how fast QEMU runs the guest's kernel. The CPU time the backend
//! process uses per MiB (user + system, all threads, before and after each
//! run: utime + stime of `/proc/PID/stat`, read at nanosecond resolution)
//! is what the backend itself costs, and the fair comparison; QEMU's
//! is recorded separately, with how busy it kept its core.
//!
//! Why the echo keeps one chunk in flight (write W bytes, read the W bytes
//! back, repeat): vhost-device-vsock 0.3.0 flushes what it holds for a
//! host socket only on an event that is exactly `EPOLLOUT`, so once a
//! socket that is readable as well fills up, it stops forwarding for good
//! (`docs/benchmarks.md`, the cross-check section). With at most 64 KiB
//! in flight, far below a Unix socket's buffer, no backend ever finds the
//! host socket full, and both run the same pattern. Every read has a
//! timeout all the same: a run that stalls is recorded as failed rather
//! than hanging the benchmark.
//!
//! The **full-duplex** case drives both directions at once, as a real
//! stream client would: the host writes the whole transfer from one
//! thread while another reads the echo (and compares it with what was
//! sent). It runs on both backends, though vhost-device-vsock 0.3.0 is
//! at risk there, for the flush rule above: in `vhu_vsock_thread.rs` its
//! handler flushes the bytes it holds for a host socket only when the
//! epoll event is exactly `EPOLLOUT`, and any event with `EPOLLIN` in it
//! (the host's next bytes waiting) is taken as a read instead. With the
//! host writing while it reads, its socket is readable whenever it is
//! writable, so once the backend has had to hold some of the guest's bytes
//! (the host socket full for a moment, a host reader slower than the
//! guest), the flush never comes and the transfer stalls for good. A host
//! reader that keeps up, as this one does with a guest slowed by TCG,
//! never fills the socket, and the runs so far completed; a stall is
//! reported as a failed run, like any other. With a reader slowed down
//! (a 20 ms sleep after each read, an ad hoc run), vhost-device-vsock
//! stalled after 215 KiB at 4 KiB writes and 256 KiB at 64 KiB, about a
//! Unix socket's buffer, while pier finished the 8 MiB at the reader's
//! pace.
//!
//! The two backends take turns in [`rounds`] alternated rounds: in each,
//! one backend boots a fresh guest and runs every case once, then the
//! other does the same (pier first in the first, third and fifth rounds,
//! vhost-device-vsock in the others), one backend at a time, so the two
//! never share the machine's two cores. A throughput is the median of a
//! backend's rounds and a ratio the median of the rounds' own ratios (the
//! goal's, at 64 KiB, with its lowest and highest round), so a host that
//! drifts over the minutes of a run moves both sides of a round alike; a
//! run that fails is counted apart and left out of both. CPU and context
//! switches are summed over the rounds.
//!
//! `cargo bench --workspace --bench linux_guest [-- --quick]`; with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records every
//! number for `docs/benchmarks.md`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::size_label;
use pier_testkit::bench::{PairedRatio, cpu_seconds, median, round_order, rounds};
use pier_testkit::linux_guest::{READY, ports};
use pier_testkit::linux_vm::{Backend, BackendProcess, GuestSlot, LinuxVm, LinuxVmConfig};

const MIB: f64 = (1 << 20) as f64;
const SIZES: [usize; 2] = [4096, 65536];
/// Boots take 8 to 30 s under TCG on this host, far longer while it
/// compiles.
const BOOT: Duration = Duration::from_secs(240);
/// How long one echo of a chunk may take before the run counts as stalled:
/// generous, since a busy 2-core host can pause TCG for seconds.
const STALL: Duration = Duration::from_secs(30);
/// Context switches (voluntary and not) of `pid`'s threads so far: each is
/// a wake-up on the path or a preemption, which on a loaded host is where
/// a round trip waits. Summed over the live threads, which for both
/// backends and QEMU live as long as the guest.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A connection to the guest's stream echo through the hybrid socket,
/// retrying for up to 30 s, with every read bounded by [`STALL`].
fn connect(uds: &Path) -> Result<UnixStream, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = UnixStream::connect(uds)
            && s.set_read_timeout(Some(Duration::from_secs(2))).is_ok()
            && s.write_all(pier_hybrid::connect_line(ports::STREAM_ECHO).as_bytes()).is_ok()
        {
            let mut line = Vec::new();
            let mut byte = [0u8];
            while s.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            if pier_hybrid::parse_ok(&line).is_some() {
                s.set_read_timeout(Some(STALL)).map_err(|e| e.to_string())?;
                return Ok(s);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the stream echo behind {} never answered CONNECT", uds.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One run: `total` bytes echoed in `write`-byte chunks, one chunk in
/// flight. Returns the wall time, or why the run failed.
fn echo(uds: &Path, total: usize, write: usize) -> Result<Duration, String> {
    let mut s = connect(uds)?;
    let mut chunk = vec![0u8; write];
    let mut back = vec![0u8; write];
    let started = Instant::now();
    for i in 0..total / write {
        // A different first byte each time, so a repeated or stale chunk
        // cannot pass the check.
        chunk[0] = i as u8;
        chunk[write - 1] = (i >> 8) as u8;
        s.write_all(&chunk).map_err(|e| format!("chunk {i}: write: {e}"))?;
        s.read_exact(&mut back).map_err(|e| format!("chunk {i}: read back: {e}"))?;
        if back != chunk {
            return Err(format!("chunk {i}: the echo differs"));
        }
    }
    Ok(started.elapsed())
}

/// One run of the full-duplex echo: `total` bytes written in `write`-byte
/// writes by one thread while this one reads the echo and compares it
/// with what was sent. Returns the wall time until the last byte came
/// back, or why the run failed.
fn duplex_echo(uds: &Path, total: usize, write: usize) -> Result<Duration, String> {
    let s = connect(uds)?;
    s.set_write_timeout(Some(STALL)).map_err(|e| e.to_string())?;
    let mut writer = s.try_clone().map_err(|e| e.to_string())?;
    let mut reader = s;
    let sent = std::sync::Arc::new(pier_testkit::pattern::data(write as u64, total));
    let to_send = std::sync::Arc::clone(&sent);
    let started = Instant::now();
    let writing = std::thread::spawn(move || -> Result<(), String> {
        for (i, chunk) in to_send.chunks(write).enumerate() {
            writer.write_all(chunk).map_err(|e| format!("chunk {i}: write: {e}"))?;
        }
        Ok(())
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    let read = loop {
        if got == total {
            break Ok(started.elapsed());
        }
        match reader.read(&mut buf) {
            Ok(0) => break Err(format!("the echo ended after {got} of {total} bytes")),
            Ok(n) if buf[..n] != sent[got..got + n] => {
                break Err(format!(
                    "the echo differs from what was sent in bytes {got}..{}",
                    got + n
                ));
            }
            Ok(n) => got += n,
            Err(e) => break Err(format!("read after {got} of {total} bytes: {e}")),
        }
    };
    // A reader that gave up leaves the writer blocked until its timeout;
    // closing the socket ends it at once.
    if read.is_err() {
        let _ = reader.shutdown(std::net::Shutdown::Both);
    }
    let wrote = writing.join().map_err(|_| "the writer panicked".to_owned())?;
    let took = read?;
    wrote?;
    Ok(took)
}

/// What one backend measured at one write size.
#[derive(Debug, Default)]
struct Case {
    /// MiB/s each way in each round, NaN for a run that failed.
    rates: Vec<f64>,
    /// Summed over all the runs that completed.
    mib: f64,
    wall: f64,
    backend_cpu: f64,
    qemu_cpu: f64,
    backend_switches: u64,
    qemu_switches: u64,
    failures: Vec<String>,
}

impl Case {
    /// Adds one more round's measurement of the same case.
    fn absorb(&mut self, round: Case) {
        self.rates.extend(round.rates);
        self.mib += round.mib;
        self.wall += round.wall;
        self.backend_cpu += round.backend_cpu;
        self.qemu_cpu += round.qemu_cpu;
        self.backend_switches += round.backend_switches;
        self.qemu_switches += round.qemu_switches;
        self.failures.extend(round.failures);
    }

    /// One round's case that failed: the run itself, or the backend or its
    /// guest never coming up.
    fn failed(why: &str) -> Case {
        Case { rates: vec![f64::NAN], failures: vec![why.to_owned()], ..Case::default() }
    }

    fn backend_ms_per_mib(&self) -> f64 {
        self.backend_cpu * 1e3 / self.mib
    }
    fn qemu_ms_per_mib(&self) -> f64 {
        self.qemu_cpu * 1e3 / self.mib
    }
    fn qemu_busy(&self) -> f64 {
        self.qemu_cpu * 100.0 / self.wall
    }
    fn backend_busy(&self) -> f64 {
        self.backend_cpu * 100.0 / self.wall
    }
}

/// The echo modes, each measured at every write size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EchoMode {
    /// One chunk in flight ([`echo`]).
    Lockstep,
    /// Both directions at once ([`duplex_echo`]).
    FullDuplex,
}

const MODES: [EchoMode; 2] = [EchoMode::Lockstep, EchoMode::FullDuplex];

/// Every (mode, write size) measured, in the order of a backend's results.
fn modes_and_sizes() -> impl Iterator<Item = (EchoMode, usize)> {
    MODES.into_iter().flat_map(|mode| SIZES.into_iter().map(move |write| (mode, write)))
}

impl EchoMode {
    fn run(self, uds: &Path, total: usize, write: usize) -> Result<Duration, String> {
        match self {
            EchoMode::Lockstep => echo(uds, total, write),
            EchoMode::FullDuplex => duplex_echo(uds, total, write),
        }
    }
}

/// Boots a guest on `backend`, measures every size in each of [`MODES`]
/// once (the cases in that order, sizes inner), and stops both: one
/// backend's round.
fn measure(
    backend: &Backend,
    guest: &pier_testkit::linux_guest::LinuxGuest,
    dir: &Path,
    total: usize,
) -> Result<Vec<Case>, String> {
    let slot = GuestSlot::in_dir(dir, 3);
    let process = BackendProcess::start(backend, std::slice::from_ref(&slot))?;
    let mut vm = LinuxVm::start(&LinuxVmConfig::new(guest, &slot.vhost_socket))?;
    let booted = vm
        .wait_for(READY, BOOT)
        .map_err(|e| format!("{}: {e}\nbackend stderr:\n{}", backend.name(), process.stderr()))?;
    println!("{}: guest ready {:.1} s after QEMU started", backend.name(), booted.as_secs_f64());
    let (backend_pid, qemu_pid) = (process.pid(), vm.pid());
    let mut cases = Vec::new();
    for (mode, write) in modes_and_sizes() {
        let (b0, q0) = (cpu_seconds(backend_pid), cpu_seconds(qemu_pid));
        let (bs0, qs0) = (switches(backend_pid), switches(qemu_pid));
        let case = match mode.run(&slot.uds, total, write) {
            Ok(took) => {
                let (b1, q1) = (cpu_seconds(backend_pid), cpu_seconds(qemu_pid));
                let (bs1, qs1) = (switches(backend_pid), switches(qemu_pid));
                let (mib, wall) = (total as f64 / MIB, took.as_secs_f64());
                Case {
                    rates: vec![mib / wall],
                    mib,
                    wall,
                    backend_cpu: b1 - b0,
                    qemu_cpu: q1 - q0,
                    backend_switches: bs1.saturating_sub(bs0),
                    qemu_switches: qs1.saturating_sub(qs0),
                    failures: Vec::new(),
                }
            }
            Err(e) => {
                eprintln!(
                    "{}: {mode:?}, {} writes: run failed: {e}",
                    backend.name(),
                    size_label(write)
                );
                Case::failed(&e)
            }
        };
        cases.push(case);
    }
    drop(vm);
    drop(process);
    Ok(cases)
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total = if quick { 8 << 20 } else { 32 << 20 };
    let runs = rounds();
    let guest = pier_testkit::linux_guest::build(pier_testkit::Output::OnFailure)
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load().trim());

    let backends =
        [Backend::Pier(PathBuf::from(env!("CARGO_BIN_EXE_pier"))), Backend::VhostDeviceVsock];
    let cases = MODES.len() * SIZES.len();
    let mut results: Vec<Vec<Case>> =
        backends.iter().map(|_| (0..cases).map(|_| Case::default()).collect()).collect();
    for round in 0..runs {
        println!("round {} of {runs}", round + 1);
        for b in round_order(round, backends.len()) {
            let (backend, totals) = (&backends[b], &mut results[b]);
            let measured = measure(backend, &guest, dir.path(), total).unwrap_or_else(|e| {
                eprintln!("{}: {e}", backend.name());
                (0..cases).map(|_| Case::failed(&e)).collect()
            });
            for (sum, case) in totals.iter_mut().zip(measured) {
                sum.absorb(case);
            }
        }
    }
    println!("load average after: {}\n", load().trim());

    println!(
        "echo with a Linux guest under QEMU TCG, {} MiB per run, one chunk in flight, \
         median of {runs} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        total >> 20
    );
    println!(
        "| write size | pier vhost-user | vhost-device-vsock | pier / vhost-device-vsock \
         | lowest, highest round |"
    );
    println!("|---|---|---|---|---|");
    let nan = f64::NAN;
    for (i, &write) in SIZES.iter().enumerate() {
        let (p, v) = (&results[0][i], &results[1][i]);
        let (pr, vr) = (median(&p.rates), median(&v.rates));
        let ratio = PairedRatio::of(&p.rates, &v.rates);
        println!(
            "| {} | {pr:.2} MiB/s | {vr:.2} MiB/s | {:.2}x | {:.2}x, {:.2}x |",
            size_label(write),
            ratio.median,
            ratio.lowest,
            ratio.highest
        );
        for (case, value, unit) in [
            ("pier", pr, "MiB/s"),
            ("vdv", vr, "MiB/s"),
            ("pier/vdv", ratio.median, "x"),
            ("pier/vdv-lowest", ratio.lowest, "x"),
            ("pier/vdv-highest", ratio.highest, "x"),
        ] {
            rec.record("linux-guest-echo", case, write, value, unit);
        }
    }
    println!(
        "\nfull-duplex echo (one thread writes, one reads, both at once), {} MiB per run, \
         median of {runs} alternated rounds\n",
        total >> 20
    );
    println!(
        "| write size | pier vhost-user | vhost-device-vsock | pier / vhost-device-vsock \
         | backend CPU: pier | backend CPU: vhost-device-vsock | vdv / pier |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, &write) in SIZES.iter().enumerate() {
        let (p, v) = (&results[0][SIZES.len() + i], &results[1][SIZES.len() + i]);
        let (pr, vr) = (median(&p.rates), median(&v.rates));
        let ratio = PairedRatio::of(&p.rates, &v.rates).median;
        // A backend none of whose runs completed has used no CPU over no
        // MiB: 0 / 0, which prints and records as failed.
        let (pb, vb) = (p.backend_ms_per_mib(), v.backend_ms_per_mib());
        println!(
            "| {} | {pr:.2} MiB/s | {vr:.2} MiB/s | {:.2}x | {pb:.2} ms/MiB | {vb:.2} ms/MiB | {:.2}x |",
            size_label(write),
            ratio,
            vb / pb
        );
        for (case, value, unit) in [
            ("pier", pr, "MiB/s"),
            ("vdv", vr, "MiB/s"),
            ("pier/vdv", ratio, "x"),
            ("pier-backend", pb, "ms/MiB"),
            ("vdv-backend", vb, "ms/MiB"),
            ("vdv/pier-backend", vb / pb, "x"),
        ] {
            rec.record("linux-guest-duplex", case, write, value, unit);
        }
    }
    println!("\nhost CPU per MiB echoed (user + system, summed over the runs)\n");
    println!(
        "| write size | backend: pier | backend: vhost-device-vsock | vdv / pier | \
         QEMU with pier | QEMU with vdv | QEMU busy, pier | QEMU busy, vdv | backend busy, pier | backend busy, vdv |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (i, &write) in SIZES.iter().enumerate() {
        let (p, v) = (&results[0][i], &results[1][i]);
        let ok = |c: &Case, v: f64| if c.mib > 0.0 { v } else { nan };
        let (pb, vb) = (ok(p, p.backend_ms_per_mib()), ok(v, v.backend_ms_per_mib()));
        let (pq, vq) = (ok(p, p.qemu_ms_per_mib()), ok(v, v.qemu_ms_per_mib()));
        let (pqb, vqb) = (ok(p, p.qemu_busy()), ok(v, v.qemu_busy()));
        let (pbb, vbb) = (ok(p, p.backend_busy()), ok(v, v.backend_busy()));
        println!(
            "| {} | {pb:.2} ms/MiB | {vb:.2} ms/MiB | {:.2}x | {pq:.2} ms/MiB | {vq:.2} ms/MiB | \
             {pqb:.0} % | {vqb:.0} % | {pbb:.0} % | {vbb:.0} % |",
            size_label(write),
            vb / pb
        );
        rec.record("linux-guest-cpu", "pier-backend", write, pb, "ms/MiB");
        rec.record("linux-guest-cpu", "vdv-backend", write, vb, "ms/MiB");
        rec.record("linux-guest-cpu", "vdv/pier-backend", write, vb / pb, "x");
        rec.record("linux-guest-cpu", "pier-qemu", write, pq, "ms/MiB");
        rec.record("linux-guest-cpu", "vdv-qemu", write, vq, "ms/MiB");
        rec.record("linux-guest-cpu", "pier-qemu-busy", write, pqb, "%");
        rec.record("linux-guest-cpu", "vdv-qemu-busy", write, vqb, "%");
        rec.record("linux-guest-cpu", "pier-backend-busy", write, pbb, "%");
        rec.record("linux-guest-cpu", "vdv-backend-busy", write, vbb, "%");
    }
    println!("\ncontext switches per 64 KiB echoed (all threads, summed over the runs)\n");
    println!(
        "| write size | pier vhost-user | vhost-device-vsock | QEMU with pier | QEMU with vdv |"
    );
    println!("|---|---|---|---|---|");
    for (i, &write) in SIZES.iter().enumerate() {
        let (p, v) = (&results[0][i], &results[1][i]);
        let per = |n: u64, c: &Case| if c.mib > 0.0 { n as f64 / (c.mib * 16.0) } else { nan };
        let (pb, vb) = (per(p.backend_switches, p), per(v.backend_switches, v));
        let (pq, vq) = (per(p.qemu_switches, p), per(v.qemu_switches, v));
        println!("| {} | {pb:.1} | {vb:.1} | {pq:.1} | {vq:.1} |", size_label(write));
        rec.record("linux-guest-switches", "pier-backend", write, pb, "");
        rec.record("linux-guest-switches", "vdv-backend", write, vb, "");
        rec.record("linux-guest-switches", "pier-qemu", write, pq, "");
        rec.record("linux-guest-switches", "vdv-qemu", write, vq, "");
    }
    for (backend, measured) in backends.iter().zip(&results) {
        for (case, (mode, write)) in measured.iter().zip(modes_and_sizes()) {
            if !case.failures.is_empty() {
                println!(
                    "\n{} ({mode:?}) at {} writes: {} of {runs} runs failed: {}",
                    backend.name(),
                    size_label(write),
                    case.failures.len(),
                    case.failures[0]
                );
            }
        }
    }
}
