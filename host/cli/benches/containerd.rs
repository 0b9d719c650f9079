//! What one pier container costs under containerd: start time (from the
//! start command until the component echoes) and memory per container,
//! with N echo components on one node at once (50; 10 with `--quick`),
//! each under a memory limit as a Pod with `resources.limits` has.
//!
//! Baseline, in the same run: the same component started N times as
//! plain `pier run` processes. The difference is containerd's share: a
//! shim process and its zygote per container, containerd's own records,
//! and `ctr` asking containerd over gRPC.
//!
//! Memory is each container's processes' proportional set size (PSS, from
//! `/proc/PID/smaps_rollup`): pages shared between processes (the shim's
//! code, the compiled component mapped from the compile cache) are
//! split between them, so the sum over N containers is what N cost.
//! containerd's own growth is reported beside it.
//!
//! Run: `cargo bench --workspace --bench containerd [-- --quick]`
//! (`PIER_BENCH_CONTAINERS=N` for another N).

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Pier, pier, retry, vsock_connect};
use pier_testkit::containerd::Containerd;

const PORT: u32 = 1234;
const IMAGE: &str = "docker.io/pier/echo:latest";
/// Every component runs under a memory limit, as a Pod with
/// `resources.limits.memory` does: `ctr run --memory-limit` for the
/// containers, `pier run --max-memory` for the baseline.
const MEMORY_LIMIT: u64 = 64 << 20;

/// Echoes one small message, so "started" means "serving".
fn echo_once(uds: &Path) {
    let mut conn = retry(|| vsock_connect(uds, PORT));
    conn.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
}

/// PSS and RSS of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("Pss:"), field("Rss:"))
}

/// A process and its children (the shim's zygote).
fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The parent's pid is the second field after the command's ')'.
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if parent.and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            pids.push(child);
        }
    }
    pids
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p90(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

struct Measured {
    starts_ms: Vec<f64>,
    pss_kib: Vec<u64>,
    rss_kib: Vec<u64>,
    /// Threads and open files of each component's processes: what a
    /// node's limits (`pid_max`, `RLIMIT_NOFILE`) count.
    threads: Vec<u64>,
    fds: Vec<u64>,
}

/// Entries of a `/proc/PID/` folder (`task`, `fd`).
fn count(pid: u32, folder: &str) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/{folder}")).map_or(0, |d| d.count() as u64)
}

impl Measured {
    fn of(starts_ms: Vec<f64>, processes: &[Vec<u32>]) -> Self {
        let total = |f: &dyn Fn(u32) -> u64| -> Vec<u64> {
            processes.iter().map(|pids| pids.iter().map(|&p| f(p)).sum()).collect()
        };
        Self {
            starts_ms,
            pss_kib: total(&|p| memory_kib(p).0),
            rss_kib: total(&|p| memory_kib(p).1),
            threads: total(&|p| count(p, "task")),
            fds: total(&|p| count(p, "fd")),
        }
    }
}

