//! The device model with pier-driver over the in-process transport, in one
//! thread: what the device and its host side do with the traffic of a real
//! driver (data both ways, small guest buffers, hostile packets, refusals,
//! a rebooted guest). The driver's own behaviour (negotiation, kicks,
//! interrupts, refills, resets, ring wrap) is tested in `driver/tests/`.

use std::time::Duration;

use pier_device::InProcessDevice;
use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::wire::{HEADER_LEN, Header, Op};
use pier_stack::{Error, SocketType, VMADDR_CID_ANY, VsockAddr};
use pier_testkit::pattern::xorshift32_bytes;

const GUEST: u32 = 3;

#[test]
fn stream_both_ways_through_virtio() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 1234);
    for (from_guest, size) in [(true, 8 << 20), (false, 8 << 20)] {
        let data = xorshift32_bytes(size as u32 + from_guest as u32, size);
        let mut got = Vec::with_capacity(size);
        let mut sent = 0;
        let mut buf = vec![0u8; 48 * 1024];
        let mut idle = 0;
        while got.len() < size {
            let (tx_stack, tx_h) =
                if from_guest { (&mut bed.guest, c) } else { (bed.host.stack(), s) };
            if sent < size
                && let Ok(n) = tx_stack.send(tx_h, &data[sent..])
            {
                sent += n;
            }
            let moved = bed.step();
            let (rx_stack, rx_h) =
                if from_guest { (bed.host.stack(), s) } else { (&mut bed.guest, c) };
            match rx_stack.recv(rx_h, &mut buf) {
                Ok(info) => {
                    got.extend_from_slice(&buf[..info.len]);
                    idle = 0;
                }
                Err(Error::WouldBlock) => {
                    idle += usize::from(moved == 0);
                    assert!(idle < 100, "stalled at {} of {size}", got.len());
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(got == data, "{size} bytes intact");
    }
    assert_eq!(bed.host.stats().spoofed_source, 0);
    assert!(bed.driver.stats().tx_packets > 0);
}

#[test]
fn seqpacket_and_datagrams_through_virtio() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::SeqPacket, 99);
    let messages: Vec<(Vec<u8>, bool)> =
        (0..40).map(|i| (xorshift32_bytes(i as u32 + 1, 1 + i * 3001), i % 3 == 0)).collect();
    let mut buf = vec![0u8; 200_000];
    for (m, eor) in &messages {
        bed.guest.send_message(c, m, *eor).unwrap();
        bed.run();
        let info = bed.host.stack().recv(s, &mut buf).unwrap();
        assert_eq!((info.len, info.end_of_record), (m.len(), *eor));
        assert!(buf[..info.len] == m[..]);
    }
    let hd = bed.host.stack().socket(SocketType::Datagram).unwrap();
    bed.host.stack().bind(hd, VsockAddr::new(VMADDR_CID_ANY, 7)).unwrap();
    let gd = bed.guest.socket(SocketType::Datagram).unwrap();
    bed.guest.send_to(gd, b"datagram", VsockAddr::new(2, 7)).unwrap();
    bed.run();
    let info = bed.host.stack().recv(hd, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"datagram");
    bed.host.stack().send_to(hd, b"reply", info.from.unwrap()).unwrap();
    bed.run();
    assert_eq!(bed.guest.recv(gd, &mut buf).unwrap().len, 5);
}

/// A guest that posts small receive buffers still gets everything: the
/// device tells the host stack to cut smaller packets.
#[test]
fn small_guest_buffers_get_smaller_packets() {
    let driver = DriverConfig { rx_buffer_size: HEADER_LEN + 4096, ..DriverConfig::default() };
    let mut bed = Testbed::new(VsockConfig::default(), driver).unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 5);
    let data = xorshift32_bytes(3, 200_000);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..10_000 {
        if sent < data.len() {
            sent += bed.host.stack().send(s, &data[sent..]).unwrap_or(0);
        }
        bed.step();
        if let Ok(info) = bed.guest.recv(c, &mut buf) {
            got.extend_from_slice(&buf[..info.len]);
        }
        if got.len() == data.len() {
            break;
        }
    }
    assert!(got == data);
    assert_eq!(bed.host.stats().rx_buffer_shrinks, 1);
    assert_eq!(bed.host.stack().max_payload(), 4096);
}

