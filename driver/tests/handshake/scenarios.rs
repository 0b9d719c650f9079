//! The exchanges of the rings, each with a driver thread and a device
//! thread, checked when both are done: whoever is left asleep with work
//! waiting must have a notification coming.
//!
//! A side that would sleep, here, ends its thread instead; the check
//! after both ended asks whether the other side's kick or interrupt is
//! pending, which is what would have woken it. Each thread does a fixed
//! amount of work, so loom can try every interleaving.

use loom::thread;
use pier_driver::handshake::{
    RingSignals, should_kick, used_after_drain, used_after_interrupts_on,
};
use std::sync::Arc;

use crate::model::{Barrier, DeviceQueue, DriverQueue, Ring};

/// The driver publishes and kicks (pier-driver's `kick_tx`) as it is
/// told to.
fn publish(driver: &mut DriverQueue, n: u16) {
    driver.add(n);
    if should_kick(driver, driver.ring().event_idx(), driver.published()) {
        driver.ring().kicks.signal();
    }
}

/// After both threads: the device took all `of` entries (`what`), or a
/// kick is pending that would wake it for the rest.
fn assert_no_lost_kick(ring: &Ring, taken: u16, of: u16, what: &str) {
    assert!(
        taken == of || ring.kicks.pending(),
        "lost kick: the device sleeps with {taken} of {of} {what}"
    );
}

/// tx: the driver publishes a packet and kicks while the device loop
/// drains what an earlier kick announced (pier-device's `drain_tx`, run
/// on every kick). No packet may be left published with the device loop
/// asleep and no kick pending.
pub fn tx_kicks(event_idx: bool, without: &'static [Barrier]) {
    loom::model::Builder::new().check(move || {
        let ring = Arc::new(Ring::without(event_idx, without));
        // Before the threads: the first packet, published and kicked.
        let mut driver = DriverQueue::new(ring.clone());
        publish(&mut driver, 0);
        let mut device = DeviceQueue::new(ring.clone());
        let device = thread::spawn(move || {
            while device.ring().kicks.take() {
                device.drain_tx();
            }
            device.popped()
        });
        publish(&mut driver, 1);
        let drained = device.join().expect("device thread");
        assert_no_lost_kick(&ring, drained, 2, "tx packets drained");
    });
}

/// tx on the in-process bus while the device loop runs the guest's
/// interrupt handler inline: the application, holding the guest lock (so
/// the handler finds it taken and returns), publishes a packet; its kick
/// is absorbed (the loop then looks again) or held back and sent once the
/// application lets the lock go. Neither way may lose it.
pub fn tx_kicks_during_an_inline_interrupt(event_idx: bool, without: &'static [Barrier]) {
    loom::model::Builder::new().check(move || {
        let ring = Arc::new(Ring::without(event_idx, without));
        let mut device = DeviceQueue::new(ring.clone());
        let device = thread::spawn(move || {
            if device.ring().bus.run_guest_inline(|| {}) {
                device.drain_tx();
            }
            while device.ring().kicks.take() {
                device.drain_tx();
            }
            device.popped()
        });
        let mut driver = DriverQueue::new(ring.clone());
        driver.add(0);
        if should_kick(&driver, event_idx, driver.published()) {
            ring.bus.notify();
        }
        ring.bus.flush(&ring.kicks);
        let drained = device.join().expect("device thread");
        assert_no_lost_kick(&ring, drained, 1, "tx packets drained");
    });
}

