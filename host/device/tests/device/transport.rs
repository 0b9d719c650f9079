//! virtio-drivers' own `VirtQueue`, driven through the in-process transport
//! against the device, with a device thread woken by eventfds.

use pier_device::device::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE, status};
use pier_device::mmio::{INT_CONFIG, INT_VRING};
use pier_device::queues::EVENT_TRANSPORT_RESET;
use pier_device::{HDR_LEN, InProcessHal, VsockConfig};
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, Transport};

use crate::common::*;

const Q: usize = 16;

fn features() -> F {
    F::VERSION_1 | F::EVENT_IDX | F::STREAM | F::SEQPACKET | F::NO_IMPLIED_STREAM | F::DGRAM
}

/// Brings a harness up to DRIVER_OK with all three queues.
fn up<const N: usize>(
    config: VsockConfig,
) -> (Harness, VirtQueue<InProcessHal, N>, VirtQueue<InProcessHal, N>, VirtQueue<InProcessHal, N>) {
    let mut h = Harness::new(config, features());
    let event_idx = h.negotiated.contains(F::EVENT_IDX);
    let rx = VirtQueue::new(&mut h.transport, RX_QUEUE as u16, false, event_idx).unwrap();
    let tx = VirtQueue::new(&mut h.transport, TX_QUEUE as u16, false, event_idx).unwrap();
    let ev = VirtQueue::new(&mut h.transport, EVENT_QUEUE as u16, false, event_idx).unwrap();
    h.transport.finish_init();
    (h, rx, tx, ev)
}

#[test]
fn begin_init_negotiates_and_queues_come_up() {
    let config = VsockConfig {
        guest_cid: 0x1_0000_0042,
        features: (F::VERSION_1 | F::EVENT_IDX | F::STREAM | F::SEQPACKET).bits(),
        ..VsockConfig::default()
    };
    // The driver also wants DGRAM, which the device does not offer.
    let mut h = Harness::new(config, features());
    assert_eq!(h.negotiated, F::VERSION_1 | F::EVENT_IDX | F::STREAM | F::SEQPACKET);
    assert_eq!(h.dev().negotiated_features(), h.negotiated.bits());
    assert_eq!(
        h.transport.get_status(),
        DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK
    );
    assert_eq!(h.transport.device_type(), virtio_drivers::transport::DeviceType::Socket);
    assert_eq!(h.transport.max_queue_size(1), 256);

    // The guest CID, read the way virtio-drivers' socket driver reads it.
    let cid = h
        .transport
        .read_consistent(|| {
            let lo: u32 = h.transport.read_config_space(0)?;
            let hi: u32 = h.transport.read_config_space(4)?;
            Ok(u64::from(lo) | (u64::from(hi) << 32))
        })
        .unwrap();
    assert_eq!(cid, 0x1_0000_0042);
    assert!(h.transport.read_config_space::<u32>(8).is_err(), "past the 8-byte config space");

    let mut queues = Vec::new();
    for q in 0..3u16 {
        assert!(!h.transport.queue_used(q));
        queues.push(VirtQueue::<InProcessHal, Q>::new(&mut h.transport, q, false, true).unwrap());
        assert!(h.transport.queue_used(q));
    }
    // A queue cannot be set up twice.
    assert!(VirtQueue::<InProcessHal, Q>::new(&mut h.transport, 1, false, true).is_err());
    assert!(!h.dev().driver_ok());
    h.transport.finish_init();
    assert!(h.dev().driver_ok());
    for q in 0..3 {
        let dev = h.dev();
        let queue = dev.queue(q).unwrap().queue();
        assert!(virtio_queue::QueueT::event_idx_enabled(queue));
        assert_eq!(virtio_queue::QueueT::size(queue), Q as u16);
    }
    // Rings and nothing else were allocated: 3 queues x 2 regions.
    assert_eq!(h.region.allocated_pages(), 6);
    drop(queues);
    assert_eq!(h.region.allocated_pages(), 0);
}

#[test]
fn queue_unset_and_reset_forget_queues() {
    let (mut h, rx, tx, ev) = up::<Q>(VsockConfig::default());
    drop((rx, tx, ev));
    h.transport.queue_unset(1);
    assert!(!h.transport.queue_used(1));
    assert!(h.transport.queue_used(0));
    h.transport.set_status(DeviceStatus::empty());
    assert_eq!(h.transport.get_status(), DeviceStatus::empty());
    for q in 0..3 {
        assert!(!h.transport.queue_used(q));
    }
    // The reset reached the device thread's control eventfd.
    // begin_init's reset, finish_init's DRIVER_OK, and this reset.
    assert_eq!(h.events.control().read().unwrap(), 3);
}

