//! A component's vsock resources through a real guest (the `probe` app):
//! the socket limit, grant denials as `access-denied`, and everything a
//! component held (sockets, host connections, descriptors) released when
//! it ends, while the shim and its other components carry on.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::path::Path;

use common::{Component, connect, eventually, listen};
use pier_shim::{
    ComponentStats, ConnectGrant, Grants, Monitor, Preopen, STOPPED_EXIT_CODE, Shim, ShimConfig,
    ShimOptions,
};

fn start(dir: &Path, components: &[&Component], options: ShimOptions) -> Shim {
    let config = ShimConfig {
        cid: 3,
        uds: dir.join("vm.vsock"),
        components: components.iter().map(|c| c.spec.clone()).collect(),
    };
    Shim::start_with(config, options).expect("starting the shim")
}

fn stats_of(monitor: &Monitor, name: &str) -> ComponentStats {
    let stats = monitor.stats().components.into_iter().find(|c| c.name == name);
    stats.unwrap_or_else(|| panic!("no component {name}"))
}

fn codes(named: &[(&str, i32)]) -> Vec<(String, i32)> {
    named.iter().map(|&(name, code)| (name.to_owned(), code)).collect()
}

/// This process's descriptors that refer to `path`.
fn descriptors_of(path: &Path) -> usize {
    let path = path.canonicalize().expect("canonical path");
    let fds = std::fs::read_dir("/proc/self/fd").expect("listing /proc/self/fd");
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok()).filter(|p| *p == path).count()
}

/// A host connection's end as the host sees it: end-of-file, or a reset.
fn assert_closed(conn: &mut impl Read) {
    let mut rest = Vec::new();
    match conn.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "more data after the end: {rest:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn creating_sockets_past_the_limit_fails_with_new_socket_limit() {
    let dir = tempfile::tempdir().unwrap();
    let greedy = Component::probe(dir.path(), "greedy", &["sockets"], Grants::none());
    let options = ShimOptions { socket_limit: 4, ..ShimOptions::default() };
    let shim = start(dir.path(), &[&greedy], options);
    let monitor = shim.monitor();
    assert_eq!(shim.wait().unwrap(), codes(&[("greedy", 1)]), "{}", greedy.said());
    let said = greedy.said();
    assert!(said.contains("opened 4 sockets, then: vsock: new-socket-limit"), "{said}");
    let stats = stats_of(&monitor, "greedy");
    assert_eq!(stats.sockets_opened, 4);
    assert_eq!(stats.socket_limit_refusals, 1);
    assert_eq!(stats.sockets_open, 0, "the sockets went with the component");
}

/// A listener at its component's limit cannot hand out the connection
/// waiting on it: the peer is refused rather than left queued, and the
/// component's `accept` says `new-socket-limit`.
#[test]
fn accepting_past_the_limit_refuses_the_waiting_peer() {
    let dir = tempfile::tempdir().unwrap();
    let hoard = Component::probe(dir.path(), "hoard", &["hoard", "6000"], listen(6000));
    let options = ShimOptions { socket_limit: 2, ..ShimOptions::default() };
    let shim = start(dir.path(), &[&hoard], options);
    let monitor = shim.monitor();
    // The listener and this connection: the limit.
    let mut first = connect(shim.uds(), 6000);
    let mut second = connect(shim.uds(), 6000);
    assert_closed(&mut second);
    assert_eq!(shim.wait().unwrap(), codes(&[("hoard", 1)]), "{}", hoard.said());
    let said = hoard.said();
    assert!(said.contains("probe: vsock: new-socket-limit"), "{said}");
    assert_closed(&mut first);
    // At least this one: an `accept` at the limit that found no peer
    // waiting yet counts as well.
    assert!(stats_of(&monitor, "hoard").socket_limit_refusals >= 1);
}

