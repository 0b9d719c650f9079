//! `cargo xtask bench`: every benchmark in one go, and the tables and plots
//! of `docs/benchmarks.md` regenerated from what they measured.
//!
//! The benchmark binaries (`cargo bench --workspace`) keep printing their
//! own tables for a human at the terminal. For the documentation they also
//! write one JSON line per measurement to the file named by
//! `PIER_BENCH_JSON` (`pier_testkit::bench`, which owns the format); this
//! module runs them all with that set, reads the lines back, and rewrites
//! only what a run measured:
//!
//! - each table between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in
//!   `docs/benchmarks.md` (the prose around the markers is hand-written and
//!   left alone; a table whose benchmark did not run is left as it was);
//! - each plot, `docs/plots/NAME.svg`, which the document embeds.
//!
//! Every benchmark measures its baseline in the same invocation and
//! records the ratio itself, so a table only lays out records: it never
//! pairs numbers from two runs.
//!
//! `PIER_BENCH_QUICK=1` (`cargo xtask bench --quick`) asks every benchmark
//! for fewer bytes and runs, a few minutes in all: enough for the shape of
//! each curve and a sanity check of a change, too noisy for a claim, so
//! the tables say which mode produced them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pier_testkit::bench::{JSON_ENV, QUICK_ENV, Record, Recorder, X, parse_records};
use pier_testkit::{cargo, repo_root, run_visibly, target_dir};

/// The record, first in a results file, that says which mode produced it.
const RUN_BENCH: &str = "_run";

/// How a table prints its rows' x.
#[derive(Clone, Copy, Debug)]
enum Rows {
    /// Byte counts: "64 B", "4 KiB".
    Bytes,
    /// Labels or plain numbers, as recorded.
    Plain,
}

/// One generated table: the records of `bench`, one row per x in the
/// order first recorded, one column per case listed.
#[derive(Debug)]
struct Table {
    /// The marker name in `docs/benchmarks.md` (`<!-- bench:NAME -->`).
    marker: &'static str,
    bench: &'static str,
    rows: Rows,
    row_heading: &'static str,
    /// (case, column heading).
    columns: &'static [(&'static str, &'static str)],
}

/// One generated plot, `docs/plots/FILE.svg`: value against x on log-log
/// axes, one line per case.
#[derive(Debug)]
struct Plot {
    file: &'static str,
    bench: &'static str,
    title: &'static str,
    x_desc: &'static str,
    y_desc: &'static str,
    /// (case, legend label).
    series: &'static [(&'static str, &'static str)],
}

