//! Feature negotiation and start-up: which features the driver takes from
//! a device offering all or some of them, what the socket types it then
//! carries are, and how it gives up on a device it cannot drive.

use pier_device::device::{VsockConfig, features as device_features};
use pier_device::inprocess::SetupError;
use pier_device::testing::Testbed;
use pier_driver::{DriverConfig, DriverError, VsockFeatures as F};
use pier_stack::wire::HEADER_LEN;
use pier_stack::{Error, Features, SocketType, VMADDR_CID_ANY, VsockAddr};
use virtio_bindings::virtio_mmio as reg;
use virtio_drivers::transport::DeviceStatus;

use crate::common::*;

/// A datagram socket on each side, one datagram each way.
fn datagram_round_trip(bed: &mut Testbed) {
    let host = bed.host.stack().socket(SocketType::Datagram).unwrap();
    bed.host.stack().bind(host, VsockAddr::new(VMADDR_CID_ANY, 7)).unwrap();
    let guest = bed.guest.socket(SocketType::Datagram).unwrap();
    bed.guest.send_to(guest, b"ping", VsockAddr::new(2, 7)).unwrap();
    bed.run();
    let mut buf = [0u8; 16];
    let info = bed.host.stack().recv(host, &mut buf).unwrap();
    assert_eq!(&buf[..info.len], b"ping");
    bed.host.stack().send_to(host, b"pong", info.from.unwrap()).unwrap();
    bed.run();
    assert_eq!(bed.guest.recv(guest, &mut buf).unwrap().len, 4);
}

/// A stream connection to the host and a few bytes over it.
fn stream_works(bed: &mut Testbed, port: u32) {
    let (c, s) = bed.connect(SocketType::Stream, port);
    assert_reaches_host(bed, c, s, b"stream");
}

#[test]
fn takes_every_feature_a_full_device_offers_and_reads_the_cid() {
    let bed = Testbed::with_defaults().unwrap();
    assert_eq!(bed.driver.features(), F::SUPPORTED);
    assert_eq!(bed.mmio.lock().unwrap().negotiated_features(), F::SUPPORTED.bits());
    assert_eq!(bed.driver.features().socket_types(), Features::ALL);
    assert_eq!(bed.driver.guest_cid(), 3);
    assert_eq!(bed.guest.local_cid(), 3);
}

/// Bits the driver does not know stay off, whatever the device offers:
/// INDIRECT_DESC in particular, whose tables virtio-drivers would build on
/// the heap, where the in-process device cannot read them.
#[test]
fn never_takes_a_feature_it_does_not_know() {
    let device = VsockConfig {
        features: F::SUPPORTED.bits() | device_features::INDIRECT_DESC,
        ..VsockConfig::default()
    };
    let mut bed = Testbed::new(device, DriverConfig::default()).unwrap();
    assert_eq!(bed.driver.features(), F::SUPPORTED);
    let negotiated = bed.mmio.lock().unwrap().negotiated_features();
    assert_eq!(negotiated & device_features::INDIRECT_DESC, 0, "negotiated {negotiated:#x}");
    stream_works(&mut bed, 80);
}

#[test]
fn without_dgram_datagram_sockets_fail_as_unsupported() {
    let mut bed = offering(F::SUPPORTED - F::DGRAM, DriverConfig::default());
    assert!(!bed.driver.features().contains(F::DGRAM));
    let refused = bed.guest.socket(SocketType::Datagram);
    assert_eq!(refused, Err(Error::SocketTypeNotSupported));
    assert_eq!(
        refused.unwrap_err().to_string(),
        "socket type not supported by the transport",
        "a clear error"
    );
    stream_works(&mut bed, 80);
    let (c, s) = bed.connect(SocketType::SeqPacket, 81);
    bed.guest.send_message(c, b"message", true).unwrap();
    bed.run();
    let mut buf = [0u8; 16];
    assert!(bed.host.stack().recv(s, &mut buf).unwrap().end_of_record);
}