/// Each operation a grant covers, denied: the component sees
/// `access-denied`, the shim counts the denial; the granted one beside
/// them works.
#[test]
fn a_denied_bind_connect_or_send_is_access_denied() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let only_7001 = Grants { listen: vec![], connect: vec!["2:7001".parse().unwrap()] };
    let bind = Component::probe(d, "bind", &["listen", "4000"], Grants::none());
    let privileged = Component::probe(
        d,
        "privileged",
        &["listen", "80"],
        Grants { listen: vec![pier_shim::PortGrant::Any], connect: vec![ConnectGrant::ANY] },
    );
    let dial = Component::probe(d, "connect", &["connect", "2", "7000"], Grants::none());
    let send = Component::probe(d, "send", &["dgram-send", "2", "7000"], only_7001);
    let granted = Component::probe(d, "granted", &["listen", "4001"], listen(4001));
    let all = [&bind, &privileged, &dial, &send, &granted];
    let shim = start(d, &all, ShimOptions::default());
    let monitor = shim.monitor();
    let expected =
        codes(&[("bind", 1), ("privileged", 1), ("connect", 1), ("send", 1), ("granted", 0)]);
    assert_eq!(shim.wait().unwrap(), expected);
    for denied in &all[..4] {
        let said = denied.said();
        assert!(said.contains("probe: vsock: access-denied"), "{}: {said}", denied.spec.name);
        assert_eq!(stats_of(&monitor, &denied.spec.name).grant_denials, 1, "{}", denied.spec.name);
    }
    assert!(granted.said().contains("probe: listen ok"), "{}", granted.said());
    assert_eq!(stats_of(&monitor, "granted").grant_denials, 0);
}

/// A component that ends (here it traps mid-connection) leaves nothing
/// behind while the shim runs on: its sockets are closed and returned to
/// its quota, its host connection ends, and the descriptors of its
/// preopened directory and its stderr are closed.
#[test]
fn a_component_that_ends_releases_its_sockets_connections_and_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut trap = Component::probe(dir.path(), "trap", &["trap-echo", "5000", "4"], listen(5000));
    trap.spec.dirs = vec![Preopen { host: data.clone(), guest: "/data".into(), read_only: false }];
    let keeper = Component::probe(dir.path(), "keeper", &["hoard", "5001"], listen(5001));
    let own_stderr_fds = descriptors_of(&trap.stderr);
    let shim = start(dir.path(), &[&trap, &keeper], ShimOptions::default());
    let monitor = shim.monitor();

    let mut neighbour = connect(shim.uds(), 5001);
    let mut conn = connect(shim.uds(), 5000);
    // Each holds its listener and the connection it accepted.
    eventually("both accepted", || {
        stats_of(&monitor, "trap").sockets_open == 2
            && stats_of(&monitor, "keeper").sockets_open == 2
    });
    assert!(descriptors_of(&data) > 0, "the preopened directory is open while it runs");
    assert!(descriptors_of(&trap.stderr) > own_stderr_fds, "so is its own stderr");

    conn.write_all(b"ping").unwrap();
    let mut echoed = [0; 4];
    conn.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"ping");
    // Having echoed its 4 bytes, the component traps.
    assert_closed(&mut conn);
    eventually("the trapped component's sockets are released", || {
        stats_of(&monitor, "trap").sockets_open == 0
    });
    eventually("the trapped component's descriptors are closed", || {
        descriptors_of(&data) == 0 && descriptors_of(&trap.stderr) == own_stderr_fds
    });
    assert_eq!(stats_of(&monitor, "keeper").sockets_open, 2, "its neighbour keeps its sockets");
    neighbour.set_nonblocking(true).unwrap();
    let still_open = neighbour.read(&mut [0; 1]).map_err(|e| e.kind());
    assert_eq!(still_open, Err(ErrorKind::WouldBlock), "and its connection");
    neighbour.set_nonblocking(false).unwrap();

    shim.stopper().stop();
    let expected = codes(&[("trap", 134), ("keeper", STOPPED_EXIT_CODE)]);
    assert_eq!(shim.wait().unwrap(), expected, "{}", keeper.said());
    assert_closed(&mut neighbour);
    assert_eq!(stats_of(&monitor, "keeper").sockets_open, 0);
}

/// A component's memory limit stops it, as an OOM kill would, only when
/// it grows past the limit: the same allocation passes under a larger one.
#[test]
fn a_component_that_grows_past_its_memory_limit_ends_with_137() {
    let dir = tempfile::tempdir().unwrap();
    let mut cramped = Component::probe(dir.path(), "cramped", &["grow", "48"], Grants::none());
    cramped.spec.memory_limit = Some(32 << 20);
    let mut roomy = Component::probe(dir.path(), "roomy", &["grow", "48"], Grants::none());
    roomy.spec.memory_limit = Some(96 << 20);
    let shim = start(dir.path(), &[&cramped, &roomy], ShimOptions::default());
    assert_eq!(
        shim.wait().unwrap(),
        codes(&[("cramped", pier_shim::OUT_OF_MEMORY_EXIT_CODE), ("roomy", 0)]),
        "cramped: {}, roomy: {}",
        cramped.said(),
        roomy.said()
    );
}