const TABLES: &[Table] = &[
    Table {
        marker: "loopback-stream",
        bench: "loopback-stream",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("pier", "pier loopback, send"),
            ("pier-in-place", "pier loopback, in place"),
            ("unix", "Unix socket pair"),
            ("pier/unix", "send / Unix"),
            ("pier-in-place/unix", "in place / Unix"),
        ],
    },
    Table {
        marker: "loopback-pingpong",
        bench: "loopback-pingpong",
        rows: Rows::Bytes,
        row_heading: "message size (round trip)",
        columns: &[
            ("pier", "pier loopback"),
            ("unix", "Unix socket pair"),
            ("unix/pier", "Unix / pier (pier's speed-up)"),
        ],
    },
    Table {
        marker: "echo-cost",
        bench: "echo-cost",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("pier-cpu", "host CPU ms/MiB, pier vsock 0.1.0"),
            ("rt3-cpu", "0.2.0 (bench-echo)"),
            ("p3-cpu", "0.2.0 (echo-p3)"),
            ("tcp-cpu", "wasi:sockets TCP"),
            ("pier-syscalls", "system calls/MiB, pier vsock 0.1.0"),
            ("rt3-syscalls", "0.2.0 (bench-echo)"),
            ("p3-syscalls", "0.2.0 (echo-p3)"),
            ("tcp-syscalls", "wasi:sockets TCP"),
        ],
    },
    Table {
        marker: "copy-strategy",
        bench: "copy-strategy",
        rows: Rows::Bytes,
        row_heading: "size",
        columns: &[
            ("stream-memcpy", "loopback, memcpy"),
            ("stream-vector", "loopback, vector loop"),
            ("stream-vector/memcpy", "loopback vector / memcpy"),
            ("copy-memcpy", "copy, memcpy"),
            ("copy-vector", "copy, vector loop"),
            ("copy-vector/memcpy", "copy vector / memcpy"),
        ],
    },
    Table {
        marker: "accept",
        bench: "accept",
        rows: Rows::Plain,
        row_heading: "non-blocking accept, empty backlog",
        columns: &[
            ("pier-stack", "pier-stack"),
            ("unix", "Unix listener (accept4)"),
            ("tcp", "TCP listener, loopback (accept4)"),
            ("unix/pier", "Unix / pier"),
        ],
    },
    Table {
        marker: "accept-app",
        bench: "accept-app",
        rows: Rows::Plain,
        row_heading: "non-blocking accept, empty backlog",
        columns: &[
            ("shim", "pier run (WIT accept)"),
            ("unikernel", "pier boot (unikernel)"),
            ("unix", "Unix listener (accept4)"),
            ("unix/shim", "Unix / WIT"),
        ],
    },
    Table {
        marker: "rx-buffers",
        bench: "rx-buffers",
        rows: Rows::Bytes,
        row_heading: "rx buffer (payload)",
        columns: &[("pier", "throughput"), ("vs-4k", "vs 4 KiB")],
    },
    Table {
        marker: "rx-buffers-ring-trace",
        bench: "rx-buffers-ring-trace",
        rows: Rows::Bytes,
        row_heading: "rx buffer (payload)",
        columns: &[("off", "ring trace off"), ("on", "ring trace on"), ("on/off", "on / off")],
    },
    Table {
        marker: "wakeups",
        bench: "wakeups",
        rows: Rows::Plain,
        row_heading: "",
        columns: &[
            ("syscall", "system call (getppid)"),
            ("wakeup-any-cpu", "wakeup, either CPU"),
            ("wakeup-one-cpu", "wakeup, both threads on one CPU"),
            ("any/one", "either CPU / one CPU"),
            ("wakeup/syscall", "wakeup (either CPU) / system call"),
        ],
    },
    Table {
        marker: "chain",
        bench: "chain",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("host-to-guest", "host -> guest"),
            ("guest-to-host", "guest -> host"),
            ("unix", "Unix socket pair"),
            ("h2g/unix", "host -> guest / Unix"),
            ("g2h/unix", "guest -> host / Unix"),
            ("h2g/unix-lowest", "host -> guest / Unix, lowest round"),
            ("h2g/unix-highest", "highest round"),
            ("g2h/unix-lowest", "guest -> host / Unix, lowest round"),
            ("g2h/unix-highest", "highest round"),
        ],
    },
    Table {
        marker: "chain-cost",
        bench: "chain-cost",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("h2g-cpu", "CPU ms/MiB, host -> guest"),
            ("g2h-cpu", "CPU ms/MiB, guest -> host"),
            ("unix-cpu", "CPU ms/MiB, Unix pair"),
            ("h2g-syscalls", "system calls/MiB, host -> guest"),
            ("g2h-syscalls", "system calls/MiB, guest -> host"),
            ("unix-syscalls", "system calls/MiB, Unix pair"),
        ],
    },
    Table {
        marker: "chain-rx-count",
        bench: "chain-rx-count",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("64", "64 buffers"),
            ("32", "32 buffers"),
            ("16", "16 buffers"),
            ("8", "8 buffers"),
            ("32/64", "32 / 64"),
            ("16/64", "16 / 64"),
            ("8/64", "8 / 64"),
        ],
    },
    Table {
        marker: "echo",
        bench: "echo",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("pier", "pier vsock, 0.1.0"),
            ("rt3", "pier vsock, 0.2.0 (bench-echo)"),
            ("p3", "pier vsock, 0.2.0 (echo-p3)"),
            ("tcp", "wasi:sockets TCP"),
            ("pier/tcp", "0.1.0 / TCP"),
            ("pier/tcp-lowest", "0.1.0 / TCP, lowest round"),
            ("pier/tcp-highest", "highest round"),
            ("rt3/pier", "0.2.0 (bench-echo) / 0.1.0"),
            ("p3/pier", "0.2.0 (echo-p3) / 0.1.0"),
        ],
    },
    Table {
        marker: "datagrams",
        bench: "datagrams",
        rows: Rows::Bytes,
        row_heading: "datagram size",
        columns: &[
            ("pier", "pier run msg-echo"),
            ("udp", "kernel UDP, 127.0.0.1"),
            ("pier/udp", "pier / UDP"),
            ("pier/udp-lowest", "pier / UDP, lowest round"),
            ("pier/udp-highest", "highest round"),
            ("pier-lost", "lost (pier)"),
            ("udp-lost", "lost (UDP)"),
        ],
    },
    Table {
        marker: "datagrams-flood",
        bench: "datagrams-flood",
        rows: Rows::Bytes,
        row_heading: "datagram size, no window",
        columns: &[
            ("pier", "pier run msg-echo, echoed"),
            ("udp", "kernel UDP, 127.0.0.1, echoed"),
            ("pier/udp", "pier / UDP"),
            ("sent", "sent (each)"),
            ("pier-lost", "lost (pier)"),
            ("udp-lost", "lost (UDP)"),
            ("pier-lost-share", "lost share (pier)"),
            ("udp-lost-share", "lost share (UDP)"),
        ],
    },
    Table {
        marker: "unikernel-boot",
        bench: "unikernel-boot",
        rows: Rows::Plain,
        row_heading: "",
        columns: &[
            ("boot", "pier boot (unikernel)"),
            ("boot-pool", "pier boot --pool"),
            ("boot-preboot", "pier boot --pool, prebooted"),
            ("run", "pier run, warm compile cache"),
            ("run-no-cache", "pier run --no-compile-cache"),
            ("boot/run", "boot / run (warm cache)"),
            ("boot-pool/run", "boot --pool / run (warm cache)"),
            ("boot-preboot/run", "prebooted / run (warm cache)"),
            ("boot-pool/boot", "boot --pool / boot"),
            ("boot/run-no-cache", "boot / run (no cache)"),
            ("run/run-no-cache", "run: warm cache / no cache"),
        ],
    },
    Table {
        marker: "component-start",
        bench: "component-start",
        rows: Rows::Plain,
        row_heading: "",
        columns: &[
            ("0.1.0", "0.1.0, warm compile cache"),
            ("0.2.0", "0.2.0, warm compile cache"),
            ("0.1.0-no-cache", "0.1.0, no cache"),
            ("0.2.0-no-cache", "0.2.0, no cache"),
            ("0.2.0/0.1.0", "0.2.0 / 0.1.0 (warm)"),
            ("0.2.0/0.1.0-no-cache", "0.2.0 / 0.1.0 (no cache)"),
        ],
    },
    Table {
        marker: "unikernel-echo",
        bench: "unikernel-echo",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("boot", "pier boot"),
            ("run", "pier run"),
            ("unix", "Unix socket pair"),
            ("boot/run", "boot / run"),
            ("boot/run-lowest", "boot / run, lowest round"),
            ("boot/run-highest", "highest round"),
            ("boot/unix", "boot / Unix pair"),
        ],
    },
    Table {
        marker: "unikernel-cost",
        bench: "unikernel-cost",
        rows: Rows::Bytes,
        row_heading: "write size",
        columns: &[
            ("boot-cpu", "host CPU ms/MiB, pier boot"),
            ("run-cpu", "host CPU ms/MiB, pier run"),
            ("boot/run-cpu", "boot / run"),
            ("boot-syscalls", "system calls/MiB, pier boot"),
            ("run-syscalls", "system calls/MiB, pier run"),
        ],
    },
    Table {
        marker: "unikernel-size",
        bench: "unikernel-size",
        rows: Rows::Plain,
        row_heading: "echo",
        columns: &[("bytes", "bytes")],
    },
    Table {
        marker: "crosscheck-boot",
        bench: "crosscheck-boot",
        rows: Rows::Plain,
        row_heading: "",
        columns: &[
            ("pier", "pier boot"),
            ("qemu", "QEMU microvm + vhost-device-vsock"),
            ("qemu-pier", "QEMU microvm + pier vhost-user"),
            ("qemu/pier", "QEMU + vhost-device-vsock / pier boot"),
        ],
    },
    Table {
        marker: "crosscheck-h2g",
        bench: "crosscheck-h2g",
        rows: Rows::Bytes,
        row_heading: "host to guest, write size",
        columns: &[
            ("pier", "pier boot"),
            ("qemu", "QEMU + vhost-device-vsock"),
            ("qemu-pier", "QEMU + pier vhost-user"),
            ("pier/qemu", "pier boot / QEMU + vhost-device-vsock"),
            ("qemu-pier/qemu", "pier vhost-user / vhost-device-vsock"),
            ("pier/qemu-lowest", "pier boot / QEMU + vhost-device-vsock, lowest round"),
            ("pier/qemu-highest", "highest round"),
        ],
    },
    Table {
        marker: "crosscheck-g2h",
        bench: "crosscheck-g2h",
        rows: Rows::Plain,
        row_heading: "guest to host",
        columns: &[
            ("pier", "pier boot"),
            ("qemu", "QEMU + vhost-device-vsock"),
            ("qemu-pier", "QEMU + pier vhost-user"),
            ("pier/qemu", "pier boot / QEMU + vhost-device-vsock"),
            ("qemu-pier/qemu", "pier vhost-user / vhost-device-vsock"),
            ("pier/qemu-lowest", "pier boot / QEMU + vhost-device-vsock, lowest round"),
            ("pier/qemu-highest", "highest round"),
        ],
    },
    Table {
        marker: "containerd",
        bench: "containerd",
        rows: Rows::Plain,
        row_heading: "echo components on one node",
        columns: &[
            ("pier-run", "pier run"),
            ("containerd", "containerd + containerd-shim-pier-v1"),
            ("containerd/pier-run", "containerd / pier run"),
        ],
    },
    Table {
        marker: "linux-guest-echo",
        bench: "linux-guest-echo",
        rows: Rows::Bytes,
        row_heading: "echo, write size",
        columns: &[
            ("pier", "QEMU + pier vhost-user"),
            ("vdv", "QEMU + vhost-device-vsock"),
            ("pier/vdv", "pier / vhost-device-vsock"),
            ("pier/vdv-lowest", "pier / vhost-device-vsock, lowest round"),
            ("pier/vdv-highest", "highest round"),
        ],
    },
    Table {
        marker: "linux-guest-duplex",
        bench: "linux-guest-duplex",
        rows: Rows::Bytes,
        row_heading: "full-duplex echo, write size",
        columns: &[
            ("pier", "QEMU + pier vhost-user"),
            ("vdv", "QEMU + vhost-device-vsock"),
            ("pier/vdv", "pier / vhost-device-vsock"),
            ("pier-backend", "pier vhost-user process, CPU per MiB"),
            ("vdv-backend", "vhost-device-vsock process, CPU per MiB"),
            ("vdv/pier-backend", "vhost-device-vsock / pier, CPU"),
        ],
    },
    Table {
        marker: "linux-guest-cpu",
        bench: "linux-guest-cpu",
        rows: Rows::Bytes,
        row_heading: "host CPU per MiB echoed, write size",
        columns: &[
            ("pier-backend", "pier vhost-user process"),
            ("vdv-backend", "vhost-device-vsock process"),
            ("vdv/pier-backend", "vhost-device-vsock / pier"),
            ("pier-qemu", "QEMU, with pier"),
            ("vdv-qemu", "QEMU, with vhost-device-vsock"),
            ("pier-qemu-busy", "QEMU, with pier: share of a core"),
            ("vdv-qemu-busy", "QEMU, with vhost-device-vsock: share of a core"),
            ("pier-backend-busy", "pier: share of a core"),
            ("vdv-backend-busy", "vhost-device-vsock: share of a core"),
        ],
    },
    Table {
        marker: "linux-guest-switches",
        bench: "linux-guest-switches",
        rows: Rows::Bytes,
        row_heading: "context switches per 64 KiB echoed, write size",
        columns: &[
            ("pier-backend", "pier vhost-user process"),
            ("vdv-backend", "vhost-device-vsock process"),
            ("pier-qemu", "QEMU, with pier"),
            ("vdv-qemu", "QEMU, with vhost-device-vsock"),
        ],
    },
];

