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