/// rx refill: the device has packets for the guest and waits for rx
/// buffers (pier-device's `take_rx_chain`), while the driver posts them
/// one by one and kicks (pier-driver's `receive` reposting). No buffer may
/// be left posted with the device asleep and no kick pending.
pub fn rx_refill_kicks(event_idx: bool, without: &'static [Barrier]) {
    loom::model::Builder::new().check(move || {
        let ring = Arc::new(Ring::without(event_idx, without));
        let mut device = DeviceQueue::new(ring.clone());
        let device = thread::spawn(move || {
            let mut filled = 0;
            while filled < 2 {
                match device.take_rx_chain() {
                    Some(head) => {
                        device.add_used(head, filled);
                        filled += 1;
                    }
                    None if device.ring().kicks.take() => {}
                    None => break,
                }
            }
            filled
        });
        let mut driver = DriverQueue::new(ring.clone());
        publish(&mut driver, 0);
        publish(&mut driver, 1);
        let filled = device.join().expect("device thread");
        assert_no_lost_kick(&ring, filled, 2, "posted rx buffers filled");
    });
}

/// How the guest waits for used buffers once it has drained them.
#[derive(Clone, Copy, Debug)]
enum Sleep {
    /// The in-process bus's guest thread (pier-device's `GuestThread`):
    /// interrupts stay on, it drains, then waits on the interrupt eventfd.
    OnInterrupt,
    /// pier-rt's unikernel (its `until`): interrupts off while it polls;
    /// before halting it turns them on and looks once more (pier-driver's
    /// `has_used`).
    InterruptsOffWhilePolling,
}

/// rx interrupts to the in-process bus's guest thread.
pub fn rx_interrupts_in_process(event_idx: bool, without: &'static [Barrier]) {
    rx_interrupts(event_idx, Sleep::OnInterrupt, without);
}

/// rx interrupts to pier-rt's unikernel.
pub fn rx_interrupts_unikernel(event_idx: bool, without: &'static [Barrier]) {
    rx_interrupts(event_idx, Sleep::InterruptsOffWhilePolling, without);
}

/// rx interrupts: the device fills two posted buffers, deciding after
/// each whether to interrupt (pier-device's `interrupt_if_needed`), while
/// the guest drains the used ring (pier-driver's `receive`) and sleeps as
/// `sleep` says. No used buffer may be left with the guest asleep and no
/// interrupt pending.
fn rx_interrupts(event_idx: bool, sleep: Sleep, without: &'static [Barrier]) {
    loom::model::Builder::new().check(move || {
        let ring = Arc::new(Ring::without(event_idx, without));
        // Before the threads: two rx buffers posted, and taken by the
        // device, which has a packet for each.
        let mut driver = DriverQueue::new(ring.clone());
        driver.add(0);
        driver.add(1);
        if let Sleep::InterruptsOffWhilePolling = sleep {
            driver.set_dev_notify(false);
        }
        let mut device = DeviceQueue::new(ring.clone());
        let heads = [0, 1].map(|_| device.take_rx_chain().expect("posted before"));
        let device = thread::spawn(move || {
            for (n, head) in (0..).zip(heads) {
                device.add_used(head, n);
                if device.needs_interrupt() {
                    device.ring().interrupts.signal();
                }
            }
        });
        let received = receive_until_asleep(&mut driver, sleep);
        device.join().expect("device thread");
        assert!(
            received == 2 || ring.interrupts.pending(),
            "lost interrupt: the guest sleeps with {received} of 2 used rx buffers taken ({sleep:?})",
        );
    });
}

/// The guest's side of [`rx_interrupts`]: drain, then sleep as `sleep`
/// says; an interrupt wakes it for another round. Returns the buffers
/// taken.
fn receive_until_asleep(driver: &mut DriverQueue, sleep: Sleep) -> u16 {
    let mut received = 0;
    loop {
        // pier-driver's drain loop: take what is used, then look again
        // after the pops moved `used_event`.
        loop {
            while driver.can_pop() {
                driver.pop_used(received);
                received += 1;
            }
            if !used_after_drain(driver) {
                break;
            }
        }
        if let Sleep::InterruptsOffWhilePolling = sleep {
            driver.set_dev_notify(true);
            if used_after_interrupts_on(driver) {
                driver.set_dev_notify(false);
                continue;
            }
        }
        if !driver.ring().interrupts.take() {
            return received;
        }
        if let Sleep::InterruptsOffWhilePolling = sleep {
            driver.set_dev_notify(false);
        }
    }
}