/// Packets a hostile guest writes straight into the tx ring: a spoofed
/// source CID is dropped and counted; a packet to an unknown connection
/// draws an RST; a credit overrun is reset; an unknown op gets RST.
#[test]
fn hostile_guest_packets() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, _s) = bed.connect(SocketType::Stream, 1234);
    let local = bed.guest.local_addr(c).unwrap();
    let forge = |src_cid: u64, op: Op, len: u32| Header {
        src_cid,
        dst_cid: 2,
        src_port: local.port,
        dst_port: 1234,
        len,
        socket_type: SocketType::Stream,
        op,
        flags: 0,
        buf_alloc: 1 << 30,
        fwd_cnt: 0,
    };
    let spoofed = forge(7, Op::Rw, 3);
    let overrun = forge(GUEST as u64, Op::Rw, 60_000);
    let mut unknown_op = forge(GUEST as u64, Op::Rw, 0).to_raw();
    unknown_op.op = 99;
    unknown_op.src_port = 5555;
    let before = bed.host.stack().stats().clone();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut f = spoofed.encode().to_vec();
    f.extend_from_slice(b"abc");
    frames.push(f);
    for _ in 0..6 {
        let mut f = overrun.encode().to_vec();
        f.extend_from_slice(&[0u8; 60_000]);
        frames.push(f);
    }
    frames.push(unknown_op.encode().to_vec());
    let sent = inject(&mut bed, &frames);
    assert_eq!(sent, frames.len());
    bed.run();
    let host = bed.host.stack().stats().clone();
    assert_eq!(bed.host.stats().spoofed_source, 1);
    assert_eq!(
        host.rst_sent(pier_stack::RstReason::CreditOverrun)
            - before.rst_sent(pier_stack::RstReason::CreditOverrun),
        1
    );
    assert_eq!(host.rst_sent(pier_stack::RstReason::UnknownOp), 1);
    assert!(bed.host.stack().buffered_bytes() <= 2 << 20, "memory bounded");
    // The guest heard the RSTs and is not hung.
    assert_eq!(bed.guest.send(c, b"x"), Err(Error::BrokenPipe));
}

/// Writes raw frames into the tx ring as if the guest driver had, then
/// lets the device take them.
fn inject(bed: &mut Testbed, frames: &[Vec<u8>]) -> usize {
    let mut n = 0;
    for frame in frames {
        let raw = pier_stack::wire::RawHeader::parse(frame).unwrap();
        let payload = &frame[HEADER_LEN..];
        bed.driver.transmit_raw(&raw, payload).expect("a free tx buffer");
        n += 1;
        let now = bed.now();
        let InProcessDevice { guest, driver, host, mmio, .. } = &mut **bed;
        let mut wakes = pier_stack::WakeList::new();
        host.process(&mut mmio.lock().unwrap(), &mut pier_device::NoHostSide, now, &mut wakes);
        driver.poll(guest, now, &mut wakes);
    }
    n
}

/// A connect from the guest to a host port nobody listens on fails at once.
#[test]
fn connect_to_nothing_is_refused_fast() {
    let mut bed = Testbed::with_defaults().unwrap();
    bed.freeze_clock();
    let c = bed.guest.socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.guest.connect(c, VsockAddr::new(2, 4444), now).unwrap();
    bed.run();
    assert_eq!(bed.guest.finish_connect(c), Err(Error::ConnectionReset));
    assert!(bed.now() < pier_stack::Instant::ZERO + Duration::from_secs(1), "no timer involved");
}

