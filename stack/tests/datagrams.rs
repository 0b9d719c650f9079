//! Datagram sockets (feature bit 3, the virtio-vsock datagram RFC): one
//! packet per datagram, no credit, no RST, a port space of their own, and
//! every drop counted by reason (`docs/linux-behaviours.md#datagrams`).
mod common;

use common::*;
use pier_stack::phy::Side;
use pier_stack::wire::{Header, Op};
use pier_stack::{
    Config, DropReason, Error, Features, Readiness, SocketType, VMADDR_CID_ANY, VMADDR_CID_LOCAL,
    VsockAddr,
};
use pier_testkit::pattern::xorshift32_bytes;

fn dgram(
    lb: &mut pier_stack::phy::Loopback,
    side: Side,
    port: Option<u32>,
) -> pier_stack::SocketHandle {
    let s = lb.stack(side);
    let h = s.socket(SocketType::Datagram).unwrap();
    if let Some(port) = port {
        s.bind(h, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
    }
    h
}

/// An empty datagram-typed packet from guest port 1500 to host port 5000.
fn guest_datagram(op: Op) -> Header {
    Header {
        src_cid: GUEST as u64,
        dst_cid: HOST as u64,
        src_port: 1500,
        dst_port: 5000,
        len: 0,
        socket_type: SocketType::Datagram,
        op,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    }
}

/// sendto / recvfrom both ways: the receiver learns the sender's address
/// and can answer it.
#[test]
fn dgram_sendto_recvfrom_round_trip() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    lb.a.send_to(client, b"ping", VsockAddr::new(HOST, 5000)).unwrap();
    lb.run();
    let mut buf = [0u8; 16];
    let info = lb.b.recv(server, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"ping");
    let from = info.from.unwrap();
    assert_eq!(from, lb.a.local_addr(client).map(|a| VsockAddr::new(GUEST, a.port)).unwrap());
    lb.b.send_to(server, b"pong", from).unwrap();
    lb.run();
    let info = lb.a.recv(client, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"pong");
    assert_eq!(info.from, Some(VsockAddr::new(HOST, 5000)));
}

/// The first send binds an unbound socket to an ephemeral port above 1023.
#[test]
fn dgram_auto_binds_on_first_send() {
    let mut lb = pair();
    let _server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    assert_eq!(lb.a.local_addr(client), Err(Error::InvalidArgument), "unbound before");
    lb.a.send_to(client, b"x", VsockAddr::new(HOST, 5000)).unwrap();
    let port = lb.a.local_addr(client).unwrap().port;
    assert!(port > 1023 && port != u32::MAX, "ephemeral port {port}");
}

/// Datagram ports are a space of their own: a stream listener and a
/// datagram socket share a port number, and a second datagram bind of it fails.
#[test]
fn dgram_port_space_is_separate_from_streams() {
    let mut lb = pair();
    let l = listener(&mut lb, Side::B, SocketType::Stream, 7000);
    let d = dgram(&mut lb, Side::B, Some(7000));
    let other = lb.b.socket(SocketType::Datagram).unwrap();
    assert_eq!(lb.b.bind(other, VsockAddr::new(VMADDR_CID_ANY, 7000)), Err(Error::AddressInUse));

    let (_c, outcome) =
        try_connect(&mut lb, Side::A, SocketType::Stream, VsockAddr::new(HOST, 7000));
    outcome.unwrap();
    assert!(lb.b.accept(l).is_ok());
    let client = dgram(&mut lb, Side::A, None);
    lb.a.send_to(client, b"datagram", VsockAddr::new(HOST, 7000)).unwrap();
    lb.run();
    let mut buf = [0u8; 16];
    assert_eq!(lb.b.recv(d, &mut buf).unwrap().len, 8);
}

/// connect sets a default peer for send; without one, send is EINVAL as in Linux.
#[test]
fn dgram_connect_sets_default_peer() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    assert_eq!(lb.a.send(client, b"nowhere"), Err(Error::InvalidArgument));
    lb.a.connect(client, VsockAddr::new(HOST, 5000), lb.now()).unwrap();
    assert_eq!(lb.a.peer_addr(client), Ok(VsockAddr::new(HOST, 5000)));
    assert_eq!(lb.a.send(client, b"default"), Ok(7));
    lb.run();
    let mut buf = [0u8; 16];
    let info = lb.b.recv(server, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"default");
}

