//! What `pier run` shows of itself: a pcap of the traffic through the
//! virtio device, read back with tshark; the logs of a denied bind and a
//! refused CONNECT at the default filter, and how `-q`, `-v` and
//! `RUST_LOG` change it; the counters `--stats` and SIGUSR1 print, with
//! the drops a test provoked; and bad capture settings as clear errors.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{PierRun, connect, pier, signal, wait_for_stderr, wasm};
use pier_client::{HybridDatagram, HybridStream};
use pier_device::testing::pcap::{Decoded, decode};

/// tshark, installed first when the machine lacks it.
fn tshark() -> std::path::PathBuf {
    pier_testkit::tools::ensure(pier_testkit::tools::TSHARK).unwrap_or_else(|e| panic!("{e}"))
}

const CONNECT: u16 = 1;
const DISCONNECT: u16 = 2;
const CONTROL: u16 = 3;
const PAYLOAD: u16 = 4;
// virtio ops
const REQUEST: u16 = 1;
const RESPONSE: u16 = 2;
const RST: u16 = 3;
const SHUTDOWN: u16 = 4;
const RW: u16 = 5;

/// Asks for a guest port nobody listens on: pier closes the socket
/// without `OK` once the guest's RST arrives.
fn refused_connect(uds: &Path, port: u32) {
    let refused = HybridStream::connect_timeout(uds, port, Duration::from_secs(10));
    let e = refused.expect_err("a refused CONNECT got OK");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
}

/// Stops `pier run` with SIGTERM and waits for it to exit.
fn stop(run: &mut PierRun) {
    signal(run, "TERM");
    assert_eq!(run.wait(Duration::from_secs(30)), 128 + 15, "{}", run.stderr());
}

/// The monitor op Linux's `virtio_transport_build_skb` gives a virtio op.
fn monitor_op(virtio_op: u16) -> u16 {
    match virtio_op {
        REQUEST | RESPONSE => CONNECT,
        RST | SHUTDOWN => DISCONNECT,
        RW => PAYLOAD,
        6 | 7 => CONTROL,
        _ => 0,
    }
}

/// The packets between host port `host` and guest port `guest`.
fn conversation(packets: &[Decoded], host: u32, guest: u32) -> Vec<Decoded> {
    let ours = |d: &&Decoded| {
        (d.src_cid, d.src_port, d.dst_cid, d.dst_port) == (2, host, 3, guest)
            || (d.src_cid, d.src_port, d.dst_cid, d.dst_port) == (3, guest, 2, host)
    };
    packets.iter().filter(ours).cloned().collect()
}

#[test]
fn pcap_of_an_echo_with_a_half_close_and_a_refused_connect_decodes_in_tshark() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("echo.pcap");
    let run = common::run_echo(&["--pcap", pcap.to_str().unwrap()]);
    check_echo_capture(run, &pcap);
}

/// The same capture from the echo unikernel under `pier boot --pcap`:
/// the device is the same, so is what tshark must see.
#[test]
fn pier_boot_captures_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("echo.pcap");
    let run = boot_echo(&dir.path().join("vm.vsock"), &["--pcap", pcap.to_str().unwrap()]);
    check_echo_capture(run, &pcap);
}

/// `pier boot` of the echo image on `uds`, with `options`.
fn boot_echo(uds: &Path, options: &[&str]) -> PierRun {
    let mut command = common::pier();
    command
        .arg("boot")
        .arg(common::image("echo"))
        .arg("--uds")
        .arg(uds)
        .args(options)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    PierRun::spawn_command(&mut command, uds)
}