/// A header that claims more payload than the bed carries, or more than
/// 64 KiB, is rejected by the device without a panic; an RST storm for
/// unknown connections draws no answer and costs no memory.
#[test]
fn lying_lengths_and_rst_storms() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 1234);
    let local = bed.guest.local_addr(c).unwrap();
    let mut liar = Header {
        src_cid: GUEST as u64,
        dst_cid: 2,
        src_port: local.port,
        dst_port: 1234,
        len: 100_000,
        socket_type: SocketType::Stream,
        op: Op::Rw,
        flags: 0,
        buf_alloc: 65536,
        fwd_cnt: 0,
    }
    .to_raw();
    bed.driver.transmit_raw(&liar, &[1; 1000]).unwrap();
    liar.len = 5000;
    bed.driver.transmit_raw(&liar, &[1; 1000]).unwrap();
    // A packet for the guest's own CID that reaches the device anyway is
    // dropped, as Linux's vhost drops it; the guest's stack loops such
    // traffic back itself.
    let mut to_self = liar;
    to_self.len = 0;
    to_self.dst_cid = GUEST as u64;
    to_self.op = Op::Request as u16;
    bed.driver.transmit_raw(&to_self, &[]).unwrap();
    bed.run();
    assert_eq!(bed.host.stats().bad_chains, 2);
    assert_eq!(bed.host.stack().stats().dropped(pier_stack::DropReason::WrongDestination), 1);
    let rst_before = bed.host.stack().stats().rst_sent_total();
    let mut sent = 0;
    for port in 0..5000u32 {
        let rst = Header {
            src_cid: GUEST as u64,
            dst_cid: 2,
            src_port: 20_000 + port,
            dst_port: 9,
            len: 0,
            socket_type: SocketType::Stream,
            op: Op::Rst,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        };
        while bed.driver.transmit_raw(&rst.to_raw(), &[]).is_err() {
            bed.step();
        }
        sent += 1;
    }
    bed.run();
    let stats = bed.host.stack().stats().clone();
    assert_eq!(stats.dropped(pier_stack::DropReason::RstForUnknown), sent);
    assert_eq!(stats.rst_sent_total(), rst_before, "an RST never draws an RST");
    // The real connection still works.
    bed.guest.send(c, b"alive").unwrap();
    bed.run();
    let mut buf = [0u8; 8];
    assert_eq!(bed.host.stack().recv(s, &mut buf).unwrap().len, 5);
}

/// A guest that reboots (its driver resets the device and a new one sets
/// it up) gets nothing of the old connections: the host side resets them,
/// so host programs see their connections fail, and the new guest stack
/// receives no packet for a connection it never had.
#[test]
fn a_rebooted_guest_gets_nothing_of_the_old_connections() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 1234);
    // The host has bytes on the way that the old guest never reads.
    bed.guest.send(c, b"before").unwrap();
    bed.run();
    let sent = bed.host.stack().send(s, &[7; 300_000]).unwrap();
    assert!(sent > 0);
    bed.step();

    let mut bed = bed.restart_guest(DriverConfig::default()).unwrap();
    bed.run();

    assert_eq!(bed.host.stack().send(s, b"x"), Err(Error::ConnectionReset));
    assert_eq!(bed.host.stats().driver_resets, 1);
    let guest = bed.guest.stats();
    assert_eq!(
        guest.rx_packets + guest.rst_sent_total(),
        0,
        "the new guest was sent packets of the old connections"
    );
    assert_eq!(bed.driver.stats().rx_buffers_used, 0);
}

/// A testbed whose host side is a real bridge on `<dir>/v.sock`, driven
/// by the test's own poll, and a guest stream listener on port 4000.
struct BridgedBed {
    dir: tempfile::TempDir,
    bed: Testbed,
    poll: mio::Poll,
    bridge: pier_device::bridge::Bridge,
    guest_listener: pier_stack::SocketHandle,
}