/// A datagram for a port nobody bound is dropped and counted; no RST goes back.
#[test]
fn dgram_without_receiver_is_dropped_silently() {
    let mut lb = pair();
    let client = dgram(&mut lb, Side::A, None);
    lb.a.send_to(client, b"lost", VsockAddr::new(HOST, 9999)).unwrap();
    lb.run();
    assert_eq!(lb.b.stats().dropped(DropReason::DatagramNoSocket), 1);
    assert_eq!(lb.b.stats().rst_sent_total(), 0);
    assert_eq!(lb.a.stats().rst_received, 0);
    assert_eq!(lb.a.stats().rx_packets, 0, "nothing came back");
}

/// A receiver whose buffer is full drops new datagrams and counts them;
/// what was queued is kept and what is dropped is exactly the excess.
#[test]
fn dgram_full_receive_buffer_drops_and_counts() {
    let mut lb = pair_with(|c: &mut Config| c.datagram_receive_buffer = 4096);
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    for i in 0..10u8 {
        lb.a.send_to(client, &[i; 1000], VsockAddr::new(HOST, 5000)).unwrap();
    }
    lb.run();
    assert_eq!(lb.b.stats().dropped(DropReason::DatagramReceiveBufferFull), 6);
    let mut buf = [0u8; 2000];
    for i in 0..4u8 {
        let info = lb.b.recv(server, &mut buf).unwrap();
        assert_eq!(info.len, 1000);
        assert_eq!(buf[0], i, "queued datagrams kept in order");
    }
    assert_eq!(lb.b.recv(server, &mut buf), Err(Error::WouldBlock));
    assert_eq!(lb.a.stats().rst_received, 0);
}

/// At most 64 KiB per datagram, and one datagram is one packet.
#[test]
fn dgram_is_one_packet_of_at_most_64k() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    let to = VsockAddr::new(HOST, 5000);
    assert_eq!(lb.a.send_to(client, &vec![0; 65537], to), Err(Error::MessageTooLarge));
    let before = lb.a.stats().tx_packets;
    lb.a.send_to(client, &xorshift32_bytes(3, 65536), to).unwrap();
    lb.run();
    assert_eq!(lb.a.stats().tx_packets - before, 1);
    let mut buf = vec![0u8; 70000];
    let info = lb.b.recv(server, &mut buf).unwrap();
    assert_eq!(info.len, 65536);
    assert_eq!(&buf[..65536], &xorshift32_bytes(3, 65536)[..]);
}

