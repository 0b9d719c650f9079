//! A first end-to-end check: connect, move data both ways, close.
mod common;
use common::*;
use pier_stack::SocketType;
use pier_stack::phy::Side;
use pier_testkit::pattern::xorshift32_bytes;

#[test]
fn stream_round_trip_and_orderly_close() {
    let mut lb = pair();
    let (c, s) = connected(&mut lb, SocketType::Stream, 1234);
    let data = xorshift32_bytes(7, 1 << 20);
    let got = transfer(&mut lb, (Side::A, c), (Side::B, s), &data, 4096);
    assert_eq!(djb2(&got), djb2(&data));
    lb.b.send(s, b"pong").unwrap();
    lb.run();
    assert_eq!(recv_exact(&mut lb, Side::A, c, 4), b"pong");
    lb.a.close(c, lb.now()).unwrap();
    lb.run();
    let info = lb.b.recv(s, &mut [0u8; 8]).unwrap();
    assert!(info.eof);
    lb.b.close(s, lb.now()).unwrap();
    lb.run();
    assert_eq!(lb.a.socket_count(), 0);
    assert_eq!(lb.b.socket_count(), 0);
}
