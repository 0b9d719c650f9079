//! A non-blocking accept on an empty backlog, as an application sees it:
//! from a WebAssembly component through the shim's WIT `accept` (`pier
//! run`), and from a unikernel app into the stack in its image (`pier
//! boot`); each must return would-block at once. Beside them, in the same
//! run, the kernel's non-blocking `accept4` on an empty Unix listener,
//! the system call a host program pays for the same answer.
//!
//! The calls are timed inside the guest by `probe accept-cost`, so process
//! start and the host's side of the hybrid socket are not in the numbers.
//! `pier-stack`'s own bench (`stack/benches/accept.rs`) has the stack
//! alone.
//!
//! `cargo bench -p pier-cli --bench accept [-- --quick]`; with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records them.

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::Instant;

const PORT: &str = "7300";

/// Runs `pier ARGS -- accept-cost PORT CALLS` and returns the
/// nanoseconds per call the probe printed.
fn probe_ns(pier_args: &[&str], calls: u32) -> f64 {
    let calls = calls.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pier"))
        .args(pier_args)
        .args(["--", "accept-cost", PORT, &calls])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pier");
    let mut out = String::new();
    child.stdout.take().expect("piped").read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    let ns = out.lines().find_map(|l| {
        l.trim().strip_prefix("accept-cost ")?.strip_suffix(" ns")?.parse::<f64>().ok()
    });
    ns.unwrap_or_else(|| panic!("pier {pier_args:?} ({status}) printed no accept-cost: {out:?}"))
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let runs = if quick { 1 } else { 3 };
    let calls: u32 = if quick { 200_000 } else { 2_000_000 };
    let cache = pier_testkit::cache_dir("guest-target");
    let wasm = pier_testkit::build_guest_components(&cache, pier_testkit::Output::Show)
        .unwrap_or_else(|e| panic!("{e}"))
        .join("probe.wasm");
    let image = pier_testkit::build_guest_image(
        "probe",
        &pier_testkit::cache_dir("guest-image-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("accept.vsock");
    let uds = uds.to_str().unwrap();
    let best = |f: &dyn Fn() -> f64| (0..runs).map(|_| f()).fold(f64::MAX, f64::min);

    let shim =
        best(&|| probe_ns(&["run", wasm.to_str().unwrap(), "--uds", uds, "--listen", PORT], calls));
    let unikernel = best(&|| probe_ns(&["boot", image.to_str().unwrap(), "--uds", uds], calls));
    let listener = UnixListener::bind(dir.path().join("l.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    let unix = best(&|| {
        let kernel_calls = calls / 10;
        let started = Instant::now();
        for _ in 0..kernel_calls {
            let e = listener.accept().expect_err("nothing to accept");
            assert_eq!(e.kind(), ErrorKind::WouldBlock);
        }
        started.elapsed().as_secs_f64() * 1e9 / f64::from(kernel_calls)
    });

    println!("non-blocking accept on an empty backlog, from the app, best of {runs}\n");
    println!(
        "| | pier run (WIT accept) | pier boot (unikernel) | Unix listener (accept4) | Unix / WIT |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| per call | {shim:.1} ns | {unikernel:.1} ns | {unix:.1} ns | {:.1}x |",
        unix / shim
    );
    for (case, value, unit) in [
        ("shim", shim, "ns"),
        ("unikernel", unikernel, "ns"),
        ("unix", unix, "ns"),
        ("unix/shim", unix / shim, "x"),
    ] {
        rec.record("accept-app", case, "per call", value, unit);
    }
}