impl BridgedBed {
    fn new() -> Self {
        use pier_device::bridge::{Bridge, BridgeConfig};
        let dir = tempfile::tempdir().unwrap();
        let mut bed = Testbed::with_defaults().unwrap();
        let poll = mio::Poll::new().unwrap();
        let config = BridgeConfig::new(dir.path().join("v.sock"), pier_device::GuestCid::DEFAULT);
        let first_token = pier_device::device_loop::FIRST_BACKEND_TOKEN;
        let bridge = Bridge::new(config, bed.host.stack(), poll.registry(), first_token).unwrap();
        let guest_listener = bed.guest.socket(SocketType::Stream).unwrap();
        bed.guest.bind(guest_listener, VsockAddr::new(VMADDR_CID_ANY, 4000)).unwrap();
        bed.guest.listen(guest_listener, 16).unwrap();
        Self { dir, bed, poll, bridge, guest_listener }
    }
}

/// A CID change reaches every part that uses the CID: the driver re-reads
/// it, and the bridge sends a host program's CONNECT to the new CID (a
/// bridge still on the old one would address a guest that is gone, and the
/// CONNECT would be refused).
#[test]
fn a_changed_guest_cid_reaches_the_bridge() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use mio::Events;
    use pier_device::GuestCid;

    let BridgedBed { dir, mut bed, mut poll, mut bridge, guest_listener } = BridgedBed::new();
    let uds = dir.path().join("v.sock");

    let new_cid = GuestCid::new(9).unwrap();
    {
        let mut wakes = pier_stack::WakeList::new();
        let InProcessDevice { host, mmio, .. } = &mut *bed;
        let mut mmio = mmio.lock().unwrap();
        host.change_guest_cid(&mut mmio, &mut bridge, new_cid, &mut wakes);
        wakes.wake_all();
    }
    bed.run();
    assert_eq!(bed.guest.local_cid(), 9, "the driver took the new CID");

    let client = std::thread::spawn(move || {
        let mut conn = UnixStream::connect(&uds).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(pier_hybrid::connect_line(4000).as_bytes()).unwrap();
        let mut answer = Vec::new();
        let mut byte = [0u8];
        while conn.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            answer.push(byte[0]);
        }
        String::from_utf8(answer).unwrap()
    });
    let mut events = Events::with_capacity(64);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !client.is_finished() && std::time::Instant::now() < deadline {
        poll.poll(&mut events, Some(Duration::from_millis(1))).unwrap();
        let now = bed.now();
        for event in events.iter() {
            bridge.handle_event(bed.host.stack(), event, now);
        }
        bridge.events_handled();
        bed.step_with(&mut bridge);
        bed.wakes.wake_all();
        let now = bed.now();
        bridge.service(bed.host.stack(), now);
        if let Ok((_, peer)) = bed.guest.accept(guest_listener) {
            assert_eq!(peer.cid, 2, "the host reached the guest's listener");
        }
    }
    let answer = client.join().unwrap();
    let ok = pier_hybrid::parse_ok(answer.as_bytes());
    assert!(ok.is_some(), "the CONNECT to the new CID was answered {answer:?}");
}

/// Under a guest thread the driver's kicks wait until the guest lock is
/// released (`DeferredKicks`): a kick held back never reaches the device's
/// eventfd before the flush, and every one does after it.
#[test]
fn deferred_kicks_reach_the_device_at_the_flush() {
    use pier_device::device::TX_QUEUE;
    let mut bed = Testbed::with_defaults().unwrap();
    let kicks = bed.driver.transport().deferred_kicks().clone();
    let tx_kick = bed.events.queue(TX_QUEUE).expect("a tx eventfd").try_clone().unwrap();
    while tx_kick.read().is_ok() {}
    kicks.enable();
    let raw = Header::new(
        SocketType::Stream,
        Op::Request,
        VsockAddr::new(GUEST, 1000),
        VsockAddr::new(2, 1001),
    )
    .to_raw();
    bed.driver.transmit_raw(&raw, &[]).expect("a free tx buffer");
    assert!(tx_kick.read().is_err(), "the kick waited");
    kicks.flush();
    assert_eq!(tx_kick.read().ok(), Some(1), "the flush sent it");
    kicks.flush();
    assert!(tx_kick.read().is_err(), "and only once");
}

