//! Readiness in every socket state, against Linux's `vsock_poll`
//! (`net/vmw_vsock/af_vsock.c`).
//!
//! One table drives a real pair of stacks (the guest A and the host B over
//! the loopback harness) into each state a stream or seqpacket socket can
//! be in: connecting, established (idle, with data, without credit), each
//! local and peer shutdown, reset, a failed connect, closed, unconnected,
//! and a listener with and without a pending connection; datagram sockets
//! have rows of their own. Each row's expected mask is what `vsock_poll`
//! returns in the same state, with a comment naming the rule that gives
//! each flag (`docs/linux-behaviours.md#readiness` states the rules).
//! Every row must match; every mismatching row is reported in one failure.
//!
//! A second table holds `Stack::unblocked`, the readiness adapters wait
//! for: Linux's mask plus the calls that would fail or end at once.
//!
//! Linux's events map to pier's flags one to one: `EPOLLIN` is
//! `READABLE`, `EPOLLOUT` `WRITABLE`, `EPOLLRDHUP` `READ_CLOSED`,
//! `EPOLLHUP` `HANGUP`, `EPOLLERR` `ERROR`. A closed descriptor (Linux
//! reports `POLLNVAL`) is a handle the stack no longer knows: `BadHandle`.

mod common;

use std::fmt::Write as _;
use std::time::Duration;

use common::*;
use pier_stack::phy::{Loopback, Middleware, Side, Verdict};
use pier_stack::wire::{Header, Op};
use pier_stack::{
    Error, Instant, Readiness, Shutdown, SocketHandle, SocketType, VMADDR_CID_ANY, VsockAddr,
    WakeList,
};

/// Linux's names for pier's flags, so each row reads like `vsock_poll`.
const NONE: Readiness = Readiness::EMPTY;
const IN: Readiness = Readiness::READABLE;
const OUT: Readiness = Readiness::WRITABLE;
const RDHUP: Readiness = Readiness::READ_CLOSED;
const HUP: Readiness = Readiness::HANGUP;
const ERR: Readiness = Readiness::ERROR;

const PORT: u32 = 1234;

/// The socket a row queries: which stack, which handle.
type Probe = (Side, SocketHandle);

/// Drives a fresh pair of stacks into a state; returns the socket to ask.
type Setup = fn(&mut Loopback, SocketType) -> Probe;

/// A row of the table.
struct Row {
    name: &'static str,
    ty: SocketType,
    /// Drives a fresh pair of stacks into the state; returns the socket to ask.
    setup: Setup,
    /// What Linux's `vsock_poll` returns in that state; `Err(BadHandle)`
    /// where Linux would report `POLLNVAL` (the descriptor is closed).
    linux: Result<Readiness, Error>,
}

/// A stream or seqpacket case, run for both types.
struct Case {
    name: &'static str,
    setup: Setup,
    linux: Result<Readiness, Error>,
}

