//! The blocking datagram shell: `VsockDatagram`.

use std::io::ErrorKind;

use super::{assert_kind, dialable};
use crate::addr::{VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::datagram::VsockDatagram;

/// A socket on a free port, and the address to reach it at.
fn bound() -> (VsockDatagram, VsockAddr) {
    let socket = VsockDatagram::bind(VsockAddr::new(VMADDR_CID_LOCAL, VMADDR_PORT_ANY)).unwrap();
    let addr = dialable(socket.local_addr().unwrap());
    (socket, addr)
}

#[test]
fn a_datagram_arrives_whole_with_its_senders_address() {
    let (a, a_addr) = bound();
    let (b, b_addr) = bound();
    assert_eq!(a.send_to(b"ping", b_addr).unwrap(), 4);
    let mut buf = [0; 16];
    assert_eq!(b.recv_from(&mut buf).unwrap(), (4, a_addr));
    assert_eq!(&buf[..4], b"ping");
}

#[test]
fn what_does_not_fit_the_buffer_is_discarded() {
    let (a, _) = bound();
    let (b, b_addr) = bound();
    a.send_to(b"0123456789", b_addr).unwrap();
    a.send_to(b"xy", b_addr).unwrap();
    let mut small = [0; 3];
    assert_eq!(b.recv(&mut small).unwrap(), 3);
    assert_eq!(&small, b"012");
    assert_eq!(b.recv(&mut [0; 16]).unwrap(), 2);
}

#[test]
fn send_and_peer_addr_need_a_connected_peer() {
    let (a, _) = bound();
    assert_kind(a.send(b"to whom"), ErrorKind::NotConnected);
    assert_kind(a.peer_addr(), ErrorKind::NotConnected);
}

#[test]
fn a_connected_socket_sends_to_and_hears_only_its_peer() {
    let (a, a_addr) = bound();
    let (mut b, b_addr) = bound();
    let (c, _) = bound();
    b.connect(a_addr).unwrap();
    assert_eq!(b.peer_addr().unwrap(), a_addr);
    c.send_to(b"stranger", b_addr).unwrap();
    a.send_to(b"peer", b_addr).unwrap();
    let mut buf = [0; 16];
    assert_eq!(b.recv_from(&mut buf).unwrap(), (4, a_addr));
    b.set_nonblocking(true).unwrap();
    assert_kind(b.recv(&mut buf), ErrorKind::WouldBlock);
    b.send(b"back").unwrap();
    assert_eq!(a.recv_from(&mut buf).unwrap(), (4, b_addr));
}

#[test]
fn recv_queued_counts_payload_bytes() {
    let (a, _) = bound();
    let (b, b_addr) = bound();
    a.send_to(b"abc", b_addr).unwrap();
    a.send_to(b"de", b_addr).unwrap();
    assert_eq!(b.recv_queued().unwrap(), 5);
}
