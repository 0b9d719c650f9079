//! The blocking seqpacket shells: `SeqpacketListener`, `SeqpacketStream`.

use std::io::ErrorKind;
use std::net::Shutdown;

use super::{assert_kind, dialable, listening};
use crate::addr::{VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::message::RecvMessage;
use crate::platform::loopback::BUFFER;
use crate::seqpacket::{SeqpacketListener, SeqpacketStream};

/// A connected pair: (client, server).
fn pair() -> (SeqpacketStream, SeqpacketStream) {
    let listener =
        SeqpacketListener::bind(VsockAddr::new(VMADDR_CID_LOCAL, VMADDR_PORT_ANY)).unwrap();
    let client = SeqpacketStream::connect(dialable(listener.local_addr().unwrap())).unwrap();
    let (server, peer) = listener.accept().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    (client, server)
}

#[test]
fn each_send_arrives_as_one_message() {
    let (client, server) = pair();
    assert_eq!(client.send(b"a").unwrap(), 1);
    assert_eq!(client.send(b"bcd").unwrap(), 3);
    let mut buf = [0; 64];
    assert_eq!(server.recv(&mut buf).unwrap().len, 1);
    assert_eq!(&buf[..1], b"a");
    assert_eq!(server.recv(&mut buf).unwrap().len, 3);
    assert_eq!(&buf[..3], b"bcd");
}

#[test]
fn end_of_record_marks_reach_the_receiver() {
    let (client, server) = pair();
    client.send_eor(b"last of a record", true).unwrap();
    client.send(b"first of the next").unwrap();
    let mut buf = [0; 64];
    assert!(server.recv(&mut buf).unwrap().end_of_record);
    assert!(!server.recv(&mut buf).unwrap().end_of_record);
}

#[test]
fn a_short_buffer_truncates_the_message_and_drops_its_rest() {
    let (client, server) = pair();
    client.send(b"0123456789").unwrap();
    client.send(b"next").unwrap();
    let mut small = [0; 4];
    let got = server.recv(&mut small).unwrap();
    assert_eq!(got, RecvMessage { len: 4, truncated: true, end_of_record: false });
    assert_eq!(&small, b"0123");
    let mut buf = [0; 64];
    let got = server.recv(&mut buf).unwrap();
    assert_eq!((got.len, got.truncated), (4, false));
    assert_eq!(&buf[..4], b"next");
}

#[test]
fn after_the_peer_shuts_down_sending_recv_reports_the_end_as_length_zero() {
    let (client, server) = pair();
    client.send(b"bye").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut buf = [0; 8];
    assert_eq!(server.recv(&mut buf).unwrap().len, 3);
    assert_eq!(server.recv(&mut buf).unwrap(), RecvMessage::default());
    assert_kind(client.send(b"more"), ErrorKind::BrokenPipe);
}

#[test]
fn a_message_longer_than_the_connection_carries_is_invalid_input() {
    let (client, _server) = pair();
    assert_kind(client.send(&vec![0; BUFFER + 1]), ErrorKind::InvalidInput);
    assert_eq!(client.send(&vec![0; BUFFER]).unwrap(), BUFFER);
}

#[test]
fn a_non_blocking_send_that_does_not_fit_whole_would_block() {
    let (client, server) = pair();
    client.set_nonblocking(true).unwrap();
    client.send(&vec![1; BUFFER - 10]).unwrap();
    assert_kind(client.send(&[2; 11]), ErrorKind::WouldBlock);
    server.recv(&mut vec![0; BUFFER]).unwrap();
    assert_eq!(client.send(&[2; 11]).unwrap(), 11);
}

#[test]
fn recv_queued_counts_the_bytes_of_queued_messages() {
    let (client, server) = pair();
    client.send(b"abc").unwrap();
    client.send(b"defgh").unwrap();
    assert_eq!(server.recv_queued().unwrap(), 8);
    server.recv(&mut [0; 8]).unwrap();
    assert_eq!(server.recv_queued().unwrap(), 5);
}

#[test]
fn a_seqpacket_connect_to_a_stream_listener_is_refused() {
    let (_stream_listener, addr) = listening();
    assert_kind(SeqpacketStream::connect(addr), ErrorKind::ConnectionRefused);
}

#[test]
fn incoming_yields_seqpacket_connections() {
    let listener =
        SeqpacketListener::bind(VsockAddr::new(VMADDR_CID_LOCAL, VMADDR_PORT_ANY)).unwrap();
    let client = SeqpacketStream::connect(dialable(listener.local_addr().unwrap())).unwrap();
    let server = listener.incoming().next().unwrap().unwrap();
    client.send(b"hi").unwrap();
    assert_eq!(server.recv(&mut [0; 8]).unwrap().len, 2);
}
