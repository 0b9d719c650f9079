//! Every socket call's failure modes, checked against what Linux's
//! AF_VSOCK returns for the same call in the same state.
mod common;

use std::time::Duration;

use common::*;
use pier_stack::phy::Side;
use pier_stack::{
    Config, Error, Shutdown, SocketType, VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY,
    VsockAddr,
};

fn any(port: u32) -> VsockAddr {
    VsockAddr::new(VMADDR_CID_ANY, port)
}

#[test]
fn errno_values_are_linux_values() {
    let table = [
        (Error::WouldBlock, 11),
        (Error::Already, 114),
        (Error::IsConnected, 106),
        (Error::NotConnected, 107),
        (Error::InvalidArgument, 22),
        (Error::AddressInUse, 98),
        (Error::AddressNotAvailable, 99),
        (Error::PermissionDenied, 13),
        (Error::ConnectionReset, 104),
        (Error::TimedOut, 110),
        (Error::BrokenPipe, 32),
        (Error::MessageTooLarge, 90),
        (Error::NotSupported, 95),
        (Error::SocketTypeNotSupported, 94),
        (Error::Protocol, 71),
        (Error::SocketLimit, 24),
        (Error::BadHandle, 9),
        (Error::Fault, 14),
    ];
    for (err, errno) in table {
        assert_eq!(err.errno(), errno, "{err:?}");
    }
}

#[test]
fn bind_errors() {
    let mut lb = pair();
    let s = &mut lb.a;
    let a = s.socket(SocketType::Stream).unwrap();
    s.bind(a, any(4000)).unwrap();
    assert_eq!(s.bind(a, any(4001)), Err(Error::InvalidArgument), "already bound");
    let b = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.bind(b, any(4000)), Err(Error::AddressInUse));
    assert_eq!(s.bind(b, VsockAddr::new(42, 4002)), Err(Error::AddressNotAvailable), "not our CID");
    s.bind(b, VsockAddr::new(VMADDR_CID_LOCAL, 4002)).unwrap();
    let c = s.socket(SocketType::SeqPacket).unwrap();
    assert_eq!(s.bind(c, any(4000)), Err(Error::AddressInUse), "stream and seqpacket share ports");

    let mut strict = pair_with(|c: &mut Config| c.allow_privileged_ports = false);
    let p = strict.a.socket(SocketType::Stream).unwrap();
    assert_eq!(strict.a.bind(p, any(80)), Err(Error::PermissionDenied));
    strict.a.bind(p, any(1024)).unwrap();
}

/// Linux tries 24 successive ports, then gives up with EADDRNOTAVAIL.
#[test]
fn ephemeral_ports_run_out_after_24_tries() {
    let mut lb = pair_with(|c: &mut Config| c.ephemeral_seed = 0);
    let s = &mut lb.a;
    for port in 1024..1024 + 24 {
        let h = s.socket(SocketType::Stream).unwrap();
        s.bind(h, any(port)).unwrap();
    }
    let h = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.bind(h, any(VMADDR_PORT_ANY)), Err(Error::AddressNotAvailable));
    let h2 = s.socket(SocketType::Stream).unwrap();
    s.bind(h2, any(VMADDR_PORT_ANY)).unwrap();
    assert_eq!(s.local_addr(h2).unwrap().port, 1024 + 24, "the search moved past the busy run");
}

#[test]
fn listen_and_accept_errors() {
    let mut lb = pair();
    let now = lb.now();
    let s = &mut lb.b;
    let unbound = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.listen(unbound, 1), Err(Error::InvalidArgument), "listen does not auto-bind");
    assert_eq!(s.accept(unbound), Err(Error::InvalidArgument));
    let d = s.socket(SocketType::Datagram).unwrap();
    s.bind(d, any(5000)).unwrap();
    assert_eq!(s.listen(d, 1), Err(Error::NotSupported));
    assert_eq!(s.accept(d), Err(Error::NotSupported));
    let l = s.socket(SocketType::Stream).unwrap();
    s.bind(l, any(5000)).unwrap();
    s.listen(l, 1).unwrap();
    s.listen(l, 8).unwrap();
    assert_eq!(s.connect(l, VsockAddr::new(GUEST, 1), now), Err(Error::InvalidArgument));
    assert_eq!(lb.b.send(l, b"x"), Err(Error::NotConnected));
    assert_eq!(lb.b.recv(l, &mut [0u8; 4]), Err(Error::NotConnected));
    assert_eq!(lb.b.shutdown(l, Shutdown::Both), Err(Error::NotConnected));
}

