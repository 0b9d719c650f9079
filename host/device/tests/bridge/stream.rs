//! Streams through the bridge: CONNECT in its forms, guest → host, large
//! transfers under credit stalls, half-close and resets both ways.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant as WallInstant};

use pier_device::bridge::BridgeStats;
use pier_hybrid::connect_line;
use pier_stack::wire::{Op, RawHeader};
use pier_stack::{Error, SocketType};

use crate::apps::{Echo, Sink, Source, guest_listener};
use crate::driver::{AppStatus, FnApp, Harness, TIMEOUT};
use crate::host::{
    self, accept, connect, dial, expect_ok, listen, matches, read_line, read_to_end,
};

const PORT: u32 = 5000;
const BIG: u64 = 64 << 20;

#[test]
fn host_connect_echo_one_write() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, PORT));
    let (mut s, ok_port) = connect(h.uds(), PORT);
    assert!(ok_port > 1023, "OK names the host stack's ephemeral port, got {ok_port}");
    s.write_all(b"hello, guest").unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello, guest");
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut s), b"", "the echo closes after our EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!((st.host_connections, st.established, st.active), (1, 1, 0));
    assert_eq!((st.bytes_to_guest, st.bytes_from_guest), (12, 12));
    assert_eq!(st.malformed_lines + st.unix_errors + st.stack_errors, 0);
}

#[test]
fn host_connect_line_split_byte_by_byte() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, PORT));
    let mut s = dial(h.uds());
    // Any case, extra whitespace, CRLF; one byte per write, and data after
    // the newline, also a byte at a time.
    for &b in b"coNNect \t 5000 \r\nxyz" {
        s.write_all(&[b]).unwrap();
        std::thread::sleep(Duration::from_millis(3));
    }
    expect_ok(read_line(&mut s));
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"xyz", "bytes written after the line reach the guest");
    assert_eq!(h.stats().malformed_lines, 0);
}

#[test]
fn host_connect_data_in_same_write() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, PORT));
    let mut s = dial(h.uds());
    s.write_all(&[connect_line(PORT).as_bytes(), b"early bytes in the same write"].concat())
        .unwrap();
    expect_ok(read_line(&mut s));
    let mut buf = vec![0u8; 29];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(buf, b"early bytes in the same write");
}

#[test]
fn guest_connects_to_host_listener() {
    let h = Harness::start();
    let listener = listen(h.uds(), 6000);
    let (tx, rx) = mpsc::channel();
    let mut state = None;
    let mut pinged = false;
    h.spawn(FnApp(move |guest: &mut pier_stack::Stack, now| {
        let s = *state.get_or_insert_with(|| {
            let s = guest.socket(SocketType::Stream).unwrap();
            guest.connect(s, pier_stack::VsockAddr::new(2, 6000), now).unwrap();
            s
        });
        match guest.finish_connect(s) {
            Err(Error::WouldBlock) => return AppStatus::Idle,
            Err(e) => panic!("guest connect failed: {e}"),
            Ok(()) => {}
        }
        if !pinged {
            assert_eq!(guest.send(s, b"ping"), Ok(4));
            pinged = true;
        }
        let mut buf = [0u8; 16];
        match guest.recv(s, &mut buf) {
            Ok(info) if !info.eof => {
                tx.send(buf[..info.len].to_vec()).unwrap();
                guest.close(s, now).unwrap();
                AppStatus::Done
            }
            _ => AppStatus::Idle,
        }
    }));
    let mut s = accept(&listener);
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    s.write_all(b"pong").unwrap();
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), b"pong");
    assert_eq!(read_to_end(&mut s), b"", "the guest's close reads as EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!((st.guest_connections, st.established, st.host_refused), (1, 1, 0));
}

#[test]
fn large_transfer_host_to_guest_with_slow_reader() {
    let h = Harness::start();
    let (tx, rx) = mpsc::channel();
    // The guest pauses 20 ms after every 4 MiB: the stack's credit runs out
    // and the bridge must stop reading the Unix socket, then resume.
    h.spawn(Sink::new(PORT, 4 << 20, Duration::from_millis(20), tx));
    let (mut s, _) = connect(h.uds(), PORT);
    let mut chunk = vec![0u8; 1 << 20];
    let mut sent = 0u64;
    while sent < BIG {
        host::fill(sent, &mut chunk);
        s.write_all(&chunk).unwrap();
        sent += chunk.len() as u64;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let report = rx.recv_timeout(Duration::from_secs(120)).expect("the guest sink finished");
    assert_eq!(report.bytes, BIG);
    assert!(report.intact, "the guest received the bytes in order and unchanged");
    assert!(report.eof);
    assert_eq!(read_to_end(&mut s), b"");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.bytes_to_guest, BIG);
    assert!(st.credit_stalls > 0, "the slow reader made the bridge wait for credit: {st:?}");
    // Each direction's buffer is bounded by the autotuning limit: the
    // receive buffer grows to it while the reader drains between its
    // pauses, and the send buffer the bridge lends to `readv` is at most
    // the window, which that limit caps too.
    let bound = 2 * pier_stack::DEFAULT_BUFFER_AUTOTUNE_MAX as usize;
    let max = h.run(|w| w.max_host_buffered);
    assert!(max <= bound, "host stack buffers stayed bounded, peaked at {max} bytes");
}

