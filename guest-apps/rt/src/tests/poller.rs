//! `Poller` and `Readiness`: waiting on many sockets at once.

use std::io::{ErrorKind, Read, Write};
use std::thread;
use std::time::Duration;

use super::{assert_kind, listening, stream_pair};
use crate::poll::Poller;
use crate::stream::VsockStream;

#[test]
fn wait_returns_the_tokens_of_the_ready_conditions_in_the_order_added() {
    let (first, first_addr) = listening();
    let (second, _) = listening();
    let (third, third_addr) = listening();
    let _a = VsockStream::connect(third_addr).unwrap();
    let _b = VsockStream::connect(first_addr).unwrap();
    let mut poller = Poller::with_capacity(3);
    poller.add(first.readable(), 10);
    poller.add(second.readable(), 20);
    poller.add(third.readable(), 30);
    assert_eq!(poller.len(), 3);
    assert_eq!(poller.wait(None).unwrap(), [10, 30]);
}

#[test]
fn a_zero_timeout_only_looks() {
    let (listener, _) = listening();
    let mut poller = Poller::new();
    poller.add(listener.readable(), 1);
    assert_eq!(poller.wait(Some(Duration::ZERO)).unwrap(), Vec::<usize>::new());
}

#[test]
fn an_empty_poller_waits_out_its_timeout_and_refuses_to_wait_forever() {
    let poller = Poller::new();
    assert!(poller.is_empty());
    assert_eq!(poller.wait(Some(Duration::from_millis(1))).unwrap(), Vec::<usize>::new());
    assert_kind(poller.wait(None), ErrorKind::InvalidInput);
}

#[test]
fn readiness_stays_while_its_condition_holds() {
    let (mut client, mut server) = stream_pair();
    client.write_all(b"unread").unwrap();
    for _ in 0..2 {
        let mut poller = Poller::new();
        poller.add(server.readable(), 7);
        assert_eq!(poller.wait(Some(Duration::ZERO)).unwrap(), [7]);
    }
    server.read_exact(&mut [0; 6]).unwrap();
    let mut poller = Poller::new();
    poller.add(server.readable(), 7);
    assert_eq!(poller.wait(Some(Duration::ZERO)).unwrap(), Vec::<usize>::new());
}

#[test]
fn tokens_need_not_be_unique() {
    let (client, server) = stream_pair();
    let mut poller = Poller::new();
    poller.add(client.writable(), 5);
    poller.add(server.writable(), 5);
    assert_eq!(poller.wait(None).unwrap(), [5, 5]);
}

#[test]
fn a_wait_ends_when_another_thread_makes_a_socket_ready() {
    let (client, server) = stream_pair();
    let writer = thread::spawn(move || (&client).write_all(b"wake up"));
    let mut poller = Poller::new();
    poller.add(server.readable(), 3);
    assert_eq!(poller.wait(None).unwrap(), [3]);
    writer.join().unwrap().unwrap();
}
