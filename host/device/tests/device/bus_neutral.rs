//! The device without any bus in front of it: the lifecycle a bus
//! without registers (vhost-user) drives, and the notifications the
//! device hands its bus.

use std::sync::{Arc, Mutex};

use pier_device::device::{RX_QUEUE, TX_QUEUE, features as fb};
use pier_device::{Notify, QueueRings, VsockConfig, VsockDevice};
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Records each notification: `Some(queue)` for a used buffer, `None` for
/// a config change.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Option<usize>>>>);

impl Recorder {
    fn take(&self) -> Vec<Option<usize>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Notify for Recorder {
    fn used_buffer(&mut self, queue: usize) {
        self.0.lock().unwrap().push(Some(queue));
    }
    fn config_changed(&mut self) {
        self.0.lock().unwrap().push(None);
    }
}

/// A bus without registers (vhost-user) drives the same state: the
/// frontend's features (with its own transport bits dropped), queues that
/// start at the indices it hands over, a session that begins once rx and
/// tx both run and ends when either stops, and notifications that name their
/// queue, for the bus to deliver on that queue's own line.
#[test]
fn a_bus_without_registers_starts_and_stops_queues() {
    let notified = Recorder::default();
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let mut dev =
        VsockDevice::new(mem, VsockConfig::default(), Box::new(notified.clone())).unwrap();
    let protocol_features = 1u64 << 30;
    let kept = dev.accept_driver_features(fb::VERSION_1 | fb::SEQPACKET | protocol_features);
    assert_eq!(kept, fb::VERSION_1 | fb::SEQPACKET, "the frontend's own bits are not the device's");
    assert_eq!(dev.negotiated_features(), fb::VERSION_1 | fb::SEQPACKET);
    let session = dev.session();
    let rings = |base: u64, next: u16| QueueRings {
        size: 16,
        desc: base,
        avail: base + 0x1000,
        used: base + 0x2000,
        next_avail: next,
        next_used: next,
    };
    assert!(dev.start_queue(RX_QUEUE, rings(0x10000, 7)));
    assert!(!dev.driver_ok(), "rx alone does not make a running device");
    assert!(!dev.start_queue(TX_QUEUE, rings(0xff000, 0)), "rings beyond guest memory are refused");
    assert!(!dev.driver_ok());
    assert!(dev.start_queue(TX_QUEUE, rings(0x20000, 3)));
    assert!(dev.driver_ok());
    assert_eq!(dev.session(), session + 1, "a new driver session");
    assert_eq!(dev.queue(RX_QUEUE).unwrap().queue().next_avail(), 7, "SET_VRING_BASE is kept");

    // Return one chain on tx by hand, then ask: the bus hears of that
    // queue, and only of it.
    let q = dev.queue_mut(TX_QUEUE).unwrap().queue_mut();
    q.set_next_used(q.next_used().wrapping_add(1));
    assert!(dev.interrupt_if_needed(TX_QUEUE).unwrap());
    assert_eq!(notified.take(), [Some(TX_QUEUE)]);
    dev.set_guest_cid(9);
    assert_eq!(notified.take(), [None], "a CID change is a config-change notification");

    let stopped = dev.stop_queue(RX_QUEUE).expect("rx was running");
    assert_eq!(stopped.next_avail, 7, "GET_VRING_BASE answers where the device stopped");
    assert!(!dev.driver_ok());
    assert_eq!(dev.session(), session + 2, "stopping ends the session");
    assert!(dev.stop_queue(RX_QUEUE).is_none(), "a stopped queue has no position");
}
