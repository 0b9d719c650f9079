//! The async apps, `echo-async` and `msg-echo-async` (one task per peer
//! on pier-rt's executor instead of a hand-written poll loop), must
//! behave exactly as `echo` and `msg-echo` do: the same shared scenarios
//! and the same concurrent-client checks, under `pier run` and as
//! unikernels under `pier boot`.

mod common;

use common::{PierRun, image, scenarios, wasm};

const MIB: usize = 1 << 20;
const PORT: u32 = 1234;

fn run_async_echo() -> PierRun {
    let app = wasm("echo-async");
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1234"])
}

/// Fails the test if the app reported an error on its stderr.
fn assert_quiet(run: &PierRun) {
    assert!(!run.stderr().contains("echo-async:"), "the app reported:\n{}", run.stderr());
}

fn run_msg_echo_async() -> PierRun {
    let app = wasm("msg-echo-async");
    // It answers datagrams to their sender, so it may send to the host.
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1235", "--connect", "2:*"])
}

#[test]
fn echo_async_64_mib_with_half_close() {
    let run = run_async_echo();
    scenarios::echo_64_mib_with_half_close(&run, PORT);
    assert_quiet(&run);
}

#[test]
fn echo_async_serves_concurrent_clients() {
    let run = run_async_echo();
    scenarios::echo_serves_concurrent_clients(&run, PORT, 8, |i| 3 * MIB + i as usize * 1000);
    assert_quiet(&run);
}

/// Many short peers in waves: tasks finish and their slots (task and
/// reactor) are reused, and the server keeps answering.
#[test]
fn echo_async_serves_waves_of_short_clients() {
    let run = run_async_echo();
    for _wave in 0..5 {
        scenarios::echo_serves_concurrent_clients(&run, PORT, 64, |i| 1 + i as usize * 97);
    }
    assert_quiet(&run);
}

#[test]
fn echo_async_unikernel_64_mib_with_half_close() {
    let run = PierRun::boot(&image("echo-async"), &[]);
    scenarios::echo_64_mib_with_half_close(&run, PORT);
    assert_quiet(&run);
}

#[test]
fn echo_async_unikernel_serves_concurrent_clients() {
    let run = PierRun::boot(&image("echo-async"), &[]);
    scenarios::echo_serves_concurrent_clients(&run, PORT, 8, |i| 256 * 1024 + i as usize);
    assert_quiet(&run);
}

#[test]
fn msg_echo_async_keeps_boundaries_and_end_of_record() {
    let run = run_msg_echo_async();
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&run, 1235);
    assert_quiet(&run);
}

#[test]
fn msg_echo_async_datagrams_round_trip() {
    let run = run_msg_echo_async();
    scenarios::datagrams_round_trip(&run, 1235);
    assert_quiet(&run);
}

#[test]
fn msg_echo_async_unikernel_seqpacket_and_datagrams() {
    let run = PierRun::boot(&image("msg-echo-async"), &[]);
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&run, 1235);
    scenarios::datagrams_round_trip(&run, 1235);
}
