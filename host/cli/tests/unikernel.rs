//! The unikernel end to end: the same apps' source built for
//! x86_64-unknown-none, booted by `pier boot` in pier-vmm on KVM, with the
//! device model serving a real VM and the guest's pier-driver and
//! pier-stack running in ring 3.
//!
//! The stream, seqpacket and datagram checks are the very scenarios the
//! WASI tests run against `pier run` (`common::scenarios`): a host program
//! must not be able to tell the two targets apart. The rest are what only
//! a VM has: a guest that halts when idle, a timer interrupt that ends a
//! blocked wait, and code that runs in ring 3.
//!
//! These need `/dev/kvm`: where it is missing or not permitted they fail,
//! with pier's error naming it; they never skip.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use common::{PierRun, connect, image, scenarios};
use pier_client::HybridStream;

/// `pier boot` of an app's image, waiting until its `port` answers.
fn boot(app: &str, args: &[&str]) -> PierRun {
    PierRun::boot(&image(app), args)
}

/// Reads everything a connection sends until the guest closes it.
fn read_all(conn: &mut impl Read) -> String {
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn echo_64_mib_with_half_close() {
    let run = boot("echo", &[]);
    scenarios::echo_64_mib_with_half_close(&run, 1234);
}

#[test]
fn echo_serves_concurrent_clients() {
    let run = boot("echo", &[]);
    scenarios::echo_serves_concurrent_clients(&run, 1234, 8, |i| 256 * 1024 + i as usize);
}

/// A CONNECT to a port nobody in the guest listens on is answered by the
/// guest stack's RST, which the bridge turns into a closed connection:
/// quickly, not after the host's connect timeout.
#[test]
fn a_connect_to_a_dead_port_is_refused_within_500_ms() {
    let run = boot("echo", &[]);
    drop(connect(&run.uds, 1234));
    let asked = Instant::now();
    let refused = HybridStream::connect_timeout(&run.uds, 4321, Duration::from_secs(5));
    let took = asked.elapsed();
    let e = refused.expect_err("a dead port answered OK");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "closed without OK: {e}");
    assert!(took < Duration::from_millis(500), "the refusal took {took:?}");
}

#[test]
fn seqpacket_keeps_boundaries_and_end_of_record() {
    let run = boot("msg-echo", &[]);
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&run, 1235);
}

#[test]
fn datagrams_round_trip() {
    let run = boot("msg-echo", &[]);
    scenarios::datagrams_round_trip(&run, 1235);
}

/// The guest connects out: to a host program listening on `<uds>_5000`.
/// The answer crosses back and the guest prints it on its console.
#[test]
fn the_guest_connects_to_a_host_listener() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = UnixListener::bind(pier_hybrid::listener_path(&uds, 5000)).unwrap();
    let mut run = PierRun::boot_in(&uds, &image("probe"), &["send", "2", "5000"]);
    listener.set_nonblocking(true).unwrap();
    let (mut conn, _) = run.accept_from_guest(Duration::from_secs(60), || listener.accept());
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.write_all(b"hello from the host\n").unwrap();
    // The guest half-closes after sending its (empty) stdin.
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the guest sent no stdin, but {rest:?}");
    // The guest prints what it read until the host closes, then exits.
    drop(conn);
    let console = String::from_utf8_lossy(&run.read_stdout(None, Duration::from_secs(30)))
        .replace("\r\n", "\n");
    assert_eq!(
        run.wait(Duration::from_secs(10)),
        0,
        "stderr:\n{}\nconsole:\n{console}",
        run.stderr()
    );
    assert!(console.contains("hello from the host\n"), "console:\n{console}");
}

/// An idle guest halts: with echo waiting for input on a connected but
/// silent client, the VM uses at most 2 % of a host core over 2 s.
#[test]
fn an_idle_guest_costs_its_host_almost_nothing() {
    let run = boot("echo", &[]);
    let _conn = connect(&run.uds, 1234);
    thread::sleep(Duration::from_millis(300));
    let before = common::cpu_time(run.pid());
    thread::sleep(Duration::from_secs(2));
    let used = common::cpu_time(run.pid()) - before;
    assert!(used <= Duration::from_millis(40), "an idle guest used {used:?} of CPU in 2 s");
}

