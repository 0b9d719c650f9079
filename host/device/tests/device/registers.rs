//! The virtio-mmio register file on its own: identity, negotiation rules,
//! reset, and accesses no driver should make.

use std::sync::Arc;

use pier_device::device::{VENDOR_ID, VSOCK_DEVICE_ID, features as fb, status};
use pier_device::mmio::{CONFIG_OFFSET, INT_CONFIG, INT_VRING, MAGIC_VALUE};
use pier_device::{MmioEvent, VsockConfig, VsockMmio};
use virtio_bindings::virtio_mmio as reg;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::common::*;

fn fresh(config: VsockConfig) -> Dev {
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    VsockMmio::new(mem, config).unwrap()
}

#[test]
fn identity_and_feature_windows() {
    let dev = fresh(VsockConfig {
        features: fb::VERSION_1 | fb::EVENT_IDX | fb::DGRAM,
        ..VsockConfig::default()
    });
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_MAGIC_VALUE), MAGIC_VALUE);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_VERSION), 2);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_DEVICE_ID), VSOCK_DEVICE_ID);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_VENDOR_ID), VENDOR_ID);
    let mut dev = dev;
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_DEVICE_FEATURES), (1 << 29) | (1 << 3));
    w(&mut dev, reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_DEVICE_FEATURES), 1);
    w(&mut dev, reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_DEVICE_FEATURES), 0);
    // Queues beyond the third do not exist.
    w(&mut dev, reg::VIRTIO_MMIO_QUEUE_SEL, 2);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
    w(&mut dev, reg::VIRTIO_MMIO_QUEUE_SEL, 3);
    assert_eq!(r(&dev, reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    assert_eq!(w(&mut dev, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 1), MmioEvent::Notify(1));
    assert_eq!(w(&mut dev, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 3), MmioEvent::None);
    assert!(
        VsockMmio::new(
            Arc::new(GuestMemoryMmap::<()>::new()),
            VsockConfig { queue_size: 100, ..VsockConfig::default() }
        )
        .is_none()
    );
}

#[test]
fn odd_accesses_read_zero_and_write_nothing() {
    let mut dev = fresh(VsockConfig { guest_cid: 0x1122_3344_5566_7788, ..VsockConfig::default() });
    // Registers answer only aligned 32-bit accesses.
    for (off, len) in [(0u64, 1usize), (0, 2), (0, 3), (0, 8), (1, 4), (2, 4), (0xff, 4)] {
        let mut b = vec![0xeeu8; len];
        dev.read(off, &mut b);
        assert!(b.iter().all(|&x| x == 0), "read {len}@{off:#x} = {b:?}");
    }
    for off in [0x1000u64, u64::MAX, u64::MAX - 3, CONFIG_OFFSET + 8] {
        let mut b = [0xeeu8; 8];
        dev.read(off, &mut b);
        assert_eq!(b, [0; 8], "read at {off:#x}");
        assert_eq!(dev.write(off, &[1, 2, 3, 4]), MmioEvent::None);
    }
    dev.read(0, &mut []);
    // Config space: any width, any offset, clipped at its end.
    let mut b = [0u8; 8];
    dev.read(CONFIG_OFFSET, &mut b);
    assert_eq!(u64::from_le_bytes(b), 0x1122_3344_5566_7788);
    let mut b = [0u8; 3];
    dev.read(CONFIG_OFFSET + 1, &mut b);
    assert_eq!(b, [0x77, 0x66, 0x55]);
    let mut b = [0xeeu8; 8];
    dev.read(CONFIG_OFFSET + 4, &mut b);
    assert_eq!(b, [0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0]);
    // The CID is read-only.
    dev.write(CONFIG_OFFSET, &[0; 8]);
    assert_eq!(dev.guest_cid(), 0x1122_3344_5566_7788);
    // Odd-width writes to Status are ignored.
    dev.write(u64::from(reg::VIRTIO_MMIO_STATUS), &[1, 0]);
    dev.write(u64::from(reg::VIRTIO_MMIO_STATUS) + 1, &[1, 0, 0, 0]);
    dev.write(u64::from(reg::VIRTIO_MMIO_STATUS), &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(dev.status(), 0);
    // Every register offset, garbage values: no panic.
    for off in (0..0x100u32).step_by(4) {
        for v in [0u32, 1, 2, 0xffff, u32::MAX] {
            let _ = w(&mut dev, off, v);
            let _ = r(&dev, off);
        }
    }
}

#[test]
fn feature_negotiation_refuses_what_was_not_offered() {
    let offered = fb::VERSION_1 | fb::STREAM;
    for (driver, accepted) in [
        (fb::VERSION_1 | fb::STREAM, true),
        (fb::VERSION_1, true),
        (fb::VERSION_1 | fb::DGRAM, false), // not offered
        (fb::STREAM, false),                // modern device needs VERSION_1
    ] {
        let mut dev = fresh(VsockConfig { features: offered, ..VsockConfig::default() });
        w(&mut dev, reg::VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, driver as u32);
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, (driver >> 32) as u32);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(&mut dev, reg::VIRTIO_MMIO_STATUS, s);
        let st = r(&dev, reg::VIRTIO_MMIO_STATUS);
        assert_eq!(st & status::FEATURES_OK != 0, accepted, "{driver:#x}");
        assert_eq!(dev.negotiated_features(), if accepted { driver } else { 0 });
        // DRIVER_OK cannot be set without FEATURES_OK.
        let ev = w(&mut dev, reg::VIRTIO_MMIO_STATUS, st | status::DRIVER_OK);
        assert_eq!(ev == MmioEvent::DriverOk, accepted);
        assert_eq!(dev.driver_ok(), accepted);
        // Features are frozen after FEATURES_OK.
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, u32::MAX);
        assert_eq!(dev.negotiated_features(), if accepted { driver } else { 0 });
    }
}

