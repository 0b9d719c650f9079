//! The unikernel against the WebAssembly shim, the same app source on
//! both, measured in the same run:
//!
//! - **boot to listening**: from spawning `pier boot echo` until a
//!   `CONNECT` to echo's port gets `OK`, median of 20; beside it the same
//!   for `pier boot --pool` (a `pier pool` started before the timing, so
//!   its VMs are prepared: what the pool buys), for `pier boot --pool`
//!   from a pool started with `--preboot echo` (its guests booted up to
//!   listening before they are asked for), and for `pier run
//!   echo.wasm` twice, as users meet it: with a warm compile
//!   cache (every run after the first on a machine) and with
//!   `--no-compile-cache` (a first run, or a changed component: wasmtime
//!   compiles it before it can listen). The cache is a folder of the
//!   benchmark's own (`XDG_CACHE_HOME`), filled by one run before the
//!   timed ones, so neither another checkout's cache nor a stale one
//!   changes the figure;
//! - **echo throughput**: `bench-echo` booted as a unikernel against
//!   `bench-echo.wasm` under `pier run`, and a Unix socket pair echoed by
//!   a thread (what the host's own sockets manage, with no VM or shim);
//!   Beside it, what each host process spent per MiB echoed: CPU time
//!   (every thread; under `pier boot` that includes the vCPU, so the
//!   unikernel itself) and system calls;
//! - **component start per world**: the same echo built for 0.1.0 and
//!   for 0.2.0 (pier-rt's `wasi-0-3` feature), `pier run` to listening,
//!   timed in the boot loop with and without the compile cache;
//! - **image size** of echo, beside its component's.
//!
//! `cargo bench -p pier-cli --bench unikernel [-- --quick]
//! [--sizes=4096,65536] [--only=boot,echo]` (`--sizes` and `--only` run
//! part of it, for comparing two builds quickly); with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records every
//! number for `docs/benchmarks.md`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::stream_echo::{echo, unix_pair_echo};
use common::{
    Pier, WRITE_SIZES, pier, pier_command, retry, size_label, sweep_bytes, vsock_connect,
};
use pier_testkit::bench::{
    Meter, PairedRatio, Usage, chosen_sizes, round_order, rounds, runs_part,
};

const PORT: u32 = 1234;
const BOOTS: usize = 20;

