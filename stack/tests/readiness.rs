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
//! each flag (`docs/linux-behaviours.md#readiness` states the rules). The
//! few rows where pier differs on purpose also say what pier reports and
//! why. Every mismatching row is reported in one failure.
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

/// A row of the table.
struct Row {
    name: &'static str,
    ty: SocketType,
    /// Drives a fresh pair of stacks into the state; returns the socket to ask.
    setup: fn(&mut Loopback, SocketType) -> Probe,
    /// What Linux's `vsock_poll` returns in that state; `Err(BadHandle)`
    /// where Linux would report `POLLNVAL` (the descriptor is closed).
    linux: Result<Readiness, Error>,
    /// A deliberate difference: what pier reports instead, and the section
    /// of `docs/linux-behaviours.md` that explains why.
    pier_differs: Option<(Readiness, &'static str)>,
}

/// A stream or seqpacket case, run for both types.
struct Case {
    name: &'static str,
    setup: fn(&mut Loopback, SocketType) -> Probe,
    linux: Result<Readiness, Error>,
    pier_differs: Option<(Readiness, &'static str)>,
}

/// After `SHUT_WR` a send fails at once with EPIPE; pier still reports
/// WRITABLE there, so a writer parked on write interest wakes and sees it.
const SEND_FAILS: &str = "readiness (a send that fails at once is writable)";

fn connectible_cases() -> Vec<Case> {
    vec![
        Case {
            // SYN_SENT: no ERR (sk_err 0), no IN (nothing queued), no OUT (not ESTABLISHED, not CLOSE).
            name: "connecting, no answer yet",
            setup: connecting,
            linux: Ok(NONE),
            pier_differs: None,
        },
        Case {
            // OUT: ESTABLISHED and the peer's credit > 0.
            name: "established, idle",
            setup: established,
            linux: Ok(OUT),
            pier_differs: None,
        },
        Case {
            // IN: notify_poll_in (bytes >= SO_RCVLOWAT / a message queued); OUT: credit > 0.
            name: "established, data queued to read",
            setup: established_with_data,
            linux: Ok(IN | OUT),
            pier_differs: None,
        },
        Case {
            // No OUT: ESTABLISHED but free credit is 0; nothing else applies.
            name: "established, peer's credit exhausted",
            setup: credit_exhausted,
            linux: Ok(NONE),
            pier_differs: None,
        },
        Case {
            // RDHUP and IN: sk_shutdown & RCV; OUT: ESTABLISHED, no SEND shutdown, credit > 0.
            name: "local SHUT_RD",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Read),
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // No OUT: SEND shutdown disables both OUT rules; no HUP: the peer still sends.
            name: "local SHUT_WR",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Write),
            linux: Ok(NONE),
            pier_differs: Some((OUT, SEND_FAILS)),
        },
        Case {
            // HUP: sk_shutdown == SHUTDOWN_MASK; RDHUP and IN: RCV shutdown; no OUT: SEND
            // shutdown. (The peer answers our SHUTDOWN with RST: CLOSING, same mask.)
            name: "local SHUT_RDWR",
            setup: |lb, ty| local_shutdown(lb, ty, Shutdown::Both),
            linux: Ok(IN | RDHUP | HUP),
            pier_differs: Some((IN | OUT | RDHUP | HUP, SEND_FAILS)),
        },
        Case {
            // RDHUP and IN: peer_shutdown & SEND (EOF); OUT: ESTABLISHED, credit > 0.
            name: "peer SHUT_WR (EOF)",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Write),
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // OUT: still ESTABLISHED with credit (a send would fail with EPIPE, but poll
            // does not look at peer_shutdown & RCV); nothing else applies.
            name: "peer SHUT_RD",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Read),
            linux: Ok(OUT),
            pier_differs: None,
        },
        Case {
            // RDHUP and IN: peer_shutdown & SEND; OUT: CLOSING (nothing left to read) without
            // a local SEND shutdown; no HUP: we did not shut SEND.
            name: "peer SHUT_RDWR",
            setup: |lb, ty| peer_shutdown(lb, ty, Shutdown::Both),
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // The peer's close is SHUTDOWN with both flags: as the row above.
            name: "peer closed",
            setup: peer_closed,
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // HUP: our SEND shutdown and the peer's SEND shutdown; RDHUP and IN: peer SEND;
            // no OUT: our SEND shutdown.
            name: "both sides SHUT_WR",
            setup: both_shut_wr,
            linux: Ok(IN | RDHUP | HUP),
            pier_differs: Some((IN | OUT | RDHUP | HUP, SEND_FAILS)),
        },
        Case {
            // virtio_transport_do_close: peer_shutdown = SHUTDOWN_MASK, CLOSING, no sk_err.
            // RDHUP and IN: peer SEND; OUT: CLOSING without a local SEND shutdown.
            name: "reset by the peer while connected",
            setup: |lb, ty| reset_by_peer(lb, ty, false),
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // As above, but with data queued do_close leaves it ESTABLISHED: IN and RDHUP
            // from peer SEND, OUT from the credit last granted.
            name: "reset by the peer with data queued",
            setup: |lb, ty| reset_by_peer(lb, ty, true),
            linux: Ok(IN | OUT | RDHUP),
            pier_differs: None,
        },
        Case {
            // RST while connecting: CLOSE with sk_err = ECONNRESET. ERR: sk_err; OUT: CLOSE
            // rule; no IN (no data, no shutdown).
            name: "RST while connecting (refused)",
            setup: refused,
            linux: Ok(ERR | OUT),
            pier_differs: None,
        },
        Case {
            // SO_ERROR (finish_connect) cleared sk_err: only the CLOSE rule's OUT is left.
            name: "refused, error collected",
            setup: refused_error_collected,
            linux: Ok(OUT),
            pier_differs: None,
        },
        Case {
            // vsock_connect_timeout: CLOSE with sk_err = ETIMEDOUT. ERR: sk_err; OUT: CLOSE.
            name: "connect timed out",
            setup: timed_out,
            linux: Ok(ERR | OUT),
            pier_differs: None,
        },
        Case {
            // close(2) released the descriptor: poll reports POLLNVAL.
            name: "closed by us",
            setup: closed,
            linux: Err(Error::BadHandle),
            pier_differs: None,
        },
        Case {
            // A new socket is in CLOSE: OUT from the CLOSE rule, nothing else.
            name: "unconnected",
            setup: unconnected,
            linux: Ok(OUT),
            pier_differs: None,
        },
        Case {
            // LISTEN, accept queue empty: no rule applies.
            name: "listener, nothing pending",
            setup: |lb, ty| (Side::B, listener(lb, Side::B, ty, PORT)),
            linux: Ok(NONE),
            pier_differs: None,
        },
        Case {
            // IN: LISTEN with a connection in the accept queue.
            name: "listener, a connection pending",
            setup: listener_with_pending,
            linux: Ok(IN),
            pier_differs: None,
        },
    ]
}