const PLOTS: &[Plot] = &[
    Plot {
        file: "loopback",
        bench: "loopback-stream",
        title: "pier-stack loopback: stream throughput",
        x_desc: "write size",
        y_desc: "Gbit/s (log scale)",
        series: &[
            ("pier", "pier loopback, send"),
            ("pier-in-place", "pier loopback, in place"),
            ("unix", "Unix socket pair (baseline)"),
        ],
    },
    Plot {
        file: "pingpong",
        bench: "loopback-pingpong",
        title: "pier-stack loopback: ping-pong round trip",
        x_desc: "message size",
        y_desc: "µs per round trip (log scale)",
        series: &[("pier", "pier loopback"), ("unix", "Unix socket pair (baseline)")],
    },
    Plot {
        file: "rx-buffers",
        bench: "rx-buffers",
        title: "pier-driver: host -> guest by receive buffer size",
        x_desc: "receive buffer payload",
        y_desc: "Gbit/s (log scale)",
        series: &[("pier", "in-process virtio bed")],
    },
    Plot {
        file: "chain",
        bench: "chain",
        title: "host program <-> guest app, whole in-process chain",
        x_desc: "write size",
        y_desc: "Gbit/s (log scale)",
        series: &[
            ("host-to-guest", "host -> guest"),
            ("guest-to-host", "guest -> host"),
            ("unix", "Unix socket pair (baseline)"),
        ],
    },
    Plot {
        file: "echo",
        bench: "echo",
        title: "echo to a component: pier vsock vs wasi:sockets TCP",
        x_desc: "write size",
        y_desc: "Gbit/s each way (log scale)",
        series: &[
            ("pier", "pier vsock, 0.1.0"),
            ("rt3", "pier vsock, 0.2.0 (bench-echo)"),
            ("p3", "pier vsock, 0.2.0 (echo-p3)"),
            ("tcp", "wasi:sockets TCP (baseline)"),
        ],
    },
    Plot {
        file: "datagrams",
        bench: "datagrams",
        title: "datagram echo: pier run msg-echo vs kernel UDP",
        x_desc: "datagram size",
        y_desc: "MB/s each way (log scale)",
        series: &[("pier", "pier run msg-echo"), ("udp", "UDP on 127.0.0.1 (baseline)")],
    },
    Plot {
        file: "unikernel",
        bench: "unikernel-echo",
        title: "echo: unikernel vs component vs Unix socket pair",
        x_desc: "write size",
        y_desc: "Gbit/s each way (log scale)",
        series: &[
            ("boot", "pier boot (unikernel)"),
            ("run", "pier run (component)"),
            ("unix", "Unix socket pair (baseline)"),
        ],
    },
    Plot {
        file: "crosscheck",
        bench: "crosscheck-h2g",
        title: "host -> guest: pier boot, QEMU + vhost-device-vsock, QEMU + pier vhost-user",
        x_desc: "write size",
        y_desc: "Gbit/s (log scale)",
        series: &[
            ("pier", "pier boot"),
            ("qemu", "QEMU + vhost-device-vsock (baseline)"),
            ("qemu-pier", "QEMU + pier vhost-user"),
        ],
    },
];

