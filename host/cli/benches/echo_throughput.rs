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
//! `cargo bench -p pier-cli --bench echo_throughput [-- --quick]
//! [--sizes=4096,65536] [--only=pier,tcp]` (`--sizes` and `--only`, the
//! columns `pier`, `rt3`, `p3` and `tcp`, run part of it, for comparing
//! two builds quickly); with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records the sweep.

use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;

mod common;

use common::stream_echo::echo;
use common::{WRITE_SIZES, pier, retry, size_label, sweep_bytes, vsock_connect};
use pier_testkit::bench::{Meter, PairedRatio, Usage, median, round_order, rounds, runs_part};

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

/// One side of the comparison: a `pier run` serving an echo, and how a
/// host program reaches it.
struct Column {
    /// The JSON records' case name.
    key: &'static str,
    server: common::Pier,
    echo_once: Box<dyn Fn(u64, usize) -> f64>,
    /// Bytes per second in each round of the current write size.
    rates: Vec<f64>,
    usage: Usage,
}

impl Column {
    /// Echoes `total` bytes in `write`-byte writes once, keeping the
    /// round's rate and adding what the server process spent.
    fn run(&mut self, total: u64, write: usize) {
        let meter = Meter::start(self.server.0.id());
        self.rates.push((self.echo_once)(total, write));
        self.usage.add(meter.stop());
    }
}

/// A column reached through a hybrid socket at `uds`, port `port`.
fn vsock_column(key: &'static str, server: common::Pier, uds: PathBuf, port: u32) -> Column {
    let echo_once = Box::new(move |total, write| {
        let s = retry(|| vsock_connect(&uds, port));
        let r = s.try_clone().unwrap();
        echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write)
    });
    Column { key, server, echo_once, rates: Vec::new(), usage: Usage::default() }
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total: u64 = if quick { 64 << 20 } else { 512 << 20 };
    let runs = rounds();
    let components = guest_components();
    let wasm = components.join("bench-echo.wasm");
    let wasm = wasm.to_str().unwrap();
    let p3_wasm = components.join("echo-p3.wasm");
    let rt3_wasm = components.join("bench-echo-wasi-0-3.wasm");
    let dir = tempfile::tempdir().unwrap();
    let serve = |key: &'static str, component: &str, port: u32, app_args: &[&str]| {
        let uds = dir.path().join(format!("{key}.vsock"));
        let port_arg = port.to_string();
        let mut args = vec!["run", component, "--uds", uds.to_str().unwrap()];
        args.extend(["--listen", &port_arg, "--"]);
        args.extend(app_args);
        args.push(&port_arg);
        vsock_column(key, pier(&args), uds.clone(), port)
    };
    // `--only=pier,tcp` runs some of the columns, for comparing two builds
    // quickly; the ratios need both of their columns.
    let mut columns: Vec<Column> = Vec::new();
    if runs_part("pier") {
        columns.push(serve("pier", wasm, VSOCK_PORT, &["--vsock"]));
    }
    if runs_part("rt3") {
        columns.push(serve("rt3", rt3_wasm.to_str().unwrap(), RT3_PORT, &["--vsock"]));
    }
    if runs_part("p3") {
        columns.push(serve("p3", p3_wasm.to_str().unwrap(), P3_PORT, &["--port"]));
    }
    if runs_part("tcp") {
        let tcp_uds = dir.path().join("tcp.vsock");
        let tcp = TCP_PORT.to_string();
        let server = pier(&[
            "run",
            wasm,
            "--uds",
            tcp_uds.to_str().unwrap(),
            "--wasi-tcp",
            "--",
            "--tcp",
            &tcp,
        ]);
        let echo_once = Box::new(|total, write| {
            let t = retry(|| TcpStream::connect(("127.0.0.1", TCP_PORT)).ok());
            let r = t.try_clone().unwrap();
            echo(t, r, |t| t.shutdown(Shutdown::Write).unwrap(), total, write)
        });
        columns.push(Column {
            key: "tcp",
            server,
            echo_once,
            rates: Vec::new(),
            usage: Usage::default(),
        });
    }
    println!(
        "echo throughput, host program <-> component, up to {} MiB each way per case, \
         median of {runs} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        total >> 20
    );
    println!(
        "| write size | pier 0.1.0 | 0.2.0 bench-echo | 0.2.0 echo-p3 | wasi:sockets TCP \
         | 0.1.0 / TCP | lowest, highest round | bench-echo 0.2.0 / 0.1.0 | echo-p3 / 0.1.0 \
         | host CPU ms/MiB, 0.1.0 | 0.2.0 bench-echo | echo-p3 | TCP \
         | system calls/MiB, 0.1.0 | 0.2.0 bench-echo | echo-p3 | TCP |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for write in pier_testkit::bench::chosen_sizes().unwrap_or(WRITE_SIZES.to_vec()) {
        let total = sweep_bytes(total, write, quick);
        for column in &mut columns {
            column.rates.clear();
            column.usage = Usage::default();
        }
        for round in 0..runs {
            for i in round_order(round, columns.len()) {
                columns[i].run(total, write);
            }
        }
        let moved = total * runs as u64;
        let find = |key: &str| columns.iter().find(|c| c.key == key);
        let rates = |key: &str| find(key).map_or(&[][..], |c| &c.rates[..]);
        let rate = |key: &str| median(rates(key));
        let ratio = |a: &str, b: &str| PairedRatio::of(rates(a), rates(b));
        let cpu = |key: &str| find(key).map_or(f64::NAN, |c| c.usage.cpu_ms_per_mib(moved));
        let calls = |key: &str| find(key).map_or(f64::NAN, |c| c.usage.syscalls_per_mib(moved));
        let keys = ["pier", "rt3", "p3", "tcp"];
        let gbit = |key: &str| rate(key) * 8.0 / 1e9;
        let ratios =
            [("pier/tcp", "pier", "tcp"), ("rt3/pier", "rt3", "pier"), ("p3/pier", "p3", "pier")];
        let goal = ratio("pier", "tcp");
        println!(
            "| {} | {} | {:.2}x | {:.2}x, {:.2}x | {} | {} |",
            size_label(write),
            keys.map(|k| format!("{:.2} Gbit/s", gbit(k))).join(" | "),
            goal.median,
            goal.lowest,
            goal.highest,
            ratios[1..]
                .iter()
                .map(|(_, a, b)| format!("{:.2}x", ratio(a, b).median))
                .collect::<Vec<_>>()
                .join(" | "),
            keys.map(|k| format!("{:.2}", cpu(k)))
                .into_iter()
                .chain(keys.map(|k| format!("{:.0}", calls(k))))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        for column in &columns {
            rec.record("echo", column.key, write, gbit(column.key), "Gbit/s");
            rec.record(
                "echo-cost",
                &format!("{}-cpu", column.key),
                write,
                cpu(column.key),
                "ms/MiB",
            );
            let syscalls = calls(column.key);
            rec.record(
                "echo-cost",
                &format!("{}-syscalls", column.key),
                write,
                syscalls,
                "calls/MiB",
            );
        }
        for (case, a, b) in ratios {
            if find(a).is_some() && find(b).is_some() {
                rec.record("echo", case, write, ratio(a, b).median, "x");
            }
        }
        if find("pier").is_some() && find("tcp").is_some() {
            rec.record("echo", "pier/tcp-lowest", write, goal.lowest, "x");
            rec.record("echo", "pier/tcp-highest", write, goal.highest, "x");
        }
    }
}
