//! `pier run` at its limits: the bridge's connection cap
//! (`BridgeConfig::max_connections`, 1,024) and a process out of file
//! descriptors (EMFILE). At either, pier must refuse what it cannot take,
//! stay idle while nothing moves (no busy loop on a listener it cannot
//! accept from), and serve new connections once room comes back.

mod common;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::{PierRun, connect, data, wasm};

/// The bridge's default `max_connections`.
const CAP: usize = 1024;

/// CPU pier may use over an idle second: a tenth of a core is far above
/// an idle loop (a few timer ticks) and far below a spin (the whole second).
const IDLE_CPU: Duration = Duration::from_millis(100);

/// Echoes a few KiB through `conn` and checks them.
fn round_trip(conn: &mut UnixStream, seed: u64) {
    let payload = data(seed, 4096);
    conn.write_all(&payload).unwrap();
    let mut back = vec![0; payload.len()];
    conn.read_exact(&mut back).unwrap();
    assert!(back == payload, "echo differs");
}

/// CPU pier uses over one second of nothing happening.
fn idle_cpu(pid: u32) -> Duration {
    // Let whatever the last step started finish first.
    thread::sleep(Duration::from_millis(300));
    let before = common::cpu_time(pid);
    thread::sleep(Duration::from_secs(1));
    common::cpu_time(pid) - before
}

/// Opens a hybrid connection and sends its CONNECT line, without waiting
/// for the answer. A bridge that refuses the connection may close it
/// before the line is written (`EPIPE`, or a reset); that is its answer,
/// which [`answer`] then reads as a close.
fn dial(uds: &Path, port: u32) -> UnixStream {
    let mut s = UnixStream::connect(uds).expect("the Unix listener's backlog has room");
    match s.write_all(pier_hybrid::connect_line(port).as_bytes()) {
        Ok(()) => {}
        Err(e)
            if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {}
        Err(e) => panic!("sending the CONNECT line: {e}"),
    }
    s
}

/// The answer to a CONNECT line, waiting up to `timeout`: `Some(true)` for
/// `OK`, `Some(false)` when the bridge closed the connection, `None` when
/// nothing came.
fn answer(s: &mut UnixStream, timeout: Duration) -> Option<bool> {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8];
    loop {
        match s.read(&mut byte) {
            Ok(0) => return Some(false),
            Ok(_) if byte[0] == b'\n' => return Some(pier_hybrid::parse_ok(&line).is_some()),
            Ok(_) => line.push(byte[0]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                assert!(line.is_empty(), "half an answer: {line:?}");
                return None;
            }
            Err(_) => return Some(false),
        }
    }
}

/// One counter of the bridge's `refused or closed` line (absent: zero),
/// from a SIGUSR1 report.
fn refusals(run: &PierRun, reason: &str) -> u64 {
    let report = common::stats::report(run);
    common::stats::counter(&report, "bridge\n", "refused or closed:", reason).unwrap_or(0)
}

/// At 1,024 bridged connections, the next host program is closed before
/// OK, pier idles, and once connections close new ones are served.
#[test]
fn at_the_connection_cap_pier_refuses_idles_and_recovers() {
    let echo = wasm("echo");
    let run = PierRun::start(&[echo.to_str().unwrap(), "--listen", "1234"]);
    // echo serves 1,000 at once; the rest wait in its listener's backlog,
    // answered OK by the guest stack as Linux does.
    let mut conns: Vec<UnixStream> = (0..CAP).map(|_| connect(&run.uds, 1234)).collect();
    round_trip(&mut conns[0], 1);

    let mut extra = dial(&run.uds, 1234);
    assert_eq!(answer(&mut extra, Duration::from_secs(10)), Some(false), "closed before OK");
    assert_eq!(refusals(&run, "connection-limit"), 1);
    let used = idle_cpu(run.pid());
    eprintln!("CPU over an idle second at the cap: {used:?}");
    assert!(used < IDLE_CPU, "pier used {used:?} of CPU in an idle second at the cap");

    // Room again: the first hundred go (echo takes the 24 that waited in
    // its backlog and has room left), then new ones are served.
    conns.drain(..100);
    for i in 0..10 {
        let mut conn = connect(&run.uds, 1234);
        round_trip(&mut conn, 100 + i);
        conns.push(conn);
    }
    round_trip(conns.last_mut().unwrap(), 2);
}