/// Datagram rows: IN with a datagram queued or after SHUT_RD; OUT unless
/// SHUT_WR; RDHUP and HUP from the rules common to every socket type.
fn datagram_rows() -> Vec<Row> {
    let row = |name, setup, linux, pier_differs| Row {
        name,
        ty: SocketType::Datagram,
        setup,
        linux,
        pier_differs,
    };
    vec![
        // OUT: no SEND shutdown.
        row(
            "datagram, fresh",
            dgram_fresh as fn(&mut Loopback, SocketType) -> Probe,
            Ok(OUT),
            None,
        ),
        // IN: the receive queue is not empty; OUT: no SEND shutdown.
        row("datagram, one queued", dgram_queued, Ok(IN | OUT), None),
        // IN and RDHUP: RCV shutdown; OUT: no SEND shutdown.
        row(
            "datagram, SHUT_RD",
            |lb, _| dgram_shutdown(lb, Shutdown::Read),
            Ok(IN | OUT | RDHUP),
            None,
        ),
        // SEND shutdown: no OUT; nothing else applies.
        row(
            "datagram, SHUT_WR",
            |lb, _| dgram_shutdown(lb, Shutdown::Write),
            Ok(NONE),
            Some((OUT, SEND_FAILS)),
        ),
        // HUP: both shut; IN and RDHUP: RCV shutdown; no OUT: SEND shutdown.
        row(
            "datagram, SHUT_RDWR",
            |lb, _| dgram_shutdown(lb, Shutdown::Both),
            Ok(IN | RDHUP | HUP),
            Some((IN | OUT | RDHUP | HUP, SEND_FAILS)),
        ),
    ]
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for case in connectible_cases() {
        for ty in [SocketType::Stream, SocketType::SeqPacket] {
            rows.push(Row {
                name: case.name,
                ty,
                setup: case.setup,
                linux: case.linux,
                pier_differs: case.pier_differs,
            });
        }
    }
    rows.extend(datagram_rows());
    rows
}

/// Every row, on a fresh pair of stacks; all mismatches in one message.
#[test]
fn readiness_matches_vsock_poll_in_every_state() {
    let mut failures = String::new();
    let rows = rows();
    for row in &rows {
        let mut lb = pair();
        let (side, h) = (row.setup)(&mut lb, row.ty);
        let got = lb.stack(side).readiness(h);
        let want = match row.pier_differs {
            Some((pier, _)) => Ok(pier),
            None => row.linux,
        };
        if got != want {
            let _ = writeln!(
                failures,
                "  {:?} {}: got {:?}, want {:?} (Linux {:?}{})",
                row.ty,
                row.name,
                got,
                want,
                row.linux,
                row.pier_differs.map_or(String::new(), |(_, why)| format!(
                    "; pier differs on purpose: docs/linux-behaviours.md#{why}"
                )),
            );
        }
    }
    assert!(failures.is_empty(), "readiness differs from the table:\n{failures}");
    assert!(rows.len() >= 40, "every case runs for stream and seqpacket");
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
        buf_alloc: 262_144,
        fwd_cnt: 0,
    };
    let now = lb.now();
    let mut wakes = WakeList::new();
    lb.a.receive_batch(now, [&rst.encode()[..]], &mut wakes);
    wakes.wake_all();
    lb.run();
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
