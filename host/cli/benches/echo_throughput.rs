//! Echo throughput between a host program and a WebAssembly component:
//! pier's vsock sockets (hybrid Unix socket, bridge, virtio chain, the
//! shim's WIT resources) against wasmtime's own `wasi:sockets` TCP over
//! loopback, with the same echo loop in the same component
//! (`guest-apps/bench-echo`), measured in the same run.
//!
//! `cargo bench -p pier-cli --bench echo_throughput [-- --quick]`; with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records the sweep.

use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;

mod common;

use common::{WRITE_SIZES, echo, pier, retry, size_label, sweep_bytes, vsock_connect};

const VSOCK_PORT: u32 = 5000;
const TCP_PORT: u16 = 15_731;

/// Builds the guest components and returns bench-echo.wasm.
fn bench_echo() -> PathBuf {
    pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .join("bench-echo.wasm")
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
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
        "echo throughput, host program <-> component, up to {} MiB each way per case, best of {runs}\n",
        total >> 20
    );
    println!("| write size | pier vsock | wasi:sockets TCP | pier / TCP |");
    println!("|---|---|---|---|");
    for write in WRITE_SIZES {
        let total = sweep_bytes(total, write, quick);
        let mut best_vsock = 0f64;
        let mut best_tcp = 0f64;
        for _ in 0..runs {
            let s = retry(|| vsock_connect(&uds, VSOCK_PORT));
            let r = s.try_clone().unwrap();
            best_vsock =
                best_vsock.max(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
            let t = retry(|| TcpStream::connect(("127.0.0.1", TCP_PORT)).ok());
            let r = t.try_clone().unwrap();
            best_tcp =
                best_tcp.max(echo(t, r, |t| t.shutdown(Shutdown::Write).unwrap(), total, write));
        }
        println!(
            "| {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
            size_label(write),
            best_vsock * 8.0 / 1e9,
            best_tcp * 8.0 / 1e9,
            best_vsock / best_tcp
        );
        rec.record("echo", "pier", write, best_vsock * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "tcp", write, best_tcp * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "pier/tcp", write, best_vsock / best_tcp, "x");
    }
}