/// With its RLIMIT_NOFILE lowered, pier runs out of file descriptors
/// accepting host programs: the ones it cannot accept wait in the Unix
/// listener's backlog, pier idles (no busy retry, also while other
/// connections are busy), and once clients close theirs, the waiting ones
/// are served.
#[test]
fn out_of_file_descriptors_pier_waits_idles_and_recovers() {
    const NOFILE: u64 = 64;
    let echo = wasm("echo");
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let mut command = common::pier();
    command
        .arg("run")
        .arg("--uds")
        .arg(&uds)
        .arg(&echo)
        .arg("--listen")
        .arg("1234")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: NOFILE, rlim_max: NOFILE };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run = PierRun::spawn_command(&mut command, &uds);
    drop(connect(&uds, 1234));
    thread::sleep(Duration::from_millis(200));
    let in_use = std::fs::read_dir(format!("/proc/{}/fd", run.pid())).unwrap().count();
    let room = NOFILE as usize - in_use;
    eprintln!("pier holds {in_use} descriptors of {NOFILE}: room for {room} connections");

    // Twenty more than fit.
    let mut clients: Vec<UnixStream> = (0..room + 20).map(|_| dial(&uds, 1234)).collect();
    let (mut served, mut waiting) = (Vec::new(), Vec::new());
    for (i, mut c) in clients.drain(..).enumerate() {
        match answer(&mut c, Duration::from_millis(if i < room { 5000 } else { 200 })) {
            Some(true) => served.push(c),
            Some(false) => panic!("connection {i} closed; stderr:\n{}", run.stderr()),
            None => waiting.push(c),
        }
    }
    eprintln!("{} served, {} waiting", served.len(), waiting.len());
    assert!(waiting.len() >= 10, "only {} connections wait for a descriptor", waiting.len());
    let errors = refusals(&run, "accept-error");
    assert!(errors >= 1, "no accept error counted at EMFILE");

    let used = idle_cpu(run.pid());
    eprintln!("CPU over an idle second out of descriptors: {used:?}");
    assert!(used < IDLE_CPU, "pier used {used:?} of CPU in an idle second at EMFILE");

    // Busy connections must not turn into accept retries on every round.
    let errors = refusals(&run, "accept-error");
    let start = Instant::now();
    let mut busy = served.pop().unwrap();
    let payload = data(9, 8 << 20);
    let mut writer = busy.try_clone().unwrap();
    let sent = payload.clone();
    let w = thread::spawn(move || writer.write_all(&sent).unwrap());
    busy.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut back = vec![0; payload.len()];
    busy.read_exact(&mut back).unwrap();
    w.join().unwrap();
    assert!(back == payload, "echo differs at EMFILE");
    let retries = refusals(&run, "accept-error") - errors;
    let took = start.elapsed();
    eprintln!("accept retries while 8 MiB were echoed in {took:?}: {retries}");
    // Twice the bridge's retry rate (one per 100 ms) and some: before it
    // backed off, a failing accept ran on every device round (1,148 here).
    let bound = 5 + 2 * took.as_millis() as u64 / 100;
    assert!(retries <= bound, "{retries} accept retries in {took:?} while one connection was busy");
    let warnings = run.stderr().matches("accepting a host connection failed").count();
    assert_eq!(warnings, 1, "one warning per run of failures:\n{}", run.stderr());

    // Descriptors come back: every waiting client is served.
    drop(served);
    drop(busy);
    for (i, c) in waiting.iter_mut().enumerate() {
        assert_eq!(
            answer(c, Duration::from_secs(5)),
            Some(true),
            "waiting connection {i} not served once descriptors came back; stderr:\n{}",
            run.stderr()
        );
        round_trip(c, 200 + i as u64);
    }
}
