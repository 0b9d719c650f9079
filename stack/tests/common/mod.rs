//! Helpers shared by the integration tests: two stacks over the loopback
//! harness, and small loops that move whole buffers.
#![allow(dead_code)]

use pier_stack::phy::{Loopback, Side};
use pier_stack::{Config, Error, Instant, SocketHandle, SocketType, VsockAddr};

pub const GUEST: u32 = 3;
pub const HOST: u32 = 2;

/// A guest (side A, CID 3) and a host (side B, CID 2).
pub fn pair() -> Loopback {
    Loopback::guest_and_host()
}

pub fn pair_with(configure: impl Fn(&mut Config)) -> Loopback {
    let mut a = Config::new(GUEST);
    let mut b = Config::new(HOST);
    configure(&mut a);
    configure(&mut b);
    Loopback::new(a, b)
}

pub fn listener(lb: &mut Loopback, side: Side, ty: SocketType, port: u32) -> SocketHandle {
    let s = lb.stack(side);
    let h = s.socket(ty).unwrap();
    s.bind(h, VsockAddr::new(pier_stack::VMADDR_CID_ANY, port)).unwrap();
    s.listen(h, 128).unwrap();
    h
}

/// Starts a connect from `side` and runs the loopback; returns the socket and the outcome.
pub fn try_connect(
    lb: &mut Loopback,
    side: Side,
    ty: SocketType,
    to: VsockAddr,
) -> (SocketHandle, Result<(), Error>) {
    let now = lb.now();
    let s = lb.stack(side);
    let h = s.socket(ty).unwrap();
    s.connect(h, to, now).unwrap();
    lb.run();
    let outcome = lb.stack(side).finish_connect(h);
    (h, outcome)
}

/// A connected pair: the client on A (guest) and the accepted socket on B (host).
pub fn connected(lb: &mut Loopback, ty: SocketType, port: u32) -> (SocketHandle, SocketHandle) {
    let l = listener(lb, Side::B, ty, port);
    let (c, outcome) = try_connect(lb, Side::A, ty, VsockAddr::new(HOST, port));
    outcome.unwrap();
    let (s, peer) = lb.b.accept(l).unwrap();
    assert_eq!(peer.cid, GUEST);
    lb.b.close(l, lb.now()).unwrap();
    lb.run();
    (c, s)
}

/// Sends all of `data`, running the loopback whenever credit runs out.
pub fn send_all(lb: &mut Loopback, side: Side, h: SocketHandle, data: &[u8]) {
    let mut off = 0;
    let mut stalls = 0;
    while off < data.len() {
        match lb.stack(side).send(h, &data[off..]) {
            Ok(n) => {
                off += n;
                stalls = 0;
            }
            Err(Error::WouldBlock) => {
                stalls += 1;
                assert!(stalls < 1000, "send stalled with {} of {} bytes sent", off, data.len());
            }
            Err(e) => panic!("send failed: {e}"),
        }
        lb.run();
    }
}

/// Receives until `n` bytes arrived or EOF; runs the loopback between reads.
pub fn recv_exact(lb: &mut Loopback, side: Side, h: SocketHandle, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    let mut stalls = 0;
    while got < n {
        match lb.stack(side).recv(h, &mut out[got..]) {
            Ok(info) if info.eof => break,
            Ok(info) => {
                got += info.len;
                stalls = 0;
            }
            Err(Error::WouldBlock) => {
                stalls += 1;
                assert!(stalls < 1000, "recv stalled with {got} of {n} bytes");
            }
            Err(e) => panic!("recv failed: {e}"),
        }
        lb.run();
    }
    out.truncate(got);
    out
}

pub fn now(lb: &Loopback) -> Instant {
    lb.now()
}

/// djb2, the hash the kernel's vsock_test uses to compare what was sent and received.
pub fn djb2(data: &[u8]) -> u32 {
    data.iter().fold(5381u32, |h, &b| h.wrapping_mul(33).wrapping_add(b as u32))
}

/// Moves `data` from one socket to another, reading as it goes, and returns
/// what arrived. `read_chunk` bounds each receive, to make the reader slow.
pub fn transfer(
    lb: &mut Loopback,
    from: (Side, SocketHandle),
    to: (Side, SocketHandle),
    data: &[u8],
    read_chunk: usize,
) -> Vec<u8> {
    let mut sent = 0;
    let mut out = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; read_chunk];
    let mut idle_rounds = 0;
    while out.len() < data.len() {
        let mut progress = false;
        if sent < data.len() {
            match lb.stack(from.0).send(from.1, &data[sent..]) {
                Ok(n) => {
                    sent += n;
                    progress |= n > 0;
                }
                Err(Error::WouldBlock) => {}
                Err(e) => panic!("send failed: {e}"),
            }
        }
        progress |= lb.run() > 0;
        match lb.stack(to.0).recv(to.1, &mut buf) {
            Ok(info) => {
                assert!(!info.eof, "unexpected EOF after {} bytes", out.len());
                out.extend_from_slice(&buf[..info.len]);
                progress |= info.len > 0;
            }
            Err(Error::WouldBlock) => {}
            Err(e) => panic!("recv failed: {e}"),
        }
        idle_rounds = if progress { 0 } else { idle_rounds + 1 };
        assert!(idle_rounds < 100, "transfer stalled: sent {sent}, received {}", out.len());
    }
    out
}