#[test]
fn without_seqpacket_seqpacket_sockets_fail_as_unsupported() {
    let mut bed = offering(F::SUPPORTED - F::SEQPACKET, DriverConfig::default());
    assert!(!bed.driver.features().contains(F::SEQPACKET));
    assert_eq!(bed.guest.socket(SocketType::SeqPacket), Err(Error::SocketTypeNotSupported));
    stream_works(&mut bed, 80);
    datagram_round_trip(&mut bed);
}

/// A device with no socket-type bit at all is a pre-1.2 device: stream
/// only, implied.
#[test]
fn a_device_offering_no_socket_type_carries_streams_only() {
    let mut bed = offering(F::VERSION_1 | F::EVENT_IDX, DriverConfig::default());
    assert_eq!(
        bed.driver.stack_config().features,
        Features { stream: true, seqpacket: false, datagram: false }
    );
    assert_eq!(bed.guest.socket(SocketType::SeqPacket), Err(Error::SocketTypeNotSupported));
    assert_eq!(bed.guest.socket(SocketType::Datagram), Err(Error::SocketTypeNotSupported));
    stream_works(&mut bed, 80);
}

/// Without EVENT_IDX, on the device's side or in the driver's
/// configuration, the driver falls back to the rings' flags, and a device
/// that only looks at a ring after a kick still gets every packet both
/// ways: the flags-based kick decisions are right.
#[test]
fn without_event_idx_the_driver_works_with_flags_based_suppression() {
    let device_without = offering(F::SUPPORTED - F::EVENT_IDX, DriverConfig::default());
    let driver_without =
        offering(F::SUPPORTED, DriverConfig { event_idx: false, ..DriverConfig::default() });
    for mut bed in [device_without, driver_without] {
        assert!(!bed.driver.features().contains(F::EVENT_IDX));
        let negotiated = bed.mmio.lock().unwrap().negotiated_features();
        assert_eq!(negotiated & F::EVENT_IDX.bits(), 0, "negotiated {negotiated:#x}");
        let (c, s) = bed.connect(SocketType::SeqPacket, 80);
        let mut device = KickDrivenDevice::default();
        let mut buf = [0u8; 16];
        for i in 0..500u32 {
            bed.guest.send_message(c, &i.to_le_bytes(), true).unwrap();
            bed.host.stack().send_message(s, &i.to_le_bytes(), true).unwrap();
            for _ in 0..3 {
                device.step(&mut bed);
            }
            let to_host = bed.host.stack().recv(s, &mut buf).expect("guest to host");
            assert_eq!(&buf[..to_host.len], &i.to_le_bytes(), "guest to host, message {i}");
            let to_guest = bed.guest.recv(c, &mut buf).expect("host to guest");
            assert_eq!(&buf[..to_guest.len], &i.to_le_bytes(), "host to guest, message {i}");
        }
    }
}

/// A device without VIRTIO_F_VERSION_1 is refused with an error (not a
/// panic), and told so: FAILED, added to the status bits already set,
/// because a device ignores a status write that clears bits.
#[test]
fn a_device_without_version_1_fails_init_with_an_error() {
    let device =
        VsockConfig { features: (F::SUPPORTED - F::VERSION_1).bits(), ..VsockConfig::default() };
    let result = Testbed::new(device.clone(), DriverConfig::default());
    assert!(
        matches!(result, Err(SetupError::Driver(DriverError::NoVersion1))),
        "{:?}",
        result.map(|_| ())
    );
    assert_eq!(DriverError::NoVersion1.to_string(), "device does not offer VIRTIO_F_VERSION_1");

    let recorded = start_recorded(device, DriverConfig::default(), false);
    assert!(matches!(recorded.outcome, Err(DriverError::NoVersion1)), "{recorded:?}");
    assert!(
        recorded.statuses.iter().any(|s| s.held.contains(DeviceStatus::FAILED)),
        "the device never held FAILED: {:?}",
        recorded.statuses
    );
    assert!(
        recorded.statuses.iter().all(|s| !s.written.contains(DeviceStatus::DRIVER_OK)),
        "{:?}",
        recorded.statuses
    );
}

