//! The datagram echo the `datagrams` benchmark measures, and its kernel
//! baseline: a client that sends a window of datagrams, then reads their
//! echoes ([`echo_windows`]), so neither a Unix datagram queue (10
//! datagrams) nor a UDP receive buffer (about 208 KiB) overflows; and a
//! UDP socket on 127.0.0.1 that a thread echoes ([`udp_echo`]).
//!
//! Any transport plugs in through [`Echo`]. It needs nothing from the
//! benchmark harness, so the `socket_floor` example shares it too.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use pier_hybrid::DATAGRAM_HEADER_LEN;

/// A window holds at most this many bytes of datagrams...
pub const WINDOW_BYTES: usize = 128 * 1024;
/// ...and at most this many datagrams.
pub const MAX_WINDOW: usize = 8;
/// How long an echo may take before it counts as lost.
pub const LOSS_TIMEOUT: Duration = Duration::from_millis(200);

/// One side of the comparison: send one datagram, receive one echo. Both
/// may be called from two threads at once (the flood's sender and
/// receiver).
pub trait Echo: Sync {
    fn send(&self, payload: &[u8]);
    /// The echo's payload length, or `None` after [`LOSS_TIMEOUT`].
    fn recv(&self, buf: &mut [u8]) -> Option<usize>;
}

pub struct Udp(pub UdpSocket);

impl Echo for Udp {
    fn send(&self, payload: &[u8]) {
        self.0.send(payload).expect("sending to the UDP echo");
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.0.recv(buf).ok()
    }
}

/// Echoes `count` datagrams of `size` bytes in windows of [`MAX_WINDOW`]
/// datagrams or [`WINDOW_BYTES`], whichever is fewer, each window's echoes
/// read before the next is sent; returns payload bytes per second one way
/// and the datagrams lost.
pub fn echo_windows(side: &dyn Echo, size: usize, count: usize) -> (f64, usize) {
    let window = (WINDOW_BYTES / size).clamp(1, MAX_WINDOW);
    let payload = vec![0x5au8; size];
    let mut buf = vec![0u8; 65536 + DATAGRAM_HEADER_LEN];
    let (mut sent, mut echoed, mut lost) = (0, 0, 0);
    let started = Instant::now();
    while sent < count {
        let batch = window.min(count - sent);
        for _ in 0..batch {
            side.send(&payload);
        }
        sent += batch;
        for _ in 0..batch {
            match side.recv(&mut buf) {
                Some(n) => {
                    assert_eq!(n, size, "an echo of another size");
                    echoed += 1;
                }
                None => lost += 1,
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    ((echoed * size) as f64 / elapsed, lost)
}

/// A UDP echo on 127.0.0.1, served by a thread until a 1-byte datagram.
pub fn udp_echo() -> (Udp, std::thread::JoinHandle<()>) {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        loop {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            if n == 1 {
                return;
            }
            let _ = server.send_to(&buf[..n], from);
        }
    });
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(addr).unwrap();
    client.set_read_timeout(Some(LOSS_TIMEOUT)).unwrap();
    (Udp(client), thread)
}
