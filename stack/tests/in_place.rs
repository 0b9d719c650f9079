//! Stream bytes sent in place over the loopback harness
//! (`Loopback::send_in_place`): they skip the sender's send ring while
//! nothing of the connection is queued ahead and the peer's credit allows,
//! and arrive whole and in order however the two ways of sending mix.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{connected, pair, recv_exact};
use pier_stack::phy::{Side, Tracer};
use pier_stack::{Error, SocketType};

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn an_in_place_send_reaches_the_peer_without_a_step_or_the_send_ring() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1000);
    let data = pattern(10_000);
    assert_eq!(lb.send_in_place(Side::A, c, &data).unwrap(), data.len());
    assert_eq!(lb.a.send_queued(c).unwrap(), 0, "nothing should wait in the send ring");
    assert_eq!(lb.b.recv_queued(s).unwrap(), data.len(), "the peer holds it before any step");
    assert_eq!(recv_exact(&mut lb, Side::B, s, data.len()), data);
}

#[test]
fn an_in_place_send_stops_at_the_peers_credit_and_the_rest_follows_as_the_peer_reads() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1000);
    let data = pattern(3 << 20);
    let credit = lb.a.send_space(c).unwrap();
    assert!(credit < data.len(), "the write must be larger than the peer's buffer");
    assert_eq!(lb.send_in_place(Side::A, c, &data).unwrap(), credit);
    assert_eq!(lb.send_in_place(Side::A, c, &data[credit..]), Err(Error::WouldBlock));

    let mut sent = credit;
    let mut received = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 100_000];
    while received.len() < data.len() {
        if let Ok(info) = lb.b.recv(s, &mut buf) {
            received.extend_from_slice(&buf[..info.len]);
        }
        lb.run();
        if sent < data.len() {
            sent += lb.send_in_place(Side::A, c, &data[sent..]).unwrap_or(0);
        }
    }
    assert!(received == data, "the bytes arrived changed or out of order");
}

#[test]
fn bytes_queued_by_send_leave_before_a_later_in_place_send() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1000);
    assert_eq!(lb.a.send(c, b"first,").unwrap(), 6);
    assert_eq!(lb.send_in_place(Side::A, c, b"second").unwrap(), 6);
    assert_eq!(lb.a.send_queued(c).unwrap(), 12, "the later bytes must queue behind the first");
    assert_eq!(lb.b.recv_queued(s).unwrap(), 0);
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::B, s, 12), b"first,second");
}

#[test]
fn with_middleware_an_in_place_packet_is_framed_and_passes_the_chain_at_the_next_step() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1000);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    lb.add_middleware(Tracer::new(move |event| {
        if let Ok(header) = event.packet {
            log.borrow_mut().push((event.from, header.len));
        }
    }));
    let data = pattern(5000);
    assert_eq!(lb.send_in_place(Side::A, c, &data).unwrap(), data.len());
    assert_eq!(lb.a.send_queued(c).unwrap(), 0);
    assert_eq!(lb.b.recv_queued(s).unwrap(), 0, "a framed packet waits for the step");
    lb.run();
    assert!(seen.borrow().contains(&(Side::A, 5000)), "the tracer saw {:?}", seen.borrow());
    assert_eq!(recv_exact(&mut lb, Side::B, s, data.len()), data);
}

#[test]
fn under_a_transmit_capacity_an_in_place_send_goes_through_the_send_ring() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1000);
    lb.set_tx_capacity(1);
    let data = pattern(2000);
    assert_eq!(lb.send_in_place(Side::A, c, &data).unwrap(), data.len());
    assert_eq!(lb.a.send_queued(c).unwrap(), data.len());
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::B, s, data.len()), data);
}

#[test]
fn an_in_place_send_on_a_seqpacket_socket_sends_one_message_as_send_does() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::SeqPacket, 1000);
    assert_eq!(lb.send_in_place(Side::A, c, b"one message").unwrap(), 11);
    lb.run();
    let mut buf = [0u8; 64];
    let info = lb.b.recv(s, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"one message");
}