/// An echo with a half-close and a refused connect through `run`, which
/// captures to `pcap`; then what tshark decodes of it.
fn check_echo_capture(mut run: PierRun, pcap: &std::path::Path) {
    // Serving: connects before this may have been refused, and are in the
    // capture too; the checks below look at their own connections only.
    drop(connect(&run.uds, 1234));
    refused_connect(&run.uds, 4321);
    let line = b"hello over vsock\n";
    let host_port = common::echo_with_half_close(&run.uds, 1234, line);
    // The host program has its EOF before the close handshake's last
    // packet (the RST) has crossed the device: wait until the capture
    // holds it, or a loaded machine stops pier first. The file is read
    // while pier writes it, so a decode that catches a record half
    // written is simply tried again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let ended = std::panic::catch_unwind(|| decode(&tshark(), pcap)).ok().is_some_and(|p| {
            conversation(&p, host_port, 1234).last().is_some_and(|d| d.virtio_op == RST)
        });
        if ended {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut run);

    let packets = decode(&tshark(), pcap);
    let stderr = run.stderr();
    let summary =
        format!("pier: capture {}: {} packets written, 0 dropped", pcap.display(), packets.len());
    assert!(stderr.contains(&summary), "expected {summary:?} in:\n{stderr}");
    for d in &packets {
        assert_eq!((d.transport, d.transport_len, d.virtio_type), (2, 44, 1), "{d:?}");
        assert_eq!(d.monitor_op, monitor_op(d.virtio_op), "{d:?}");
        assert_eq!(d.frame_len, 76 + d.virtio_len, "{d:?}");
        assert_eq!(d.payload.len() as u32, d.virtio_len, "{d:?}");
    }

    // The refusal: our REQUEST to guest port 4321, the guest's RST back.
    let refusal: Vec<&Decoded> =
        packets.iter().filter(|d| d.dst_port == 4321 || d.src_port == 4321).collect();
    assert_eq!(refusal.len(), 2, "{refusal:#?}");
    assert_eq!((refusal[0].src_cid, refusal[0].virtio_op), (2, REQUEST));
    assert_eq!((refusal[1].src_cid, refusal[1].virtio_op), (3, RST));
    assert_eq!(refusal[1].dst_port, refusal[0].src_port);
    assert_eq!(refusal[0].summary, "vSocket, Op: Connect, Transport: Virtio");
    assert_eq!(refusal[1].summary, "vSocket, Op: Disconnect, Transport: Virtio");

    // The echo: handshake, the line and our half-close, the line back and
    // the guest's close, then the RST that ends it.
    let echo = conversation(&packets, host_port, 1234);
    let ops: Vec<(u64, u16)> = echo.iter().map(|d| (d.src_cid, d.virtio_op)).collect();
    assert_eq!(ops[..2], [(2, REQUEST), (3, RESPONSE)], "{echo:#?}");
    assert_eq!(echo.last().unwrap().virtio_op, RST, "{echo:#?}");
    let sent: Vec<u8> =
        echo.iter().filter(|d| d.src_cid == 2).flat_map(|d| d.payload.clone()).collect();
    let back: Vec<u8> =
        echo.iter().filter(|d| d.src_cid == 3).flat_map(|d| d.payload.clone()).collect();
    assert_eq!((sent.as_slice(), back.as_slice()), (&line[..], &line[..]));
    let position =
        |cid: u64, op: u16| echo.iter().position(|d| d.src_cid == cid && d.virtio_op == op);
    let half_close = position(2, SHUTDOWN).expect("our SHUTDOWN");
    assert_eq!(echo[half_close].virtio_flags, 2, "SEND only: a half-close");
    assert!(position(2, RW).unwrap() < half_close, "the line goes out before the half-close");
    let guest_close = position(3, SHUTDOWN).expect("the guest's SHUTDOWN");
    assert!(position(3, RW).unwrap() < guest_close && half_close < guest_close, "{echo:#?}");
}

#[test]
fn a_denied_bind_logs_a_warning_naming_the_component() {
    let echo = wasm("echo");
    let mut run = PierRun::start(&[echo.to_str().unwrap()]);
    assert_eq!(run.wait(Duration::from_secs(30)), 1);
    let stderr = run.stderr();
    let warning = stderr
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning in:\n{stderr}"));
    assert!(warning.contains("echo: bind on port 1234 denied"), "{warning}");
    assert!(warning.contains("component=echo"), "{warning}");
}