fn connectible_cases() -> Vec<Case> {
    vec![
        Case {
            // SYN_SENT: no ERR (sk_err 0), no IN (nothing queued), no OUT (not ESTABLISHED, not CLOSE).
            name: "connecting, no answer yet",
            setup: connecting,
            linux: Ok(NONE),
        },
        Case {
            // OUT: ESTABLISHED and the peer's credit > 0.
            name: "established, idle",
            setup: established,
            linux: Ok(OUT),
        },
        Case {
            // IN: notify_poll_in (bytes >= SO_RCVLOWAT / a message queued); OUT: credit > 0.
            name: "established, data queued to read",
            setup: established_with_data,
            linux: Ok(IN | OUT),
        },
        Case {
            // No OUT: ESTABLISHED but free credit is 0; nothing else applies.
            name: "established, peer's credit exhausted",
            setup: credit_exhausted,
            linux: Ok(NONE),
        },
        Case {
            // RDHUP and IN: sk_shutdown & RCV; OUT: ESTABLISHED, no SEND shutdown, credit > 0.
            name: "local SHUT_RD",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Read),
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // No OUT: SEND shutdown disables both OUT rules; no HUP: the peer still sends.
            name: "local SHUT_WR",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Write),
            linux: Ok(NONE),
        },
        Case {
            // HUP: sk_shutdown == SHUTDOWN_MASK; RDHUP and IN: RCV shutdown; no OUT: SEND
            // shutdown. (The peer answers our SHUTDOWN with RST: CLOSING, same mask.)
            name: "local SHUT_RDWR",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Both),
            linux: Ok(IN | RDHUP | HUP),
        },
        Case {
            // RDHUP and IN: peer_shutdown & SEND (EOF); OUT: ESTABLISHED, credit > 0.
            name: "peer SHUT_WR (EOF)",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Write),
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // OUT: still ESTABLISHED with credit (a send would fail with EPIPE, but poll
            // does not look at peer_shutdown & RCV); nothing else applies.
            name: "peer SHUT_RD",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Read),
            linux: Ok(OUT),
        },
        Case {
            // No OUT: ESTABLISHED without credit (a send fails with EPIPE at once, but
            // poll looks only at the credit); nothing else applies.
            name: "peer SHUT_RD, credit used up",
            setup: peer_shut_rd_credit_exhausted,
            linux: Ok(NONE),
        },
        Case {
            // RDHUP and IN: peer_shutdown & SEND; OUT: CLOSING (nothing left to read) without
            // a local SEND shutdown; no HUP: we did not shut SEND.
            name: "peer SHUT_RDWR",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Both),
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // The peer's close is SHUTDOWN with both flags: as the row above.
            name: "peer closed",
            setup: peer_closed,
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // HUP: our SEND shutdown and the peer's SEND shutdown; RDHUP and IN: peer SEND;
            // no OUT: our SEND shutdown.
            name: "both sides SHUT_WR",
            setup: both_shut_wr,
            linux: Ok(IN | RDHUP | HUP),
        },
        Case {
            // virtio_transport_do_close: peer_shutdown = SHUTDOWN_MASK, CLOSING, no sk_err.
            // RDHUP and IN: peer SEND; OUT: CLOSING without a local SEND shutdown.
            name: "reset by the peer while connected",
            setup: |lb, ty| reset_by_peer(lb, ty, false),
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // As above, but with data queued do_close leaves it ESTABLISHED: IN and RDHUP
            // from peer SEND, OUT from the credit last granted.
            name: "reset by the peer with data queued",
            setup: |lb, ty| reset_by_peer(lb, ty, true),
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // ESTABLISHED as above, but the RST granted no credit: no OUT.
            name: "reset by the peer with data queued, no credit",
            setup: reset_by_peer_without_credit,
            linux: Ok(IN | RDHUP),
        },
        Case {
            // The peer's SHUTDOWN of both ways with data queued: no RST, still
            // ESTABLISHED. IN and RDHUP: peer SEND; OUT: credit > 0.
            name: "peer SHUT_RDWR with data queued",
            setup: peer_shut_rdwr_with_data,
            linux: Ok(IN | OUT | RDHUP),
        },
        Case {
            // virtio_vsock_reset_sock: CLOSE with sk_err = ECONNRESET, shutdown flags as
            // they were. ERR: sk_err; OUT: CLOSE without a SEND shutdown; no IN, no RDHUP:
            // nothing queued, the peer did not shut down.
            name: "transport reset while connected",
            setup: |lb, ty| transport_reset(lb, ty, false),
            linux: Ok(ERR | OUT),
        },
        Case {
            // As above; IN: notify_poll_in still sees the queued bytes.
            name: "transport reset with data queued",
            setup: |lb, ty| transport_reset(lb, ty, true),
            linux: Ok(ERR | IN | OUT),
        },
        Case {
            // ERR: sk_err; no OUT: our SEND shutdown; no HUP: the peer never shut SEND.
            name: "transport reset after local SHUT_WR",
            setup: transport_reset_after_shut_wr,
            linux: Ok(ERR),
        },
        Case {
            // The error collected (by a send): only the CLOSE rule's OUT is left.
            name: "transport reset, error collected",
            setup: transport_reset_error_collected,
            linux: Ok(OUT),
        },
        Case {
            // A socket the peer reset is still in Linux's connected table: the transport
            // reset makes it CLOSE with ECONNRESET. ERR: sk_err; IN and RDHUP: peer SEND
            // (do_close set peer_shutdown); OUT: CLOSE rule.
            name: "transport reset after the peer's reset",
            setup: transport_reset_after_peer_reset,
            linux: Ok(ERR | IN | OUT | RDHUP),
        },
        Case {
            // RST while connecting: CLOSE with sk_err = ECONNRESET. ERR: sk_err; OUT: CLOSE
            // rule; no IN (no data, no shutdown).
            name: "RST while connecting (refused)",
            setup: refused,
            linux: Ok(ERR | OUT),
        },
        Case {
            // SO_ERROR (finish_connect) cleared sk_err: only the CLOSE rule's OUT is left.
            name: "refused, error collected",
            setup: refused_error_collected,
            linux: Ok(OUT),
        },
        Case {
            // vsock_connect_timeout: CLOSE with sk_err = ETIMEDOUT. ERR: sk_err; OUT: CLOSE.
            name: "connect timed out",
            setup: timed_out,
            linux: Ok(ERR | OUT),
        },
        Case {
            // close(2) released the descriptor: poll reports POLLNVAL.
            name: "closed by us",
            setup: closed,
            linux: Err(Error::BadHandle),
        },
        Case {
            // A new socket is in CLOSE: OUT from the CLOSE rule, nothing else.
            name: "unconnected",
            setup: unconnected,
            linux: Ok(OUT),
        },
        Case {
            // LISTEN, accept queue empty: no rule applies.
            name: "listener, nothing pending",
            setup: |lb, ty| (Side::B, listener(lb, Side::B, ty, PORT)),
            linux: Ok(NONE),
        },
        Case {
            // IN: LISTEN with a connection in the accept queue.
            name: "listener, a connection pending",
            setup: listener_with_pending,
            linux: Ok(IN),
        },
    ]
}