#[test]
fn connect_errors() {
    let mut lb = pair();
    listener(&mut lb, Side::B, SocketType::Stream, 1234);
    let now = lb.now();
    let c = lb.a.socket(SocketType::Stream).unwrap();
    assert_eq!(
        lb.a.connect(c, VsockAddr::new(VMADDR_CID_ANY, 1234), now),
        Err(Error::InvalidArgument)
    );
    assert_eq!(
        lb.a.connect(c, VsockAddr::new(HOST, VMADDR_PORT_ANY), now),
        Err(Error::InvalidArgument)
    );
    lb.a.connect(c, VsockAddr::new(HOST, 1234), now).unwrap();
    assert_eq!(lb.a.finish_connect(c), Err(Error::WouldBlock));
    assert_eq!(lb.a.connect(c, VsockAddr::new(HOST, 1234), now), Err(Error::Already));
    assert_eq!(lb.a.send(c, b"early"), Err(Error::NotConnected), "ENOTCONN while connecting");
    lb.run();
    lb.a.finish_connect(c).unwrap();
    assert_eq!(lb.a.connect(c, VsockAddr::new(HOST, 1234), now), Err(Error::IsConnected));
    assert_eq!(lb.a.listen(c, 1), Err(Error::InvalidArgument));
    let fresh = lb.a.socket(SocketType::Stream).unwrap();
    assert_eq!(lb.a.finish_connect(fresh), Err(Error::NotConnected));
}

#[test]
fn unconnected_socket_errors() {
    let mut lb = pair();
    let s = &mut lb.a;
    let h = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.send(h, b"x"), Err(Error::NotConnected));
    assert_eq!(s.recv(h, &mut [0u8; 4]), Err(Error::NotConnected));
    assert_eq!(s.shutdown(h, Shutdown::Write), Err(Error::NotConnected));
    assert_eq!(s.peer_addr(h), Err(Error::NotConnected));
    assert_eq!(s.local_addr(h), Err(Error::InvalidArgument), "unbound");
    let q = s.socket(SocketType::SeqPacket).unwrap();
    assert_eq!(s.send_message(q, b"m", false), Err(Error::NotConnected));
    let st = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.send_message(st, b"m", false), Err(Error::NotSupported));
    assert_eq!(s.send_to(st, b"m", VsockAddr::new(HOST, 1)), Err(Error::NotSupported));
}

#[test]
fn shutdown_gives_broken_pipe_before_not_connected() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    lb.a.shutdown(c, Shutdown::Write).unwrap();
    assert_eq!(lb.a.send(c, b"x"), Err(Error::BrokenPipe));
    lb.run();
    // The peer's shutdown of its read side makes our sends fail too.
    lb.a.shutdown(c, Shutdown::Read).unwrap();
    lb.run();
    assert_eq!(lb.b.send(s, b"x"), Err(Error::BrokenPipe));
    // Our own SHUT_RD reads as EOF at once, even with data queued.
    assert!(lb.a.recv(c, &mut [0u8; 4]).unwrap().eof);
}

#[test]
fn closed_handles_are_bad_handles() {
    let mut lb = pair();
    let (c, _s) = connected(&mut lb, SocketType::Stream, 1234);
    let now = lb.now();
    lb.a.close(c, now).unwrap();
    assert_eq!(lb.a.close(c, now), Err(Error::BadHandle));
    assert_eq!(lb.a.send(c, b"x"), Err(Error::BadHandle));
    assert_eq!(lb.a.recv(c, &mut [0u8; 1]), Err(Error::BadHandle));
    assert_eq!(lb.a.readiness(c), Err(Error::BadHandle));
}

#[test]
fn socket_limit_is_a_clear_error() {
    let mut lb = pair_with(|c: &mut Config| c.max_sockets = 4);
    for _ in 0..4 {
        lb.a.socket(SocketType::Stream).unwrap();
    }
    assert_eq!(lb.a.socket(SocketType::Stream), Err(Error::SocketLimit));
}

#[test]
fn seqpacket_message_too_large_for_the_peer() {
    let mut lb = pair();
    let (c, _s) = connected(&mut lb, SocketType::SeqPacket, 1234);
    let cap = lb.a.buffer_size(c).unwrap() as usize;
    assert_eq!(lb.a.send_message(c, &vec![0; cap + 1], false), Err(Error::MessageTooLarge));
    lb.a.send_message(c, &vec![0; cap], false).unwrap();
}

#[test]
fn option_errors_and_clamps() {
    let mut lb = pair();
    let (c, _s) = connected(&mut lb, SocketType::Stream, 1234);
    assert_eq!(lb.a.set_rcvlowat(c, 256 * 1024 + 1), Err(Error::InvalidArgument));
    lb.a.set_rcvlowat(c, 0).unwrap();
    assert_eq!(lb.a.rcvlowat(c), Ok(1), "0 means 1, as in Linux");
    lb.a.set_buffer_size(c, 1).unwrap();
    assert_eq!(lb.a.buffer_size(c), Ok(128), "clamped to the minimum");
    lb.a.set_buffer_size(c, 1 << 30).unwrap();
    assert_eq!(lb.a.buffer_size(c), Ok(256 * 1024), "clamped to the maximum");
    assert_eq!(lb.a.set_connect_timeout(c, Duration::ZERO), Err(Error::InvalidArgument));
}

