//! WASI 0.3 components under `pier run`: `echo-p3` and `msg-echo-p3`,
//! built on `vsock:sockets@0.2.0` and exporting the async
//! `wasi:cli/run@0.3.0`, must pass the shared scenarios that `echo` and
//! `msg-echo` pass on 0.1.0.

mod common;

use common::{PierRun, scenarios, wasm};

const MIB: usize = 1 << 20;

fn run_echo_p3() -> PierRun {
    let app = wasm("echo-p3");
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1234"])
}

fn run_msg_echo_p3() -> PierRun {
    let app = wasm("msg-echo-p3");
    // It answers datagrams to their sender, so it may send to the host.
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1235", "--connect", "2:*"])
}

/// Fails the test if the app reported a failure on its stderr (each
/// connection's own report of how it ended is not one).
fn assert_no_failure(run: &PierRun, app: &str) {
    let stderr = run.stderr();
    let failures: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with(&format!("{app}:")))
        .filter(|l| !l.contains("listening on") && !l.contains("peer ended ok; send ok"))
        .collect();
    assert!(failures.is_empty(), "the app reported:\n{stderr}");
}

#[test]
fn a_wasi_0_3_echo_returns_64_mib_with_half_close() {
    let run = run_echo_p3();
    scenarios::echo_64_mib_with_half_close(&run, 1234);
    assert_no_failure(&run, "echo-p3");
}

#[test]
fn a_wasi_0_3_echo_serves_concurrent_clients() {
    let run = run_echo_p3();
    scenarios::echo_serves_concurrent_clients(&run, 1234, 8, |i| 3 * MIB + i as usize * 1000);
    assert_no_failure(&run, "echo-p3");
}

#[test]
fn a_wasi_0_3_msg_echo_keeps_boundaries_and_end_of_record() {
    let run = run_msg_echo_p3();
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&run, 1235);
    assert_no_failure(&run, "msg-echo-p3");
}

#[test]
fn a_wasi_0_3_msg_echo_returns_datagrams_to_their_sender() {
    let run = run_msg_echo_p3();
    scenarios::datagrams_round_trip(&run, 1235);
    assert_no_failure(&run, "msg-echo-p3");
}

// The same sources pier-rt serves on 0.1.0 (`echo`, `msg-echo`,
// `echo-async`), built with its `wasi-0-3` feature: their blocking, poll
// and async APIs on vsock:sockets@0.2.0 must pass the same scenarios.

/// Fails the test if the app wrote anything to stderr: these apps print
/// only their failures.
fn assert_quiet(run: &PierRun, app: &str) {
    let stderr = run.stderr();
    assert!(!stderr.contains(&format!("{app}:")), "the app reported:\n{stderr}");
}

fn run_pier_rt_app(app: &str, args: &[&str]) -> PierRun {
    let app = wasm(&format!("{app}-wasi-0-3"));
    let mut all = vec![app.to_str().unwrap()];
    all.extend_from_slice(args);
    PierRun::start(&all)
}

#[test]
fn pier_rt_echo_built_for_wasi_0_3_returns_64_mib_with_half_close() {
    let run = run_pier_rt_app("echo", &["--listen", "1234"]);
    scenarios::echo_64_mib_with_half_close(&run, 1234);
    assert_quiet(&run, "echo");
}

#[test]
fn pier_rt_echo_built_for_wasi_0_3_serves_concurrent_clients() {
    let run = run_pier_rt_app("echo", &["--listen", "1234"]);
    scenarios::echo_serves_concurrent_clients(&run, 1234, 8, |i| 3 * MIB + i as usize * 1000);
    assert_quiet(&run, "echo");
}

#[test]
fn pier_rt_echo_async_built_for_wasi_0_3_returns_64_mib_with_half_close() {
    let run = run_pier_rt_app("echo-async", &["--listen", "1234"]);
    scenarios::echo_64_mib_with_half_close(&run, 1234);
    assert_quiet(&run, "echo-async");
}

#[test]
fn pier_rt_echo_async_built_for_wasi_0_3_serves_waves_of_concurrent_clients() {
    let run = run_pier_rt_app("echo-async", &["--listen", "1234"]);
    scenarios::echo_serves_concurrent_clients(&run, 1234, 8, |i| 3 * MIB + i as usize * 1000);
    for _wave in 0..3 {
        scenarios::echo_serves_concurrent_clients(&run, 1234, 64, |i| 1 + i as usize * 97);
    }
    assert_quiet(&run, "echo-async");
}

#[test]
fn pier_rt_msg_echo_built_for_wasi_0_3_keeps_boundaries_and_end_of_record() {
    let run = run_pier_rt_app("msg-echo", &["--listen", "1235", "--connect", "2:*"]);
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&run, 1235);
    assert_quiet(&run, "msg-echo");
}

#[test]
fn pier_rt_msg_echo_built_for_wasi_0_3_returns_datagrams_to_their_sender() {
    let run = run_pier_rt_app("msg-echo", &["--listen", "1235", "--connect", "2:*"]);
    scenarios::datagrams_round_trip(&run, 1235);
    assert_quiet(&run, "msg-echo");
}
