//! Echo throughput between a host program and a WebAssembly component:
//! pier's vsock sockets (hybrid Unix socket, bridge, virtio chain, the
//! shim's WIT resources) against wasmtime's own `wasi:sockets` TCP over
//! loopback, with the same echo loop in the same component
//! (`guest-apps/bench-echo`), measured in the same run.
//!
//! Two more columns are the WASI 0.3 world, `vsock:sockets@0.2.0`, through
//! the same chain: bench-echo itself built with pier-rt's `wasi-0-3`
//! feature (the same loop, so that ratio is the two worlds and nothing
//! else), and `guest-apps/echo-p3`, written on the generated bindings
//! (async `stream<u8>`s, 64 KiB reads, one task per connection on
//! wit-bindgen's executor), as an app author without pier-rt meets 0.2.0.
//!
//! Beside throughput it reports what each host process spent per MiB
//! echoed, summed over the runs: CPU time (user + system, every thread),
//! and system calls (`perf stat` of `raw_syscalls:sys_enter`). The `pier run`
//! process is the whole host side of both paths: for pier it holds the
//! bridge, the device and the component; for TCP, wasmtime's sockets and
//! the component. The benchmark's own client is the same for both and is
//! not counted.
//!
//! `cargo bench -p pier-cli --bench echo_throughput [-- --quick]`; with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records the sweep.

use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;

mod common;

use common::{WRITE_SIZES, echo, pier, retry, size_label, sweep_bytes, vsock_connect};
use pier_testkit::bench::{Meter, Usage};

const VSOCK_PORT: u32 = 5000;
const P3_PORT: u32 = 5001;
const RT3_PORT: u32 = 5002;
const TCP_PORT: u16 = 15_731;

/// Builds the guest components and returns their folder.
fn guest_components() -> PathBuf {
    pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total: u64 = if quick { 64 << 20 } else { 512 << 20 };
    let runs = if quick { 1 } else { 3 };
    let components = guest_components();
    let wasm = components.join("bench-echo.wasm");
    let wasm = wasm.to_str().unwrap();
    let p3_wasm = components.join("echo-p3.wasm");
    let rt3_wasm = components.join("bench-echo-wasi-0-3.wasm");
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
    let p3_uds = dir.path().join("p3.vsock");
    let p3_port = P3_PORT.to_string();
    let _p3 = pier(&[
        "run",
        p3_wasm.to_str().unwrap(),
        "--uds",
        p3_uds.to_str().unwrap(),
        "--listen",
        &p3_port,
        "--",
        "--port",
        &p3_port,
    ]);
    let rt3_uds = dir.path().join("rt3.vsock");
    let rt3_port = RT3_PORT.to_string();
    let _rt3 = pier(&[
        "run",
        rt3_wasm.to_str().unwrap(),
        "--uds",
        rt3_uds.to_str().unwrap(),
        "--listen",
        &rt3_port,
        "--",
        "--vsock",
        &rt3_port,
    ]);
    let tcp_uds = dir.path().join("tcp.vsock");
    let _tcp =
        pier(&["run", wasm, "--uds", tcp_uds.to_str().unwrap(), "--wasi-tcp", "--", "--tcp", &tcp]);
    println!(
        "echo throughput, host program <-> component, up to {} MiB each way per case, best of {runs}\n",
        total >> 20
    );
    let (vsock_pid, rt3_pid, p3_pid, tcp_pid) =
        (_vsock.0.id(), _rt3.0.id(), _p3.0.id(), _tcp.0.id());
    println!(
        "| write size | pier 0.1.0 | 0.2.0 bench-echo | 0.2.0 echo-p3 | wasi:sockets TCP \
         | 0.1.0 / TCP | bench-echo 0.2.0 / 0.1.0 | echo-p3 / 0.1.0 \
         | host CPU ms/MiB, 0.1.0 | 0.2.0 bench-echo | echo-p3 | TCP \
         | system calls/MiB, 0.1.0 | 0.2.0 bench-echo | echo-p3 | TCP |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for write in WRITE_SIZES {
        let total = sweep_bytes(total, write, quick);
        let mut best_vsock = 0f64;
        let mut best_p3 = 0f64;
        let mut best_rt3 = 0f64;
        let mut best_tcp = 0f64;
        let (mut vsock_usage, mut rt3_usage, mut p3_usage, mut tcp_usage) =
            (Usage::default(), Usage::default(), Usage::default(), Usage::default());
        for _ in 0..runs {
            let s = retry(|| vsock_connect(&uds, VSOCK_PORT));
            let r = s.try_clone().unwrap();
            let meter = Meter::start(vsock_pid);
            best_vsock =
                best_vsock.max(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
            vsock_usage.add(meter.stop());
            let s = retry(|| vsock_connect(&rt3_uds, RT3_PORT));
            let r = s.try_clone().unwrap();
            let meter = Meter::start(rt3_pid);
            best_rt3 =
                best_rt3.max(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
            rt3_usage.add(meter.stop());
            let s = retry(|| vsock_connect(&p3_uds, P3_PORT));
            let r = s.try_clone().unwrap();
            let meter = Meter::start(p3_pid);
            best_p3 =
                best_p3.max(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
            p3_usage.add(meter.stop());
            let t = retry(|| TcpStream::connect(("127.0.0.1", TCP_PORT)).ok());
            let r = t.try_clone().unwrap();
            let meter = Meter::start(tcp_pid);
            best_tcp =
                best_tcp.max(echo(t, r, |t| t.shutdown(Shutdown::Write).unwrap(), total, write));
            tcp_usage.add(meter.stop());
        }
        let moved = total * runs as u64;
        let usages = [&vsock_usage, &rt3_usage, &p3_usage, &tcp_usage];
        let cpu = usages.map(|u| u.cpu_ms_per_mib(moved));
        let calls = usages.map(|u| u.syscalls_per_mib(moved));
        println!(
            "| {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x | {:.2}x \
             | {:.2}x | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
            size_label(write),
            best_vsock * 8.0 / 1e9,
            best_rt3 * 8.0 / 1e9,
            best_p3 * 8.0 / 1e9,
            best_tcp * 8.0 / 1e9,
            best_vsock / best_tcp,
            best_rt3 / best_vsock,
            best_p3 / best_vsock,
            cpu[0],
            cpu[1],
            cpu[2],
            cpu[3],
            calls[0],
            calls[1],
            calls[2],
            calls[3]
        );
        rec.record("echo", "pier", write, best_vsock * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "rt3", write, best_rt3 * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "p3", write, best_p3 * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "tcp", write, best_tcp * 8.0 / 1e9, "Gbit/s");
        rec.record("echo", "pier/tcp", write, best_vsock / best_tcp, "x");
        rec.record("echo", "rt3/pier", write, best_rt3 / best_vsock, "x");
        rec.record("echo", "p3/pier", write, best_p3 / best_vsock, "x");
        for (column, i) in [("pier", 0), ("rt3", 1), ("p3", 2), ("tcp", 3)] {
            rec.record("echo-cost", &format!("{column}-cpu"), write, cpu[i], "ms/MiB");
            rec.record("echo-cost", &format!("{column}-syscalls"), write, calls[i], "calls/MiB");
        }
    }
}
