//! What the bridge refuses: bad CONNECT lines, slow ones, too many
//! connections. Each refusal is a closed socket for the host program (the
//! protocol has no error message) and a counter for the operator.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::mpsc;
use std::time::{Duration, Instant as WallInstant};

use pier_hybrid::{connect_line, parse_ok};
use pier_stack::{Error, SocketType};

use crate::apps::{Dialer, Echo};
use crate::driver::{Harness, TIMEOUT};
use crate::host::{connect, dial, expect_closed, listen, read_line};

#[test]
fn malformed_connect_lines_are_closed() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let cases: [&[u8]; 7] = [
        b"HELLO 5000\n",
        b"CONNECT\n",
        b"CONNECT five\n",
        b"CONNECT 5000 5001\n",
        b"CONNECT +5000\n",
        b"CONNECT 4294967295\n",
        &[b'A'; 64],
    ];
    for (i, line) in cases.iter().enumerate() {
        let mut s = dial(h.uds());
        let t0 = WallInstant::now();
        s.write_all(line).unwrap();
        expect_closed(&mut s);
        assert!(t0.elapsed() < Duration::from_millis(500), "case {i} took {:?}", t0.elapsed());
    }
    // EOF before the newline.
    let mut s = dial(h.uds());
    s.write_all(b"CONNECT 50").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    expect_closed(&mut s);
    let st = h.wait_stats("eight refusals", |s| s.closed == 8);
    assert_eq!(st.malformed_lines, 8, "{st:?}");
    assert_eq!((st.established, st.active), (0, 0));
    // A good line still works afterwards.
    let _ = connect(h.uds(), 5000);
}

#[test]
fn connect_line_must_arrive_within_two_seconds() {
    let h = Harness::start();
    let mut s = dial(h.uds());
    let t0 = WallInstant::now();
    s.write_all(b"CONN").unwrap();
    expect_closed(&mut s);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(3500),
        "closed after {took:?}"
    );
    let st = h.stats();
    assert_eq!((st.line_timeouts, st.active), (1, 0));
}

/// One local program that opens connections and never sends a CONNECT
/// line cannot starve everyone: once its connections have been silent for
/// the grace (500 ms), each new connection past the line budget (128) or
/// at the connection cap closes the one that has waited longest. Real
/// clients that arrive after 1,100 idle connections are all served.
#[test]
fn idle_connections_cannot_starve_real_clients() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let idle: Vec<_> = (0..1100).map(|_| dial(h.uds())).collect();
    h.wait_stats("the idle connections taken or refused", |s| {
        s.host_connections + s.connection_limit >= 1100
    });
    std::thread::sleep(Duration::from_millis(600));
    for i in 0..32 {
        let (mut s, _) = connect(h.uds(), 5000);
        s.write_all(&[i as u8; 3]).unwrap();
        let mut back = [0u8; 3];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, [i as u8; 3]);
    }
    let st = h.stats();
    assert_eq!(st.established, 32, "every real client got through: {st:?}");
    assert!(st.line_evictions >= 32, "{st:?}");
    drop(idle);
}

/// A burst of real clients that are slow to write their lines (all within
/// the grace) is not cut by the line budget: every one is served.
#[test]
fn a_burst_of_slow_writers_is_not_evicted() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let socks: Vec<_> = (0..300).map(|_| dial(h.uds())).collect();
    h.wait_stats("the burst accepted", |s| s.host_connections >= 300);
    for (i, mut s) in socks.into_iter().enumerate() {
        s.write_all(connect_line(5000).as_bytes()).unwrap();
        let line = read_line(&mut s);
        let port = line.as_deref().and_then(|line| parse_ok(line.as_bytes()));
        assert!(port.is_some(), "client {i}: {line:?}");
    }
    let st = h.stats();
    assert_eq!((st.line_evictions, st.established), (0, 300), "{st:?}");
}

#[test]
fn connection_limit_refuses_both_directions() {
    let h = Harness::with_bridge(|c| c.max_connections = 2);
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let _listener = listen(h.uds(), 6000);
    let (a, _) = connect(h.uds(), 5000);
    let (_b, _) = connect(h.uds(), 5000);
    // A third host program is closed without a word.
    let mut c = dial(h.uds());
    // The bridge may close it before the line is written (EPIPE then).
    let _ = c.write_all(connect_line(5000).as_bytes());
    expect_closed(&mut c);
    // A guest connection is refused with RST.
    let (tx, rx) = mpsc::channel();
    h.spawn(Dialer::new(SocketType::Stream, 6000, tx));
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap().0, Err(Error::ConnectionReset));
    let st = h.stats();
    assert_eq!((st.connection_limit, st.active), (2, 2), "{st:?}");
    // Room again once one closes.
    drop(a);
    h.wait_stats("a slot to free up", |s| s.active == 1);
    let _ = connect(h.uds(), 5000);
}

/// The uid the flooding user's connections come from in the fairness
/// tests: `nobody`, a user other than the test's own.
const OTHER_USER: u32 = 65534;

