//! Stopping `pier run` with a signal: components stop whatever they are
//! doing (serving sockets, computing, sleeping in WASI), host connections
//! end, the socket files go, and the exit code says which signal it was.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{
    PierRun, connect, more_than_an_unread_stream_socket_holds, signal, wait_for_stderr, wasm,
};
use pier_client::HybridListener;

fn assert_sockets_removed(uds: &Path) {
    for p in pier_hybrid::paths::backend_paths(uds) {
        assert!(!p.exists(), "{} is left behind", p.display());
    }
}

#[test]
fn sigint_stops_a_serving_component_and_removes_the_sockets() {
    let echo = wasm("echo");
    let mut run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    let mut client = connect(&run.uds, 1234);
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    assert!(run.uds.exists());

    signal(&run, "INT");
    assert_eq!(run.wait(Duration::from_secs(10)), 130, "stderr:\n{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("pier: stopping (signal 2)"), "{err}");
    assert!(!err.contains("closing the endpoint"), "echo stopped within the grace: {err}");
    assert_sockets_removed(&run.uds);
    // The host program's connection ended; it is not left hanging.
    let mut rest = Vec::new();
    match client.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "nothing more was echoed"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn sigterm_stops_a_component_that_never_calls_the_host() {
    let probe = wasm("probe");
    let mut run =
        PierRun::start(&[probe.to_str().unwrap(), "--listen", "7000", "--", "spin", "7000"]);
    wait_for_stderr(&run, "probe: spinning");
    signal(&run, "TERM");
    assert_eq!(run.wait(Duration::from_secs(10)), 143, "stderr:\n{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("pier: stopping (signal 15)"), "{err}");
    assert!(!err.contains("closing the endpoint"), "the epoch stopped it, not the cut: {err}");
    assert_sockets_removed(&run.uds);
}

#[test]
fn a_component_asleep_in_wasi_is_cut_after_the_grace() {
    let probe = wasm("probe");
    let mut run =
        PierRun::start(&[probe.to_str().unwrap(), "--listen", "7001", "--", "sleep", "7001"]);
    wait_for_stderr(&run, "probe: sleeping");
    signal(&run, "INT");
    assert_eq!(run.wait(Duration::from_secs(20)), 130, "stderr:\n{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("components still running after 3 s; closing the endpoint"), "{err}");
    assert_sockets_removed(&run.uds);
}

/// A second `pier run` on a socket path that a running one answers on
/// refuses to start, before printing any hint; the first keeps serving and
/// still removes its own files when it stops.
#[test]
fn a_second_pier_on_a_live_socket_path_refuses_to_start() {
    let echo = wasm("echo");
    let mut first = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    let mut client = connect(&first.uds, 1234);
    // Killed when dropped, so a second pier that does start cannot hang
    // the test: `wait` fails it after the timeout instead.
    let mut second = PierRun::start_in(
        &first.uds,
        &[echo.to_str().unwrap(), "--listen", "1234"],
        Stdio::null(),
        Stdio::null(),
    );
    let code = second.wait(Duration::from_secs(10));
    let err = second.stderr();
    assert_eq!(code, 1, "stderr:\n{err}");
    assert!(err.contains("is in use"), "{err}");
    assert!(!err.contains("connect with"), "a failed start printed the hint: {err}");

    client.write_all(b"still here").unwrap();
    let mut got = [0u8; 10];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still here");
    drop(client);
    signal(&first, "TERM");
    assert_eq!(first.wait(Duration::from_secs(10)), 143, "stderr:\n{}", first.stderr());
    assert_sockets_removed(&first.uds);
}

/// Ctrl-C once every component has ended, while `pier run` waits for a
/// host program to read what a component wrote before it exited, ends
/// that wait at once: nothing is left to stop, so the user asked not to
/// wait. pier drops the unread bytes with a warning that says how many,
/// and exits with the component's code. Without the signal it waits for
/// the connection to close (8 s) and then for the program (5 s more).
#[test]
fn ctrl_c_after_the_components_ended_drops_what_a_program_has_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = HybridListener::bind(&uds, 5002).unwrap();
    let probe = wasm("probe");
    // The component's writes complete, it exits, and the rest waits in
    // the shim for a program that never reads.
    let total = more_than_an_unread_stream_socket_holds().to_string();
    let args = [probe.to_str().unwrap(), "--connect", "2:5002", "--", "blurt", "2", "5002", &total];
    let mut run = PierRun::start_in(&uds, &args, Stdio::null(), Stdio::null());
    listener.set_nonblocking(true).unwrap();
    let _conn = run.accept_from_guest(Duration::from_secs(60), || listener.accept());
    // Long enough for the component to write everything and exit.
    std::thread::sleep(Duration::from_secs(2));
    signal(&run, "INT");
    // Well short of the 8 s it would wait for the connection to close.
    assert_eq!(run.wait(Duration::from_secs(4)), 0, "stderr:\n{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("pier: stopping (signal 2); the components have ended"), "{err}");
    assert!(
        err.contains("bytes from the guest undelivered: the stop was made urgent"),
        "pier says what it dropped:\n{err}"
    );
    assert_sockets_removed(&uds);
}
