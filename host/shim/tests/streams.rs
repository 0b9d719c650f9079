//! A component's stream through a real guest (the `probe` app): what its
//! `wasi:io` streams report where that differs from Linux's poll.
//!
//! The stack's readiness is Linux's `vsock_poll`, which has no POLLOUT for
//! a socket shut down for sending. A `wasi:io` output stream's pollable
//! must still resolve then (the next `check-write` reports the stream
//! closed), so the shim waits for the calls that would not block rather
//! than for Linux's mask. Without that, a component that polls its output
//! stream after `shutdown` would hang.

mod common;

use std::io::Read;
use std::path::Path;

use common::{Component, connect, listen};
use pier_shim::{Shim, ShimConfig, ShimOptions};

fn start(dir: &Path, component: &Component) -> Shim {
    let config =
        ShimConfig { cid: 3, uds: dir.join("vm.vsock"), components: vec![component.spec.clone()] };
    Shim::start_with(config, ShimOptions::default()).expect("starting the shim")
}

#[test]
fn an_output_stream_pollable_resolves_after_shutdown_and_the_write_fails() {
    let dir = tempfile::tempdir().unwrap();
    let probe = Component::probe(dir.path(), "shut-wait", &["shut-wait", "6100"], listen(6100));
    let shim = start(dir.path(), &probe);
    let mut conn = connect(shim.uds(), 6100);
    // The component shut down writing: the host reads the end, nothing else.
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).expect("reading to the end");
    assert!(rest.is_empty(), "data after the component's shutdown: {rest:?}");
    let codes = shim.wait().unwrap();
    let said = probe.said();
    assert_eq!(codes, vec![("shut-wait".to_owned(), 0)], "{said}");
    assert!(said.contains("probe: writable after shutdown, write: BrokenPipe"), "{said}");
}