/// A connect nobody answers fails with ETIMEDOUT at exactly the timeout,
/// and a RESPONSE that turns up later draws an RST.
#[test]
fn connect_times_out_and_late_response_is_reset() {
    let mut lb = pair();
    // The host never sees the REQUEST: connect to a CID nobody serves.
    let c = lb.a.socket(SocketType::Stream).unwrap();
    lb.a.connect(c, VsockAddr::new(77, 1234), lb.now()).unwrap();
    lb.run();
    assert_eq!(lb.a.poll_at(), Some(lb.now() + Duration::from_secs(2)));
    lb.advance(Duration::from_millis(1999));
    assert_eq!(lb.a.finish_connect(c), Err(Error::WouldBlock));
    lb.advance(Duration::from_millis(1));
    assert_eq!(lb.a.finish_connect(c), Err(Error::TimedOut));
    assert_eq!(lb.a.finish_connect(c), Err(Error::NotConnected), "the error is reported once");
    assert_eq!(lb.a.poll_at(), None);

    // A RESPONSE for that connection now finds no socket: RST.
    let local = lb.a.local_addr(c).unwrap();
    let late = pier_stack::wire::Header {
        src_cid: 77,
        dst_cid: GUEST as u64,
        src_port: 1234,
        dst_port: local.port,
        len: 0,
        socket_type: SocketType::Stream,
        op: pier_stack::wire::Op::Response,
        flags: 0,
        buf_alloc: 4096,
        fwd_cnt: 0,
    };
    let mut wakes = pier_stack::WakeList::new();
    lb.a.receive_batch(lb.now(), [&late.encode()[..]], &mut wakes);
    lb.run();
    assert_eq!(lb.a.stats().rst_sent(pier_stack::RstReason::StrayResponse), 1);
}

/// The timeout is a per-socket option.
#[test]
fn connect_timeout_is_configurable() {
    let mut lb = pair();
    let c = lb.a.socket(SocketType::Stream).unwrap();
    lb.a.set_connect_timeout(c, Duration::from_millis(300)).unwrap();
    lb.a.connect(c, VsockAddr::new(77, 1), lb.now()).unwrap();
    lb.run();
    lb.advance(Duration::from_millis(300));
    assert_eq!(lb.a.finish_connect(c), Err(Error::TimedOut));
}

/// Calls that belong to another socket type fail the way they always
/// have on a datagram socket, and the datagram-only call on a stream.
#[test]
fn calls_of_another_socket_type() {
    let mut lb = pair();
    let now = lb.now();
    let s = &mut lb.a;
    let d = s.socket(SocketType::Datagram).unwrap();
    assert_eq!(s.confirm(d), Err(Error::InvalidArgument));
    assert_eq!(s.refuse(d), Err(Error::InvalidArgument));
    assert_eq!(s.finish_connect(d), Err(Error::NotConnected));
    assert_eq!(s.send_space(d), Err(Error::NotSupported));
    assert_eq!(s.send_with(d, |_, _| Ok::<_, ()>(0)), Err(Error::NotSupported));
    assert_eq!(s.send_message(d, b"m", false), Err(Error::NotSupported));
    assert_eq!(s.listen_catch_all(d, 1), Err(Error::NotSupported));
    assert_eq!(s.is_listening(d), Ok(false));
    assert_eq!(s.shutdown(d, Shutdown::Both), Err(Error::NotConnected));
    assert_eq!(s.peer_addr(d), Err(Error::NotConnected));
    s.connect(d, VsockAddr::new(HOST, 9), now).unwrap();
    assert_eq!(s.peer_addr(d), Ok(VsockAddr::new(HOST, 9)));
    s.shutdown(d, Shutdown::Write).unwrap();
    assert_eq!(s.send(d, b"x"), Err(Error::BrokenPipe));
    assert_eq!(s.send_to(d, b"x", VsockAddr::new(HOST, VMADDR_PORT_ANY)), Err(Error::BrokenPipe));
    s.set_rcvlowat(d, 1 << 30).unwrap();
    assert_eq!(s.rcvlowat(d), Ok(1 << 30));
    s.set_buffer_size(d, 4096).unwrap();
    assert_eq!(s.buffer_size(d), Ok(4096));
    let st = s.socket(SocketType::Stream).unwrap();
    assert_eq!(s.confirm(st), Err(Error::InvalidArgument));
    assert_eq!(s.refuse(st), Err(Error::InvalidArgument));
    assert_eq!(s.send_to(st, b"x", VsockAddr::new(HOST, 9)), Err(Error::NotSupported));
    s.close(d, now).unwrap();
    assert_eq!(s.send_queued(d), Err(Error::BadHandle));
}