/// Datagram rows: IN with a datagram queued or after SHUT_RD; OUT unless
/// SHUT_WR; RDHUP and HUP from the rules common to every socket type.
fn datagram_rows() -> Vec<Row> {
    let row = |name, setup: Setup, linux| Row { name, ty: SocketType::Datagram, setup, linux };
    vec![
        // OUT: no SEND shutdown.
        row("datagram, fresh", dgram_fresh, Ok(OUT)),
        // IN: the receive queue is not empty; OUT: no SEND shutdown.
        row("datagram, one queued", dgram_queued, Ok(IN | OUT)),
        // IN and RDHUP: RCV shutdown; OUT: no SEND shutdown.
        row("datagram, SHUT_RD", |lb, _| dgram_shutdown(lb, Shutdown::Read), Ok(IN | OUT | RDHUP)),
        // SEND shutdown: no OUT; nothing else applies.
        row("datagram, SHUT_WR", |lb, _| dgram_shutdown(lb, Shutdown::Write), Ok(NONE)),
        // HUP: both shut; IN and RDHUP: RCV shutdown; no OUT: SEND shutdown.
        row(
            "datagram, SHUT_RDWR",
            |lb, _| dgram_shutdown(lb, Shutdown::Both),
            Ok(IN | RDHUP | HUP),
        ),
    ]
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for case in connectible_cases() {
        for ty in [SocketType::Stream, SocketType::SeqPacket] {
            rows.push(Row { name: case.name, ty, setup: case.setup, linux: case.linux });
        }
    }
    rows.extend(datagram_rows());
    rows
}

