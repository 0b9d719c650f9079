//! Echo throughput between a host program and a WebAssembly component:
//! pier's vsock sockets (hybrid Unix socket, bridge, virtio chain, the
//! shim's WIT resources) against wasmtime's own `wasi:sockets` TCP over
//! loopback, with the same echo loop in the same component
//! (`guest-apps/bench-echo`), measured in the same run.
//!
//! `cargo bench -p pier-cli --bench echo_throughput [-- --quick]`

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VSOCK_PORT: u32 = 5000;
const TCP_PORT: u16 = 15_731;

/// Builds the guest components and returns bench-echo.wasm.
fn bench_echo() -> PathBuf {
    xtask::build_guest_components(&xtask::cache_dir("guest-target"), xtask::Output::Show)
        .unwrap_or_else(|e| panic!("{e}"))
        .join("bench-echo.wasm")
}

struct Pier(Child);

impl Drop for Pier {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pier(args: &[&str]) -> Pier {
    Pier(
        Command::new(env!("CARGO_BIN_EXE_pier"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pier"),
    )
}

fn retry<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "the component never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn vsock_connect(uds: &Path) -> Option<UnixStream> {
    let mut s = UnixStream::connect(uds).ok()?;
    s.write_all(format!("CONNECT {VSOCK_PORT}\n").as_bytes()).ok()?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        if s.read(&mut b).ok()? == 0 {
            return None;
        }
        line.push(b[0]);
    }
    line.starts_with(b"OK ").then_some(s)
}

/// Echoes `total` bytes in `write`-byte writes; returns bytes per second.
fn echo<S: Read + Write + Send + 'static>(
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let total: u64 = if quick { 64 << 20 } else { 512 << 20 };
    let runs = if quick { 1 } else { 3 };
    let wasm = bench_echo();
    let wasm = wasm.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("bench.vsock");
    let listen = VSOCK_PORT.to_string();
    let tcp = TCP_PORT.to_string();
    let _vsock = pier(&[
        "run",
        wasm,
        "--uds",
        uds.to_str().unwrap(),
        "--listen",
        &listen,
        "--",
        "--vsock",
        &listen,
    ]);
    let tcp_uds = dir.path().join("tcp.vsock");
    let _tcp =
        pier(&["run", wasm, "--uds", tcp_uds.to_str().unwrap(), "--wasi-tcp", "--", "--tcp", &tcp]);
    println!(
        "echo throughput, host program <-> component, {} MiB each way per case, best of {runs}\n",
        total >> 20
    );
    println!("| write size | pier vsock | wasi:sockets TCP | pier / TCP |");
    println!("|---|---|---|---|");
    for write in [4096usize, 65536] {
        let mut best_vsock = 0f64;
        let mut best_tcp = 0f64;
        for _ in 0..runs {
            let s = retry(|| vsock_connect(&uds));
            let r = s.try_clone().unwrap();
            best_vsock =
                best_vsock.max(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
            let t = retry(|| TcpStream::connect(("127.0.0.1", TCP_PORT)).ok());
            let r = t.try_clone().unwrap();
            best_tcp =
                best_tcp.max(echo(t, r, |t| t.shutdown(Shutdown::Write).unwrap(), total, write));
        }
        println!(
            "| {} KiB | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
            write / 1024,
            best_vsock * 8.0 / 1e9,
            best_tcp * 8.0 / 1e9,
            best_vsock / best_tcp
        );
    }
}
