//! Stream sockets end to end: a host program, the hybrid vsock socket,
//! the bridge, the device, the driver, the guest stack, the shim's
//! `wasi:io` streams and the `echo` component, and all the way back.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::{PierRun, connect, data, scenarios, wasm};
use pier_client::HybridStream;

const MIB: usize = 1 << 20;

/// 64 MiB through `echo`, checked with a hash; the client half-closes and
/// must get every byte back, then end-of-file.
#[test]
fn echo_64_mib_with_half_close() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    scenarios::echo_64_mib_with_half_close(&run, 1234);
}

/// Several clients at once, each with its own data, all echoed intact:
/// one component thread serves them through one poll loop.
#[test]
fn echo_serves_concurrent_clients() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    scenarios::echo_serves_concurrent_clients(&run, 1234, 8, |i| 3 * MIB + i as usize * 1000);
}

/// A burst of a thousand clients at once, each trying exactly once: every
/// one is answered `OK` and gets its own bytes back. Linux refuses a vsock
/// connection whose listener's backlog is full (no retry, unlike a TCP
/// SYN), so this holds only because the backlogs follow Linux's defaults
/// (somaxconn, 4096, for pier-rt's listeners and the bridge's Unix
/// listener) and echo accepts eagerly (up to the default socket limit).
#[test]
fn echo_serves_a_burst_of_a_thousand_clients_without_refusing_any() {
    const CLIENTS: usize = 1000;
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234", "--stats"]);
    // Echo is up once one connection is answered; then the burst starts.
    drop(connect(&run.uds, 1234));
    let start = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|i| {
            let (uds, start) = (run.uds.clone(), start.clone());
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || -> Result<bool, String> {
                    let payload = data(5000 + i, 4096 + i as usize);
                    start.wait();
                    let mut conn =
                        HybridStream::connect_timeout(&uds, 1234, Duration::from_secs(60))
                            .map_err(|e| format!("connect: {e}"))?;
                    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    conn.write_all(&payload).map_err(|e| format!("payload: {e}"))?;
                    conn.shutdown(Shutdown::Write).unwrap();
                    let mut back = Vec::new();
                    conn.read_to_end(&mut back).map_err(|e| format!("echo: {e}"))?;
                    Ok(back == payload)
                })
                .unwrap()
        })
        .collect();
    let results: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let failures: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let intact = results.iter().filter(|r| matches!(r, Ok(true))).count();
    if !failures.is_empty() {
        // The counters say which rule closed them (`--stats`, on SIGUSR1).
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(run.pid() as i32, libc::SIGUSR1) };
        thread::sleep(Duration::from_millis(500));
    }
    assert!(
        failures.is_empty(),
        "{} of {CLIENTS} failed, first: {:?}; stderr:\n{}",
        failures.len(),
        failures.first(),
        run.stderr()
    );
    assert_eq!(intact, CLIENTS, "every client got its own bytes back");
    // Memory follows what is live: within 3 s of the burst's last close,
    // the process is back under 100 MiB (it was 27 MB before the burst).
    thread::sleep(Duration::from_secs(3));
    let rss = common::rss(run.pid());
    eprintln!("resident after the burst: {} MiB", rss >> 20);
    assert!(rss < 100 << 20, "{} MiB resident after the burst", rss >> 20);
}

/// `pier connect` relays stdin to the guest and the guest to stdout, and
/// turns the end of stdin into a half-close, so it exits by itself once
/// the echo is complete.
#[test]
fn pier_connect_relays_with_half_close() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    // Wait until the echo answers before handing over to the CLI.
    drop(connect(&run.uds, 1234));
    let input = data(7, 5 * MIB);
    let mut child = common::pier()
        .arg("connect")
        .arg(&run.uds)
        .arg("1234")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feed = {
        let input = input.clone();
        thread::spawn(move || stdin.write_all(&input).unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    feed.join().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "pier connect did not exit");
        thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "pier connect failed: {status}\n{err}");
    assert!(out == input, "pier connect printed {} bytes, sent {}", out.len(), input.len());
}

/// `pier connect` to a port nobody listens on fails with a clear error.
#[test]
fn pier_connect_reports_a_refusal() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    drop(connect(&run.uds, 1234));
    let out = common::pier()
        .arg("connect")
        .arg(&run.uds)
        .arg("4321")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("closed before OK"), "{err}");
}

/// An idle shim sleeps: with the echo waiting in `wasi:io/poll` and a
/// connected but silent client, the process uses (almost) no CPU.
#[test]
fn an_idle_shim_does_not_spin() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    let _conn = connect(&run.uds, 1234);
    thread::sleep(Duration::from_millis(300));
    let before = common::cpu_time(run.pid());
    thread::sleep(Duration::from_secs(2));
    let used = common::cpu_time(run.pid()) - before;
    eprintln!("CPU while idle: {used:?}");
    assert!(used < Duration::from_millis(200), "an idle shim used {used:?} of CPU in 2 s");
}
