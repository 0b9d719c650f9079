//! What a real driver (Linux's `virtio_mmio` and `virtio_vsock`, or
//! virtio-drivers on a real bus) relies on and pier-driver alone would
//! not have caught: notification re-arming with EVENT_IDX, an interrupt
//! for every returned chain, a reset that reaches the host side, events
//! kept until the driver has a buffer, and the register file's corners.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use pier_device::device::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE, features as fb, status};
use pier_device::mmio::{INT_CONFIG, INT_VRING, MmioDevice};
use pier_device::queues::EVENT_TRANSPORT_RESET;
use pier_device::{
    DmaRegion, EventSource, GuestCid, HostEndpoint, MmioBus, MmioEvent, NoHostSide, QueueError,
    Relay, Siblings, VsockConfig, VsockMmio,
};
use pier_stack::wire::RawHeader;
use pier_stack::{Instant, SocketType, TxSink, VsockAddr, WakeList};
use virtio_bindings::virtio_mmio as reg;
use vm_memory::{Bytes, GuestAddress};

use crate::common::*;

const MEM: usize = 4 << 20;

fn feats() -> u64 {
    fb::VERSION_1 | fb::EVENT_IDX | fb::STREAM | fb::SEQPACKET | fb::NO_IMPLIED_STREAM
}

