//! What the pier-cli benchmarks share: starting `pier` children that die
//! with the benchmark, hybrid-socket connections (pier-client), and the echo
//! measurements themselves (`stream_echo`, `datagram_echo`), so every
//! benchmark measures the same way.

#![allow(dead_code)]

pub mod datagram_echo;
pub mod stream_echo;

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