#[test]
fn reset_forgets_everything_but_the_cid() {
    let mut d = raw_device(fb::VERSION_1 | fb::EVENT_IDX, 8, 4 << 20);
    d.dev.raise_interrupt(INT_VRING).unwrap();
    assert_eq!(r(&d.dev, reg::VIRTIO_MMIO_INTERRUPT_STATUS), INT_VRING);
    // A driver cannot clear bits other than by writing 0.
    w(&mut d.dev, reg::VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE);
    assert!(d.dev.driver_ok());
    assert_eq!(w(&mut d.dev, reg::VIRTIO_MMIO_STATUS, 0), MmioEvent::Reset);
    assert_eq!(d.dev.status(), 0);
    assert_eq!(d.dev.negotiated_features(), 0);
    assert_eq!(r(&d.dev, reg::VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    for q in 0..3 {
        w(&mut d.dev, reg::VIRTIO_MMIO_QUEUE_SEL, q);
        assert_eq!(r(&d.dev, reg::VIRTIO_MMIO_QUEUE_READY), 0);
    }
    assert_eq!(d.dev.guest_cid(), 3);
    assert!(d.dev.write_rx(&header(0, 5), &[]).is_err());
}

#[test]
fn queue_setup_is_validated() {
    let mut dev = fresh(VsockConfig::default());
    let s = status::ACKNOWLEDGE | status::DRIVER;
    w(&mut dev, reg::VIRTIO_MMIO_STATUS, s);
    w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    w(&mut dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, 1);
    w(&mut dev, reg::VIRTIO_MMIO_STATUS, s | status::FEATURES_OK);
    let setup = |dev: &mut Dev, num: u32, desc: u64, avail: u64, used: u64| -> u32 {
        w(dev, reg::VIRTIO_MMIO_QUEUE_SEL, 1);
        w(dev, reg::VIRTIO_MMIO_QUEUE_READY, 0);
        w(dev, reg::VIRTIO_MMIO_QUEUE_NUM, num);
        w(dev, reg::VIRTIO_MMIO_QUEUE_DESC_LOW, desc as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, (desc >> 32) as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH, (avail >> 32) as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_USED_LOW, used as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_USED_HIGH, (used >> 32) as u32);
        w(dev, reg::VIRTIO_MMIO_QUEUE_READY, 1);
        r(dev, reg::VIRTIO_MMIO_QUEUE_READY)
    };
    assert_eq!(setup(&mut dev, 16, 0x1000, 0x2000, 0x3000), 1);
    assert_eq!(setup(&mut dev, 15, 0x1000, 0x2000, 0x3000), 0, "not a power of 2");
    assert_eq!(setup(&mut dev, 512, 0x1000, 0x2000, 0x3000), 0, "above QueueNumMax");
    assert_eq!(setup(&mut dev, 16, 0x1001, 0x2000, 0x3000), 0, "misaligned");
    assert_eq!(setup(&mut dev, 16, 1 << 40, 0x2000, 0x3000), 0, "outside memory");
    assert_eq!(setup(&mut dev, 16, 0x1000, 0x2000, (1 << 20) - 8), 0, "straddles end");
    // A live queue ignores address writes.
    assert_eq!(setup(&mut dev, 16, 0x1000, 0x2000, 0x3000), 1);
    w(&mut dev, reg::VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000);
    let q = dev.queue(1).unwrap().queue();
    assert_eq!(virtio_queue::QueueT::desc_table(q), 0x1000);
}

#[test]
fn interrupts_are_acknowledged_bit_by_bit() {
    let mut d = raw_device(fb::VERSION_1, 8, 4 << 20);
    d.dev.raise_interrupt(INT_VRING).unwrap();
    d.dev.set_guest_cid(9);
    assert_eq!(d.dev.interrupt_status(), INT_VRING | INT_CONFIG);
    assert_eq!(r(&d.dev, reg::VIRTIO_MMIO_CONFIG_GENERATION), 1);
    w(&mut d.dev, reg::VIRTIO_MMIO_INTERRUPT_ACK, INT_VRING);
    assert_eq!(d.dev.interrupt_status(), INT_CONFIG);
    w(&mut d.dev, reg::VIRTIO_MMIO_INTERRUPT_ACK, INT_CONFIG);
    assert_eq!(d.dev.interrupt_status(), 0);
}
