//! Receive buffers: every one consumed is posted again, so the device finds
//! the whole ring each round however long the transfer and however small
//! the buffers; a ring the device found empty is refilled and the device
//! told; refills the device did not ask about are not kicked.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::SocketType;
use pier_stack::wire::HEADER_LEN;

use crate::common::*;

/// Receive buffers holding 4 KiB of payload: many packets per transfer.
fn small_buffers(rx_buffers: usize, event_idx: bool) -> DriverConfig {
    DriverConfig {
        rx_buffer_size: HEADER_LEN + 4096,
        rx_buffers,
        event_idx,
        ..DriverConfig::default()
    }
}

/// Stream bytes for a transfer: a counter modulo a prime, so a packet
/// lost, repeated or out of order shows.
fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Host to guest, 4 MiB in 4 KiB packets (over a thousand of them):
/// after every driver poll the device finds every buffer posted again but
/// those the stack holds unread (read in the previous step, they are
/// posted again by this poll), and fills them all while it has data, so
/// the ring never runs short of buffers through the driver's doing.
#[test]
fn every_consumed_rx_buffer_is_reposted() {
    for rx_buffers in [1, 16, 48] {
        let mut bed =
            Testbed::new(VsockConfig::default(), small_buffers(rx_buffers, true)).unwrap();
        let (c, s) = bed.connect(SocketType::Stream, 80);
        let data = data(4 << 20);
        let mut full_rounds = 0;
        let got = stream_to_guest(&mut bed, (c, s), &data, |bed| {
            poll(bed);
            let held = bed.driver.rx_held();
            assert!(held <= bed.driver.max_lent(), "{rx_buffers} buffers: {held} held");
            let written = bed.host.stats().to_guest;
            device_round(bed);
            let written = bed.host.stats().to_guest - written;
            if bed.host.stack().has_pending_tx() {
                // The device stopped for want of buffers: it must have
                // found every one the stack does not hold.
                assert_eq!(
                    written,
                    (rx_buffers - held) as u64,
                    "{rx_buffers} buffers, {held} held: a round found fewer"
                );
                full_rounds += 1;
            }
        });
        assert!(
            got == data,
            "{rx_buffers} buffers: {} of {} bytes arrived intact",
            got.len(),
            data.len()
        );
        assert!(
            full_rounds > 10,
            "{rx_buffers} buffers: the ring was the limit in {full_rounds} rounds"
        );
        let stats = bed.driver.stats();
        assert_eq!(stats.rx_buffers_used, bed.host.stats().to_guest);
        assert_eq!(stats.rx_malformed, 0);
    }
}

/// The device fills the ring and finds it empty (the driver was busy);
/// the driver's next poll reposts every buffer and kicks rx, which the
/// device asked for, and a device that waits for that kick goes on.
#[test]
fn a_ring_run_dry_is_refilled_and_kicked() {
    for event_idx in [true, false] {
        let mut bed = Testbed::new(VsockConfig::default(), small_buffers(16, event_idx)).unwrap();
        let (c, s) = bed.connect(SocketType::Stream, 80);
        let data = data(1 << 20);
        let mut device = KickDrivenDevice::default();
        let mut first = true;
        let got = stream_to_guest(&mut bed, (c, s), &data, |bed| {
            if !std::mem::take(&mut first) {
                // The rest of the transfer, with a device that always
                // waits for the refill kick.
                device.step(bed);
                return;
            }
            device.round(bed);
            device.round(bed);
            assert!(bed.host.stack().has_pending_tx(), "the ring did not run dry");
            let (counted, seen) = (bed.driver.stats().rx_notifications, device.rx_kicks);
            assert_eq!(poll(bed).received, 16);
            assert_eq!(bed.driver.stats().rx_notifications - counted, 1, "event_idx {event_idx}");
            assert!(device.round(bed) > 0, "event_idx {event_idx}: the device did not go on");
            assert_eq!(
                device.rx_kicks - seen,
                1,
                "event_idx {event_idx}: the refill was not kicked"
            );
        });
        assert!(got == data, "event_idx {event_idx}: {} of {} bytes", got.len(), data.len());
    }
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
    let (c, s) = bed.connect(SocketType::Stream, 5);
    let kicks_before = bed.driver.stats().rx_notifications;
    let raised_before = interrupts(&bed);
    let data = data(16 << 20);
    let got = stream_to_guest(&mut bed, (c, s), &data, |bed| {
        bed.step();
    });
    assert!(got == data, "{} of {} bytes arrived", got.len(), data.len());
    let kicks = bed.driver.stats().rx_notifications - kicks_before;
    let rx_used = bed.driver.stats().rx_buffers_used;
    assert!(rx_used >= 256, "the transfer took {rx_used} receive buffers");
    // Before the device turned RX kicks off while it had buffers, this
    // transfer kicked 64 times (once per batch of refills).
    assert!(kicks * 16 <= rx_used, "{kicks} rx kicks for {rx_used} refilled buffers");
    let raised = interrupts(&bed) - raised_before;
    assert_eq!(raised, 0, "interrupts were off, yet {raised} were raised");
}