/// What `cargo xtask bench` was asked for.
#[derive(Debug, Default)]
pub struct Options {
    pub quick: bool,
    /// Only these bench targets (`cargo bench --bench NAME`); all when empty.
    pub benches: Vec<String>,
    /// Regenerate from an earlier run's JSON lines instead of running
    /// (labelled with that run's mode; `--quick` only for files without).
    pub from: Option<PathBuf>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--bench" => {
                    options.benches.push(args.next().ok_or("--bench needs a name")?.clone());
                }
                "--from" => {
                    options.from = Some(args.next().ok_or("--from needs a file")?.into());
                }
                other => return Err(format!("unknown bench option {other}")),
            }
        }
        Ok(options)
    }
}

/// Runs the benchmarks (unless `--from`), then rewrites the tables and
/// plots their records cover. A benchmark that fails does not stop the
/// others (`--no-fail-fast`); what ran is still written, and the failure
/// is returned after.
pub fn run(options: &Options) -> Result<(), String> {
    let root = repo_root();
    let (results, ran) = match &options.from {
        Some(path) => (path.clone(), Ok(())),
        None => {
            let dir = target_dir().join("bench");
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let results = dir.join("results.jsonl");
            // The mode goes first, so that `--from` labels the tables as the
            // run that measured them.
            let mode = if options.quick { "quick" } else { "full" };
            Recorder::create(&results)?.record(RUN_BENCH, "mode", mode, 0.0, "");
            let mut cmd = cargo();
            cmd.args(["bench", "--workspace", "--no-fail-fast"]);
            for bench in &options.benches {
                cmd.args(["--bench", bench]);
            }
            cmd.env(JSON_ENV, &results);
            if options.quick {
                cmd.env(QUICK_ENV, "1");
            } else {
                cmd.env_remove(QUICK_ENV);
            }
            eprintln!(
                "xtask: running the benchmarks ({} mode), measurements to {}",
                if options.quick { "quick" } else { "full" },
                results.display()
            );
            let started = std::time::Instant::now();
            let ran = run_visibly(&mut cmd, "cargo bench");
            eprintln!("xtask: benchmarks took {:.0} s", started.elapsed().as_secs_f64());
            (results, ran)
        }
    };
    let text = std::fs::read_to_string(&results)
        .map_err(|e| format!("reading {}: {e}", results.display()))?;
    let records = parse_records(&text)?;
    let quick = match records.iter().find(|r| r.bench == RUN_BENCH && r.case == "mode") {
        Some(r) => r.x == X::Label("quick".into()),
        None => options.quick,
    };
    let stamp = Stamp { quick, date: today(), machine: machine() };
    let doc_path = root.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&doc_path)
        .map_err(|e| format!("reading {}: {e}", doc_path.display()))?;
    let (doc, written) = update_doc(&doc, &records, &stamp)?;
    std::fs::write(&doc_path, doc).map_err(|e| format!("{}: {e}", doc_path.display()))?;
    eprintln!("xtask: docs/benchmarks.md: {} tables rewritten", written.len());
    let plots = root.join("docs/plots");
    std::fs::create_dir_all(&plots).map_err(|e| format!("{}: {e}", plots.display()))?;
    for plot in PLOTS {
        let series = plot_series(plot, &records);
        if series.iter().all(|(_, points)| points.is_empty()) {
            continue;
        }
        let path = plots.join(format!("{}.svg", plot.file));
        draw(&path, plot, &series, &stamp)?;
        eprintln!("xtask: wrote {}", path.display());
    }
    ran
}

