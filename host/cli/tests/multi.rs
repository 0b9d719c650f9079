//! Several components in one shim: they share the CID, each keeps its own
//! grants, and they reach each other over the local CID (1) or the shim's
//! own CID, which the stack delivers internally.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{Fnv, PierRun, data, wasm};

/// Writes `config` next to `uds`, feeds `input` as stdin, returns the run.
fn run_config(dir: &tempfile::TempDir, config: &str, input: &[u8]) -> PierRun {
    let file = dir.path().join("pier.toml");
    std::fs::write(&file, config).unwrap();
    let stdin = dir.path().join("stdin.bin");
    std::fs::write(&stdin, input).unwrap();
    let uds = dir.path().join("vm.vsock");
    PierRun::start_in(
        &uds,
        &["--config", file.to_str().unwrap()],
        Stdio::from(std::fs::File::open(&stdin).unwrap()),
        Stdio::piped(),
    )
}

/// `echo` and a client on the local CID 1: the client's data goes through
/// the echo and back, and a third component without grants is refused
/// the very connect the client was allowed.
#[test]
fn components_talk_over_the_local_cid() {
    let dir = tempfile::tempdir().unwrap();
    let (echo, probe) = (wasm("echo"), wasm("probe"));
    let config = format!(
        r#"
        [[component]]
        name = "echo"
        wasm = "{echo}"
        listen = ["1234"]

        [[component]]
        name = "client"
        wasm = "{probe}"
        args = ["send", "1", "1234"]
        connect = ["1:1234"]

        [[component]]
        name = "stranger"
        wasm = "{probe}"
        args = ["connect", "1", "1234"]
        "#,
        echo = echo.display(),
        probe = probe.display(),
    );
    let input = data(11, 6 << 20);
    let mut run = run_config(&dir, &config, &input);
    let out = run.read_stdout(Some(input.len()), Duration::from_secs(60));
    assert_eq!(Fnv::of(&out), Fnv::of(&input), "the echo came back intact");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !run.stderr().contains("access-denied") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = run.stderr();
    assert!(err.contains("probe: vsock: access-denied"), "the stranger is refused: {err}");
    assert!(!err.contains("echo:"), "{err}");
}

/// A sink and a sender on the shim's own CID (here 7): both finish, so
/// the shim exits 0 by itself, and the sink printed exactly what the
/// sender read from stdin.
#[test]
fn components_talk_over_the_shims_own_cid() {
    let dir = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let config = format!(
        r#"
        cid = 7

        [[component]]
        name = "sink"
        wasm = "{probe}"
        args = ["sink", "4000"]
        listen = ["4000"]

        [[component]]
        name = "sender"
        wasm = "{probe}"
        args = ["send", "7", "4000"]
        connect = ["7:4000"]
        "#,
        probe = probe.display(),
    );
    let input = data(12, 3 << 20);
    let mut run = run_config(&dir, &config, &input);
    let out = run.read_stdout(None, Duration::from_secs(60));
    let code = run.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "stderr:\n{}", run.stderr());
    assert!(run.stderr().contains("guest CID 7"), "{}", run.stderr());
    assert_eq!(out.len(), input.len());
    assert_eq!(Fnv::of(&out), Fnv::of(&input));
}

/// The exit code of a config run is the first non-zero component code.
#[test]
fn a_config_run_exits_with_the_first_failure() {
    let dir = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let config = format!(
        r#"
        [[component]]
        wasm = "{probe}"
        args = ["listen", "4000"]
        listen = ["4000"]

        [[component]]
        wasm = "{probe}"
        args = ["listen", "4001"]
        "#,
        probe = probe.display(),
    );
    let mut run = run_config(&dir, &config, b"");
    assert_eq!(run.wait(Duration::from_secs(30)), 1, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("listen ok") && err.contains("access-denied"), "{err}");
}
