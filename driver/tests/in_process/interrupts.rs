//! Interrupt suppression on the rx side: with EVENT_IDX the driver's
//! `used_event` asks for one interrupt per batch it has not seen and moves
//! on as it drains (notifications re-enabled once it is idle); without it,
//! the avail ring's NO_INTERRUPT flag follows `set_interrupts`.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::{DriverConfig, VsockFeatures};
use pier_stack::{SocketHandle, SocketType};

use crate::common::*;

/// A seqpacket connection, quiet on both sides.
fn connected(driver: DriverConfig) -> (Testbed, SocketHandle, SocketHandle) {
    let mut bed = Testbed::new(VsockConfig::default(), driver).unwrap();
    let (c, s) = bed.connect(SocketType::SeqPacket, 80);
    bed.run();
    (bed, c, s)
}

/// Host messages written into rx buffers by a device round of their own;
/// returns the interrupts that round raised.
fn deliver(bed: &mut Testbed, s: SocketHandle, message: &[u8]) -> u64 {
    let before = interrupts(bed);
    bed.host.stack().send_message(s, message, true).unwrap();
    let to_guest = bed.host.stats().to_guest;
    device_round(bed);
    assert_eq!(bed.host.stats().to_guest - to_guest, 1, "the message reached an rx buffer");
    interrupts(bed) - before
}

#[test]
fn with_event_idx_one_interrupt_until_the_driver_has_drained() {
    let (mut bed, c, s) = connected(DriverConfig::default());
    assert!(bed.driver.features().contains(VsockFeatures::EVENT_IDX));
    assert_eq!(deliver(&mut bed, s, b"first"), 1, "an idle driver wants to hear of a packet");
    // The driver has not looked yet: its used_event is where it was.
    assert_eq!(deliver(&mut bed, s, b"second"), 0, "interrupted a driver that has one pending");
    assert_eq!(deliver(&mut bed, s, b"third"), 0);

    // It drains all three and, idle again, wants the next interrupt.
    let outcome = poll(&mut bed);
    assert_eq!((outcome.received, outcome.sent), (3, 0));
    assert!(!bed.driver.has_used());
    assert_eq!(deliver(&mut bed, s, b"fourth"), 1, "a drained driver was not interrupted");
    let mut buf = [0u8; 8];
    for _ in 0..3 {
        bed.guest.recv(c, &mut buf).unwrap();
    }
}

/// Without EVENT_IDX interrupts stay off while the driver says so (a guest
/// that polls while busy), the buffers used meanwhile show in `has_used`
/// (a guest re-enabling them checks it before sleeping), and once they are
/// on again the next buffer used interrupts.
#[test]
fn without_event_idx_interrupts_follow_set_interrupts() {
    let driver = DriverConfig { event_idx: false, ..DriverConfig::default() };
    let (mut bed, _c, s) = connected(driver);
    assert!(!bed.driver.features().contains(VsockFeatures::EVENT_IDX));
    assert_eq!(deliver(&mut bed, s, b"on"), 1, "interrupts start enabled");
    assert_eq!(poll(&mut bed).received, 1);

    bed.driver.set_interrupts(false);
    assert_eq!(deliver(&mut bed, s, b"off"), 0, "interrupted a driver that turned them off");
    assert_eq!(deliver(&mut bed, s, b"off"), 0);
    bed.driver.set_interrupts(true);
    assert!(bed.driver.has_used(), "buffers used while interrupts were off went unseen");
    assert_eq!(poll(&mut bed).received, 2);
    assert!(!bed.driver.has_used());
    assert_eq!(deliver(&mut bed, s, b"on again"), 1, "interrupts did not come back");
}
