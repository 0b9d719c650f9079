//! The blocking stream shells: `VsockListener`, `Incoming`, `VsockStream`.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::Duration;

use super::{assert_kind, listening, nobody, stream_pair};
use crate::addr::{VMADDR_CID_LOCAL, VsockAddr};
use crate::platform::loopback::BUFFER;
use crate::poll::Poller;
use crate::stream::VsockStream;

#[test]
fn accept_returns_the_connection_with_the_clients_address() {
    let (listener, addr) = listening();
    let client = VsockStream::connect(addr).unwrap();
    let (server, peer) = listener.accept().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    assert_eq!(server.peer_addr().unwrap(), peer);
    assert_eq!(client.peer_addr().unwrap(), addr);
    assert_eq!(server.local_addr().unwrap().port, addr.port);
}

#[test]
fn bytes_arrive_in_order_through_owned_and_shared_references() {
    let (mut client, server) = stream_pair();
    client.write_all(b"hello ").unwrap();
    (&client).write_all(b"world").unwrap();
    client.flush().unwrap();
    let mut got = [0; 11];
    (&server).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello world");
}

#[test]
fn half_close_delivers_the_rest_then_the_end_and_the_reply_still_flows() {
    let (mut client, mut server) = stream_pair();
    client.write_all(b"request").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut request = Vec::new();
    server.read_to_end(&mut request).unwrap();
    assert_eq!(request, b"request");
    server.write_all(b"reply").unwrap();
    drop(server);
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"reply");
    assert_kind(client.write(b"more"), ErrorKind::BrokenPipe);
}

#[test]
fn dropping_a_stream_delivers_what_it_wrote_then_the_end() {
    let (mut client, mut server) = stream_pair();
    client.write_all(b"last words").unwrap();
    drop(client);
    let mut got = Vec::new();
    server.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"last words");
}

#[test]
fn linger_zero_makes_the_drop_a_reset() {
    let (client, mut server) = stream_pair();
    (&client).write_all(b"discarded").unwrap();
    assert_kind(client.set_linger(Some(Duration::from_secs(1))), ErrorKind::Unsupported);
    client.set_linger(Some(Duration::ZERO)).unwrap();
    drop(client);
    assert_kind(server.read(&mut [0; 16]), ErrorKind::ConnectionReset);
}

#[test]
fn recv_queued_counts_unread_bytes_and_is_one_at_the_end() {
    let (mut client, mut server) = stream_pair();
    assert_eq!(server.recv_queued().unwrap(), 0);
    client.write_all(b"12345").unwrap();
    assert_eq!(server.recv_queued().unwrap(), 5);
    assert_eq!(client.send_queued().unwrap(), 0);
    client.shutdown(Shutdown::Write).unwrap();
    server.read_exact(&mut [0; 5]).unwrap();
    assert_eq!(server.recv_queued().unwrap(), 1);
    assert_eq!(server.read(&mut [0; 5]).unwrap(), 0);
}

#[test]
fn non_blocking_accept_and_read_return_would_block_instead_of_waiting() {
    let (listener, addr) = listening();
    listener.set_nonblocking(true).unwrap();
    assert_kind(listener.accept(), ErrorKind::WouldBlock);
    let client = VsockStream::connect(addr).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    assert_kind((&server).read(&mut [0; 8]), ErrorKind::WouldBlock);
    (&client).write_all(b"now").unwrap();
    assert_eq!((&server).read(&mut [0; 8]).unwrap(), 3);
}

#[test]
fn a_full_peer_makes_a_non_blocking_write_would_block_until_it_reads() {
    let (client, server) = stream_pair();
    client.set_nonblocking(true).unwrap();
    let chunk = vec![7; 4096];
    let mut written = 0;
    loop {
        match (&client).write(&chunk) {
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(written, BUFFER);
    let mut poller = Poller::new();
    poller.add(client.writable(), 1);
    assert!(poller.wait(Some(Duration::ZERO)).unwrap().is_empty(), "writable while full");
    (&server).read_exact(&mut [0; 100]).unwrap();
    let mut poller = Poller::new();
    poller.add(client.writable(), 1);
    assert_eq!(poller.wait(Some(Duration::ZERO)).unwrap(), [1]);
    assert_eq!((&client).write(&chunk).unwrap(), 100);
}

#[test]
fn a_blocking_read_waits_for_what_another_thread_writes() {
    let (client, mut server) = stream_pair();
    let writer = thread::spawn(move || (&client).write_all(b"late"));
    let mut got = [0; 4];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"late");
    writer.join().unwrap().unwrap();
}

#[test]
fn a_blocking_accept_waits_for_a_connect_from_another_thread() {
    let (listener, addr) = listening();
    let connector = thread::spawn(move || VsockStream::connect(addr).map(|c| c.local_addr()));
    let (_, peer) = listener.accept().unwrap();
    assert_eq!(peer, connector.join().unwrap().unwrap().unwrap());
}

#[test]
fn connecting_where_nobody_listens_is_refused() {
    assert_kind(VsockStream::connect(nobody()), ErrorKind::ConnectionRefused);
}

#[test]
fn a_zero_connect_timeout_is_invalid_input_and_connects_nothing() {
    let (listener, addr) = listening();
    listener.set_nonblocking(true).unwrap();
    assert_kind(VsockStream::connect_timeout(addr, Duration::ZERO), ErrorKind::InvalidInput);
    assert_kind(listener.accept(), ErrorKind::WouldBlock);
    let client = VsockStream::connect_timeout(addr, Duration::from_secs(1)).unwrap();
    assert_eq!(listener.accept().unwrap().1, client.local_addr().unwrap());
}

#[test]
fn incoming_yields_each_connection_in_turn() {
    let (listener, addr) = listening();
    let first = VsockStream::connect(addr).unwrap();
    let second = VsockStream::connect(addr).unwrap();
    let peers: Vec<VsockAddr> =
        listener.incoming().take(2).map(|s| s.unwrap().peer_addr().unwrap()).collect();
    assert_eq!(peers, [first.local_addr().unwrap(), second.local_addr().unwrap()]);
}

#[test]
fn a_listener_bound_to_a_taken_port_is_refused() {
    let (_listener, addr) = listening();
    let again = crate::stream::VsockListener::bind(VsockAddr::new(VMADDR_CID_LOCAL, addr.port));
    assert_kind(again, ErrorKind::AddrInUse);
    let seqpacket = crate::seqpacket::SeqpacketListener::bind(addr);
    assert_kind(seqpacket, ErrorKind::AddrInUse);
}