/// A guest app that connects to a host program listening on `port` and
/// sends it `total` bytes: the program's end of the connection, and the
/// channel on which the app reports what it sent.
fn guest_source_to_a_program(
    h: &Harness,
    port: u32,
    total: u64,
) -> (UnixStream, mpsc::Receiver<Result<u64, Error>>) {
    let listener = listen(h.uds(), port);
    let (tx, rx) = mpsc::channel();
    h.spawn(Source::new(port, total, tx));
    (accept(&listener), rx)
}

#[test]
fn large_transfer_guest_to_host_with_slow_reader() {
    let h = Harness::start();
    let (mut s, rx) = guest_source_to_a_program(&h, 6000, BIG);
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    let mut next_pause = 4u64 << 20;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(matches(got, &buf[..n]), "bytes differ at offset {got}");
        got += n as u64;
        if got >= next_pause {
            next_pause += 4 << 20;
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(got, BIG);
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), Ok(BIG));
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.bytes_from_guest, BIG);
    assert!(st.unix_stalls > 0, "the slow reader filled the Unix socket: {st:?}");
    // Each direction's buffer is bounded by the autotuning limit: the
    // receive buffer grows to it while the reader drains between its
    // pauses, and the send buffer the bridge lends to `readv` is at most
    // the window, which that limit caps too.
    let bound = 2 * pier_stack::DEFAULT_BUFFER_AUTOTUNE_MAX as usize;
    let max = h.run(|w| w.max_host_buffered);
    assert!(max <= bound, "host stack buffers stayed bounded, peaked at {max} bytes");
}

/// More guest bytes than the kernel's default Unix send buffer holds
/// (208 KiB on most systems), but less than the bridge's grown one (at
/// least 416 KiB even where `net.core.wmem_max` is at its default).
const MORE_THAN_A_DEFAULT_SOCKET_HOLDS: u64 = 320 << 10;

/// What a program that read the socket's first filling reads before it
/// stops: enough that Unix reports room again (it does below a quarter
/// of the send buffer, and the default one holds about 210 KiB).
const FIRST_READ: usize = 192 << 10;

/// A guest sends to a host program that reads nothing until the Unix
/// socket is full, then reads [`FIRST_READ`] bytes and stops until the
/// socket is full again. Returns how many bytes the socket held the
/// second time, and the bridge's counters then, after checking that the
/// program gets every byte once it reads on.
fn drain_once_then_stop(h: &Harness) -> (u64, BridgeStats) {
    // Enough to fill the grown socket and the host stack's buffer behind it.
    const TOTAL: u64 = 3 << 20;
    let (mut s, rx) = guest_source_to_a_program(h, 6100, TOTAL);
    let full = h.wait_stats("the Unix socket to fill", |s| s.unix_stalls > 0);
    assert_eq!(full.send_buffers_grown, 0, "grown before its program read: {full:?}");
    let mut got = vec![0u8; FIRST_READ];
    s.read_exact(&mut got).unwrap();
    let again = h.wait_stats("the Unix socket to fill again", |s| s.unix_stalls > 1);
    let held = again.bytes_from_guest - FIRST_READ as u64;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    got.extend_from_slice(&rest);
    assert_eq!(got.len() as u64, TOTAL);
    assert!(matches(0, &got), "the bytes arrive intact and in order");
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), Ok(TOTAL));
    (held, again)
}

/// The bridge grows a stream socket's send buffer once its program has
/// read what filled it, so a reader that pauses does not make the
/// guest's bytes wait in the host stack (a copy and a later write).
#[test]
fn a_stream_socket_holds_more_once_its_program_has_drained_it() {
    let h = Harness::start();
    let (held, st) = drain_once_then_stop(&h);
    assert_eq!(st.send_buffers_grown, 1, "{st:?}");
    assert!(
        held > MORE_THAN_A_DEFAULT_SOCKET_HOLDS,
        "the drained socket held {held} bytes, no more than a default one: {st:?}"
    );
}

