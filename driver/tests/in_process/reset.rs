//! Resets: a TRANSPORT_RESET event ends the driver's connections with
//! connection-reset, keeps its listeners, moves it to the CID the device
//! now reports, and every later event still arrives (event buffers are
//! posted again); a new driver on a device reset under it starts clean.

use pier_device::device::EVENT_QUEUE;
use pier_device::queues::EVENT_TRANSPORT_RESET;
use pier_device::testing::Testbed;
use pier_driver::{DriverConfig, DriverStats};
use pier_stack::{Error, SocketType, VsockAddr, WakeList};

use crate::common::*;

/// The device moves the guest to `cid` and reports a TRANSPORT_RESET, as a
/// migration does; the host side follows.
fn migrate(bed: &mut Testbed, cid: u64) {
    let cid = pier_device::GuestCid::try_from(cid).expect("a guest CID");
    {
        let mut mmio = bed.mmio.lock().unwrap();
        mmio.set_guest_cid(cid.as_u64());
        assert_eq!(mmio.post_event(EVENT_TRANSPORT_RESET), Ok(true), "no event buffer posted");
    }
    bed.host.set_guest_cid(cid, &mut WakeList::new());
}

#[test]
fn a_transport_reset_ends_connections_and_a_new_one_works() {
    let mut bed = Testbed::with_defaults().unwrap();
    let guest_listener = listen(&mut bed.guest, SocketType::Stream, 4000);
    let (c, _s) = bed.connect(SocketType::Stream, 1234);
    bed.guest.send(c, &[1; 100_000]).unwrap();
    // A connect on its way when the reset comes.
    let pending = bed.guest.socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.guest.connect(pending, VsockAddr::new(2, 4321), now).unwrap();
    migrate(&mut bed, 9);
    bed.run();

    assert_eq!(bed.driver.stats().transport_resets, 1);
    assert_eq!(bed.driver.guest_cid(), 9);
    assert_eq!(bed.guest.local_cid(), 9);
    assert_eq!(bed.guest.send(c, b"x"), Err(Error::ConnectionReset));
    assert_eq!(bed.guest.finish_connect(pending), Err(Error::ConnectionReset));
    assert!(bed.guest.is_listening(guest_listener).unwrap());
    // The host reaches the surviving listener at the new CID ...
    let h = bed.host.stack().socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.host.stack().connect(h, VsockAddr::new(9, 4000), now).unwrap();
    bed.run();
    assert_eq!(bed.host.stack().finish_connect(h), Ok(()));
    assert!(bed.guest.accept(guest_listener).is_ok());
    // ... and the guest connects out again from it.
    let (c, s) = bed.connect(SocketType::Stream, 1235);
    assert_eq!(bed.guest.local_addr(c).unwrap().cid, 9);
    assert_reaches_host(&mut bed, c, s, b"after");
}

/// The event queue holds a few buffers; each event the driver takes is
/// reposted, so events far beyond the queue's size, one at a time or a
/// queue's worth at once, all arrive.
#[test]
fn event_buffers_are_reposted_so_every_transport_reset_arrives() {
    let mut bed = Testbed::with_defaults().unwrap();
    let mut delivered = 0;
    for round in 0..10u64 {
        // A burst that stops when the device finds no buffer left.
        let burst = if round % 2 == 0 { 1 } else { 64 };
        kicks(&bed, EVENT_QUEUE);
        let mut posted = 0;
        {
            let mut mmio = bed.mmio.lock().unwrap();
            while posted < burst && mmio.post_event(EVENT_TRANSPORT_RESET) == Ok(true) {
                posted += 1;
            }
        }
        assert!(posted >= 1, "round {round}: the driver had no event buffer posted");
        poll(&mut bed);
        delivered += posted;
        assert_eq!(bed.driver.stats().transport_resets, delivered, "round {round}");
        // A device that found no buffer waits for the repost's kick.
        assert!(kicks(&bed, EVENT_QUEUE) > 0, "round {round}: reposts not kicked");
    }
    assert!(delivered > 16, "only {delivered} events: the queue's buffers were not reused");
    assert_eq!(bed.driver.stats().unknown_events, 0);
    assert!(!bed.mmio.lock().unwrap().transport_reset_pending());
}

/// An event id the driver does not know is counted and changes nothing.
#[test]
fn an_unknown_event_is_counted_and_ends_nothing() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 1234);
    assert_eq!(bed.mmio.lock().unwrap().post_event(7), Ok(true));
    bed.run();
    let stats = bed.driver.stats();
    assert_eq!((stats.unknown_events, stats.transport_resets), (1, 0));
    assert_reaches_host(&mut bed, c, s, b"alive");
}

/// A guest reboots: the old driver goes (its transport resets the device)
/// with data in flight both ways, and a new driver on the same device
/// starts with nothing of it: clean counters, the features and CID read
/// afresh, and a new connection that works.
#[test]
fn a_new_driver_on_a_reset_device_starts_clean_and_connects() {
    let mut bed = Testbed::with_defaults().unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 1234);
    bed.guest.send(c, &[1; 200_000]).unwrap();
    bed.host.stack().send(s, &[2; 200_000]).unwrap();
    bed.step();

    let mut bed = bed.restart_guest(DriverConfig::default()).unwrap();
    assert_eq!(bed.driver.stats(), DriverStats::default());
    assert_eq!(bed.driver.features(), pier_driver::VsockFeatures::SUPPORTED);
    assert_eq!(bed.driver.guest_cid(), 3);
    bed.run();
    assert_eq!(bed.driver.stats().rx_buffers_used, 0, "the new driver got the old one's packets");

    let (c, s) = bed.connect(SocketType::Stream, 1235);
    assert_reaches_host(&mut bed, c, s, b"new guest");
    let got = stream_to_guest(&mut bed, (c, s), b"new host", |bed| {
        bed.step();
    });
    assert_eq!(got, b"new host");
}
