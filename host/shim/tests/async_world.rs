//! Components of the WASI 0.3 world: `vsock:sockets@0.2.0` served to a
//! component that exports the async `wasi:cli/run@0.3.0` (the `echo-p3`
//! app, written on the generated bindings).
//!
//! What these check is the async plumbing itself: the shim calls the
//! async `run` in wasmtime's event loop, `listen`'s stream hands over
//! connections, bytes move through `stream<u8>` both ways, the end of the
//! component's send stream is SHUT_WR, and the futures beside the streams
//! say how each side ended.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::path::Path;
use std::sync::Arc;

use common::{Component, connect, listen};
use pier_shim::{Shim, ShimConfig, ShimOptions};

/// Bytes waiting in a host socket's receive queue (FIONREAD).
fn queued(conn: &std::os::unix::net::UnixStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer.
    let rc = unsafe { libc::ioctl(conn.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

fn start(dir: &Path, component: &Component) -> Shim {
    let config =
        ShimConfig { cid: 3, uds: dir.join("vm.vsock"), components: vec![component.spec.clone()] };
    Shim::start_with(config, ShimOptions::default()).expect("starting the shim")
}

/// Byte `i` of the stream the host sends: not periodic in any buffer size
/// a layer might use, so a lost, repeated or reordered chunk shows.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7) ^ (i >> 13)) as u8
}

#[test]
fn a_0_2_0_component_echoes_64_mib_then_ends_its_side_after_the_peers_half_close() {
    const TOTAL: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let echo = Component::app(dir.path(), "echo-p3", "echo-p3", &["--port", "6200"], listen(6200));
    let shim = start(dir.path(), &echo);
    let mut conn = connect(shim.uds(), 6200);
    let mut writer = conn.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let chunk: Vec<u8> = (0..TOTAL).map(pattern).collect();
        for piece in chunk.chunks(48 * 1024 + 17) {
            writer.write_all(piece).unwrap();
        }
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::with_capacity(TOTAL);
    conn.read_to_end(&mut back).expect("reading the echo to its end");
    sender.join().unwrap();
    assert_eq!(back.len(), TOTAL, "echoed bytes");
    if let Some(i) = (0..TOTAL).find(|&i| back[i] != pattern(i)) {
        panic!("echoed byte {i} is {:#x}, sent {:#x}", back[i], pattern(i));
    }
    common::eventually("the component reports the connection", || {
        echo.said().contains("echo-p3: echoed")
    });
    let said = echo.said();
    assert!(said.contains("echo-p3: listening on 6200"), "{said}");
    assert!(
        said.contains(&format!("echo-p3: echoed {TOTAL} bytes; peer ended ok; send ok")),
        "{said}"
    );
    shim.stopper().stop();
    shim.wait().expect("stopping the shim");
}

#[test]
fn a_0_2_0_component_serves_clients_that_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let echo = Component::app(dir.path(), "echo-p3", "echo-p3", &["--port", "6201"], listen(6201));
    let shim = start(dir.path(), &echo);
    // Both connections are open at once, and the second is served while
    // the first still waits for its peer: one task per connection.
    let mut first = connect(shim.uds(), 6201);
    let mut second = connect(shim.uds(), 6201);
    for (conn, word) in [(&mut second, &b"second"[..]), (&mut first, &b"first"[..])] {
        conn.write_all(word).unwrap();
        let mut back = vec![0; word.len()];
        conn.read_exact(&mut back).unwrap();
        assert_eq!(back, word);
    }
    for conn in [&mut first, &mut second] {
        conn.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "bytes after the echo: {rest:?}");
    }
    common::eventually("both connections end", || {
        echo.said().matches("echo-p3: echoed").count() == 2
    });
    shim.stopper().stop();
    shim.wait().expect("stopping the shim");
}

#[test]
fn a_reset_from_the_peer_reaches_a_0_2_0_component_on_the_receive_future() {
    let dir = tempfile::tempdir().unwrap();
    let echo = Component::app(dir.path(), "echo-p3", "echo-p3", &["--port", "6202"], listen(6202));
    let shim = start(dir.path(), &echo);
    let mut conn = connect(shim.uds(), 6202);
    conn.write_all(b"left unread").unwrap();
    // Closing with the echo unread is how a host program resets a
    // connection: the bridge sees ECONNRESET and aborts the guest's side
    // with an RST rather than closing it in order.
    common::eventually("the echo waits unread", || queued(&conn) == b"left unread".len());
    drop(conn);
    common::eventually("the component sees the end", || echo.said().contains("echo-p3: echoed"));
    let said = echo.said();
    assert!(said.contains("echo-p3: echoed 11 bytes; peer ended connection-reset;"), "{said}");
    shim.stopper().stop();
    shim.wait().expect("stopping the shim");
}

#[test]
fn a_0_1_0_component_and_a_0_2_0_component_talk_over_the_shims_cid() {
    const BYTES: usize = 3 << 20;
    let dir = tempfile::tempdir().unwrap();
    let echo = Component::app(dir.path(), "echo-p3", "echo-p3", &["--port", "6210"], listen(6210));
    // The 0.1.0 probe sends its stdin to the 0.2.0 echo on CID 3, the
    // shim's own, half-closes, and copies the echo to its stdout.
    let input: Vec<u8> = (0..BYTES).map(pattern).collect();
    std::fs::write(dir.path().join("input"), &input).unwrap();
    let output = dir.path().join("output");
    let mut client = Component::probe(
        dir.path(),
        "probe",
        &["send", "3", "6210"],
        pier_shim::Grants { listen: vec![], connect: vec!["3:6210".parse().unwrap()] },
    );
    client.spec.stdio.stdin = Some(Arc::new(File::open(dir.path().join("input")).unwrap()));
    client.spec.stdio.stdout = Some(Arc::new(File::create(&output).unwrap()));
    let config = ShimConfig {
        cid: 3,
        uds: dir.path().join("vm.vsock"),
        components: vec![echo.spec.clone(), client.spec.clone()],
    };
    let shim = Shim::start_with(config, ShimOptions::default()).expect("starting the shim");
    common::eventually("the echo reports the probe's connection", || {
        echo.said().contains("echo-p3: echoed")
    });
    let said = echo.said();
    assert!(
        said.contains(&format!("echo-p3: echoed {BYTES} bytes; peer ended ok; send ok")),
        "{said}"
    );
    // The echo is done before the probe has read all of it back: stopping
    // now would stop the probe mid-read.
    common::eventually("the probe ends", || shim.has_ended("probe") == Some(true));
    shim.stopper().stop();
    let codes = shim.wait().expect("stopping the shim");
    assert!(codes.contains(&("probe".to_owned(), 0)), "{codes:?}\n{}", client.said());
    let echoed = std::fs::read(&output).unwrap();
    assert!(echoed == input, "the probe read {} bytes back, not the {BYTES} it sent", echoed.len());
}

#[test]
fn a_0_2_0_component_without_a_listen_grant_is_denied_its_bind() {
    let dir = tempfile::tempdir().unwrap();
    let no_grants = pier_shim::Grants { listen: vec![], connect: vec![] };
    let echo = Component::app(dir.path(), "echo-p3", "echo-p3", &["--port", "6211"], no_grants);
    let shim = start(dir.path(), &echo);
    let codes = shim.wait().expect("running the component");
    let said = echo.said();
    assert_eq!(codes, vec![("echo-p3".to_owned(), 1)], "{said}");
    assert!(said.contains("echo-p3: bind:") && said.contains("access-denied"), "{said}");
}
