//! An app's abortive close: `set_linger(Some(0))` then drop resets the
//! connection (the peer cannot take the end for a clean one), in the
//! component under `pier run` and in the unikernel under `pier boot`, and
//! pier's counters show the RST.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{PierRun, image, wasm};

const PORT: u32 = 7300;

/// Connects, sends bytes the app never reads, and waits for the end: it
/// must come at once, as EOF or a reset, with nothing read.
fn connection_ends_at_once(run: &PierRun) {
    let mut conn = common::connect(&run.uds, PORT);
    let _ = conn.write_all(&[7u8; 64 * 1024]);
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let asked = Instant::now();
    let mut buf = [0u8; 16];
    match conn.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the reset connection answered {other:?}; stderr:\n{}", run.stderr()),
    }
    assert!(asked.elapsed() < Duration::from_secs(2), "the end took {:?}", asked.elapsed());
}

#[test]
fn a_component_s_linger_zero_close_is_a_reset() {
    let mut run = PierRun::start(&[
        "--stats",
        "--listen",
        &PORT.to_string(),
        wasm("probe").to_str().unwrap(),
        "--",
        "reset",
        &PORT.to_string(),
    ]);
    connection_ends_at_once(&run);
    assert_eq!(run.wait(Duration::from_secs(10)), 0, "{}", run.stderr());
    let stderr = run.stderr();
    assert!(stderr.contains("probe: reset the connection"), "{stderr}");
    assert!(
        stderr.contains("rst sent, aborted: 1"),
        "the component's stack counts its RST:\n{stderr}"
    );
}

#[test]
fn a_unikernel_s_linger_zero_close_is_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let mut run =
        PierRun::boot_with(&["--stats"], &uds, &image("probe"), &["reset", &PORT.to_string()]);
    connection_ends_at_once(&run);
    assert_eq!(run.wait(Duration::from_secs(10)), 0, "{}", run.stderr());
    let console =
        String::from_utf8_lossy(&run.read_stdout(None, Duration::from_secs(5))).into_owned();
    assert!(console.contains("probe: reset the connection"), "{console}");
    let stderr = run.stderr();
    // The guest resets once on close, and again for each of the host's data
    // packets that was already on its way: the count is at least one, and
    // how many more depends on timing.
    let resets = common::stats::counter(&stderr, "host stack", "rst received", "rst received");
    assert!(
        resets.is_some_and(|n| n >= 1),
        "the host stack counts the guest's RST (got {resets:?}):\n{stderr}"
    );
}