/// Sends one packet whose bytes are laid out over `cuts` (lengths of the
/// successive descriptors) and checks the device sees exactly the packet.
fn send_split(
    h: &mut Harness,
    tx: &mut VirtQueue<InProcessHal, Q>,
    dt: &DeviceThread,
    irq: &mut pier_device::EventWaiter,
    cuts: &[usize],
    seed: u8,
) {
    let total: usize = cuts.iter().sum();
    let data = payload(total - HDR_LEN, seed);
    let hdr = header(data.len() as u32, 5);
    let mut packet = hdr.to_vec();
    packet.extend_from_slice(&data);

    let buf = DmaBuf::new(packet.len().div_ceil(4096) + 1);
    // SAFETY: one slice per descriptor, disjoint, dropped before `buf`.
    let whole = unsafe { buf.slice(0, packet.len()) };
    whole.copy_from_slice(&packet);
    let mut parts: Vec<&[u8]> = Vec::new();
    let mut rest: &[u8] = whole;
    for &n in cuts {
        let (a, b) = rest.split_at(n);
        parts.push(a);
        rest = b;
    }
    // SAFETY: the buffers stay untouched until pop_used below.
    let token = unsafe { tx.add(&parts, &mut []) }.unwrap();
    assert!(tx.should_notify(), "device left avail_event behind");
    h.transport.notify(TX_QUEUE as u16);

    let (got_hdr, got_payload) = dt.tx_packets.recv_timeout(TIMEOUT).unwrap();
    assert_eq!(got_hdr, hdr);
    assert_eq!(got_payload, data);
    assert_eq!(wait_irq(h, irq) & INT_VRING, INT_VRING);
    assert!(tx.can_pop());
    // SAFETY: same buffers as passed to add.
    let used = unsafe { tx.pop_used(token, &parts, &mut []) }.unwrap();
    assert_eq!(used, 0, "the device writes nothing into TX buffers");
}

#[test]
fn tx_packets_split_over_descriptors_arrive_intact() {
    let (mut h, _rx, mut tx, _ev) = up::<Q>(VsockConfig::default());
    let dt = DeviceThread::spawn(h.bus.clone(), &h.events);
    let mut irq = pier_device::EventWaiter::new(&[h.events.irq()]).unwrap();

    send_split(&mut h, &mut tx, &dt, &mut irq, &[HDR_LEN + 100], 1); // one descriptor
    send_split(&mut h, &mut tx, &dt, &mut irq, &[HDR_LEN, 1000], 2); // rust-vmm layout
    send_split(&mut h, &mut tx, &dt, &mut irq, &[HDR_LEN], 3); // header only
    send_split(&mut h, &mut tx, &dt, &mut irq, &[10, 34, 7, 4000, 1], 4); // header split
    send_split(&mut h, &mut tx, &dt, &mut irq, &[50, 9000], 5); // header + payload head
    assert!(dt.errors.try_recv().is_err());
}

