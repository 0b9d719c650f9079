//! What the pier-cli benchmarks share: starting `pier` children that die
//! with the benchmark, hybrid-socket connections (pier-client), and the echo
//! measurement itself, so every benchmark measures the same way.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Write sizes of the throughput sweeps: powers of 4, 64 B to 256 KiB.
pub const WRITE_SIZES: [usize; 7] = [64, 256, 1024, 4096, 16384, 65536, 262_144];

/// Bytes to move at `write`-byte writes: `total`, or less for small
/// writes, each of which is a system call of a few microseconds on a
/// nested host, so that every point of a sweep takes similar time.
pub fn sweep_bytes(total: u64, write: usize, quick: bool) -> u64 {
    let max_writes: u64 = if quick { 16 << 10 } else { 128 << 10 };
    total.min(write as u64 * max_writes)
}

/// "64 B", "4 KiB", "65507 B".
pub fn size_label(size: usize) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

pub struct Pier(pub Child);

impl Drop for Pier {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn pier(args: &[&str]) -> Pier {
    Pier(pier_command(args).spawn().expect("start pier"))
}

/// The `pier` command with `args` and its output discarded, for a caller
/// that sets more (an environment) before spawning it.
pub fn pier_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pier"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

pub fn retry<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "the component never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A stream connection to the guest's `port` through `uds`, or `None`
/// while nothing answers there yet (for [`retry`]).
pub fn vsock_connect(uds: &Path, port: u32) -> Option<UnixStream> {
    pier_client::HybridStream::connect(uds, port).ok().map(pier_client::HybridStream::into_inner)
}

/// Echoes `total` bytes in `write`-byte writes; returns bytes per second.
pub fn echo<S: Read + Write + Send + 'static>(
    stream: S,
    mut reader: S,
    shutdown: impl FnOnce(&S) + Send + 'static,
    total: u64,
    write: usize,
) -> f64 {
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut stream = stream;
        let chunk = vec![0x42u8; write];
        let mut sent = 0u64;
        while sent < total {
            stream.write_all(&chunk).unwrap();
            sent += write as u64;
        }
        shutdown(&stream);
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    writer.join().unwrap();
    assert_eq!(got, total, "every byte echoed");
    total as f64 / started.elapsed().as_secs_f64()
}

/// CPU seconds (user + system, every thread, exited ones included) `pid`
/// has used so far: the total `/proc/PID/stat` gives as utime + stime, but
/// read through the process's CPU-time clock, in nanoseconds rather than
/// 10 ms ticks, since a quick run of a backend can take under a tick.
pub fn cpu_seconds(pid: u32) -> f64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: both calls only write the out-parameters they are given.
    let ts = unsafe {
        let err = libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock);
        assert_eq!(err, 0, "no CPU-time clock for process {pid}: error {err}");
        let mut ts: libc::timespec = std::mem::zeroed();
        assert_eq!(libc::clock_gettime(clock, &mut ts), 0, "reading process {pid}'s CPU time");
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// What one process spent on a measured stretch of work.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_seconds: f64,
    /// Every system call the process's threads entered: perf's count of
    /// the `raw_syscalls:sys_enter` tracepoint (counting, not sampling, so
    /// it costs the process next to nothing).
    pub syscalls: u64,
}

impl Usage {
    /// Adds another stretch.
    pub fn add(&mut self, other: Self) {
        self.cpu_seconds += other.cpu_seconds;
        self.syscalls += other.syscalls;
    }

    /// CPU milliseconds per MiB of `bytes`.
    pub fn cpu_ms_per_mib(&self, bytes: u64) -> f64 {
        self.cpu_seconds * 1e3 / (bytes as f64 / (1u64 << 20) as f64)
    }

    /// System calls per MiB of `bytes`.
    pub fn syscalls_per_mib(&self, bytes: u64) -> f64 {
        self.syscalls as f64 / (bytes as f64 / (1u64 << 20) as f64)
    }
}

/// Measures one process from [`Meter::start`] to [`Meter::stop`]: its CPU
/// time, and its system calls through `perf stat` attached to it
/// (installed through pier-testkit's tools, like the other programs the
/// benchmarks need).
pub struct Meter {
    pid: u32,
    cpu_at_start: f64,
    perf: Child,
}

impl Meter {
    pub fn start(pid: u32) -> Self {
        let perf_path = pier_testkit::tools::ensure(pier_testkit::tools::PERF)
            .unwrap_or_else(|e| panic!("{e}"));
        let perf = Command::new(perf_path)
            .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perf stat");
        // perf counts from when it has attached, which its first output
        // would say only at the end: give it the moment attaching takes.
        std::thread::sleep(Duration::from_millis(50));
        Self { pid, cpu_at_start: cpu_seconds(pid), perf }
    }

    pub fn stop(mut self) -> Usage {
        let cpu_seconds = cpu_seconds(self.pid) - self.cpu_at_start;
        // SAFETY: kill(2) on a child this meter owns and has not reaped.
        unsafe { libc::kill(self.perf.id() as libc::pid_t, libc::SIGINT) };
        let mut report = String::new();
        self.perf.stderr.take().expect("piped").read_to_string(&mut report).expect("perf output");
        self.perf.wait().expect("perf stat exits");
        let syscalls = report
            .lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next()?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("perf stat gave no syscall count:\n{report}"));
        Usage { cpu_seconds, syscalls }
    }
}