/// The driver reads the status back after FEATURES_OK (spec 3.1.1 step 6)
/// and gives up, marking the device FAILED, if the device refused.
#[test]
fn the_driver_gives_up_when_its_features_are_refused() {
    let recorded = start_recorded(VsockConfig::default(), DriverConfig::default(), true);
    assert!(matches!(recorded.outcome, Err(DriverError::FeaturesRejected)), "{recorded:?}");
    // FAILED, then the reset of the transport being dropped; no queue was
    // set up and DRIVER_OK never written.
    let statuses = &recorded.statuses;
    assert!(statuses.iter().any(|s| s.held.contains(DeviceStatus::FAILED)), "{statuses:?}");
    assert!(statuses.iter().all(|s| !s.written.contains(DeviceStatus::DRIVER_OK)), "{statuses:?}");
}

/// Bug: pier-driver read the 64-bit CID with one 8-byte access, which
/// virtio-drivers' MMIO and PCI transports refuse with a panic (config
/// space is only 4-byte aligned; spec 4.2.2.2 wants 32-bit accesses).
/// The in-process transport asserts the same; the driver reads two halves.
#[test]
fn the_driver_reads_the_cid_in_32_bit_halves() {
    let device = VsockConfig { guest_cid: 0x1_2345, ..VsockConfig::default() };
    let recorded = start_recorded(device, DriverConfig::default(), false);
    assert_eq!(recorded.outcome.unwrap().0, 0x1_2345);
    let widths = recorded.config_widths;
    assert!(!widths.is_empty());
    assert!(widths.iter().all(|&w| w == 4), "config accesses of widths {widths:?}");
}

/// Setting the queues up reads no `QueueReady`: the reset that starts the
/// set-up left every queue unused, and in a VM each register read is an
/// exit to the hypervisor. The driver still reads each queue's maximum
/// size, which only the device knows.
#[test]
fn start_up_reads_no_queue_ready_register() {
    let recorded = start_recorded(VsockConfig::default(), DriverConfig::default(), false);
    assert!(recorded.outcome.is_ok(), "{recorded:?}");
    let reads = &recorded.reads;
    let ready = u64::from(reg::VIRTIO_MMIO_QUEUE_READY);
    let num_max = u64::from(reg::VIRTIO_MMIO_QUEUE_NUM_MAX);
    assert!(!reads.contains(&ready), "QueueReady read during start-up: {reads:x?}");
    assert_eq!(reads.iter().filter(|&&r| r == num_max).count(), 3, "{reads:x?}");
}

/// A configuration the queues cannot hold is refused before the device is
/// touched (no status written), so the device is left for a driver that
/// can use it.
#[test]
fn buffer_counts_and_sizes_outside_the_queues_are_refused_up_front() {
    let default = DriverConfig::default();
    for bad in [
        DriverConfig { rx_buffers: 0, ..default },
        DriverConfig { rx_buffers: pier_driver::QUEUE_SIZE + 1, ..default },
        DriverConfig { tx_buffers: 0, ..default },
        DriverConfig { tx_buffers: pier_driver::QUEUE_SIZE / 2 + 1, ..default },
        DriverConfig { rx_buffer_size: HEADER_LEN, ..default },
    ] {
        let recorded = start_recorded(VsockConfig::default(), bad, false);
        assert!(
            matches!(recorded.outcome, Err(DriverError::BadConfig(_))),
            "{bad:?}: {recorded:?}"
        );
        // Only the dropped transport's reset.
        assert!(recorded.statuses.iter().all(|s| s.written.is_empty()), "{:?}", recorded.statuses);
    }
    // The limits themselves are fine.
    let edge = DriverConfig {
        rx_buffers: pier_driver::QUEUE_SIZE,
        tx_buffers: pier_driver::QUEUE_SIZE / 2,
        rx_buffer_size: HEADER_LEN + 1,
        ..default
    };
    let bed = Testbed::new(VsockConfig::default(), edge);
    assert!(bed.is_ok(), "{:?}", bed.map(|_| ()));
}
