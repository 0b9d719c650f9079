//! Hostile components: one that opens sockets without end, and one that
//! accepts connections and never reads them. Neither may make the shim
//! grow without bound; the first gets a clear `new-socket-limit`.

mod common;

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{PierRun, connect, wasm};
use pier_client::HybridStream;
use pier_shim::{ComponentSpec, ComponentStdio, Grants, PortGrant, Shim, ShimConfig};

#[test]
fn opening_sockets_without_end_hits_the_limit() {
    let probe = wasm("probe");
    let mut run = PierRun::start(&[probe.to_str().unwrap(), "--", "sockets"]);
    assert_eq!(run.wait(Duration::from_secs(30)), 1);
    let err = run.stderr();
    assert!(err.contains("opened 1024 sockets, then: vsock: new-socket-limit"), "{err}");

    let mut run =
        PierRun::start(&[probe.to_str().unwrap(), "--socket-limit", "16", "--", "sockets"]);
    assert_eq!(run.wait(Duration::from_secs(30)), 1);
    let err = run.stderr();
    assert!(err.contains("opened 16 sockets, then: vsock: new-socket-limit"), "{err}");
}

/// The limit is per component: two greedy components in one shim each get
/// their full share, and closing sockets gives them back (a component
/// that exits frees everything it held, or the second run would fail).
#[test]
fn the_limit_is_per_component() {
    let dir = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let config = format!(
        "[[component]]\nname = \"a\"\nwasm = \"{p}\"\nargs = [\"sockets\"]\n\
         [[component]]\nname = \"b\"\nwasm = \"{p}\"\nargs = [\"sockets\"]\n",
        p = probe.display()
    );
    let file = dir.path().join("pier.toml");
    std::fs::write(&file, config).unwrap();
    let mut run = PierRun::start(&["--config", file.to_str().unwrap()]);
    assert_eq!(run.wait(Duration::from_secs(30)), 1);
    let err = run.stderr();
    assert_eq!(
        err.matches("opened 1024 sockets, then: vsock: new-socket-limit").count(),
        2,
        "{err}"
    );
}

/// A listener at its limit refuses the connection it cannot take (the
/// host sees it closed) and the component learns why from `accept`.
#[test]
fn accepting_past_the_limit_is_refused() {
    let probe = wasm("probe");
    let mut run = PierRun::start(&[
        probe.to_str().unwrap(),
        "--listen",
        "4000",
        "--socket-limit",
        "4",
        "--",
        "hoard",
        "4000",
    ]);
    // The listener holds one socket; three connections fill the quota.
    let _kept: Vec<UnixStream> = (0..3).map(|_| connect(&run.uds, 4000)).collect();
    // The fourth is established by the stack, then refused by the shim:
    // closed right after OK, or before it if the shim exits first (the
    // component ends on the error).
    match HybridStream::connect_timeout(&run.uds, 4000, Duration::from_secs(10)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(mut extra) => {
            extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut extra, &mut rest);
            assert!(rest.is_empty(), "the connection past the limit carries nothing: {rest:?}");
        }
    }
    assert_eq!(run.wait(Duration::from_secs(30)), 1);
    assert!(run.stderr().contains("probe: vsock: new-socket-limit"), "{}", run.stderr());
}