/// `stream_send_buffer: None` keeps the kernel's default, which the same
/// bytes fill: the check above tells the two apart.
#[test]
fn without_a_stream_send_buffer_the_socket_holds_what_a_default_one_does() {
    let h = Harness::with_bridge(|config| config.stream_send_buffer = None);
    let (held, st) = drain_once_then_stop(&h);
    assert_eq!(st.send_buffers_grown, 0, "{st:?}");
    assert!(held < MORE_THAN_A_DEFAULT_SOCKET_HOLDS, "held {held} bytes: {st:?}");
}

/// A program that never reads keeps the kernel's default send buffer, so
/// an idle or stuck program costs no more kernel memory than before the
/// setting.
#[test]
fn a_program_that_never_reads_keeps_the_default_send_buffer() {
    let h = Harness::start();
    let (_s, _rx) = guest_source_to_a_program(&h, 6101, MORE_THAN_A_DEFAULT_SOCKET_HOLDS);
    let st = h.wait_stats("the Unix socket to fill", |s| s.unix_stalls > 0);
    assert!(st.bytes_from_guest < MORE_THAN_A_DEFAULT_SOCKET_HOLDS, "{st:?}");
    assert_eq!(st.send_buffers_grown, 0, "{st:?}");
}

/// Host SHUT_WR: the guest sees EOF, still answers, the host reads the
/// answer and then EOF.
#[test]
fn half_close_from_host() {
    let h = Harness::start();
    let (tx, rx) = mpsc::channel();
    let mut listener = None;
    let mut conn = None;
    let mut got = Vec::new();
    h.spawn(FnApp(move |guest: &mut pier_stack::Stack, now| {
        let l = *listener.get_or_insert_with(|| guest_listener(guest, SocketType::Stream, PORT));
        if conn.is_none() {
            conn = guest.accept(l).ok().map(|(c, _)| c);
        }
        let Some(c) = conn else { return AppStatus::Idle };
        let mut buf = [0u8; 64];
        match guest.recv(c, &mut buf) {
            Ok(info) if info.eof => {
                tx.send(got.clone()).unwrap();
                // Our read side is done; our write side is not.
                assert_eq!(guest.send(c, b"reply after your EOF"), Ok(20));
                guest.close(c, now).unwrap();
                return AppStatus::Done;
            }
            Ok(info) => got.extend_from_slice(&buf[..info.len]),
            Err(Error::WouldBlock) => {}
            Err(e) => panic!("guest recv: {e}"),
        }
        AppStatus::Idle
    }));
    // The listener appears on the app's first poll.
    h.wait_for("the guest listener", TIMEOUT, |w| w.guest.socket_count() >= 1);
    let (mut s, _) = connect(h.uds(), PORT);
    s.write_all(b"request").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), b"request", "the guest saw our bytes, then EOF");
    assert_eq!(read_to_end(&mut s), b"reply after your EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.unix_errors + st.stack_errors, 0);
}

/// Guest SHUT_WR: the host reads EOF, still answers, the guest reads the
/// answer and then EOF.
#[test]
fn half_close_from_guest() {
    let h = Harness::start();
    let listener = listen(h.uds(), 6001);
    let (tx, rx) = mpsc::channel();
    let mut sock = None;
    let mut shut = false;
    let mut got = Vec::new();
    h.spawn(FnApp(move |guest: &mut pier_stack::Stack, now| {
        let s = *sock.get_or_insert_with(|| {
            let s = guest.socket(SocketType::Stream).unwrap();
            guest.connect(s, pier_stack::VsockAddr::new(2, 6001), now).unwrap();
            s
        });
        match guest.finish_connect(s) {
            Err(Error::WouldBlock) => return AppStatus::Idle,
            Err(e) => panic!("guest connect: {e}"),
            Ok(()) => {}
        }
        if !shut {
            assert_eq!(guest.send(s, b"question"), Ok(8));
            guest.shutdown(s, pier_stack::Shutdown::Write).unwrap();
            shut = true;
        }
        let mut buf = [0u8; 64];
        loop {
            match guest.recv(s, &mut buf) {
                Ok(info) if info.eof => {
                    tx.send(got.clone()).unwrap();
                    guest.close(s, now).unwrap();
                    return AppStatus::Done;
                }
                Ok(info) => got.extend_from_slice(&buf[..info.len]),
                Err(Error::WouldBlock) => return AppStatus::Idle,
                Err(e) => panic!("guest recv: {e}"),
            }
        }
    }));
    let mut s = accept(&listener);
    assert_eq!(read_to_end(&mut s), b"question", "the guest's SHUT_WR reads as EOF");
    s.write_all(b"answer after your EOF").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), b"answer after your EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.unix_errors + st.stack_errors, 0);
}

