//! `echo` against `echo-async` under `pier run`: the same server written
//! as a hand-made poll loop and as one task per peer on pier-rt's async
//! executor, measured the same way (`common::echo`) in the same run,
//! one peer at a time and eight at once.
//!
//! `cargo bench -p pier-cli --bench async_echo [-- --quick]`.

use std::net::Shutdown;
use std::path::Path;
use std::time::Instant;

mod common;

use common::stream_echo::echo;
use common::{WRITE_SIZES, pier, retry, size_label, sweep_bytes, vsock_connect};

const PORT: u32 = 1234;
/// Peers of the concurrent case, each moving `total / PEERS` bytes.
const PEERS: u64 = 8;

/// One measurement: bytes per second through the echo at `uds`, moving
/// `total` bytes in `write`-byte writes.
type Case = fn(&Path, u64, usize) -> f64;

fn one_peer(uds: &Path, total: u64, write: usize) -> f64 {
    let s = retry(|| vsock_connect(uds, PORT));
    let r = s.try_clone().unwrap();
    echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), total, write)
}

/// Aggregate bytes per second of `PEERS` echoes at once.
fn many_peers(uds: &Path, total: u64, write: usize) -> f64 {
    let each = total / PEERS / write as u64 * write as u64;
    let started = Instant::now();
    let peers: Vec<_> = (0..PEERS)
        .map(|_| {
            let s = retry(|| vsock_connect(uds, PORT));
            let r = s.try_clone().unwrap();
            std::thread::spawn(move || {
                echo(s, r, |s| s.shutdown(Shutdown::Write).unwrap(), each, write)
            })
        })
        .collect();
    for p in peers {
        p.join().unwrap();
    }
    (each * PEERS) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let total: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let runs = if quick { 1 } else { 3 };
    let dir = pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::Show,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap();
    let apps = ["echo", "echo-async"].map(|app| {
        let wasm = dir.join(format!("{app}.wasm"));
        let uds = tmp.path().join(format!("{app}.vsock"));
        let child = pier(&[
            "run",
            wasm.to_str().unwrap(),
            "--uds",
            uds.to_str().unwrap(),
            "--listen",
            &PORT.to_string(),
        ]);
        (child, uds)
    });
    println!(
        "echo vs echo-async under pier run, up to {} MiB each way, best of {runs}\n",
        total >> 20
    );
    println!("| case | write size | echo | echo-async | async / echo |");
    println!("|---|---|---|---|---|");
    let cases: [(&str, Case); 2] = [("1 peer", one_peer), ("8 peers", many_peers)];
    for (name, case) in cases {
        for write in WRITE_SIZES {
            let total = sweep_bytes(total, write, quick);
            let mut best = [0f64; 2];
            for _ in 0..runs {
                // Interleaved, so drift on the shared host hits both.
                for (i, (_, uds)) in apps.iter().enumerate() {
                    best[i] = best[i].max(case(uds, total, write));
                }
            }
            println!(
                "| {name} | {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
                size_label(write),
                best[0] * 8.0 / 1e9,
                best[1] * 8.0 / 1e9,
                best[1] / best[0]
            );
        }
    }
}
