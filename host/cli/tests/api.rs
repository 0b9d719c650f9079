//! The `pier_shim` API and the CLI's error paths: bad input is an error
//! with context, never a panic, and `Shim::wait` reports every exit code.

mod common;

use std::path::PathBuf;

use common::wasm;
use pier_shim::{
    ComponentSpec, ComponentStdio, Grants, PortGrant, STOPPED_EXIT_CODE, Shim, ShimConfig,
};

fn spec(name: &str, wasm: PathBuf, args: &[&str], grants: Grants) -> ComponentSpec {
    ComponentSpec {
        name: name.into(),
        wasm,
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        grants,
        dirs: Vec::new(),
        stdio: ComponentStdio::default(),
        memory_limit: None,
    }
}

#[test]
fn wait_returns_each_components_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let shim = Shim::start(ShimConfig {
        cid: 3,
        uds: dir.path().join("vm.vsock"),
        components: vec![
            spec(
                "granted",
                probe.clone(),
                &["listen", "4000"],
                Grants { listen: vec![PortGrant::Port(4000)], connect: vec![] },
            ),
            spec("denied", probe.clone(), &["listen", "4001"], Grants::none()),
            spec("usage", probe, &["no-such-mode"], Grants::none()),
        ],
    })
    .unwrap();
    assert_eq!(shim.cid(), 3);
    let codes = shim.wait().unwrap();
    assert_eq!(
        codes,
        vec![("granted".to_owned(), 0), ("denied".to_owned(), 1), ("usage".to_owned(), 1)]
    );
}

/// `Stopper::stop` ends a component that computes forever and one that
/// waits in `accept`; each reports `STOPPED_EXIT_CODE`, and a component
/// that already ended keeps its own code.
#[test]
fn a_stopper_ends_running_and_waiting_components() {
    let dir = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let listen = |port| Grants { listen: vec![PortGrant::Port(port)], connect: vec![] };
    let shim = Shim::start(ShimConfig {
        cid: 3,
        uds: dir.path().join("vm.vsock"),
        components: vec![
            spec("spin", probe.clone(), &["spin", "4100"], listen(4100)),
            spec("hoard", probe.clone(), &["hoard", "4101"], listen(4101)),
            spec("done", probe, &["listen", "4102"], listen(4102)),
        ],
    })
    .unwrap();
    // Let the first two get to their loops (the third ends at once).
    std::thread::sleep(std::time::Duration::from_millis(500));
    shim.stopper().stop();
    let codes = shim.wait().unwrap();
    assert_eq!(
        codes,
        vec![
            ("spin".to_owned(), STOPPED_EXIT_CODE),
            ("hoard".to_owned(), STOPPED_EXIT_CODE),
            ("done".to_owned(), 0)
        ]
    );
}

#[test]
fn bad_configurations_are_errors_with_context() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let config = |cid, components| ShimConfig { cid, uds: uds.clone(), components };
    let echo = || vec![spec("echo", wasm("echo"), &[], Grants::none())];

    let err = Shim::start(config(2, echo())).unwrap_err();
    assert!(format!("{err:#}").contains("reserved"), "{err:#}");
    let err = Shim::start(config(3, vec![])).unwrap_err();
    assert!(format!("{err:#}").contains("no components"), "{err:#}");

    let missing = dir.path().join("missing.wasm");
    let err =
        Shim::start(config(3, vec![spec("m", missing.clone(), &[], Grants::none())])).unwrap_err();
    assert!(format!("{err:#}").contains(missing.to_str().unwrap()), "{err:#}");

    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not a component").unwrap();
    let err = Shim::start(config(3, vec![spec("j", junk, &[], Grants::none())])).unwrap_err();
    assert!(format!("{err:#}").contains("junk.wasm"), "{err:#}");

    let nowhere =
        ShimConfig { cid: 3, uds: dir.path().join("no/such/dir/vm.vsock"), components: echo() };
    let err = Shim::start(nowhere).unwrap_err();
    assert!(format!("{err:#}").contains("no/such/dir"), "{err:#}");
}

#[test]
fn the_cli_reports_errors_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::pier()
        .args(["run", "--uds"])
        .arg(dir.path().join("vm.vsock"))
        .arg(dir.path().join("missing.wasm"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pier: starting the shim: loading component"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[component]]\nwasm = \"x.wasm\"\nlisten = [\"nope\"]\n").unwrap();
    let out = common::pier().args(["run", "--config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("nope"), "{err}");

    let out = common::pier().args(["connect"]).arg(dir.path().join("none")).arg("1").output();
    let out = out.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to"));
}
