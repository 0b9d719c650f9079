//! Creating and tearing down a bridge: socket files, bad settings, and
//! `Bridge::shutdown`.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::sync::mpsc;

use mio::Poll;
use pier_device::GuestCid;
use pier_device::bridge::{Bridge, BridgeConfig};
use pier_hybrid::paths::{backend_paths, datagram_path, seqpacket_path};
use pier_stack::{Config, Error, SocketType, Stack};

use crate::apps::{Dialer, Echo};
use crate::driver::{Harness, TIMEOUT};
use crate::host::{connect, read_to_end};

/// A bridge at `uds` for a fresh host stack, registered with `poll`.
fn bridge_at(uds: &std::path::Path, poll: &Poll) -> std::io::Result<Bridge> {
    let mut stack = Stack::new(Config::new(2));
    Bridge::new(BridgeConfig::new(uds, GuestCid::DEFAULT), &mut stack, poll.registry(), 0)
}

#[test]
fn stale_socket_files_are_replaced_and_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    // A crashed VMM leaves its socket files behind.
    for path in backend_paths(&uds) {
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
    }
    let poll = Poll::new().unwrap();
    let mut stack = Stack::new(Config::new(2));
    let bridge =
        Bridge::new(BridgeConfig::new(&uds, GuestCid::DEFAULT), &mut stack, poll.registry(), 0)
            .unwrap();
    assert_eq!(bridge.token_range(), 0..3 + 2 * 1024);
    std::os::unix::net::UnixStream::connect(&uds).expect("the new listener answers");
    drop(bridge);
    for path in backend_paths(&uds) {
        assert!(!path.exists(), "{} removed on drop", path.display());
    }
}

/// A second bridge on a path a live one answers on refuses to start
/// (rather than leave the first unreachable), and the first keeps its files.
#[test]
fn a_socket_path_a_live_process_answers_on_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let poll = Poll::new().unwrap();
    let first = bridge_at(&uds, &poll).unwrap();
    let err = bridge_at(&uds, &poll).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    for path in backend_paths(&uds) {
        assert!(path.exists(), "{} kept for the first bridge", path.display());
    }
    std::os::unix::net::UnixStream::connect(&uds).expect("the first bridge still answers");
    drop(first);
}

/// Only the datagram name is taken by a live process: the bridge refuses,
/// and removes the listeners it had already made.
#[test]
fn a_refused_start_leaves_no_files_behind() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let _live = std::os::unix::net::UnixDatagram::bind(datagram_path(&uds)).unwrap();
    let poll = Poll::new().unwrap();
    let err = bridge_at(&uds, &poll).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    assert!(!uds.exists() && !seqpacket_path(&uds).exists());
    assert!(datagram_path(&uds).exists(), "the live socket's file is not touched");
}

/// A bridge removes on drop only files that are still the ones it made:
/// a later bridge that took the names keeps its own.
#[test]
fn a_bridge_removes_only_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let poll = Poll::new().unwrap();
    let first = bridge_at(&uds, &poll).unwrap();
    for path in backend_paths(&uds) {
        std::fs::remove_file(path).unwrap();
    }
    let second = bridge_at(&uds, &poll).unwrap();
    drop(first);
    for path in backend_paths(&uds) {
        assert!(path.exists(), "{}: the second bridge's file survived", path.display());
    }
    std::os::unix::net::UnixStream::connect(&uds).expect("the second bridge answers");
    drop(second);
    assert!(!uds.exists());
}

#[test]
fn a_regular_file_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    std::fs::File::create(&uds).unwrap().write_all(b"precious").unwrap();
    let poll = Poll::new().unwrap();
    let mut stack = Stack::new(Config::new(2));
    let err =
        Bridge::new(BridgeConfig::new(&uds, GuestCid::DEFAULT), &mut stack, poll.registry(), 0)
            .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&uds).unwrap(), b"precious");
}

#[test]
fn bad_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let poll = Poll::new().unwrap();
    let mut stack = Stack::new(Config::new(2));
    let long = dir.path().join("x".repeat(100));
    let err =
        Bridge::new(BridgeConfig::new(long, GuestCid::DEFAULT), &mut stack, poll.registry(), 0);
    assert_eq!(err.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(stack.socket_count(), 0, "nothing left behind in the stack");
}

#[test]
fn shutdown_closes_connections_and_stops_taking_guest_connections() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let (mut s, _) = connect(h.uds(), 5000);
    assert_eq!(h.stats().active, 1);
    h.run(|w| w.bridge.shutdown(w.host, w.now));
    assert_eq!(read_to_end(&mut s), b"");
    assert_eq!(h.stats().active, 0);
    let _listener = crate::host::listen(h.uds(), 6000);
    let (tx, rx) = mpsc::channel();
    h.spawn(Dialer::new(SocketType::Stream, 6000, tx));
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap().0, Err(Error::ConnectionReset));
    assert_eq!(h.stats().guest_connections, 0);
}

#[test]
fn a_second_bridge_on_the_same_stack_is_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let poll = Poll::new().unwrap();
    let mut stack = Stack::new(Config::new(2));
    let first = dir.path().join("a.sock");
    let second = dir.path().join("b.sock");
    let _bridge =
        Bridge::new(BridgeConfig::new(&first, GuestCid::DEFAULT), &mut stack, poll.registry(), 0)
            .unwrap();
    let sockets = stack.socket_count();
    // The stack has one catch-all listener per type, and it is taken.
    let err = Bridge::new(
        BridgeConfig::new(&second, GuestCid::DEFAULT),
        &mut stack,
        poll.registry(),
        2000,
    );
    assert_eq!(err.unwrap_err().kind(), std::io::ErrorKind::Other);
    assert_eq!(stack.socket_count(), sockets, "the failed bridge left no socket in the stack");
    assert!(!second.exists(), "and no socket file");
    assert!(first.exists());
}