/// No credit: the sender throttles itself on its own send buffer.
#[test]
fn dgram_sender_blocks_on_its_send_buffer() {
    let mut lb = pair_with(|c: &mut Config| c.datagram_send_buffer = 8192);
    let _server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    let to = VsockAddr::new(HOST, 5000);
    let mut queued = 0;
    loop {
        match lb.a.send_to(client, &[1; 1000], to) {
            Ok(()) => queued += 1000,
            Err(Error::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(queued, 8000);
    assert_eq!(lb.a.send_queued(client).unwrap(), 8000);
    assert!(!lb.a.readiness(client).unwrap().contains(Readiness::WRITABLE));
    lb.run();
    assert_eq!(lb.a.send_queued(client).unwrap(), 0);
    assert!(lb.a.readiness(client).unwrap().contains(Readiness::WRITABLE));
    lb.a.send_to(client, &[1; 1000], to).unwrap();
}

/// A short buffer truncates: the rest of the datagram is discarded, the
/// full length is reported, and peek leaves the datagram queued.
#[test]
fn dgram_truncation_and_peek() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    let to = VsockAddr::new(HOST, 5000);
    lb.a.send_to(client, b"0123456789", to).unwrap();
    lb.a.send_to(client, b"next", to).unwrap();
    lb.run();
    let mut small = [0u8; 4];
    let peeked = lb.b.peek(server, &mut small).unwrap();
    assert_eq!((peeked.len, peeked.message_len, peeked.truncated), (4, 10, true));
    let info = lb.b.recv(server, &mut small).unwrap();
    assert_eq!(&small, b"0123");
    assert_eq!((info.len, info.message_len, info.truncated), (4, 10, true));
    assert_eq!(info.inq, 4, "the next datagram is still queued");
    let info = lb.b.recv(server, &mut small).unwrap();
    assert_eq!(&small[..info.len], b"next");
    assert!(!info.truncated);
    assert_eq!(info.inq, 0);
}

/// Datagrams to our own CID or to CID 1 are delivered inside the stack.
#[test]
fn dgram_loopback_inside_one_stack() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::A, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    lb.a.send_to(client, b"to myself", VsockAddr::new(GUEST, 5000)).unwrap();
    lb.a.send_to(client, b"to local", VsockAddr::new(VMADDR_CID_LOCAL, 5000)).unwrap();
    lb.run();
    let mut buf = [0u8; 32];
    let first = lb.a.recv(server, &mut buf).unwrap();
    assert_eq!(&buf[..first.len], b"to myself");
    let second = lb.a.recv(server, &mut buf).unwrap();
    assert_eq!(&buf[..second.len], b"to local");
    assert_eq!(second.from.unwrap().cid, VMADDR_CID_LOCAL);
    assert_eq!(lb.a.stats().tx_packets, 0, "nothing reached the device");
    assert_eq!(lb.b.stats().rx_packets, 0);
}

/// Without the datagram feature no datagram socket can be made, and
/// datagram packets are dropped, never answered.
#[test]
fn dgram_needs_the_feature() {
    let mut lb =
        pair_with(|c: &mut Config| c.features = Features { datagram: false, ..Features::ALL });
    assert_eq!(lb.b.socket(SocketType::Datagram), Err(Error::SocketTypeNotSupported));
    let mut wakes = pier_stack::WakeList::new();
    lb.b.receive_batch(lb.now(), [&guest_datagram(Op::Rw).encode()[..]], &mut wakes);
    assert_eq!(lb.b.stats().dropped(DropReason::TypeNotNegotiated), 1);
    assert!(!lb.b.has_pending_tx(), "no RST for a datagram");
}

/// A datagram-typed packet with any op but RW is dropped, never answered.
#[test]
fn dgram_wrong_op_is_dropped() {
    let mut lb = pair();
    let _server = dgram(&mut lb, Side::B, Some(5000));
    let mut wakes = pier_stack::WakeList::new();
    for op in [Op::Request, Op::Rst, Op::Shutdown, Op::CreditRequest] {
        lb.b.receive_batch(lb.now(), [&guest_datagram(op).encode()[..]], &mut wakes);
    }
    assert_eq!(lb.b.stats().dropped(DropReason::DatagramBadOp), 4);
    assert!(!lb.b.has_pending_tx());
}

/// Many small datagrams arrive whole and in order; the byte count and the
/// packet count match.
#[test]
fn dgram_many_in_order() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    let to = VsockAddr::new(HOST, 5000);
    let mut buf = [0u8; 512];
    for round in 0..50u32 {
        for i in 0..20u32 {
            let msg = xorshift32_bytes(round * 20 + i, 1 + ((round * 20 + i) % 300) as usize);
            lb.a.send_to(client, &msg, to).unwrap();
        }
        lb.run();
        for i in 0..20u32 {
            let want = xorshift32_bytes(round * 20 + i, 1 + ((round * 20 + i) % 300) as usize);
            let info = lb.b.recv(server, &mut buf).unwrap();
            assert_eq!(&buf[..info.len], &want[..]);
        }
    }
    assert_eq!(lb.b.stats().dropped_total(), 0);
}

/// Readiness: readable only with a datagram queued; closing frees the port.
#[test]
fn dgram_readiness_and_close_frees_port() {
    let mut lb = pair();
    let server = dgram(&mut lb, Side::B, Some(5000));
    let client = dgram(&mut lb, Side::A, None);
    assert!(!lb.b.readiness(server).unwrap().contains(Readiness::READABLE));
    lb.a.send_to(client, b"x", VsockAddr::new(HOST, 5000)).unwrap();
    lb.run();
    assert!(lb.b.readiness(server).unwrap().contains(Readiness::READABLE));
    lb.b.close(server, lb.now()).unwrap();
    assert_eq!(lb.b.recv(server, &mut [0u8; 4]), Err(Error::BadHandle));
    let again = dgram(&mut lb, Side::B, Some(5000));
    assert!(lb.b.readiness(again).unwrap().contains(Readiness::WRITABLE));
}