/// The app and its stack run in ring 3: the probe reads its code
/// segment's privilege level right after its socket calls, and sends it
/// over vsock.
#[test]
fn the_app_and_its_stack_run_in_ring_3() {
    let run = boot("probe", &["ring", "7000"]);
    let mut conn = connect(&run.uds, 7000);
    assert_eq!(read_all(&mut conn), "privilege level 3\n");
}

/// A timer interrupt ends a blocked wait: the probe waits 300 ms for a
/// silent connection to become readable, halted (no spinning: it costs
/// almost no CPU), and the timer wakes it on time.
#[test]
fn a_timer_fires_while_the_app_blocks_in_a_receive() {
    let run = boot("probe", &["quiet", "7001", "300"]);
    let mut conn = connect(&run.uds, 7001);
    let before = common::cpu_time(run.pid());
    let asked = Instant::now();
    let answer = read_all(&mut conn);
    let took = asked.elapsed();
    let used = common::cpu_time(run.pid()) - before;
    let waited: u64 = answer
        .strip_prefix("quiet for ")
        .and_then(|rest| rest.strip_suffix(" ms\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the probe answered {answer:?}"));
    assert!((300..600).contains(&waited), "the guest's clock says it waited {waited} ms");
    assert!(took >= Duration::from_millis(290), "the answer came after {took:?}");
    assert!(used < Duration::from_millis(100), "waiting used {used:?} of CPU");
}

/// An app that writes and exits at once still delivers every byte: the
/// unikernel's exit lets queued data leave before it ends the VM, as
/// Linux keeps sending a process's data after it exits.
///
/// The app writes 128 KiB (within the peer's credit, so it never waits)
/// 64 bytes at a time. Each write leaves as a packet of its own until all
/// eight tx buffers are in flight; the rest gathers in the guest's stack
/// faster than the device hands buffers back, so when the app returns
/// most of it is still there, and only the exit's drain sends it. Without
/// the drain, runs here delivered 512 bytes (the eight packets) in four
/// of five tries. The drain ends when the device has taken every packet,
/// but the host program reads concurrently, so its Unix socket may still
/// be full then: the device's stop must write what its host stack holds
/// (without that, 14 of 20 runs on one host lost 1.5–46 KiB). One large
/// write would not show it: the credit window
/// fits the tx buffers, so the write's own pump hands everything to the
/// device, which takes it before the VMM ends the VM.
#[test]
fn data_written_just_before_exit_still_arrives() {
    let dir = tempfile::tempdir().unwrap();
    blurt_to_a_reader(dir.path(), &[], 5001, 128 << 10, 64);
}

/// Boots probe's `blurt`, which writes `total` bytes to host port `port`
/// in writes of `chunk` and exits, with `flags` for `pier boot`; reads
/// everything as it comes, checks it, waits for pier to exit cleanly and
/// returns it.
fn blurt_to_a_reader(dir: &Path, flags: &[&str], port: u32, total: usize, chunk: usize) -> PierRun {
    let uds = dir.join("vm.vsock");
    let listener = UnixListener::bind(pier_hybrid::listener_path(&uds, port)).unwrap();
    let args = ["blurt", "2", &port.to_string(), &total.to_string(), &chunk.to_string()];
    let mut run = PierRun::boot_with(flags, &uds, &image("probe"), &args);
    listener.set_nonblocking(true).unwrap();
    let (mut conn, _) = run.accept_from_guest(Duration::from_secs(60), || listener.accept());
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), total, "stderr:\n{}", run.stderr());
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "the bytes are intact");
    assert_eq!(run.wait(Duration::from_secs(10)), 0, "stderr:\n{}", run.stderr());
    run
}

