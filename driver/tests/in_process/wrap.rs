//! Ring indices past their 16-bit wrap: far more packets than the queue
//! holds, each way, through a device that looks at a ring only after a
//! kick, so one kick missed at the wrap is a stall.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::SocketType;

use crate::common::*;

/// More than 65 536 buffers published on rx and tx, several per round: the
/// 16-bit ring indices wrap, and with EVENT_IDX the driver still kicks when
/// the device needs it (virtio-drivers' own check is not wrap-safe). The
/// device here only looks at tx after a kick, so a missed kick stalls.
#[test]
fn ring_indices_wrap_without_a_stall() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::SeqPacket, 77);
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

/// The rx index past its wrap, with and without EVENT_IDX: the host
/// keeps one message more than the ring holds waiting, so the device runs
/// the ring dry in every round and waits for the refill kick, which must
/// come across the wrap too.
#[test]
fn the_rx_index_wraps_without_a_stall() {
    const RX_BUFFERS: u32 = 4;
    for event_idx in [true, false] {
        let driver =
            DriverConfig { rx_buffers: RX_BUFFERS as usize, event_idx, ..DriverConfig::default() };
        let mut bed = Testbed::new(VsockConfig::default(), driver).unwrap();
        let (c, s) = bed.connect(SocketType::SeqPacket, 77);
        let mut device = KickDrivenDevice::default();
        let mut buf = [0u8; 16];
        let (mut next_sent, mut next_expected) = (0u32, 0u32);
        let mut send = |bed: &mut Testbed, count: u32| {
            for _ in 0..count {
                bed.host.stack().send_message(s, &next_sent.to_le_bytes(), true).unwrap();
                next_sent += 1;
            }
        };
        // The one message ahead.
        send(&mut bed, 1);
        for round in 0..17_000u32 {
            send(&mut bed, RX_BUFFERS);
            // The driver takes the last round's buffers and refills; the
            // device fills them and finds the ring empty again.
            device.step(&mut bed);
            assert!(bed.host.stack().has_pending_tx(), "round {round}: the ring did not run dry");
            while let Ok(info) = bed.guest.recv(c, &mut buf) {
                assert_eq!(&buf[..info.len], &next_expected.to_le_bytes());
                next_expected += 1;
            }
            assert_eq!(
                next_expected,
                round * RX_BUFFERS,
                "event_idx {event_idx}: stalled in round {round}"
            );
        }
        assert!(bed.driver.stats().rx_buffers_used > 65_536);
    }
}