/// Runs `rows` on fresh pairs of stacks, asking each socket with `ask`;
/// returns every mismatch, one per line.
fn mismatches(
    rows: &[Row],
    ask: fn(&mut Loopback, Side, SocketHandle) -> Result<Readiness, Error>,
) -> String {
    let mut failures = String::new();
    for row in rows {
        let mut lb = pair();
        let (side, h) = (row.setup)(&mut lb, row.ty);
        let got = ask(&mut lb, side, h);
        if got != row.linux {
            let _ = writeln!(
                failures,
                "  {:?} {}: got {:?}, want {:?}",
                row.ty, row.name, got, row.linux
            );
        }
    }
    failures
}

/// Every row, on a fresh pair of stacks; all mismatches in one message.
#[test]
fn readiness_matches_vsock_poll_in_every_state() {
    let rows = rows();
    let failures = mismatches(&rows, |lb, side, h| lb.stack(side).readiness(h));
    assert!(failures.is_empty(), "readiness differs from Linux's vsock_poll:\n{failures}");
    assert!(rows.len() >= 60, "every case runs for stream and seqpacket");
}

/// `Stack::unblocked` is Linux's mask plus READABLE where a receive would
/// return EOF or an error at once and WRITABLE where a send would fail at
/// once; a connect under way and a listener add nothing. Its rows are the
/// states where the two differ, and a few where they must not.
#[test]
fn unblocked_adds_the_calls_that_fail_at_once() {
    let cases = [
        // Linux: NONE. A send fails with EPIPE at once.
        ("local SHUT_WR", (|lb, ty| local_shutdown(lb, ty, Shutdown::Write)) as Setup, Ok(OUT)),
        // Linux: IN|RDHUP|HUP. A send fails with EPIPE at once.
        (
            "local SHUT_RDWR",
            |lb, ty| local_shutdown(lb, ty, Shutdown::Both),
            Ok(IN | OUT | RDHUP | HUP),
        ),
        // Linux: NONE (no credit). A send fails with EPIPE at once.
        ("peer SHUT_RD, credit used up", peer_shut_rd_credit_exhausted, Ok(OUT)),
        // Linux: OUT. A receive returns EOF at once (the error was collected).
        ("transport reset, error collected", transport_reset_error_collected, Ok(IN | OUT)),
        // Linux: ERR. A send and a receive fail at once.
        ("transport reset after local SHUT_WR", transport_reset_after_shut_wr, Ok(IN | OUT | ERR)),
        // As Linux: nothing is ready while the handshake runs.
        ("connecting, no answer yet", connecting, Ok(NONE)),
        // As Linux: waiting for credit is waiting.
        ("established, peer's credit exhausted", credit_exhausted, Ok(NONE)),
        // As Linux: a listener waits for a connection.
        (
            "listener, nothing pending",
            |lb, ty| (Side::B, listener(lb, Side::B, ty, PORT)),
            Ok(NONE),
        ),
    ];
    let mut rows = Vec::new();
    for (name, setup, linux) in cases {
        for ty in [SocketType::Stream, SocketType::SeqPacket] {
            rows.push(Row { name, ty, setup, linux });
        }
    }
    // Linux: NONE. A send fails with EPIPE at once.
    rows.push(Row {
        name: "datagram, SHUT_WR",
        ty: SocketType::Datagram,
        setup: |lb, _| dgram_shutdown(lb, Shutdown::Write),
        linux: Ok(OUT),
    });
    let failures = mismatches(&rows, |lb, side, h| lb.stack(side).unblocked(h));
    assert!(failures.is_empty(), "unblocked differs:\n{failures}");
}

// ----- setups ---------------------------------------------------------------

/// Drops every frame: the peer never answers.
struct DropAll;

impl Middleware for DropAll {
    fn on_frame(&mut self, _: Side, _: Instant, _: &mut Vec<u8>) -> Verdict {
        Verdict::Drop
    }
}

