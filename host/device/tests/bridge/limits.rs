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
