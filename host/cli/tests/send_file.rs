//! The guest-to-host direction: `send-file` dials host port 5000, which
//! the bridge maps to a Unix listener at `<uds>_5000`.

mod common;

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::Duration;

use common::{Fnv, PierRun, data, wasm};
use pier_client::HybridListener;

/// How long a component may take to connect out: it starts in well under
/// a second, but a machine busy compiling takes many times that.
const GUEST_CONNECTS: Duration = Duration::from_secs(60);

/// The file (stdin of the component) arrives intact; the component
/// half-closes, waits for our close, and exits 0.
#[test]
fn send_file_reaches_a_host_listener() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = HybridListener::bind(&uds, 5000).unwrap();
    let payload = data(5, 24 << 20);
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, &payload).unwrap();

    let app = wasm("send-file");
    let mut run = PierRun::start_in(
        &uds,
        &[app.to_str().unwrap(), "--connect", "2:5000", "--", "--port", "5000"],
        Stdio::from(std::fs::File::open(&file).unwrap()),
        Stdio::null(),
    );
    listener.set_nonblocking(true).unwrap();
    let mut conn = run.accept_from_guest(GUEST_CONNECTS, || listener.accept());
    assert_eq!(conn.local_port(), 5000, "the host port the guest dialled");
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::with_capacity(payload.len());
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), payload.len(), "stderr:\n{}", run.stderr());
    assert_eq!(Fnv::of(&got), Fnv::of(&payload), "the file arrives intact");
    // Answer something (send-file drains it), then close: it may exit now.
    conn.write_all(b"thanks").unwrap();
    drop(conn);
    let code = run.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "send-file exits 0 once we closed; stderr:\n{}", run.stderr());
}

/// `--file` reads through a preopened directory (`--dir HOST::GUEST`);
/// without the grant the component sees no filesystem and fails.
#[test]
fn send_file_reads_a_granted_directory() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = HybridListener::bind(&uds, 5000).unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let payload = data(9, 3 << 20);
    std::fs::write(data_dir.join("payload.bin"), &payload).unwrap();
    let app = wasm("send-file");
    let grant = format!("{}::/data", data_dir.display());

    let mut denied = PierRun::start_in(
        &uds,
        &[
            app.to_str().unwrap(),
            "--connect",
            "2:5000",
            "--",
            "--port",
            "5000",
            "--file",
            "/data/payload.bin",
        ],
        Stdio::null(),
        Stdio::null(),
    );
    assert_ne!(denied.wait(Duration::from_secs(20)), 0, "no directory was granted");

    let mut run = PierRun::start_in(
        &uds,
        &[
            app.to_str().unwrap(),
            "--connect",
            "2:5000",
            "--dir",
            &grant,
            "--",
            "--port",
            "5000",
            "--file",
            "/data/payload.bin",
        ],
        Stdio::null(),
        Stdio::null(),
    );
    listener.set_nonblocking(true).unwrap();
    let mut conn = run.accept_from_guest(GUEST_CONNECTS, || listener.accept());
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::with_capacity(payload.len());
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(
        Fnv::of(&got),
        Fnv::of(&payload),
        "the file arrives intact; stderr:\n{}",
        run.stderr()
    );
    drop(conn);
    assert_eq!(run.wait(Duration::from_secs(20)), 0, "stderr:\n{}", run.stderr());
}

/// Without a host listener the guest's connect is refused (an RST from the
/// bridge), not left to time out: the error is `connection-refused`, never
/// `timeout`.
#[test]
fn send_file_to_a_missing_host_listener_is_refused_fast() {
    let app = wasm("send-file");
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let mut run = PierRun::start_in(
        &uds,
        &[app.to_str().unwrap(), "--connect", "2:5001", "--", "--port", "5001"],
        Stdio::null(),
        Stdio::null(),
    );
    let code = run.wait(Duration::from_secs(20));
    assert_eq!(code, 1);
    assert!(run.stderr().contains("connection-refused"), "{}", run.stderr());
}

/// A component that writes and exits at once: `pier run` still delivers
/// every byte before it exits, as a process exiting on Linux would, even
/// though the host starts reading only after the component is gone.
#[test]
fn bytes_written_just_before_exit_still_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = HybridListener::bind(&uds, 5002).unwrap();
    let probe = wasm("probe");
    // Exactly the peer's credit: the writes complete at once, the
    // component exits, and most of the bytes are still inside the shim
    // (more than the host's socket buffer takes) while nobody reads.
    let bytes = 256 * 1024;
    let count = bytes.to_string();
    let mut run = PierRun::start_in(
        &uds,
        &[probe.to_str().unwrap(), "--connect", "2:5002", "--", "blurt", "2", "5002", &count],
        Stdio::null(),
        Stdio::null(),
    );
    listener.set_nonblocking(true).unwrap();
    let mut conn = run.accept_from_guest(GUEST_CONNECTS, || listener.accept());
    std::thread::sleep(Duration::from_millis(500));
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), bytes, "stderr:\n{}", run.stderr());
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "same pattern");
    drop(conn);
    assert_eq!(run.wait(Duration::from_secs(20)), 0, "{}", run.stderr());
}