/// Linux's `vring_need_event`: after publishing from `old` to `new`, the
/// driver kicks only if the device's `avail_event` lies in between.
fn linux_kicks(avail_event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(avail_event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Posts `count` writable rx buffers of `len` bytes, from descriptor `first`.
fn post_rx(d: &mut RawDevice, first: u16, count: u16, len: u32) {
    for i in first..first + count {
        d.queues[RX_QUEUE].set_desc(i, DATA + u64::from(i) * 0x1_0000, len, F_WRITE, 0);
        d.queues[RX_QUEUE].publish(i);
    }
}

/// A tx chain of one descriptor holding `packet`, at descriptor `i`.
fn publish_tx(d: &mut RawDevice, i: u16, packet: &[u8]) {
    let addr = DATA + 0x20_0000 + u64::from(i) * 0x1000;
    d.mem.write_slice(packet, GuestAddress(addr)).unwrap();
    d.queues[TX_QUEUE].set_desc(i, addr, packet.len() as u32, 0, 0);
    d.queues[TX_QUEUE].publish(i);
}

/// A REQUEST from the guest (CID 3) to host port 1234 with a given source.
fn guest_request(src_cid: u64) -> Vec<u8> {
    let mut h = header(0, 1);
    h[0..8].copy_from_slice(&src_cid.to_le_bytes());
    h[8..16].copy_from_slice(&2u64.to_le_bytes());
    h[20..24].copy_from_slice(&1234u32.to_le_bytes());
    h.to_vec()
}

/// Bug: with EVENT_IDX the device never moved `avail_event` on the rx
/// queue, so after its first fill a Linux guest (which kicks only when its
/// index crosses `avail_event`) never kicked again and host-to-guest
/// traffic stalled. The device must ask for a kick when it runs dry.
#[test]
fn an_empty_rx_ring_asks_a_linux_driver_for_its_next_refill() {
    let mut d = raw_device(feats(), 16, MEM);
    post_rx(&mut d, 0, 2, 4096);
    for n in 0..3u8 {
        let written = d.dev.write_rx(&header(1, 5), &[n]).unwrap();
        assert_eq!(written.is_some(), n < 2, "packet {n}");
    }
    // The third packet waits. Linux refills two buffers, 2 -> 4.
    let avail_event = d.queues[RX_QUEUE].avail_event();
    assert!(
        linux_kicks(avail_event, 4, 2),
        "avail_event {avail_event}: Linux would not kick for its refill"
    );
    post_rx(&mut d, 2, 2, 4096);
    assert!(d.dev.write_rx(&header(1, 5), &[2]).unwrap().is_some());
}

/// The same rule on the event queue: a device that found no event buffer
/// must be told when one arrives.
#[test]
fn an_empty_event_ring_asks_for_a_kick() {
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[EVENT_QUEUE].set_desc(0, DATA, 4, F_WRITE, 0);
    d.queues[EVENT_QUEUE].publish(0);
    assert_eq!(d.dev.post_event(EVENT_TRANSPORT_RESET), Ok(true));
    // The one buffer is used; the next event finds none ...
    assert_eq!(d.dev.post_event(EVENT_TRANSPORT_RESET), Ok(false));
    // ... so the driver's repost (1 -> 2) must kick.
    let avail_event = d.queues[EVENT_QUEUE].avail_event();
    assert!(linux_kicks(avail_event, 2, 1), "avail_event {avail_event}");
    d.queues[EVENT_QUEUE].publish(0);
    assert_eq!(d.dev.post_event(EVENT_TRANSPORT_RESET), Ok(true));
}

/// Bug: the tx interrupt was raised only when a packet reached the host
/// stack. Chains rejected (spoofed source, malformed) went back to the
/// used ring silently, and Linux, which frees tx buffers only in its
/// tx-done callback, ran out of them (spec 2.7.7.2: the device MUST
/// interrupt for used buffers unless suppressed).
#[test]
fn rejected_tx_chains_still_interrupt_the_driver() {
    let mut d = raw_device(fb::VERSION_1 | fb::STREAM, 16, MEM);
    let mut host = HostEndpoint::new(3, |_| {});
    let mut wakes = WakeList::new();
    let now = Instant::from_micros(0);

    publish_tx(&mut d, 0, &guest_request(7));
    host.take_tx(&mut d.dev, &mut NoHostSide, now, &mut wakes).unwrap();
    assert_eq!(d.queues[TX_QUEUE].used_idx(), 1);
    assert_eq!(host.stats().spoofed_source, 1);
    assert_eq!(d.dev.interrupts_raised(), 1, "a spoofed chain came back without an interrupt");

    // A chain shorter than a header.
    publish_tx(&mut d, 1, &[0u8; 10]);
    host.take_tx(&mut d.dev, &mut NoHostSide, now, &mut wakes).unwrap();
    assert_eq!(d.queues[TX_QUEUE].used_idx(), 2);
    assert_eq!(host.stats().bad_chains, 1);
    assert_eq!(d.dev.interrupts_raised(), 2, "a malformed chain came back without an interrupt");

    // And nothing returned, no interrupt.
    host.take_tx(&mut d.dev, &mut NoHostSide, now, &mut wakes).unwrap();
    assert_eq!(d.dev.interrupts_raised(), 2);
}

/// An rx buffer too small for even a header is handed back unused; the
/// driver needs it back, so that is an interrupt too.
#[test]
fn rx_chains_returned_unused_interrupt_the_driver() {
    let mut d = raw_device(fb::VERSION_1 | fb::STREAM, 16, MEM);
    let mut host = HostEndpoint::new(3, |_| {});
    let mut wakes = WakeList::new();
    let now = Instant::from_micros(0);
    // The host connects to the guest: one REQUEST waits to go out.
    let s = host.stack().socket(SocketType::Stream).unwrap();
    host.stack().connect(s, VsockAddr::new(3, 80), now).unwrap();
    d.queues[RX_QUEUE].set_desc(0, DATA, 8, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(0);
    host.give_rx(&mut d.dev, &mut NoHostSide, now, &mut wakes);
    assert_eq!(d.queues[RX_QUEUE].used_elem(0), (0, 0));
    assert_eq!(d.dev.interrupts_raised(), 1);
}

/// Bug: a device reset only woke the device loop; the host stack went on
/// sending the new driver packets for the old driver's connections.
#[test]
fn a_device_reset_resets_the_host_side() {
    let mut d = raw_device(feats(), 16, MEM);
    let mut host = HostEndpoint::new(3, |_| {});
    let mut wakes = WakeList::new();
    let now = Instant::from_micros(0);
    // The old driver is served once (the endpoint adopts it) ...
    host.take_tx(&mut d.dev, &mut NoHostSide, now, &mut wakes).unwrap();
    // ... and the host starts a connection to it, whose REQUEST waits.
    let s = host.stack().socket(SocketType::Stream).unwrap();
    host.stack().connect(s, VsockAddr::new(3, 80), now).unwrap();
    assert!(host.stack().has_pending_tx());

    // The guest reboots: status 0, then a new driver sets the device up.
    d.reinit();
    post_rx(&mut d, 0, 4, 4096);
    host.give_rx(&mut d.dev, &mut NoHostSide, now, &mut wakes);

    assert_eq!(d.queues[RX_QUEUE].used_idx(), 0, "the new driver got the old driver's packets");
    assert!(!host.stack().has_pending_tx());
    assert_eq!(host.stack().finish_connect(s), Err(pier_stack::Error::ConnectionReset));
    assert_eq!(host.stats().driver_resets, 1);
}

/// A TRANSPORT_RESET with no event buffer posted is kept, and delivered
/// (with an interrupt) once the driver posts one.
#[test]
fn a_transport_reset_waits_for_an_event_buffer() {
    let mut d = raw_device(feats(), 16, MEM);
    let mut host = HostEndpoint::new(3, |_| {});
    let mut wakes = WakeList::new();
    host.change_guest_cid(&mut d.dev, &mut NoHostSide, GuestCid::new(9).unwrap(), &mut wakes);
    assert!(d.dev.transport_reset_pending());
    let interrupts = d.dev.interrupts_raised();

    d.mem.write_slice(&[0xaa; 4], GuestAddress(DATA)).unwrap();
    d.queues[EVENT_QUEUE].set_desc(0, DATA, 4, F_WRITE, 0);
    d.queues[EVENT_QUEUE].publish(0);
    host.follow_driver(&mut d.dev, &mut wakes);

    assert!(!d.dev.transport_reset_pending());
    assert_eq!(d.queues[EVENT_QUEUE].used_elem(0), (0, 4));
    let id: u32 = d.mem.read_obj(GuestAddress(DATA)).unwrap();
    assert_eq!(id, EVENT_TRANSPORT_RESET);
    assert_eq!(d.dev.interrupts_raised(), interrupts + 1);
    assert_eq!(d.dev.guest_cid(), 9);
}

/// A driver that sets FAILED is no longer served.
#[test]
fn a_failed_driver_is_not_served() {
    let mut d = raw_device(feats(), 16, MEM);
    assert!(d.dev.driver_ok());
    let s = r(&d.dev, reg::VIRTIO_MMIO_STATUS);
    assert_eq!(w(&mut d.dev, reg::VIRTIO_MMIO_STATUS, s | status::FAILED), MmioEvent::Failed);
    assert!(!d.dev.driver_ok());
    assert_eq!(d.dev.write_rx(&header(0, 5), &[]), Err(QueueError::NotReady));
}

/// Rings the driver broke (an available index a whole ring ahead) are
/// fatal: the device says so with DEVICE_NEEDS_RESET and a config
/// interrupt instead of failing quietly for ever.
#[test]
fn a_fatal_queue_error_sets_needs_reset() {
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[TX_QUEUE].set_avail_idx(17);
    assert_eq!(d.dev.drain_tx(|_| {}), Err(QueueError::AvailIndex));
    assert_ne!(d.dev.status() & status::NEEDS_RESET, 0);
    assert_ne!(d.dev.interrupt_status() & INT_CONFIG, 0);
    assert!(!d.dev.driver_ok());
}

/// One drain takes at most the budget; the rest waits with notifications
/// off, and the caller is told to come back.
#[test]
fn a_tx_drain_stops_at_its_budget() {
    let mut d = raw_device(feats(), 16, MEM);
    d.dev.set_tx_budget(2);
    for i in 0..5 {
        publish_tx(&mut d, i, &guest_request(3));
    }
    let mut sizes = Vec::new();
    loop {
        let stats = d.dev.drain_tx(|_| {}).unwrap();
        sizes.push(stats.packets);
        if !stats.more {
            break;
        }
    }
    assert_eq!(sizes, [2, 2, 1]);
}

/// A backend with one host datagram for the guest.
struct OneHostDatagram(Option<RawHeader>);

impl EventSource for OneHostDatagram {}
impl Siblings for OneHostDatagram {}

impl Relay for OneHostDatagram {
    fn host_datagrams(&mut self, sink: &mut dyn TxSink) {
        if let Some(header) = self.0
            && sink.transmit(&header, &[1]).is_ok()
        {
            self.0 = None;
        }
    }
}

/// The host side carries only the socket types the driver negotiated:
/// no datagrams for a driver without DGRAM (Linux's), whichever way.
#[test]
fn the_host_side_follows_the_negotiated_socket_types() {
    let mut d = raw_device(fb::VERSION_1 | fb::STREAM, 16, MEM);
    let mut host = HostEndpoint::new(3, |_| {});
    let mut wakes = WakeList::new();
    host.follow_driver(&mut d.dev, &mut wakes);
    assert!(!host.datagrams_negotiated());
    assert!(host.stack().socket(SocketType::SeqPacket).is_err());

    post_rx(&mut d, 0, 1, 4096);
    let mut dgram = header(1, 5);
    dgram[28..30].copy_from_slice(&3u16.to_le_bytes());
    let mut host_side = OneHostDatagram(Some(RawHeader::parse(&dgram).unwrap()));
    host.give_rx(&mut d.dev, &mut host_side, Instant::from_micros(0), &mut wakes);
    assert!(host_side.0.is_none(), "the datagram was neither delivered nor dropped");
    assert_eq!(d.queues[RX_QUEUE].used_idx(), 0, "a datagram reached a driver without DGRAM");
    assert_eq!(host.stats().datagrams_not_negotiated, 1);
}

/// InterruptStatus and InterruptACK answer while the device loop holds the
/// register lock: a vCPU taking the interrupt never waits for a round.
#[test]
fn interrupt_registers_do_not_wait_for_the_register_lock() {
    let region = DmaRegion::new(1 << 20).unwrap();
    let mut mmio = VsockMmio::new(region.memory(), VsockConfig::default()).unwrap();
    mmio.raise_interrupt(INT_VRING).unwrap();
    let device = Arc::new(MmioDevice::new(mmio));
    let held = device.lock().unwrap();
    let (done, finished) = mpsc::channel();
    let vcpu = {
        let device = device.clone();
        std::thread::spawn(move || {
            let mut bytes = [0u8; 4];
            device.mmio_read(u64::from(reg::VIRTIO_MMIO_INTERRUPT_STATUS), &mut bytes);
            device.mmio_write(u64::from(reg::VIRTIO_MMIO_INTERRUPT_ACK), &bytes);
            done.send(u32::from_le_bytes(bytes)).unwrap();
        })
    };
    let seen = finished.recv_timeout(Duration::from_secs(5));
    drop(held);
    vcpu.join().unwrap();
    assert_eq!(seen, Ok(INT_VRING), "the interrupt registers waited for the register lock");
    assert_eq!(device.lock().unwrap().interrupt_status(), 0);
}

/// There is no shared-memory region; a missing one reads as all ones.
#[test]
fn missing_shared_memory_regions_read_as_all_ones() {
    let d = raw_device(feats(), 16, MEM);
    for off in [
        reg::VIRTIO_MMIO_SHM_LEN_LOW,
        reg::VIRTIO_MMIO_SHM_LEN_HIGH,
        reg::VIRTIO_MMIO_SHM_BASE_LOW,
        reg::VIRTIO_MMIO_SHM_BASE_HIGH,
    ] {
        assert_eq!(r(&d.dev, off), u32::MAX, "register {off:#x}");
    }
}

/// The bus, not the register file, decides where ring indices start:
/// vhost-user resumes a queue at the index SET_VRING_BASE gives.
#[test]
fn a_queue_can_start_at_any_index() {
    let mut d = raw_device(feats(), 16, MEM);
    let mem = d.mem.clone();
    // Resume the tx queue at index 100, as if 100 chains went before.
    let q = d.dev.queue_mut(TX_QUEUE).unwrap();
    assert!(q.activate(&*mem, 100, 100, true, false));
    d.queues[TX_QUEUE].set_avail_idx(100);
    publish_tx(&mut d, 3, &guest_request(3));
    let mut packets = 0;
    d.dev.drain_tx(|p| packets += usize::from(p.is_ok_and(|p| p.head == 3))).unwrap();
    assert_eq!(packets, 1);
    assert_eq!(d.queues[TX_QUEUE].used_idx(), 101);
}