#[test]
fn a_refused_connect_is_logged_and_stats_count_it_and_a_dropped_datagram() {
    let echo = wasm("echo");
    let mut run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234", "--stats"]);
    drop(connect(&run.uds, 1234));
    refused_connect(&run.uds, 4321);
    wait_for_stderr(&run, "CONNECT 4321 refused by the guest");
    // A datagram to a guest port nobody bound: the guest stack drops it.
    HybridDatagram::bind(&run.uds, 9000).unwrap().send_to(7777, b"nobody home").unwrap();

    // SIGUSR1 prints the counters while pier runs; ask until the
    // datagram has gone through.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let before = run.stderr().matches("pier: stats").count();
        signal(&run, "USR1");
        let printed = Instant::now() + Duration::from_secs(10);
        while run.stderr().matches("pier: stats").count() == before {
            assert!(Instant::now() < printed, "SIGUSR1 printed nothing:\n{}", run.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        if run.stderr().contains("dropped, datagram-no-socket: 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the drop never showed:\n{}", run.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(&mut run);

    let stderr = run.stderr();
    // The counters at exit, after the ones SIGUSR1 printed.
    let at_exit = &stderr[stderr.rfind("pier: stats").unwrap()..];
    assert!(at_exit.contains("dropped, datagram-no-socket: 1"), "{at_exit}");
    // Every refusal logged is counted, and the other way round: the
    // connects that raced the component's start were refused too.
    let refusals = stderr.matches("refused by the guest").count();
    assert!(refusals >= 1);
    assert!(at_exit.contains(&format!("guest-refused {refusals}")), "{refusals}:\n{at_exit}");
    for heading in
        ["device", "host stack (CID 2)", "bridge", "guest stack", "driver", "component echo"]
    {
        assert!(at_exit.lines().any(|l| l == heading), "no {heading:?} in:\n{at_exit}");
    }
}

#[test]
fn quiet_verbose_and_rust_log_change_what_is_logged() {
    let echo = wasm("echo");
    let echo = echo.to_str().unwrap();
    let refusal_logged = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec![echo, "--listen", "1234"];
        all.extend_from_slice(args);
        let mut run = PierRun::start_with_env(&all, env);
        drop(connect(&run.uds, 1234));
        refused_connect(&run.uds, 4321);
        stop(&mut run);
        let stderr = run.stderr();
        (
            stderr.contains("CONNECT 4321 refused"),
            stderr.contains("CONNECT 1234 accepted by the guest"),
        )
    };
    assert_eq!(refusal_logged(&[], &[]), (true, false), "info is shown, debug is not");
    assert_eq!(refusal_logged(&["-q"], &[]), (false, false), "-q shows warnings only");
    assert_eq!(refusal_logged(&["-v"], &[]), (true, true), "-v shows pier's debug output");
    let env = [("RUST_LOG", "pier_device=debug")];
    assert_eq!(refusal_logged(&["-q"], &env), (true, true), "RUST_LOG wins over -q");
}

#[test]
fn bad_capture_settings_are_errors() {
    let echo = wasm("echo");
    let echo = echo.to_str().unwrap();
    let out = pier()
        .args(["run", echo, "--listen", "1234", "--pcap", "/nonexistent-pier-dir/x.pcap"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot create /nonexistent-pier-dir/x.pcap"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("x.pcap");
    let pcap = pcap.to_str().unwrap();
    for args in [
        &["--pcap", pcap, "--pcap-snaplen", "75"][..],
        &["--pcap", pcap, "--pcap-snaplen", "262145"][..],
        &["--pcap-snaplen", "1000"][..],
    ] {
        let out = pier().args(["run", echo]).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--pcap"), "{args:?}: {stderr}");
    }
}

/// `pier boot --stats` and SIGUSR1: the device's counters for a VM, with
/// a refused CONNECT counted and logged, as under `pier run`.
#[test]
fn pier_boot_prints_the_device_counters() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = boot_echo(&dir.path().join("vm.vsock"), &["--stats"]);
    drop(connect(&run.uds, 1234));
    refused_connect(&run.uds, 4321);
    wait_for_stderr(&run, "CONNECT 4321 refused by the guest");
    signal(&run, "USR1");
    wait_for_stderr(&run, "pier: stats");
    stop(&mut run);
    let stderr = run.stderr();
    assert_eq!(stderr.matches("pier: stats").count(), 2, "SIGUSR1 and the exit:\n{stderr}");
    let at_exit = &stderr[stderr.rfind("pier: stats").unwrap()..];
    let refusals = stderr.matches("refused by the guest").count();
    assert!(at_exit.contains(&format!("guest-refused {refusals}")), "{refusals}:\n{at_exit}");
    for heading in ["device", "host stack (CID 2)", "bridge"] {
        assert!(at_exit.lines().any(|l| l == heading), "no {heading:?} in:\n{at_exit}");
    }
}