/// The guest resets an established connection: the host program reads EOF
/// and its writes fail with EPIPE.
#[test]
fn reset_from_guest() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, PORT));
    let (mut s, host_port) = connect(h.uds(), PORT);
    s.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).unwrap();
    let rst = RawHeader {
        src_cid: 3,
        dst_cid: 2,
        src_port: PORT,
        dst_port: host_port,
        len: 0,
        type_: SocketType::Stream as u16,
        op: Op::Rst as u16,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    };
    h.run(move |w| w.inject_from_guest(&rst, &[]));
    let t0 = WallInstant::now();
    assert_eq!(read_to_end(&mut s), b"");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert!(t0.elapsed() < Duration::from_secs(1));
    let err = s.write_all(b"more").expect_err("writing after the guest's RST fails");
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    assert_eq!(st.active, 0);
}

/// The host program closes with unread data (a Unix "reset"): the bridge
/// gets ECONNRESET, closes both sides, and the guest sees the connection end.
#[test]
fn reset_from_host() {
    let h = Harness::start();
    let (tx, rx) = mpsc::channel();
    let mut listener = None;
    let mut conn = None;
    h.spawn(FnApp(move |guest: &mut pier_stack::Stack, now| {
        let l = *listener.get_or_insert_with(|| guest_listener(guest, SocketType::Stream, PORT));
        if conn.is_none()
            && let Ok((c, _)) = guest.accept(l)
        {
            // Data the host program will never read.
            assert_eq!(guest.send(c, &[7u8; 1000]), Ok(1000));
            conn = Some(c);
        }
        let Some(c) = conn else { return AppStatus::Idle };
        let mut buf = [0u8; 64];
        match guest.recv(c, &mut buf) {
            Ok(info) if info.eof => {
                let sent_after = guest.send(c, b"anyone?");
                tx.send(sent_after).unwrap();
                guest.close(c, now).unwrap();
                AppStatus::Done
            }
            Ok(_) | Err(Error::WouldBlock) => AppStatus::Idle,
            Err(e) => {
                tx.send(Err(e)).unwrap();
                AppStatus::Done
            }
        }
    }));
    h.wait_for("the guest listener", TIMEOUT, |w| w.guest.socket_count() >= 1);
    let (s, _) = connect(h.uds(), PORT);
    h.wait_stats("the guest's bytes to reach the Unix socket", |s| s.bytes_from_guest == 1000);
    drop(s);
    let t0 = WallInstant::now();
    let after = rx.recv_timeout(TIMEOUT).expect("the guest saw the connection end");
    assert!(after.is_err(), "the guest cannot send after the host's reset: {after:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.unix_errors, 1, "{st:?}");
}

#[test]
fn host_connect_to_port_without_listener_is_refused_fast() {
    let h = Harness::start();
    let mut s = dial(h.uds());
    let t0 = WallInstant::now();
    s.write_all(connect_line(5999).as_bytes()).unwrap();
    host::expect_closed(&mut s);
    assert!(t0.elapsed() < Duration::from_millis(500), "refused in {:?}", t0.elapsed());
    let st = h.wait_stats("the refusal", |s| s.closed == 1);
    assert_eq!(st.guest_refused, 1);
}

#[test]
fn guest_connect_to_port_without_listener_is_reset_fast() {
    let h = Harness::start();
    let (tx, rx) = mpsc::channel();
    let t0 = WallInstant::now();
    h.spawn(crate::apps::Dialer::new(SocketType::Stream, 7777, tx));
    let (result, took) = rx.recv_timeout(TIMEOUT).unwrap();
    assert_eq!(result, Err(Error::ConnectionReset));
    assert!(took < Duration::from_millis(500) && t0.elapsed() < Duration::from_millis(500));
    let st = h.stats();
    assert_eq!((st.host_refused, st.active), (1, 0));
}

/// The guest never answers the REQUEST: the stack's 2 s connect timeout
/// ends it, measured on the loop's real clock.
#[test]
fn host_connect_to_silent_guest_closes_after_connect_timeout() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, PORT));
    h.set_blackhole(true);
    let mut s = dial(h.uds());
    let t0 = WallInstant::now();
    s.write_all(connect_line(PORT).as_bytes()).unwrap();
    host::expect_closed(&mut s);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(3500),
        "closed after {took:?}"
    );
    let st = h.wait_stats("the timeout", |s| s.closed == 1);
    assert_eq!(st.guest_timeouts, 1);
}