/// A bridge connection closed while a poll was under way keeps its token
/// until that poll's events have been handled. The poll may already hold
/// an event of the closed socket; a new connection given the token
/// earlier would take that event as its own. A stale hang-up made such a
/// newcomer look abandoned, and it was closed before its OK. This is what
/// an inline kick's round does: it closes connections on the component's
/// thread while the device loop sleeps in its poll.
#[test]
fn a_token_freed_while_a_poll_was_under_way_does_not_reach_a_new_connection_first() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use mio::{Events, Poll};
    use pier_device::bridge::Bridge;

    fn handshake(bed: &mut Testbed, bridge: &mut Bridge, poll: &mut Poll, client: &UnixStream) {
        client.set_nonblocking(true).unwrap();
        (&*client).write_all(pier_hybrid::connect_line(4000).as_bytes()).unwrap();
        let mut events = Events::with_capacity(64);
        let mut answer = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !answer.ends_with(b"\n") {
            assert!(std::time::Instant::now() < deadline, "no answer: {answer:?}");
            poll.poll(&mut events, Some(Duration::from_millis(1))).unwrap();
            let now = bed.now();
            for event in events.iter() {
                bridge.handle_event(bed.host.stack(), event, now);
            }
            bridge.events_handled();
            bed.step_with(bridge);
            let mut byte = [0u8];
            while answer.last() != Some(&b'\n') && (&*client).read(&mut byte).unwrap_or(0) == 1 {
                answer.push(byte[0]);
            }
            assert!(bridge.stats().abandoned == 0, "the bridge dropped the client: {answer:?}");
        }
        assert!(pier_hybrid::parse_ok(&answer).is_some(), "answered {answer:?}");
    }

    let BridgedBed { dir, mut bed, mut poll, mut bridge, guest_listener } = BridgedBed::new();
    let uds = dir.path().join("v.sock");

    let first = UnixStream::connect(&uds).unwrap();
    handshake(&mut bed, &mut bridge, &mut poll, &first);
    let (first_in_guest, _) = bed.guest.accept(guest_listener).unwrap();

    // The poll collects two events: the listener's, for a new client,
    // then the first client's hang-up.
    let second = UnixStream::connect(&uds).unwrap();
    drop(first);
    let mut events = Events::with_capacity(64);
    poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
    let hang_up = |e: &&mio::event::Event| e.is_read_closed() && e.is_write_closed();
    assert_eq!(events.iter().filter(hang_up).count(), 1, "the poll holds the hang-up");
    assert!(events.iter().count() >= 2, "and the listener's event");
    // Before they are handled, a round elsewhere closes the first
    // connection: the guest resets it.
    let now = bed.now();
    bed.guest.abort(first_in_guest, now).unwrap();
    let closed = bridge.stats().closed;
    for _ in 0..8 {
        bed.step_with(&mut bridge);
    }
    assert_eq!(bridge.stats().closed, closed + 1, "the reset closed the first connection");
    // Now the poll's events, in the order that hurts (epoll may give
    // either): the new client is accepted, and the old hang-up follows it.
    let now = bed.now();
    let (hang_ups, others): (Vec<_>, Vec<_>) = events.iter().partition(hang_up);
    for event in others.into_iter().chain(hang_ups) {
        bridge.handle_event(bed.host.stack(), event, now);
    }
    bridge.events_handled();
    handshake(&mut bed, &mut bridge, &mut poll, &second);
}