fn image(app: &str) -> PathBuf {
    pier_testkit::build_guest_image(
        app,
        &pier_testkit::cache_dir("guest-image-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn component(app: &str) -> PathBuf {
    pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .join(format!("{app}.wasm"))
}

/// Starts `pier` as `command` says and returns how long until `uds`
/// answers a CONNECT to `PORT` with OK.
fn boot_to_listening(mut command: std::process::Command, uds: &Path) -> Duration {
    let _ = std::fs::remove_file(uds);
    let started = Instant::now();
    let _child = Pier(command.spawn().expect("start pier"));
    loop {
        if vsock_connect(uds, PORT).is_some() {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{command:?} never listened");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Starts `pier pool` on `socket` (with `options`) and waits until it
/// says its VMs are ready, so no boot through it is timed against a pool
/// still filling.
fn start_pool(socket: &Path, options: &[&str]) -> Pier {
    let mut args = vec!["pool", "--socket", socket.to_str().unwrap(), "--size", "2"];
    args.extend(options);
    let mut child = pier_command(&args).stderr(Stdio::piped()).spawn().expect("start pier pool");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("VMs ready at") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "pier pool ended: {line}");
    }
    // Its later log is not the benchmark's; reading it keeps the pool
    // from blocking on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    Pier(child)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn gbit(bytes_per_second: f64) -> f64 {
    bytes_per_second * 8.0 / 1e9
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total: u64 = if quick { 64 << 20 } else { 512 << 20 };
    let rounds = rounds();
    let echo_image = image("echo");
    let echo_wasm = component("echo");
    // The same echo source built for WASI 0.3 (pier-rt's `wasi-0-3`
    // feature): vsock:sockets@0.2.0 and the async `run`.
    let echo_wasi_0_3 = component("echo-wasi-0-3");
    let bench_image = image("bench-echo");
    let bench_wasm = component("bench-echo");
    let dir = tempfile::tempdir().unwrap();
    let port = PORT.to_string();

    // Boot to listening, alternating the four so drift hits all alike.
    let boot_uds = dir.path().join("boot.vsock");
    let run_uds = dir.path().join("run.vsock");
    // `--only=echo` skips this part, `--only=boot` the next.
    if runs_part("boot") {
        let pool_socket = dir.path().join("pool.sock");
        let _pool = start_pool(&pool_socket, &[]);
        let preboot_socket = dir.path().join("preboot.sock");
        let _preboot_pool =
            start_pool(&preboot_socket, &["--preboot", echo_image.to_str().unwrap()]);
        let compile_cache = dir.path().join("cache");
        let boot_echo = || {
            pier_command(&[
                "boot",
                echo_image.to_str().unwrap(),
                "--uds",
                boot_uds.to_str().unwrap(),
            ])
        };
        let pool_echo = |socket: &Path| {
            pier_command(&[
                "boot",
                "--pool",
                socket.to_str().unwrap(),
                echo_image.to_str().unwrap(),
                "--uds",
                boot_uds.to_str().unwrap(),
            ])
        };
        let run_component = |wasm: &Path, cached: bool| {
            let mut args = vec!["run", wasm.to_str().unwrap(), "--uds", run_uds.to_str().unwrap()];
            args.extend(["--listen", &port]);
            if !cached {
                args.push("--no-compile-cache");
            }
            let mut command = pier_command(&args);
            command.env("XDG_CACHE_HOME", &compile_cache);
            command
        };
        let run_echo = |cached: bool| run_component(&echo_wasm, cached);
        let run_echo_wasi_0_3 = |cached: bool| run_component(&echo_wasi_0_3, cached);
        // Fills the compile cache, so every timed cached run finds it warm.
        boot_to_listening(run_echo(true), &run_uds);
        boot_to_listening(run_echo_wasi_0_3(true), &run_uds);
        let [mut booted, mut pooled, mut prebooted, mut warm, mut cold] =
            [(); 5].map(|()| Vec::new());
        let [mut warm_0_3, mut cold_0_3] = [(); 2].map(|()| Vec::new());
        for _ in 0..BOOTS {
            booted.push(boot_to_listening(boot_echo(), &boot_uds));
            pooled.push(boot_to_listening(pool_echo(&pool_socket), &boot_uds));
            prebooted.push(boot_to_listening(pool_echo(&preboot_socket), &boot_uds));
            warm.push(boot_to_listening(run_echo(true), &run_uds));
            cold.push(boot_to_listening(run_echo(false), &run_uds));
            warm_0_3.push(boot_to_listening(run_echo_wasi_0_3(true), &run_uds));
            cold_0_3.push(boot_to_listening(run_echo_wasi_0_3(false), &run_uds));
        }
        let fastest = |v: &[Duration]| ms(*v.iter().min().unwrap());
        let all = [&booted, &pooled, &prebooted, &warm, &cold];
        let rows = [
            (format!("median of {BOOTS}"), all.map(|v| ms(median(v.clone())))),
            ("fastest".to_owned(), all.map(|v| fastest(v))),
        ];
        println!("boot to listening (echo), median of {BOOTS}, alternated\n");
        println!(
            "| | pier boot (unikernel) | pier boot --pool | pier boot --pool, prebooted \
             | pier run, warm compile cache | pier run --no-compile-cache | boot / run (warm) \
             | boot --pool / run (warm) | prebooted / run (warm) | boot --pool / boot \
             | boot / run (no cache) | run: warm / no cache |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for (row, [boot, pool, preboot, warm, cold]) in &rows {
            println!(
                "| {row} | {boot:.1} ms | {pool:.1} ms | {preboot:.1} ms | {warm:.1} ms \
                 | {cold:.1} ms | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
                boot / warm,
                pool / warm,
                preboot / warm,
                pool / boot,
                boot / cold,
                warm / cold
            );
            for (case, value, unit) in [
                ("boot", *boot, "ms"),
                ("boot-pool", *pool, "ms"),
                ("boot-preboot", *preboot, "ms"),
                ("run", *warm, "ms"),
                ("run-no-cache", *cold, "ms"),
                ("boot/run", boot / warm, "x"),
                ("boot-pool/run", pool / warm, "x"),
                ("boot-preboot/run", preboot / warm, "x"),
                ("boot-pool/boot", pool / boot, "x"),
                ("boot/run-no-cache", boot / cold, "x"),
                ("run/run-no-cache", warm / cold, "x"),
            ] {
                rec.record("unikernel-boot", case, row.as_str(), value, unit);
            }
        }
        println!();

        // Component start, per world: the same echo on 0.1.0 and on 0.2.0,
        // timed in the loop above.
        println!("component start to listening (echo), per world, median of {BOOTS}\n");
        println!(
            "| | 0.1.0, warm compile cache | 0.2.0, warm compile cache | 0.1.0, no cache \
             | 0.2.0, no cache | 0.2.0 / 0.1.0 (warm) | 0.2.0 / 0.1.0 (no cache) |"
        );
        println!("|---|---|---|---|---|---|---|");
        let start_rows = [
            (
                format!("median of {BOOTS}"),
                [&warm, &warm_0_3, &cold, &cold_0_3].map(|v| ms(median(v.clone()))),
            ),
            ("fastest".to_owned(), [&warm, &warm_0_3, &cold, &cold_0_3].map(|v| fastest(v))),
        ];
        for (row, [warm1, warm2, cold1, cold2]) in &start_rows {
            println!(
                "| {row} | {warm1:.1} ms | {warm2:.1} ms | {cold1:.1} ms | {cold2:.1} ms | {:.2}x \
                 | {:.2}x |",
                warm2 / warm1,
                cold2 / cold1
            );
            for (case, value, unit) in [
                ("0.1.0", *warm1, "ms"),
                ("0.2.0", *warm2, "ms"),
                ("0.1.0-no-cache", *cold1, "ms"),
                ("0.2.0-no-cache", *cold2, "ms"),
                ("0.2.0/0.1.0", warm2 / warm1, "x"),
                ("0.2.0/0.1.0-no-cache", cold2 / cold1, "x"),
            ] {
                rec.record("component-start", case, row.as_str(), value, unit);
            }
        }
        if std::env::var_os("PIER_BENCH_RAW").is_some() {
            for (name, v) in [
                ("boot", &booted),
                ("boot-pool", &pooled),
                ("boot-preboot", &prebooted),
                ("run", &warm),
            ] {
                let raw: Vec<String> = v.iter().map(|d| format!("{:.1}", ms(*d))).collect();
                println!("raw {name}: {}", raw.join(" "));
            }
        }
        println!();
    }

    if !runs_part("echo") {
        return;
    }
    // Echo throughput: the same bench-echo source on both targets.
    let _unikernel = pier(&[
        "boot",
        bench_image.to_str().unwrap(),
        "--uds",
        boot_uds.to_str().unwrap(),
        "--",
        "--vsock",
        &port,
    ]);
    let _component = pier(&[
        "run",
        bench_wasm.to_str().unwrap(),
        "--uds",
        run_uds.to_str().unwrap(),
        "--listen",
        &port,
        "--",
        "--vsock",
        &port,
    ]);
    println!(
        "echo throughput (bench-echo), host program <-> app, up to {} MiB each way, \
         median of {rounds} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        total >> 20
    );
    println!(
        "| write size | pier boot | pier run | Unix socket pair | boot / run \
         | lowest, highest round | boot / Unix pair |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (boot_pid, run_pid) = (_unikernel.0.id(), _component.0.id());
    let mut costs = Vec::new();
    for write in chosen_sizes().unwrap_or(WRITE_SIZES.to_vec()) {
        let total = sweep_bytes(total, write, quick);
        let (mut boot, mut run, mut unix) = (Vec::new(), Vec::new(), Vec::new());
        let (mut boot_cost, mut run_cost) = (Usage::default(), Usage::default());
        for round in 0..rounds {
            for column in round_order(round, 3) {
                let (uds, pid, rates, cost) = match column {
                    0 => (&boot_uds, boot_pid, &mut boot, &mut boot_cost),
                    1 => (&run_uds, run_pid, &mut run, &mut run_cost),
                    _ => {
                        unix.push(unix_pair_echo(total, write));
                        continue;
                    }
                };
                let s = retry(|| vsock_connect(uds, PORT));
                let r = s.try_clone().unwrap();
                let meter = Meter::start(pid);
                rates.push(echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write));
                cost.add(meter.stop());
            }
        }
        costs.push((write, total * rounds as u64, boot_cost, run_cost));
        let (against_run, against_unix) =
            (PairedRatio::of(&boot, &run), PairedRatio::of(&boot, &unix));
        let rate = pier_testkit::bench::median;
        let (boot, run, unix) = (rate(&boot), rate(&run), rate(&unix));
        println!(
            "| {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x | {:.2}x, {:.2}x | {:.2}x |",
            size_label(write),
            gbit(boot),
            gbit(run),
            gbit(unix),
            against_run.median,
            against_run.lowest,
            against_run.highest,
            against_unix.median
        );
        for (case, value, unit) in [
            ("boot", gbit(boot), "Gbit/s"),
            ("run", gbit(run), "Gbit/s"),
            ("unix", gbit(unix), "Gbit/s"),
            ("boot/run", against_run.median, "x"),
            ("boot/run-lowest", against_run.lowest, "x"),
            ("boot/run-highest", against_run.highest, "x"),
            ("boot/unix", against_unix.median, "x"),
        ] {
            rec.record("unikernel-echo", case, write, value, unit);
        }
    }

    println!(
        "\nwhat each host process spent per MiB echoed (pier boot: the VMM, its \
         vCPU and so the unikernel; pier run: the shim and the component)\n"
    );
    println!(
        "| write size | CPU ms/MiB, pier boot | pier run | boot / run \
         | system calls/MiB, pier boot | pier run |"
    );
    println!("|---|---|---|---|---|---|");
    for (write, moved, boot, run) in costs {
        let cpu = (boot.cpu_ms_per_mib(moved), run.cpu_ms_per_mib(moved));
        let calls = (boot.syscalls_per_mib(moved), run.syscalls_per_mib(moved));
        println!(
            "| {} | {:.2} | {:.2} | {:.2}x | {:.0} | {:.0} |",
            size_label(write),
            cpu.0,
            cpu.1,
            cpu.0 / cpu.1,
            calls.0,
            calls.1
        );
        for (case, value, unit) in [
            ("boot-cpu", cpu.0, "ms/MiB"),
            ("run-cpu", cpu.1, "ms/MiB"),
            ("boot/run-cpu", cpu.0 / cpu.1, "x"),
            ("boot-syscalls", calls.0, "calls/MiB"),
            ("run-syscalls", calls.1, "calls/MiB"),
        ] {
            rec.record("unikernel-cost", case, write, value, unit);
        }
    }

    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    println!("\nimage size\n");
    println!("| echo | bytes |");
    println!("|---|---|");
    let image_row = "unikernel image (ELF, x86_64-unknown-none, release)";
    let component_row = "component (wasm32-wasip2, release)";
    println!("| {image_row} | {} |", size(&echo_image));
    println!("| {component_row} | {} |", size(&echo_wasm));
    rec.record("unikernel-size", "bytes", image_row, size(&echo_image) as f64, "bytes");
    rec.record("unikernel-size", "bytes", component_row, size(&echo_wasm) as f64, "bytes");
}