/// The guest half-closes, then resets, while the host program sits idle:
/// the reset still reaches the host program at once (its writes fail),
/// not at its next write.
#[test]
fn reset_after_half_close_reaches_idle_host() {
    let h = Harness::start();
    let mut listener = None;
    h.spawn(FnApp(move |guest: &mut pier_stack::Stack, _now| {
        let l = *listener.get_or_insert_with(|| guest_listener(guest, SocketType::Stream, PORT));
        match guest.accept(l) {
            Ok((c, _)) => {
                guest.shutdown(c, pier_stack::Shutdown::Write).unwrap();
                AppStatus::Done
            }
            Err(_) => AppStatus::Idle,
        }
    }));
    h.wait_for("the guest listener", TIMEOUT, |w| w.guest.socket_count() >= 1);
    let (mut s, host_port) = connect(h.uds(), PORT);
    assert_eq!(read_to_end(&mut s), b"", "the guest's SHUT_WR reads as EOF");
    assert_eq!(h.stats().active, 1, "our direction is still open");
    let rst = RawHeader {
        src_cid: 3,
        dst_cid: 2,
        src_port: PORT,
        dst_port: host_port,
        len: 0,
        type_: SocketType::Stream as u16,
        op: Op::Rst as u16,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    };
    h.run(move |w| w.inject_from_guest(&rst, &[]));
    let st = h.wait_for_stats_within(Duration::from_secs(1), |s| s.closed == 1);
    assert_eq!(st.active, 0);
    let err = s.write_all(b"late").expect_err("the connection is gone");
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
}

/// A host program that resets its connection (it closes with data it never
/// read, so its peer's next call fails with ECONNRESET) makes the bridge
/// abort the guest's side with an RST instead of ending it in order: the
/// guest must not take a failed exchange for a finished one.
#[test]
fn a_host_reset_aborts_the_guest_side() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::Stream, 5000));
    let (mut s, _) = connect(h.uds(), 5000);
    s.write_all(&[1u8; 100_000]).unwrap();
    // The echo comes back into our socket, and we never read it.
    h.wait_stats("echoed bytes waiting in the host program's socket", |st| st.bytes_from_guest > 0);
    drop(s);
    h.wait_for("the guest's side aborted", TIMEOUT, |w| {
        w.host.stats().rst_sent(pier_stack::RstReason::Aborted) == 1
    });
    assert!(h.run(|w| w.guest.stats().rst_received) >= 1);
    assert_eq!(h.stats().unix_errors, 1);
}

/// The port policy: a host program's CONNECT to a guest port outside
/// `to_guest` is closed before the guest sees a packet, and the guest's
/// connect to a host port outside `to_host` is reset even though a
/// listener waits there; allowed ports work as before, and every denial
/// is counted.
#[test]
fn the_port_policy_denies_both_ways() {
    use crate::apps::Dialer;
    use pier_device::bridge::{PortPolicy, Ports};

    let h = Harness::with_bridge(|c| {
        c.policy =
            PortPolicy { to_guest: Ports::Only(vec![PORT]), to_host: Ports::Only(vec![6001]) }
    });
    h.spawn(Echo::new(SocketType::Stream, PORT));
    h.spawn(Echo::new(SocketType::Stream, PORT + 1));
    let (mut allowed, _) = connect(h.uds(), PORT);
    allowed.write_all(b"hi").unwrap();
    let mut buf = [0u8; 2];
    allowed.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hi", "an allowed guest port is served");

    let mut denied = dial(h.uds());
    denied.write_all(connect_line(PORT + 1).as_bytes()).unwrap();
    host::expect_closed(&mut denied);

    let _listener = listen(h.uds(), 6000);
    let (tx, rx) = mpsc::channel();
    h.spawn(Dialer::new(SocketType::Stream, 6000, tx));
    let (result, _) = rx.recv_timeout(TIMEOUT).unwrap();
    assert_eq!(result, Err(Error::ConnectionReset), "a host port outside the policy is refused");

    let st = h.wait_stats("both denials", |s| s.denied == 2);
    assert_eq!(st.guest_refused, 0, "the denied CONNECT never reached the guest");
    assert_eq!(st.guest_connections, 0, "nor did the guest's connect reach the listener");
}
