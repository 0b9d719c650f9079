//! What the shim's tests share: the guest components (built once per test
//! process, from this checkout, the way `cargo xtask` builds them), a
//! component spec with its stderr in a file the test reads, and a host
//! connection through the hybrid vsock socket.
//!
//! A failed guest build fails the test with cargo's output: these tests
//! never skip.

#![allow(dead_code)]

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pier_client::HybridStream;
use pier_shim::{ComponentSpec, ComponentStdio, Grants};

/// The guest components, built once per process (installing the target
/// first if the toolchain lacks it, as `cargo xtask run` does).
// Not every test binary uses both.
#[allow(unused_imports)]
pub use pier_testkit::{built_guest_components as guest_dir, guest_component as wasm};

/// A component whose stderr goes to a file, so the test can read what
/// the component said about the host's answers.
pub struct Component {
    pub spec: ComponentSpec,
    pub stderr: PathBuf,
}

impl Component {
    /// The `probe` app running `args`, with `grants`, its stderr in `dir`.
    pub fn probe(dir: &Path, name: &str, args: &[&str], grants: Grants) -> Self {
        Self::app(dir, name, "probe", args, grants)
    }

    /// The guest app `app` running `args`, with `grants`, its stderr in
    /// `dir`.
    pub fn app(dir: &Path, name: &str, app: &str, args: &[&str], grants: Grants) -> Self {
        let stderr = dir.join(format!("{name}.stderr"));
        let file = File::create(&stderr).expect("creating the stderr file");
        let spec = ComponentSpec {
            name: name.to_owned(),
            wasm: wasm(app),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            grants,
            dirs: Vec::new(),
            stdio: ComponentStdio { stderr: Some(Arc::new(file)), ..ComponentStdio::default() },
            memory_limit: None,
        };
        Self { spec, stderr }
    }

    /// What the component wrote to stderr so far.
    pub fn said(&self) -> String {
        std::fs::read_to_string(&self.stderr).expect("reading the stderr file")
    }
}

/// Grants to listen on `port` only.
pub fn listen(port: u32) -> Grants {
    Grants { listen: vec![pier_shim::PortGrant::Port(port)], connect: Vec::new() }
}

/// A host connection to a component's `port`, retried while the component
/// is still starting.
pub fn connect(uds: &Path, port: u32) -> UnixStream {
    let attempt = || HybridStream::connect_timeout(uds, port, Duration::from_secs(10));
    let conn = pier_client::retry(Duration::from_secs(20), attempt)
        .unwrap_or_else(|e| panic!("port {port} behind {} never answered: {e}", uds.display()));
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.into_inner()
}

/// Waits until `done` holds, failing the test with `what` after 20 s: a
/// guard against a hang, not a measurement.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
