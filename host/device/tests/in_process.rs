//! pier-driver against the device model through the in-process transport:
//! the real virtio path, in one thread.

use std::time::Duration;

use pier_device::InProcessDevice;
use pier_device::mmio::{VsockConfig, features};
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::wire::{HEADER_LEN, Header, Op};
use pier_stack::{Error, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr};
use pier_testkit::pattern::xorshift32_bytes;

const GUEST: u32 = 3;

fn listen(stack: &mut Stack, ty: SocketType, port: u32) -> SocketHandle {
    let l = stack.socket(ty).unwrap();
    stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
    stack.listen(l, 16).unwrap();
    l
}

/// Guest connects to a host listener; returns (guest socket, host socket).
fn connect_out(bed: &mut Testbed, ty: SocketType, port: u32) -> (SocketHandle, SocketHandle) {
    let l = listen(bed.host.stack(), ty, port);
    let c = bed.guest.socket(ty).unwrap();
    let now = bed.now();
    bed.guest.connect(c, VsockAddr::new(2, port), now).unwrap();
    bed.run();
    bed.guest.finish_connect(c).expect("connected over virtio");
    let (s, peer) = bed.host.stack().accept(l).unwrap();
    assert_eq!(peer.cid, GUEST);
    (c, s)
}

#[test]
fn driver_negotiates_every_feature_and_reads_the_cid() {
    let bed = Testbed::with_defaults().unwrap();
    assert_eq!(bed.driver.guest_cid(), 3);
    assert_eq!(bed.driver.features().socket_types(), pier_stack::Features::ALL);
    assert_eq!(bed.guest.local_cid(), 3);
}

#[test]
fn missing_features_fail_fast_with_not_supported() {
    let device = VsockConfig {
        features: features::VERSION_1 | features::EVENT_IDX | features::STREAM,
        ..VsockConfig::default()
    };
    let mut bed = Testbed::new(device, DriverConfig::default()).unwrap();
    assert_eq!(bed.guest.socket(SocketType::SeqPacket), Err(Error::SocketTypeNotSupported));
    assert_eq!(bed.guest.socket(SocketType::Datagram), Err(Error::SocketTypeNotSupported));
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 80);
    bed.guest.send(c, b"stream still works").unwrap();
    bed.run();
    let mut buf = [0u8; 64];
    assert_eq!(bed.host.stack().recv(s, &mut buf).unwrap().len, 18);
}

#[test]
fn stream_both_ways_through_virtio() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 1234);
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
    let (c, s) = connect_out(&mut bed, SocketType::SeqPacket, 99);
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
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 5);
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

/// A TRANSPORT_RESET event: connections fail with connection-reset, the
/// listener survives, and the new CID is used.
#[test]
fn transport_reset_through_the_event_queue() {
    let mut bed = Testbed::with_defaults().unwrap();
    let guest_listener = listen(&mut bed.guest, SocketType::Stream, 4000);
    let (c, _s) = connect_out(&mut bed, SocketType::Stream, 1234);
    bed.guest.send(c, &[1; 100_000]).unwrap();
    {
        let mut mmio = bed.mmio.lock().unwrap();
        mmio.set_guest_cid(9).unwrap();
        mmio.post_event(0).unwrap();
    }
    let mut wakes = pier_stack::WakeList::new();
    bed.host.set_guest_cid(9, &mut wakes);
    bed.run();
    assert_eq!(bed.driver.guest_cid(), 9);
    assert_eq!(bed.guest.local_cid(), 9);
    assert_eq!(bed.guest.send(c, b"x"), Err(Error::ConnectionReset));
    assert!(bed.guest.is_listening(guest_listener).unwrap());
    // The host reaches the surviving listener at the new CID.
    let h = bed.host.stack().socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.host.stack().connect(h, VsockAddr::new(9, 4000), now).unwrap();
    bed.run();
    assert_eq!(bed.host.stack().finish_connect(h), Ok(()));
    assert!(bed.guest.accept(guest_listener).is_ok());
}