#[test]
fn rx_packet_lands_in_driver_buffers() {
    let (mut h, mut rx, _tx, _ev) = up::<Q>(VsockConfig::default());
    let dt = DeviceThread::spawn(h.bus.clone(), &h.events);
    let mut irq = pier_device::EventWaiter::new(&[h.events.irq()]).unwrap();

    let buf = DmaBuf::new(3);
    // Layout 1: one 4 KiB buffer. Layout 2: a header-sized buffer, then
    // 4 KiB. virtio-drivers' `pop_used` ties the outer slice's borrow to
    // the inner slices' lifetime, so each call gets freshly built slices.
    // SAFETY (all `slice` calls): disjoint ranges of `buf`, unused after it.
    let one = || -> [&mut [u8]; 1] { [unsafe { buf.slice(0, 4096) }] };
    let two = || -> [&mut [u8]; 2] { unsafe { [buf.slice(4096, HDR_LEN), buf.slice(8192, 4096)] } };
    // SAFETY: untouched until popped.
    let t1 = unsafe { rx.add(&[], &mut one()) }.unwrap();
    let t2 = unsafe { rx.add(&[], &mut two()) }.unwrap();
    if rx.should_notify() {
        h.transport.notify(RX_QUEUE as u16);
    }

    let p1 = payload(300, 7);
    let p2 = payload(2000, 9);
    dt.send(Cmd::Rx(header(300, 5).to_vec(), p1.clone()));
    dt.send(Cmd::Rx(header(2000, 5).to_vec(), p2.clone()));
    assert_eq!(dt.rx_used.recv_timeout(TIMEOUT).unwrap(), (HDR_LEN + 300) as u32);
    assert_eq!(dt.rx_used.recv_timeout(TIMEOUT).unwrap(), (HDR_LEN + 2000) as u32);
    assert_eq!(wait_irq(&mut h, &mut irq) & INT_VRING, INT_VRING);

    // SAFETY: same buffers as added.
    let used1 = unsafe { rx.pop_used(t1, &[], &mut one()) }.unwrap();
    let used2 = unsafe { rx.pop_used(t2, &[], &mut two()) }.unwrap();
    assert_eq!(used1 as usize, HDR_LEN + 300);
    assert_eq!(used2 as usize, HDR_LEN + 2000);
    let [a] = one();
    assert_eq!(a[..HDR_LEN], header(300, 5));
    assert_eq!(a[HDR_LEN..HDR_LEN + 300], p1[..]);
    assert!(a[HDR_LEN + 300..].iter().all(|&b| b == 0), "wrote past the packet");
    let [b, c] = two();
    assert_eq!(b[..], header(2000, 5));
    assert_eq!(c[..2000], p2[..]);

    // No buffer posted: the device holds the packet until the driver adds
    // one and kicks.
    let p3 = payload(10, 1);
    dt.send(Cmd::Rx(header(10, 5).to_vec(), p3.clone()));
    assert!(dt.rx_used.recv_timeout(std::time::Duration::from_millis(200)).is_err());
    let t3 = unsafe { rx.add(&[], &mut one()) }.unwrap();
    assert!(rx.should_notify(), "device must re-arm RX kicks when starved");
    h.transport.notify(RX_QUEUE as u16);
    assert_eq!(dt.rx_used.recv_timeout(TIMEOUT).unwrap(), (HDR_LEN + 10) as u32);
    wait_irq(&mut h, &mut irq);
    let used3 = unsafe { rx.pop_used(t3, &[], &mut one()) }.unwrap();
    assert_eq!(used3 as usize, HDR_LEN + 10);
    assert_eq!(one()[0][HDR_LEN..HDR_LEN + 10], p3[..]);
    assert!(dt.errors.try_recv().is_err());
}

#[test]
fn transport_reset_event_and_cid_change_are_delivered() {
    let (mut h, _rx, _tx, mut ev) = up::<Q>(VsockConfig::default());
    let dt = DeviceThread::spawn(h.bus.clone(), &h.events);
    let mut irq = pier_device::EventWaiter::new(&[h.events.irq()]).unwrap();

    let buf = DmaBuf::new(1);
    // SAFETY: one 8-byte slice of `buf` at a time, unused after it.
    let slot = || -> [&mut [u8]; 1] { [unsafe { buf.slice(0, 8) }] };
    slot()[0].fill(0xff);
    let token = unsafe { ev.add(&[], &mut slot()) }.unwrap();
    h.transport.notify(EVENT_QUEUE as u16);

    // Migration: new CID, config interrupt, then TRANSPORT_RESET.
    let gen_before = h.transport.read_config_generation();
    h.dev().set_guest_cid(77);
    dt.send(Cmd::Event(EVENT_TRANSPORT_RESET));

    let mut seen = 0;
    while seen & (INT_VRING | INT_CONFIG) != (INT_VRING | INT_CONFIG) {
        seen |= wait_irq(&mut h, &mut irq);
    }
    assert_ne!(h.transport.read_config_generation(), gen_before);
    let lo: u32 = h.transport.read_config_space(0).unwrap();
    assert_eq!(lo, 77);
    let used = unsafe { ev.pop_used(token, &[], &mut slot()) }.unwrap();
    assert_eq!(used, 4);
    let [event] = slot();
    assert_eq!(event[..4], 0u32.to_le_bytes());
    assert_eq!(event[4..], [0xff; 4], "only the event was written");
    assert_eq!(h.transport.ack_interrupt().bits(), 0, "acknowledged interrupts stay cleared");
}

