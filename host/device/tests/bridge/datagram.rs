//! Datagrams: host → guest through `<uds>_dgram`, guest → host to
//! `<uds>_dgram_<port>`, an 8-byte port header on the Unix side, and drops
//! (never RSTs) when nobody listens.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use pier_hybrid::{
    datagram_path, datagram_receiver_path, decode_datagram_header, encode_datagram_header,
};
use pier_stack::{Error, RstReason, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr};

use crate::driver::{Harness, TIMEOUT};

fn guest_datagram_socket(h: &Harness, port: u32) -> SocketHandle {
    h.run(move |w| {
        let d = w.guest.socket(SocketType::Datagram).unwrap();
        w.guest.bind(d, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
        d
    })
}

/// Waits for one datagram on a guest socket: (payload, source).
fn guest_recv(h: &Harness, d: SocketHandle) -> (Vec<u8>, VsockAddr) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let got = h.run(move |w| {
            let mut buf = vec![0u8; 70_000];
            match w.guest.recv(d, &mut buf) {
                Ok(info) => {
                    assert!(!info.truncated);
                    Some((buf[..info.len].to_vec(), info.from.unwrap()))
                }
                Err(Error::WouldBlock) => None,
                Err(e) => panic!("guest datagram recv: {e}"),
            }
        });
        if let Some(got) = got {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "no datagram reached the guest");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn with_header(guest_port: u32, host_port: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = encode_datagram_header(guest_port, host_port).to_vec();
    d.extend_from_slice(payload);
    d
}

#[test]
fn host_to_guest_datagram() {
    let h = Harness::start();
    let d = guest_datagram_socket(&h, 7000);
    let sender = UnixDatagram::unbound().unwrap();
    sender.send_to(&with_header(7000, 1234, b"hello guest"), datagram_path(h.uds())).unwrap();
    let big = crate::host::pattern(3, 65536);
    sender.send_to(&with_header(7000, 1234, &big), datagram_path(h.uds())).unwrap();
    assert_eq!(guest_recv(&h, d), (b"hello guest".to_vec(), VsockAddr::new(2, 1234)));
    let (payload, from) = guest_recv(&h, d);
    assert_eq!(from, VsockAddr::new(2, 1234));
    assert!(payload == big, "a full 64 KiB datagram arrives whole");
    assert_eq!(h.stats().datagrams_to_guest, 2);
}

#[test]
fn guest_to_host_datagram_and_reply() {
    let h = Harness::start();
    let receiver = UnixDatagram::bind(datagram_receiver_path(h.uds(), 8000)).unwrap();
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let d = guest_datagram_socket(&h, 7001);
    h.run(move |w| w.guest.send_to(d, b"ping", VsockAddr::new(2, 8000)).unwrap());
    let mut buf = [0u8; 256];
    let (n, from) = receiver.recv_from(&mut buf).unwrap();
    assert_eq!(decode_datagram_header(&buf[..n]), Some((7001, 8000, &b"ping"[..])));
    assert_eq!(from.as_pathname(), Some(datagram_path(h.uds()).as_path()), "sent from <uds>_dgram");
    // Answer to where it came from, header filled in.
    receiver.send_to(&with_header(7001, 8000, b"pong"), from.as_pathname().unwrap()).unwrap();
    assert_eq!(guest_recv(&h, d), (b"pong".to_vec(), VsockAddr::new(2, 8000)));
    let st = h.stats();
    assert_eq!((st.datagrams_from_guest, st.datagrams_to_guest), (1, 1));
}

#[test]
fn guest_datagram_without_receiver_is_dropped_not_reset() {
    let h = Harness::start();
    let d = guest_datagram_socket(&h, 7002);
    for _ in 0..3 {
        h.run(move |w| w.guest.send_to(d, b"anyone?", VsockAddr::new(2, 8999)).unwrap());
    }
    let st = h.wait_stats("three drops", |s| s.datagrams_no_receiver == 3);
    assert_eq!(st.datagrams_from_guest, 0);
    let rsts = h.run(|w: &mut crate::driver::World<'_>| {
        let guest: &Stack = w.guest;
        (
            guest.stats().rst_received,
            RstReason::ALL.iter().map(|&r| w.host.stats().rst_sent(r)).sum::<u64>(),
        )
    });
    assert_eq!(rsts, (0, 0), "a datagram never draws an RST");
}

#[test]
fn guest_datagrams_to_a_full_receiver_are_dropped_and_counted() {
    let h = Harness::start();
    // Bound, but never read: its queue fills (net.unix.max_dgram_qlen).
    let _receiver = UnixDatagram::bind(datagram_receiver_path(h.uds(), 8001)).unwrap();
    let d = guest_datagram_socket(&h, 7003);
    const N: u64 = 200;
    for _ in 0..N {
        h.run(move |w| w.guest.send_to(d, &[5u8; 100], VsockAddr::new(2, 8001)).unwrap());
    }
    let st = h.wait_stats("every datagram accounted for", |s| {
        s.datagrams_from_guest + s.datagrams_receiver_full == N
    });
    assert!(st.datagrams_from_guest > 0 && st.datagrams_receiver_full > 0, "{st:?}");
}

#[test]
fn malformed_host_datagrams_are_dropped() {
    let h = Harness::start();
    let d = guest_datagram_socket(&h, 7004);
    let sender = UnixDatagram::unbound().unwrap();
    sender.send_to(b"short", datagram_path(h.uds())).unwrap();
    sender.send_to(&with_header(u32::MAX, 1, b"to PORT_ANY"), datagram_path(h.uds())).unwrap();
    sender.send_to(&with_header(7004, 1, &vec![0u8; 65537]), datagram_path(h.uds())).unwrap();
    sender.send_to(&with_header(7004, 1, b"fine"), datagram_path(h.uds())).unwrap();
    assert_eq!(guest_recv(&h, d), (b"fine".to_vec(), VsockAddr::new(2, 1)));
    let st = h.stats();
    assert_eq!((st.datagrams_malformed, st.datagrams_too_large, st.datagrams_to_guest), (2, 1, 1));
}

/// The device's backend seam (`HostSide`) hands guest datagrams to
/// the bridge: it claims every one, forwarding or counting it.
#[test]
fn datagram_handler_hook_forwards() {
    let h = Harness::start();
    let receiver = UnixDatagram::bind(datagram_receiver_path(h.uds(), 8002)).unwrap();
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let claimed = h.run(|w| {
        let raw = pier_stack::wire::RawHeader {
            src_cid: 3,
            dst_cid: 2,
            src_port: 4444,
            dst_port: 8002,
            len: 2,
            type_: SocketType::Datagram as u16,
            op: pier_stack::wire::Op::Rw as u16,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        };
        let spoofed = pier_stack::wire::RawHeader { src_cid: 9, ..raw };
        let hook: &mut dyn pier_device::host_side::HostSide = w.bridge;
        (hook.guest_datagram(&raw, b"hi"), hook.guest_datagram(&spoofed, b"hi"))
    });
    assert_eq!(claimed, (true, true));
    let mut buf = [0u8; 64];
    let n = receiver.recv(&mut buf).unwrap();
    assert_eq!(decode_datagram_header(&buf[..n]), Some((4444, 8002, &b"hi"[..])));
    assert_eq!(h.stats().datagrams_rejected, 1, "a datagram not from the guest's CID");
}