/// Runs `f` on a thread of its own whose effective uid is [`OTHER_USER`],
/// so the connections it makes reach the bridge as another local user's
/// (the kernel records the effective uid at `connect`, `SO_PEERCRED`).
/// The raw system call changes only that thread's credentials; glibc's
/// wrapper would change every thread's. Opens the harness's socket to
/// that user first. Needs root, which these tests say loudly.
fn as_other_user<T: Send + 'static>(
    uds: &std::path::Path,
    f: impl FnOnce(&std::path::Path) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid only reads the caller's credentials.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the fairness tests run as root to act as two users");
    let dir = uds.parent().expect("the socket's directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(uds, std::fs::Permissions::from_mode(0o666)).unwrap();
    let uds = uds.to_owned();
    std::thread::spawn(move || {
        let keep = u32::MAX; // -1: leave the real and saved uids as they are
        // SAFETY: setresuid takes three uids and touches only this
        // thread's credentials.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, keep, OTHER_USER, keep) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        f(&uds)
    })
}

/// One echo round trip as a real client does it: the line at once, then
/// three bytes back. `false` if the bridge closed the connection instead.
fn served(uds: &std::path::Path, tag: u8) -> bool {
    let mut s = dial(uds);
    if s.write_all(connect_line(5000).as_bytes()).is_err() {
        return false;
    }
    if read_line(&mut s).as_deref().and_then(|l| parse_ok(l.as_bytes())).is_none() {
        return false;
    }
    s.write_all(&[tag; 3]).unwrap();
    let mut back = [0u8; 3];
    s.read_exact(&mut back).is_ok() && back == [tag; 3]
}

/// One local user that holds more silent connections than the whole
/// table cannot keep another user out, even while every one of its
/// connections is younger than the grace: a newcomer from another user
/// closes one of the crowding user's instead.
#[test]
fn a_user_holding_silent_connections_cannot_keep_other_users_out() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let flood = as_other_user(h.uds(), |uds| (0..1100).map(|_| dial(uds)).collect::<Vec<_>>())
        .join()
        .unwrap();
    h.wait_stats("the silent connections taken or refused", |s| {
        s.host_connections + s.connection_limit >= 1100
    });
    let served = (0..32).filter(|&i| served(h.uds(), i)).count();
    let st = h.stats();
    assert_eq!(served, 32, "every client of the other user got through: {st:?}");
    assert!(st.line_evictions >= 32, "{st:?}");
    drop(flood);
}

/// One local user that cycles about 1,100 silent connections, closing
/// each before it is 300 ms old (younger than the grace, so the oldest is
/// never idle long enough to lose its place), cannot keep another user's
/// clients out: every one of them is served while the flood runs.
#[test]
fn a_user_cycling_young_connections_cannot_keep_other_users_out() {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let stop = Arc::new(AtomicBool::new(false));
    let (cycled, oldest_ms) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let flood = {
        let (stop, cycled, oldest_ms) = (stop.clone(), cycled.clone(), oldest_ms.clone());
        as_other_user(h.uds(), move |uds| {
            let mut open: VecDeque<(std::os::unix::net::UnixStream, WallInstant)> =
                (0..1100).map(|_| (dial(uds), WallInstant::now())).collect();
            while !stop.load(Ordering::Relaxed) {
                let (_, born) = open.pop_front().unwrap();
                let age = born.elapsed().as_millis() as usize;
                oldest_ms.fetch_max(age, Ordering::Relaxed);
                open.push_back((dial(uds), WallInstant::now()));
                cycled.fetch_add(1, Ordering::Relaxed);
                // About 1,100 connections every 250 ms.
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    h.wait_stats("the flood filling the table", |s| s.active >= 1000);
    let mut got = 0;
    for i in 0..23 {
        got += usize::from(served(h.uds(), i));
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let st = h.stats();
    let (cycled, oldest) = (cycled.load(Ordering::Relaxed), oldest_ms.load(Ordering::Relaxed));
    assert_eq!(
        got, 23,
        "every client of the other user got through ({cycled} connections cycled, \
         the oldest closed at {oldest} ms): {st:?}"
    );
}

/// A guest that opens connections to a host program without end gets at
/// most `max_guest_connections` of the table; the rest stays for host
/// programs, which still get in.
#[test]
fn a_guest_connecting_without_end_leaves_room_for_host_programs() {
    let h = Harness::with_bridge(|c| {
        c.max_connections = 8;
        c.max_guest_connections = 6;
    });
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let _listener = listen(h.uds(), 6000);
    let (tx, rx) = mpsc::channel();
    for _ in 0..10 {
        h.spawn(Dialer::holding(SocketType::Stream, 6000, tx.clone()));
    }
    let results: Vec<_> = (0..10).map(|_| rx.recv_timeout(TIMEOUT).unwrap().0).collect();
    let refused = results.iter().filter(|r| **r == Err(Error::ConnectionReset)).count();
    assert_eq!((results.len() - refused, refused), (6, 4), "{results:?}");
    assert!(served(h.uds(), 1) && served(h.uds(), 2), "host programs still get in");
    let st = h.stats();
    assert_eq!(st.connection_limit, 4, "{st:?}");
}