/// Packets a hostile guest writes straight into the tx ring: a spoofed
/// source CID is dropped and counted; a packet to an unknown connection
/// draws an RST; a credit overrun is reset; an unknown op gets RST.
#[test]
fn hostile_guest_packets() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, _s) = connect_out(&mut bed, SocketType::Stream, 1234);
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
        host.process(&mut mmio.lock().unwrap(), &mut pier_device::NoBackend, now, &mut wakes);
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
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 1234);
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

/// More than 65 536 buffers published on rx and tx, several per round: the
/// 16-bit ring indices wrap, and with EVENT_IDX the driver still kicks when
/// the device needs it (virtio-drivers' own check is not wrap-safe). The
/// device here only looks at tx after a kick, so a missed kick stalls.
#[test]
fn ring_indices_wrap_without_a_stall() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = connect_out(&mut bed, SocketType::SeqPacket, 77);
    bed.kicks_only = true;
    let mut buf = [0u8; 16];
    let mut next_expected = 0u32;
    for round in 0..15_000u32 {
        for k in 0..5 {
            bed.guest.send_message(c, &(round * 5 + k).to_le_bytes(), false).unwrap();
        }
        for _ in 0..3 {
            bed.step();
        }
        while let Ok(info) = bed.host.stack().recv(s, &mut buf) {
            assert_eq!(&buf[..info.len], &next_expected.to_le_bytes());
            next_expected += 1;
        }
        assert_eq!(next_expected, (round + 1) * 5, "stalled in round {round}");
    }
    assert!(bed.driver.stats().tx_packets > 70_000);
}

/// A guest that reboots (its driver resets the device and a new one sets
/// it up) gets nothing of the old connections: the host side resets them,
/// so host programs see their connections fail, and the new guest stack
/// receives no packet for a connection it never had.
#[test]
fn a_rebooted_guest_gets_nothing_of_the_old_connections() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 1234);
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

/// Without EVENT_IDX the device asks for RX kicks only while it waits for
/// a buffer: a driver that refills as it goes does not kick once per
/// packet (each kick is a VM exit for a real guest), yet every byte
/// arrives, and interrupts stay off while the driver says so.
#[test]
fn without_event_idx_refills_do_not_kick_and_polling_needs_no_interrupts() {
    let driver = DriverConfig { event_idx: false, ..DriverConfig::default() };
    let mut bed = Testbed::new(VsockConfig::default(), driver).unwrap();
    assert!(!bed.driver.features().contains(pier_driver::VsockFeatures::EVENT_IDX));
    bed.driver.set_interrupts(false);
    let (c, s) = connect_out(&mut bed, SocketType::Stream, 5);
    let kicks_before = bed.driver.stats().rx_notifications;
    let raised_before = bed.mmio.lock().unwrap().interrupts_raised();
    let data = xorshift32_bytes(9, 16 << 20);
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = vec![0u8; 65536];
    let mut packets = 0u64;
    for _ in 0..100_000 {
        if sent < data.len() {
            sent += bed.host.stack().send(s, &data[sent..]).unwrap_or(0);
        }
        bed.step();
        while let Ok(info) = bed.guest.recv(c, &mut buf) {
            got.extend_from_slice(&buf[..info.len]);
            packets += 1;
        }
        if got.len() == data.len() {
            break;
        }
    }
    assert!(got == data, "{} of {} bytes arrived", got.len(), data.len());
    let kicks = bed.driver.stats().rx_notifications - kicks_before;
    let rx_used = bed.driver.stats().rx_buffers_used;
    assert!(rx_used >= 256, "the transfer took {rx_used} receive buffers");
    // Before the device turned RX kicks off while it had buffers, this
    // transfer kicked 64 times (once per batch of refills).
    assert!(
        kicks * 16 <= rx_used,
        "{kicks} rx kicks for {rx_used} refilled buffers ({packets} reads)"
    );
    let raised = bed.mmio.lock().unwrap().interrupts_raised() - raised_before;
    assert_eq!(raised, 0, "interrupts were off, yet {raised} were raised");
}