/// Which run a table came from, printed under it.
#[derive(Debug)]
struct Stamp {
    quick: bool,
    date: String,
    machine: String,
}

/// Replaces the body of every marker pair whose table has records.
/// Returns the new document and the markers rewritten.
fn update_doc(
    doc: &str,
    records: &[Record],
    stamp: &Stamp,
) -> Result<(String, Vec<&'static str>), String> {
    let mut doc = doc.to_owned();
    let mut written = Vec::new();
    for table in TABLES {
        let Some(body) = render_table(table, records) else { continue };
        let open = format!("<!-- bench:{} -->", table.marker);
        let close = format!("<!-- /bench:{} -->", table.marker);
        let (Some(start), Some(end)) = (doc.find(&open), doc.find(&close)) else {
            eprintln!("xtask: docs/benchmarks.md has no {open} ... {close}; table not written");
            continue;
        };
        if end < start {
            return Err(format!("docs/benchmarks.md: {close} comes before {open}"));
        }
        let mode = if stamp.quick { "`cargo xtask bench --quick`" } else { "`cargo xtask bench`" };
        let generated = format!(
            "{open}\n{body}\n_Generated by {mode} on {}, {}._\n{close}",
            stamp.date, stamp.machine
        );
        doc.replace_range(start..end + close.len(), &generated);
        written.push(table.marker);
    }
    Ok((doc, written))
}