/// Sends `data` as stream bytes or as one seqpacket message.
fn send(lb: &mut Loopback, side: Side, h: SocketHandle, ty: SocketType, data: &[u8]) {
    match ty {
        SocketType::SeqPacket => lb.stack(side).send_message(h, data, true).unwrap(),
        _ => assert_eq!(lb.stack(side).send(h, data).unwrap(), data.len()),
    }
    lb.run();
}

fn connecting(lb: &mut Loopback, ty: SocketType) -> Probe {
    listener(lb, Side::B, ty, PORT);
    lb.add_middleware(DropAll);
    let (c, outcome) = try_connect(lb, Side::A, ty, VsockAddr::new(HOST, PORT));
    assert_eq!(outcome, Err(Error::WouldBlock));
    (Side::A, c)
}

fn established(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, _) = connected(lb, ty, PORT);
    (Side::A, c)
}

fn established_with_data(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    send(lb, Side::B, s, ty, b"to read");
    (Side::A, c)
}

/// The host's buffer shrinks to 4 KiB and the guest fills it.
fn credit_exhausted(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    lb.b.set_buffer_size(s, 4096).unwrap();
    lb.run();
    send(lb, Side::A, c, ty, &[7; 4096]);
    if ty == SocketType::Stream {
        assert_eq!(lb.a.send_space(c), Ok(0));
    }
    (Side::A, c)
}

fn local_shutdown(lb: &mut Loopback, ty: SocketType, how: Shutdown) -> Probe {
    let (c, _) = connected(lb, ty, PORT);
    lb.a.shutdown(c, how).unwrap();
    lb.run();
    (Side::A, c)
}

fn peer_shutdown(lb: &mut Loopback, ty: SocketType, how: Shutdown) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    lb.b.shutdown(s, how).unwrap();
    lb.run();
    (Side::A, c)
}

fn peer_closed(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    lb.b.close(s, lb.now()).unwrap();
    lb.run();
    (Side::A, c)
}

fn both_shut_wr(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    lb.b.shutdown(s, Shutdown::Write).unwrap();
    lb.a.shutdown(c, Shutdown::Write).unwrap();
    lb.run();
    (Side::A, c)
}

/// The host resets the connection: an RST for the guest's connection,
/// injected as the host would send it (a hostile or crashed peer).
fn reset_by_peer(lb: &mut Loopback, ty: SocketType, with_data: bool) -> Probe {
    inject_rst(lb, ty, with_data, 262_144)
}

/// As `reset_by_peer` with data queued, and an RST whose header grants no
/// credit (`buf_alloc` 0).
fn reset_by_peer_without_credit(lb: &mut Loopback, ty: SocketType) -> Probe {
    inject_rst(lb, ty, true, 0)
}

fn inject_rst(lb: &mut Loopback, ty: SocketType, with_data: bool, buf_alloc: u32) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    if with_data {
        send(lb, Side::B, s, ty, b"unread");
    }
    let guest = lb.a.local_addr(c).unwrap();
    let rst = Header {
        src_cid: HOST as u64,
        dst_cid: GUEST as u64,
        src_port: PORT,
        dst_port: guest.port,
        len: 0,
        socket_type: ty,
        op: Op::Rst,
        flags: 0,
        buf_alloc,
        fwd_cnt: 0,
    };
    let now = lb.now();
    let mut wakes = WakeList::new();
    lb.a.receive_batch(now, [&rst.encode()[..]], &mut wakes);
    wakes.wake_all();
    lb.run();
    (Side::A, c)
}

/// The guest's buffer credit is used up (`credit_exhausted`), then the
/// host shuts down receiving.
fn peer_shut_rd_credit_exhausted(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    lb.b.set_buffer_size(s, 4096).unwrap();
    lb.run();
    send(lb, Side::A, c, ty, &[7; 4096]);
    lb.b.shutdown(s, Shutdown::Read).unwrap();
    lb.run();
    (Side::A, c)
}

fn peer_shut_rdwr_with_data(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    send(lb, Side::B, s, ty, b"unread");
    lb.b.shutdown(s, Shutdown::Both).unwrap();
    lb.run();
    (Side::A, c)
}