/// EVENT_IDX across the u16 wrap, with virtio-drivers' own queue on the
/// driver side: every kick and interrupt decision is checked for 65,546
/// packets, and suppression is checked while the indices wrap.
#[test]
fn event_idx_suppression_across_u16_wrap() {
    let (h, _rx, mut tx, _ev) = up::<4>(VsockConfig { queue_size: 4, ..VsockConfig::default() });
    let buf = DmaBuf::new(1);
    let pkt = unsafe { buf.slice(0, HDR_LEN) };
    pkt.copy_from_slice(&header(0, 5));
    let parts: [&[u8]; 1] = [pkt];

    let mut dev = h.bus.lock().unwrap();
    let one_round = |dev: &mut Dev, tx: &mut VirtQueue<InProcessHal, 4>| -> bool {
        let token = unsafe { tx.add(&parts, &mut []) }.unwrap();
        assert!(tx.should_notify());
        let stats = dev.drain_tx(|p| assert!(p.is_ok())).unwrap();
        assert_eq!(stats.packets, 1);
        let irq = dev.interrupt_if_needed(TX_QUEUE).unwrap();
        unsafe { tx.pop_used(token, &parts, &mut []) }.unwrap();
        irq
    };
    // Used index goes 0 -> 65534; the driver pops each one, so each one
    // crosses used_event and must interrupt.
    for i in 0..65534u32 {
        assert!(one_round(&mut dev, &mut tx), "round {i} missed an interrupt");
    }

    // Batch of 3 without popping: used index 65534 -> 1 (wraps). One
    // interrupt for the batch, since used_event (65534) is crossed once.
    let tokens: Vec<u16> = (0..3)
        .map(|i| {
            let t = unsafe { tx.add(&parts, &mut []) }.unwrap();
            // Only the first add crosses avail_event (65534); virtio-drivers
            // agrees here only by luck, see the test below.
            if i == 0 {
                assert!(tx.should_notify());
            }
            t
        })
        .collect();
    assert_eq!(dev.drain_tx(|p| assert!(p.is_ok())).unwrap().packets, 3);
    assert!(dev.interrupt_if_needed(TX_QUEUE).unwrap());
    let dq = dev.queue(TX_QUEUE).unwrap().queue();
    assert_eq!(virtio_queue::QueueT::next_used(dq), 1, "used index wrapped");

    // The driver still has not popped, so used_event stays at 65534: one
    // more used entry must NOT interrupt (suppression across the wrap).
    let t4 = unsafe { tx.add(&parts, &mut []) }.unwrap();
    assert_eq!(dev.drain_tx(|p| assert!(p.is_ok())).unwrap().packets, 1);
    assert!(!dev.interrupt_if_needed(TX_QUEUE).unwrap());

    for t in tokens.into_iter().chain([t4]) {
        unsafe { tx.pop_used(t, &parts, &mut []) }.unwrap();
    }
    // Popping moved used_event to 2; the next entry interrupts again.
    for _ in 0..8 {
        assert!(one_round(&mut dev, &mut tx));
    }
    assert_eq!(dev.status() & status::NEEDS_RESET, 0, "no ring error on the way");
}

/// Documents a virtio-drivers 0.13.0 bug that pier-driver must not inherit:
/// `VirtQueue::should_notify` compares `avail_idx >= avail_event + 1`
/// without wrapping arithmetic, so a driver that adds several buffers
/// across the u16 wrap before checking skips a kick the device needs.
#[test]
fn virtio_drivers_should_notify_is_not_wrap_safe() {
    let (h, _rx, mut tx, _ev) = up::<4>(VsockConfig { queue_size: 4, ..VsockConfig::default() });
    let buf = DmaBuf::new(1);
    let pkt = unsafe { buf.slice(0, HDR_LEN) };
    pkt.copy_from_slice(&header(0, 5));
    let parts: [&[u8]; 1] = [pkt];
    let mut dev = h.bus.lock().unwrap();
    for _ in 0..65534u32 {
        let t = unsafe { tx.add(&parts, &mut []) }.unwrap();
        dev.drain_tx(|p| assert!(p.is_ok())).unwrap();
        unsafe { tx.pop_used(t, &parts, &mut []) }.unwrap();
    }
    // The device asked for a kick at the next entry: avail_event = 65534.
    let q = dev.queue(TX_QUEUE).unwrap().queue();
    assert_eq!(virtio_queue::QueueT::next_avail(q), 65534);
    // Three adds (65534 -> 1) before checking. Linux's vring_need_event
    // says kick: (1 - 65534 - 1) mod 2^16 = 2 < 3 entries added.
    let old: u16 = 65534;
    let new: u16 = 1;
    let event: u16 = 65534;
    assert!(new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old));
    for _ in 0..3 {
        unsafe { tx.add(&parts, &mut []) }.unwrap();
    }
    assert!(
        !tx.should_notify(),
        "virtio-drivers fixed its wrap bug; pier-driver may use should_notify again"
    );
    // The device still finds all three when it polls.
    assert_eq!(dev.drain_tx(|p| assert!(p.is_ok())).unwrap().packets, 3);
}