fn pier_runs(wasm: &Path, dir: &Path, n: usize) -> Measured {
    let mut runs: Vec<Pier> = Vec::with_capacity(n);
    let mut starts_ms = Vec::with_capacity(n);
    for i in 0..n {
        let uds = dir.join(format!("run-{i}.sock"));
        let started = Instant::now();
        runs.push(pier(&[
            "run",
            "--uds",
            uds.to_str().unwrap(),
            "--listen",
            "1234",
            "--max-memory",
            &MEMORY_LIMIT.to_string(),
            wasm.to_str().unwrap(),
            "--",
            "--port",
            "1234",
        ]));
        echo_once(&uds);
        starts_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let processes: Vec<Vec<u32>> = runs.iter().map(|p| vec![p.0.id()]).collect();
    Measured::of(starts_ms, &processes)
}

fn containers(containerd: &Containerd, n: usize) -> Measured {
    let mut starts_ms = Vec::with_capacity(n);
    let mut pids = Vec::with_capacity(n);
    let limit = MEMORY_LIMIT.to_string();
    for i in 0..n {
        let id = format!("echo-{i}");
        // Outside Kubernetes each container is a Pod of its own folder.
        let socket = containerd.socket_root().join("default").join(&id).join(format!("{id}.sock"));
        let started = Instant::now();
        let out = containerd
            .run_with(
                &id,
                IMAGE,
                &[("pier.dev/listen", "1234")],
                &["--memory-limit", &limit],
                &["/echo.wasm", "--port", "1234"],
                true,
            )
            .unwrap();
        assert!(out.status.success(), "ctr run: {}", String::from_utf8_lossy(&out.stderr));
        echo_once(&socket);
        starts_ms.push(started.elapsed().as_secs_f64() * 1e3);
        let (_, pid) = containerd.task(&id).unwrap().expect("the task is listed");
        pids.push(pid);
    }
    let processes: Vec<Vec<u32>> = pids.iter().map(|&pid| with_children(pid)).collect();
    Measured::of(starts_ms, &processes)
}

fn stop_all(containerd: &Containerd, n: usize) {
    for i in 0..n {
        let id = format!("echo-{i}");
        containerd.ctr_ok(&["task", "kill", &id]).unwrap();
    }
    for i in 0..n {
        let id = format!("echo-{i}");
        containerd.wait_stopped(&id, Duration::from_secs(10)).unwrap();
        containerd.delete(&id).unwrap();
    }
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let n = match std::env::var("PIER_BENCH_CONTAINERS") {
        Ok(n) => n.parse().expect("PIER_BENCH_CONTAINERS: a number"),
        Err(_) if quick => 10,
        Err(_) => 50,
    };
    let guest = pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let wasm = guest.join("echo.wasm");
    let shim = pier_testkit::containerd::build_shim(pier_testkit::Output::Show)
        .unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("echo.tar");
    pier_testkit::oci_image::write_image(&wasm, "echo", IMAGE, &[], &archive).unwrap();
    let containerd = Containerd::start(&tmp.path().join("containerd"), &shim).unwrap();
    containerd.import("default", &archive).unwrap();
    // Warm both paths once (compile cache, page cache), then measure.
    drop(pier_runs(&wasm, tmp.path(), 1));
    containers(&containerd, 1);
    stop_all(&containerd, 1);
    let containerd_before = memory_kib(containerd.pid()).0;
    let with_containerd = containers(&containerd, n);
    let containerd_growth = memory_kib(containerd.pid()).0 as f64 - containerd_before as f64;
    let plain = pier_runs(&wasm, tmp.path(), n);

    let mut rec = pier_testkit::bench::Recorder::from_env();
    println!(
        "{n} echo components on one node at once, each under a {} MiB memory limit\n",
        MEMORY_LIMIT >> 20
    );
    println!("| | pier run | containerd + containerd-shim-pier-v1 | containerd / pier run |");
    println!("|---|---|---|---|");
    let average = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
    let mean = |v: &[u64]| average(v) / 1024.0;
    let rows: [(&str, f64, f64, &str); 7] = [
        (
            "start to serving, median",
            median(plain.starts_ms.clone()),
            median(with_containerd.starts_ms.clone()),
            "ms",
        ),
        (
            "start to serving, p90",
            p90(plain.starts_ms.clone()),
            p90(with_containerd.starts_ms.clone()),
            "ms",
        ),
        ("memory per component (PSS)", mean(&plain.pss_kib), mean(&with_containerd.pss_kib), "MiB"),
        ("memory per component (RSS)", mean(&plain.rss_kib), mean(&with_containerd.rss_kib), "MiB"),
        ("threads per component", average(&plain.threads), average(&with_containerd.threads), ""),
        ("open files per component", average(&plain.fds), average(&with_containerd.fds), ""),
        (
            "all together (PSS)",
            mean(&plain.pss_kib) * n as f64,
            mean(&with_containerd.pss_kib) * n as f64,
            "MiB",
        ),
    ];
    for (row, base, measured, unit) in rows {
        println!("| {row} | {base:.1} {unit} | {measured:.1} {unit} | {:.2}x |", measured / base);
        rec.record("containerd", "pier-run", row, base, unit);
        rec.record("containerd", "containerd", row, measured, unit);
        rec.record("containerd", "containerd/pier-run", row, measured / base, "x");
    }
    let growth_per = containerd_growth / n as f64 / 1024.0;
    println!("\ncontainerd's own PSS grew by {growth_per:.2} MiB per container");
    rec.record(
        "containerd",
        "containerd",
        "containerd's own growth per container (PSS)",
        growth_per,
        "MiB",
    );
    stop_all(&containerd, n);
}