/// Guest bytes for a host program that reads them as they come leave
/// from guest memory itself: the bridge sends them from the guest's
/// transmit buffers into the program's Unix socket, with no copy of the
/// device's in between, and they arrive intact.
#[test]
fn guest_bytes_reach_a_host_program_straight_from_guest_memory() {
    let dir = tempfile::tempdir().unwrap();
    let total = 4usize << 20;
    let run = blurt_to_a_reader(dir.path(), &["--stats"], 5003, total, 64 << 10);
    let stderr = run.stderr();
    let at_exit = &stderr[stderr.rfind("pier: stats").expect("the counters at exit")..];
    let unstaged = common::stats::counter(at_exit, "device", "sent from guest memory", "memory:");
    // Bytes the program's socket had no room for wait in the host stack,
    // so not every byte need go this way; with a reader this quick, some
    // always do.
    assert!(
        unstaged.is_some_and(|n| n > 0 && n <= total as u64),
        "{unstaged:?} of {total} bytes sent from guest memory:\n{at_exit}"
    );
}

/// A `pier boot --stats` whose app writes `total` bytes to a host
/// listener and exits while the host program (the stream returned) reads
/// nothing: the bytes its Unix socket cannot take wait in the host stack,
/// and pier, its guest gone, waits for the program to read them.
fn exited_with_bytes_held_for_a_program(dir: &Path) -> (PierRun, UnixStream, usize) {
    let uds = dir.join("vm.vsock");
    let listener = UnixListener::bind(pier_hybrid::listener_path(&uds, 5002)).unwrap();
    // The app never waits for credit the host would only give once the
    // program reads.
    let total = common::more_than_an_unread_stream_socket_holds();
    let args = ["blurt", "2", "5002", &total.to_string(), "4096"];
    let mut run = PierRun::boot_with(&["--stats"], &uds, &image("probe"), &args);
    listener.set_nonblocking(true).unwrap();
    let (conn, _) = run.accept_from_guest(Duration::from_secs(60), || listener.accept());
    // Long enough for the app to write everything and exit (a few
    // milliseconds), well short of how long a stopping device waits for a
    // program that reads nothing (5 s).
    thread::sleep(Duration::from_secs(2));
    (run, conn, total)
}

/// `pier boot --stats` prints the device's last counters, with what the
/// stopping device still delivered to a program that read only once the
/// app had exited.
#[test]
fn the_counters_at_exit_count_the_bytes_a_stopping_device_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, mut conn, total) = exited_with_bytes_held_for_a_program(dir.path());
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), total, "stderr:\n{}", run.stderr());
    assert_eq!(run.wait(Duration::from_secs(10)), 0, "stderr:\n{}", run.stderr());
    let stderr = run.stderr();
    let from_guest = common::stats::counter(&stderr, "bridge", "bytes:", "from guest");
    assert_eq!(from_guest, Some(total as u64), "every byte counted:\n{stderr}");
}

/// Ctrl-C while pier waits for a host program to read the exited app's
/// last bytes ends that wait: the user asked twice, in effect, and pier
/// drops the bytes (saying how many) instead of waiting up to 5 s.
#[test]
fn ctrl_c_while_pier_waits_for_a_program_to_read_drops_the_bytes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, _conn, _) = exited_with_bytes_held_for_a_program(dir.path());
    common::signal(&run, "INT");
    // Without the signal pier would wait 3 s more.
    assert_eq!(run.wait(Duration::from_secs(2)), 0, "stderr:\n{}", run.stderr());
    let stderr = run.stderr();
    assert!(
        stderr.contains("bytes from the guest undelivered: the stop was made urgent"),
        "pier says what it dropped:\n{stderr}"
    );
}

/// A poll for writable ends after the app shut down writing, and the write
/// then fails, as under `pier run`: the stack's readiness is Linux's (no
/// WRITABLE once shut for sending), and pier-rt's reactor waits for the
/// calls that would not block.
#[test]
fn a_writable_poll_resolves_after_shutdown_and_the_write_fails() {
    let mut run = boot("probe", &["shut-wait", "7002"]);
    let mut conn = connect(&run.uds, 7002);
    assert_eq!(read_all(&mut conn), "", "data after the guest's shutdown");
    let console =
        String::from_utf8_lossy(&run.read_stdout(None, Duration::from_secs(30))).into_owned();
    assert_eq!(
        run.wait(Duration::from_secs(10)),
        0,
        "stderr:\n{}\nconsole:\n{console}",
        run.stderr()
    );
    assert!(
        console.contains("probe: writable after shutdown, write: BrokenPipe"),
        "console:\n{console}"
    );
}