/// Writes to every connection until none accepts a byte for a while;
/// returns the bytes each accepted. Panics if they never stop.
fn flood(conns: &mut [UnixStream], stall: Duration, limit: Duration) -> Vec<usize> {
    let chunk = vec![0x5a; 64 * 1024];
    let mut written = vec![0usize; conns.len()];
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < stall {
        assert!(start.elapsed() < limit, "writes never stopped: {written:?}");
        let mut progress = false;
        for (i, c) in conns.iter_mut().enumerate() {
            match c.write(&chunk) {
                Ok(n) => {
                    written[i] += n;
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("connection {i}: {e}"),
            }
        }
        if progress {
            last_progress = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    written
}

fn shim_with_hoarder(uds: &Path, app: &str) -> Shim {
    Shim::start(ShimConfig {
        cid: 3,
        uds: uds.to_owned(),
        components: vec![ComponentSpec {
            name: "hoarder".into(),
            wasm: wasm(app),
            args: vec!["hoard".into(), "4000".into()],
            env: Vec::new(),
            grants: Grants { listen: vec![PortGrant::Port(4000)], connect: vec![] },
            dirs: Vec::new(),
            stdio: ComponentStdio::default(),
            memory_limit: None,
        }],
    })
    .expect("starting the shim")
}

/// A component that never reads stops its peers' credit: host writers
/// stall, and the stack holds at most one receive buffer per connection,
/// however long they keep trying.
#[test]
fn a_component_that_never_reads_cannot_grow_the_shim() {
    a_never_reader_cannot_grow_the_shim("probe");
}

/// The same for a WASI 0.3 component: a `stream<u8>` it does not read
/// holds no more than the socket's buffer, since the shim takes bytes out
/// of the stack only as the component reads them.
#[test]
fn a_wasi_0_3_component_that_never_reads_cannot_grow_the_shim() {
    a_never_reader_cannot_grow_the_shim("probe-wasi-0-3");
}

fn a_never_reader_cannot_grow_the_shim(app: &str) {
    const CONNS: usize = 8;
    const BUFFER: usize = 256 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let shim = shim_with_hoarder(&uds, app);
    assert_eq!(shim.uds(), uds);
    let mut conns: Vec<UnixStream> = (0..CONNS).map(|_| connect(&uds, 4000)).collect();
    for c in &conns {
        c.set_nonblocking(true).unwrap();
    }
    let first = flood(&mut conns, Duration::from_millis(500), Duration::from_secs(30));
    let buffered = shim.buffered_bytes();
    eprintln!("accepted per connection: {first:?}; stack buffers: {buffered} bytes");
    assert!(
        buffered <= CONNS * BUFFER + 64 * 1024,
        "the stack holds {buffered} bytes for {CONNS} unread connections"
    );
    // What each writer got rid of: the guest's buffer, the host side's
    // credit-bounded queue and the kernel's socket buffers, nothing more.
    for (i, &n) in first.iter().enumerate() {
        assert!(n >= BUFFER / 2, "connection {i} moved only {n} bytes before stalling");
        assert!(n <= 4 << 20, "connection {i} got {n} bytes accepted");
    }
    // Keep pushing: nothing more is taken, nothing more is held.
    let more = flood(&mut conns, Duration::from_millis(300), Duration::from_secs(5));
    assert!(more.iter().all(|&n| n <= 64 * 1024), "stalled writers moved again: {more:?}");
    assert!(shim.buffered_bytes() <= buffered + 64 * 1024);
}

/// The same through `pier run`, measured from outside: the process's
/// resident memory barely moves while hosts push at a component that
/// never reads, and the process sleeps once they are stalled.
#[test]
fn the_shims_memory_and_cpu_stay_flat_under_a_never_reader() {
    let probe = wasm("probe");
    let run = PierRun::start(&[probe.to_str().unwrap(), "--listen", "4000", "--", "hoard", "4000"]);
    let mut conns: Vec<UnixStream> = (0..16).map(|_| connect(&run.uds, 4000)).collect();
    for c in &conns {
        c.set_nonblocking(true).unwrap();
    }
    let before = common::rss(run.pid());
    flood(&mut conns, Duration::from_millis(500), Duration::from_secs(30));
    let after = common::rss(run.pid());
    eprintln!("RSS before {before}, after {after}");
    // 16 receive buffers of 256 KiB on the guest side, as many on the
    // host side: 8 MiB at most, whatever the writers attempt.
    assert!(after.saturating_sub(before) < 24 << 20, "RSS grew from {before} to {after} bytes");
    let cpu = common::cpu_time(run.pid());
    flood(&mut conns, Duration::from_secs(1), Duration::from_secs(5));
    let used = common::cpu_time(run.pid()) - cpu;
    eprintln!("CPU while stalled: {used:?}");
    assert!(used < Duration::from_millis(300), "a stalled shim used {used:?} of CPU in 1 s");
}