/// The markdown table for `table`, or `None` when no record is its.
fn render_table(table: &Table, records: &[Record]) -> Option<String> {
    let mine: Vec<&Record> = records.iter().filter(|r| r.bench == table.bench).collect();
    if mine.is_empty() {
        return None;
    }
    let mut rows: Vec<&X> = Vec::new();
    for r in &mine {
        if !rows.contains(&&r.x) {
            rows.push(&r.x);
        }
    }
    let mut out = String::new();
    let _ = write!(out, "| {} |", table.row_heading);
    for (_, heading) in table.columns {
        let _ = write!(out, " {heading} |");
    }
    let _ = write!(out, "\n|---|{}\n", "---|".repeat(table.columns.len()));
    for x in rows {
        let label = match (x, table.rows) {
            (X::Num(v), Rows::Bytes) => bytes_label(*v),
            (X::Num(v), Rows::Plain) => format!("{v}"),
            (X::Label(s), _) => s.clone(),
        };
        let _ = write!(out, "| {label} |");
        for (case, _) in table.columns {
            // The last record wins, should a case be recorded twice.
            let cell = mine
                .iter()
                .rev()
                .find(|r| &r.x == x && r.case == *case)
                .map(|r| value_label(r.value, &r.unit))
                .unwrap_or_default();
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    Some(out)
}

fn bytes_label(v: f64) -> String {
    let v = v as u64;
    if v >= 1 << 20 && v.is_multiple_of(1 << 20) {
        format!("{} MiB", v >> 20)
    } else if v >= 1024 && v.is_multiple_of(1024) {
        format!("{} KiB", v >> 10)
    } else {
        format!("{v} B")
    }
}

fn value_label(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "failed".into();
    }
    match unit {
        "x" if v >= 100.0 => format!("{v:.0}x"),
        "x" if v >= 10.0 => format!("{v:.1}x"),
        "x" => format!("{v:.2}x"),
        "bytes" | "count" => thousands(v as u64),
        // A plain number whose meaning the column heading gives.
        "" => format!("{v:.1}"),
        _ if v >= 100.0 => format!("{v:.1} {unit}"),
        _ => format!("{v:.2} {unit}"),
    }
}

fn thousands(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

type Series = (&'static str, Vec<(f64, f64)>);

/// The points of each series, in x order; records with a label for x or
/// a failed value are left out.
fn plot_series(plot: &Plot, records: &[Record]) -> Vec<Series> {
    plot.series
        .iter()
        .map(|&(case, label)| {
            let mut points: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| r.bench == plot.bench && r.case == case && r.value > 0.0)
                .filter_map(|r| match r.x {
                    X::Num(x) if x > 0.0 => Some((x, r.value)),
                    _ => None,
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The last measurement of a point wins, as in the tables.
            points.reverse();
            points.dedup_by(|a, b| a.0 == b.0);
            points.reverse();
            (label, points)
        })
        .collect()
}

/// Colours that stay apart for the colour-blind (Okabe and Ito's).
const COLOURS: [plotters::style::RGBColor; 5] = [
    plotters::style::RGBColor(0x00, 0x72, 0xb2),
    plotters::style::RGBColor(0xd5, 0x5e, 0x00),
    plotters::style::RGBColor(0x00, 0x9e, 0x73),
    plotters::style::RGBColor(0xcc, 0x79, 0xa7),
    plotters::style::RGBColor(0x56, 0xb4, 0xe9),
];

/// Draws `series` on log-log axes: sizes and rates both span orders of
/// magnitude, and equal ratios should look equally far apart.
fn draw(path: &Path, plot: &Plot, series: &[Series], stamp: &Stamp) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let xs: Vec<f64> = {
        let mut xs: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| x)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs
    };
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (y_lo, y_hi) = (lo / 1.6, hi * 1.6);
    let (x_lo, x_hi) = (xs[0] / 1.4, xs[xs.len() - 1] * 1.4);

    let root = SVGBackend::new(path, (760, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mode = if stamp.quick { "quick run" } else { "full run" };
    let (main, foot) = root.split_vertically(415);
    foot.draw_text(
        &format!("cargo xtask bench ({mode}), {}, {}", stamp.date, stamp.machine),
        &("sans-serif", 12).into_font().color(&RGBColor(0x60, 0x60, 0x60)),
        (12, 6),
    )
    .map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&main)
        .caption(plot.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(xs.clone()),
            (y_lo..y_hi).log_scale().with_key_points(log_ticks(y_lo, y_hi)),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(plot.x_desc)
        .y_desc(plot.y_desc)
        .x_label_formatter(&|v| bytes_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, points)) in series.iter().enumerate() {
        if points.is_empty() {
            continue;
        }
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xaa, 0xaa, 0xaa))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// 1-2-5 ticks inside `lo..hi`, or 1-1.5-2-3-5-7 when that gives fewer
/// than three (a narrow range, such as the receive-buffer sweep).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let ticks = |mantissas: &[f64]| {
        let mut out = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            for m in mantissas {
                let t = m * decade;
                if t >= lo && t <= hi {
                    out.push(t);
                }
            }
            decade *= 10.0;
        }
        out
    };
    let coarse = ticks(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 3 { coarse } else { ticks(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]) }
}

fn tick_label(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_owned()
    }
}

/// Today's date (UTC), from the system clock: no date library for one
/// line of text.
fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// "2 CPUs, AMD EPYC ...": what a reader needs to compare runs.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_text_between_markers_changes() {
        let doc = "intro\n<!-- bench:echo -->\nold table\n<!-- /bench:echo -->\nafter\n";
        let records = vec![Record {
            bench: "echo".into(),
            case: "pier".into(),
            x: X::Num(65536.0),
            value: 12.84,
            unit: "Gbit/s".into(),
        }];
        let stamp = Stamp { quick: true, date: "2026-01-01".into(), machine: "m".into() };
        let (new, written) = update_doc(doc, &records, &stamp).unwrap();
        assert_eq!(written, ["echo"]);
        assert!(new.starts_with("intro\n<!-- bench:echo -->\n| write size |"));
        assert!(new.contains("| 64 KiB | 12.84 Gbit/s |  |  |"));
        assert!(new.ends_with("<!-- /bench:echo -->\nafter\n"));
        assert!(!new.contains("old table"));
    }
}
