//! Capabilities deny by default: a component may bind, listen on and dial
//! only what its grants name, and anything else fails with the WIT's
//! `access-denied`, which the apps print on stderr before exiting 1.

mod common;

use std::time::Duration;

use common::{PierRun, wasm};

/// Runs a component to its end; returns (exit code, stderr).
fn run_to_end(args: &[&str]) -> (i32, String) {
    let mut run = PierRun::start(args);
    let code = run.wait(Duration::from_secs(30));
    (code, run.stderr())
}

fn probe(grants: &[&str], args: &[&str]) -> (i32, String) {
    probe_app("probe", grants, args)
}

/// `probe`, or its WASI 0.3 build (`probe-wasi-0-3`).
fn probe_app(app: &str, grants: &[&str], args: &[&str]) -> (i32, String) {
    let app = wasm(app);
    let mut all = vec![app.to_str().unwrap().to_owned()];
    all.extend(grants.iter().map(|s| s.to_string()));
    all.push("--".into());
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run_to_end(&all)
}

#[test]
fn listening_without_a_grant_is_denied() {
    let echo = wasm("echo");
    let (code, err) = run_to_end(&[echo.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("echo: vsock: access-denied"), "{err}");
    // A grant for another port does not help.
    let (code, err) = run_to_end(&[echo.to_str().unwrap(), "--listen", "1235"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("access-denied"), "{err}");
}

#[test]
fn connecting_without_a_grant_is_denied() {
    let app = wasm("send-file");
    let app = app.to_str().unwrap();
    for grants in [&[][..], &["--connect", "2:5001"][..], &["--connect", "3:*"][..]] {
        let mut args = vec![app];
        args.extend_from_slice(grants);
        args.extend_from_slice(&["--", "--port", "5000"]);
        let (code, err) = run_to_end(&args);
        assert_eq!(code, 1, "{grants:?}: {err}");
        assert!(err.contains("connect 2:5000: vsock: access-denied"), "{grants:?}: {err}");
    }
    // With the grant the connect goes out (and is refused: nobody listens).
    let (code, err) = run_to_end(&[app, "--connect", "*:5000", "--", "--port", "5000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("connection-refused"), "{err}");
}

/// Each operation's grant, through `app` (a build of `probe`).
fn each_operation_is_checked_for(app: &str) {
    let probe = |grants: &[&str], args: &[&str]| probe_app(app, grants, args);
    // Stream listen: granted port, wildcard, and the privileged-port rule.
    assert_eq!(probe(&["--listen", "4000"], &["listen", "4000"]).0, 0);
    assert_eq!(probe(&["--listen", "*"], &["listen", "4000"]).0, 0);
    let (code, err) = probe(&["--listen", "*"], &["listen", "80"]);
    assert_eq!(code, 1, "a wildcard does not cover a privileged port: {err}");
    assert!(err.contains("access-denied"), "{err}");
    assert_eq!(probe(&["--listen", "80"], &["listen", "80"]).0, 0, "a named one does");

    // Stream connect.
    let (code, err) = probe(&[], &["connect", "2", "7000"]);
    assert_eq!(code, 1);
    assert!(err.contains("access-denied"), "{err}");

    // Datagrams follow the connect grants.
    let (code, err) = probe(&[], &["dgram-send", "2", "7000"]);
    assert_eq!(code, 1);
    assert!(err.contains("access-denied"), "{err}");
    let (code, err) = probe(&["--connect", "2:7001"], &["dgram-send", "2", "7000"]);
    assert_eq!(code, 1);
    assert!(err.contains("access-denied"), "{err}");
    let (code, err) = probe(&["--connect", "2:7000"], &["dgram-send", "2", "7000"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("dgram-send ok"), "{err}");

    // With the grant a connect goes out, and nobody listens there.
    let (code, err) = probe(&["--connect", "2:7000"], &["connect", "2", "7000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("connection-refused"), "{err}");
}

#[test]
fn each_operation_is_checked() {
    each_operation_is_checked_for("probe");
}

/// Grants apply the same way to a component on vsock:sockets@0.2.0.
#[test]
fn each_operation_is_checked_for_a_wasi_0_3_component() {
    each_operation_is_checked_for("probe-wasi-0-3");
}

/// Bad grants are rejected by the command line, before anything runs.
#[test]
fn malformed_grants_are_usage_errors() {
    let echo = wasm("echo");
    for bad in
        [&["--listen", "12x"][..], &["--connect", "2-5000"][..], &["--listen", "4294967295"][..]]
    {
        let out = common::pier().arg("run").arg(&echo).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}

/// wasmtime-wasi's own TCP is off unless `--wasi-tcp` asks for it, and
/// then only on loopback addresses.
#[test]
fn wasi_tcp_is_off_by_default_and_loopback_only() {
    let (code, err) = probe(&[], &["tcp-listen", "127.0.0.1:0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("probe:"), "{err}");
    let (code, err) = probe(&["--wasi-tcp"], &["tcp-listen", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = probe(&["--wasi-tcp"], &["tcp-listen", "0.0.0.0:0"]);
    assert_eq!(code, 1, "not the wildcard address: {err}");

    // And it carries data: one echo over loopback TCP.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let app = wasm("probe");
    let port_arg = port.to_string();
    let mut run =
        PierRun::start(&[app.to_str().unwrap(), "--wasi-tcp", "--", "tcp-echo", &port_arg]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => break c,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}; stderr:\n{}", run.stderr()),
        }
    };
    use std::io::{Read, Write};
    conn.write_all(b"over tcp").unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"over tcp");
    assert_eq!(run.wait(Duration::from_secs(20)), 0, "{}", run.stderr());
}