/// The guest's device reports TRANSPORT_RESET (the guest keeps its CID).
fn reset_transport(lb: &mut Loopback) {
    let mut wakes = WakeList::new();
    lb.a.transport_reset(GUEST, &mut wakes);
    wakes.wake_all();
}

fn transport_reset(lb: &mut Loopback, ty: SocketType, with_data: bool) -> Probe {
    let (c, s) = connected(lb, ty, PORT);
    if with_data {
        send(lb, Side::B, s, ty, b"unread");
    }
    reset_transport(lb);
    (Side::A, c)
}

fn transport_reset_after_shut_wr(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (_, c) = local_shutdown(lb, ty, Shutdown::Write);
    reset_transport(lb);
    (Side::A, c)
}

fn transport_reset_error_collected(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (_, c) = transport_reset(lb, ty, false);
    let sent = match ty {
        SocketType::SeqPacket => lb.a.send_message(c, b"x", true).map(|()| 1),
        _ => lb.a.send(c, b"x"),
    };
    assert_eq!(sent, Err(Error::ConnectionReset));
    (Side::A, c)
}

fn transport_reset_after_peer_reset(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (_, c) = reset_by_peer(lb, ty, false);
    reset_transport(lb);
    (Side::A, c)
}

fn refused(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, outcome) = try_connect(lb, Side::A, ty, VsockAddr::new(HOST, PORT));
    assert_eq!(outcome, Err(Error::ConnectionReset));
    // try_connect collected the error; connect again to leave it pending.
    let now = lb.now();
    lb.a.connect(c, VsockAddr::new(HOST, PORT), now).unwrap();
    lb.run();
    (Side::A, c)
}

fn refused_error_collected(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, outcome) = try_connect(lb, Side::A, ty, VsockAddr::new(HOST, PORT));
    assert_eq!(outcome, Err(Error::ConnectionReset));
    (Side::A, c)
}

fn timed_out(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (_, c) = connecting(lb, ty);
    lb.advance(Duration::from_secs(2));
    (Side::A, c)
}

fn closed(lb: &mut Loopback, ty: SocketType) -> Probe {
    let (c, _) = connected(lb, ty, PORT);
    lb.a.close(c, lb.now()).unwrap();
    lb.run();
    (Side::A, c)
}

fn unconnected(lb: &mut Loopback, ty: SocketType) -> Probe {
    (Side::A, lb.a.socket(ty).unwrap())
}

fn listener_with_pending(lb: &mut Loopback, ty: SocketType) -> Probe {
    let l = listener(lb, Side::B, ty, PORT);
    let (_, outcome) = try_connect(lb, Side::A, ty, VsockAddr::new(HOST, PORT));
    outcome.unwrap();
    (Side::B, l)
}

/// A datagram socket on the guest with the host as its destination.
fn dgram(lb: &mut Loopback) -> SocketHandle {
    let h = lb.a.socket(SocketType::Datagram).unwrap();
    lb.a.bind(h, VsockAddr::new(VMADDR_CID_ANY, 5000)).unwrap();
    lb.a.connect(h, VsockAddr::new(HOST, 5000), lb.now()).unwrap();
    h
}

fn dgram_fresh(lb: &mut Loopback, _: SocketType) -> Probe {
    (Side::A, dgram(lb))
}

fn dgram_queued(lb: &mut Loopback, _: SocketType) -> Probe {
    let h = dgram(lb);
    let sender = lb.b.socket(SocketType::Datagram).unwrap();
    lb.b.send_to(sender, b"one", VsockAddr::new(GUEST, 5000)).unwrap();
    lb.run();
    (Side::A, h)
}

fn dgram_shutdown(lb: &mut Loopback, how: Shutdown) -> Probe {
    let h = dgram(lb);
    lb.a.shutdown(h, how).unwrap();
    (Side::A, h)
}
