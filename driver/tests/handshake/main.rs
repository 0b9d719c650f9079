//! The virtqueue handshake, model-checked with loom: every interleaving of
//! the driver's and the device's steps, and every reordering their fences
//! and orderings allow, for the exchanges of the in-process rings (tx
//! kicks, also while the device loop runs the guest's interrupt handler
//! inline; rx refill kicks; rx interrupts to the in-process bus's guest
//! thread and to pier-rt's unikernel), with EVENT_IDX on and off.
//!
//! The passing tests show that no interleaving loses a kick or an
//! interrupt, or reads an avail or used entry before it was written. The
//! `without_*` tests take one fence (or ordering) out of the model and
//! show that loom finds the failure it was there to prevent; where taking
//! it out breaks nothing, a test says so and why. `docs/model-checking.md`
//! says what the model covers and what it does not.
//!
//! loom needs no `--cfg loom` here: the model's rings are loom atomics of
//! its own, and pier-driver's handshake is generic over the ring
//! ([`pier_driver::handshake::RingSignals`]), so these tests build and run
//! in the ordinary test command.

mod model;
mod scenarios;

use std::panic::{AssertUnwindSafe, catch_unwind};

use model::Barrier;
use pier_driver::handshake::HandshakeFence;
use scenarios::{
    rx_interrupts_in_process, rx_interrupts_unikernel, rx_refill_kicks, tx_kicks,
    tx_kicks_during_an_inline_interrupt,
};

type Scenario = fn(bool, &'static [Barrier]);

const EVENT_IDX: bool = true;
const NO_EVENT_IDX: bool = false;
const KICK_CHECK: Barrier = Barrier::Driver(HandshakeFence::BeforeKickCheck);
const AFTER_USED_EVENT: Barrier = Barrier::Driver(HandshakeFence::AfterUsedEvent);
const AFTER_INTERRUPTS_ON: Barrier = Barrier::Driver(HandshakeFence::AfterInterruptsOn);

/// Runs `scenario` without the barriers in `without` and returns the failure loom found,
/// failing if it found none or a different one than `expected`.
fn loom_finds(scenario: Scenario, event_idx: bool, without: &'static [Barrier], expected: &str) {
    let outcome = catch_unwind(AssertUnwindSafe(|| scenario(event_idx, without)));
    let Err(panic) = outcome else {
        panic!("loom found no failure without {without:?} (EVENT_IDX {event_idx})");
    };
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(expected),
        "without {without:?} loom found {message:?}, not {expected:?}"
    );
    eprintln!("without {without:?} (EVENT_IDX {event_idx}): {message}");
}

#[test]
fn tx_kicks_are_never_lost_with_event_idx() {
    tx_kicks(EVENT_IDX, &[]);
}

#[test]
fn tx_kicks_are_never_lost_without_event_idx() {
    tx_kicks(NO_EVENT_IDX, &[]);
}

#[test]
fn in_process_kicks_during_an_inline_interrupt_are_never_lost_with_event_idx() {
    tx_kicks_during_an_inline_interrupt(EVENT_IDX, &[]);
}

#[test]
fn in_process_kicks_during_an_inline_interrupt_are_never_lost_without_event_idx() {
    tx_kicks_during_an_inline_interrupt(NO_EVENT_IDX, &[]);
}

/// The bus's kick paths order with `SeqCst` and `AcqRel`, but a kick
/// absorbed or held back is never lost for want of them: the device's
/// drain re-arms and fences before it sleeps, and a held-back kick goes
/// out on the eventfd.
#[test]
fn in_process_kicks_need_no_ordering_of_their_own() {
    tx_kicks_during_an_inline_interrupt(EVENT_IDX, &[Barrier::InProcessKickOrderings]);
    tx_kicks_during_an_inline_interrupt(NO_EVENT_IDX, &[Barrier::InProcessKickOrderings]);
}

#[test]
fn rx_refill_kicks_are_never_lost_with_event_idx() {
    rx_refill_kicks(EVENT_IDX, &[]);
}

#[test]
fn rx_refill_kicks_are_never_lost_without_event_idx() {
    rx_refill_kicks(NO_EVENT_IDX, &[]);
}

#[test]
fn rx_interrupts_reach_the_in_process_guest_with_event_idx() {
    rx_interrupts_in_process(EVENT_IDX, &[]);
}

#[test]
fn rx_interrupts_reach_the_in_process_guest_without_event_idx() {
    rx_interrupts_in_process(NO_EVENT_IDX, &[]);
}

#[test]
fn rx_interrupts_reach_the_unikernel_without_event_idx() {
    rx_interrupts_unikernel(NO_EVENT_IDX, &[]);
}

#[test]
fn without_the_drivers_kick_check_fence_a_kick_is_lost() {
    loom_finds(tx_kicks, NO_EVENT_IDX, &[KICK_CHECK], "lost kick");
    loom_finds(rx_refill_kicks, NO_EVENT_IDX, &[KICK_CHECK], "lost kick");
}

#[test]
fn without_the_devices_rearm_fence_a_kick_is_lost() {
    loom_finds(tx_kicks, NO_EVENT_IDX, &[Barrier::RearmFence], "lost kick");
    loom_finds(rx_refill_kicks, NO_EVENT_IDX, &[Barrier::RearmFence], "lost kick");
}

/// With EVENT_IDX, virtio-drivers 0.13 kicks whenever its available index
/// is past `avail_event + 1`, and the device only ever moves
/// `avail_event` to what it has already taken: so the driver kicks after
/// every publication, and a stale `avail_event` on either side only adds
/// kicks. The kick fences guard nothing there yet; they will once the
/// driver kicks only when its index crosses `avail_event` (Linux's
/// `vring_need_event`), and this test fails then, to say so.
#[test]
fn with_event_idx_the_kick_fences_guard_nothing_while_the_driver_kicks_every_batch() {
    // Both at once: taking a fence out only adds executions, so what
    // holds without both holds without either.
    tx_kicks(EVENT_IDX, &[KICK_CHECK, Barrier::RearmFence]);
    rx_refill_kicks(EVENT_IDX, &[KICK_CHECK, Barrier::RearmFence]);
}

#[test]
fn without_the_drivers_fence_after_used_event_an_interrupt_is_lost() {
    loom_finds(rx_interrupts_in_process, EVENT_IDX, &[AFTER_USED_EVENT], "lost interrupt");
}

#[test]
fn without_the_drivers_fence_after_interrupts_on_an_interrupt_is_lost() {
    loom_finds(rx_interrupts_unikernel, NO_EVENT_IDX, &[AFTER_INTERRUPTS_ON], "lost interrupt");
}

#[test]
fn without_the_devices_interrupt_check_fence_an_interrupt_is_lost() {
    let fence = &[Barrier::InterruptCheckFence];
    loom_finds(rx_interrupts_in_process, EVENT_IDX, fence, "lost interrupt");
    loom_finds(rx_interrupts_unikernel, NO_EVENT_IDX, fence, "lost interrupt");
}

#[test]
fn without_the_publish_ordering_the_device_reads_a_stale_avail_entry() {
    loom_finds(tx_kicks, EVENT_IDX, &[Barrier::AddFenceAndRelease], "stale avail entry");
    loom_finds(rx_refill_kicks, NO_EVENT_IDX, &[Barrier::AddFenceAndRelease], "stale avail entry");
}

/// virtio-drivers' `add` both fences and stores the index with `Release`;
/// either alone orders the entry before the index, so the fence alone can
/// go without harm.
#[test]
fn the_publish_fence_alone_is_redundant_with_the_release_store() {
    tx_kicks(EVENT_IDX, &[Barrier::AddFence]);
    tx_kicks(NO_EVENT_IDX, &[Barrier::AddFence]);
}

#[test]
fn without_the_devices_avail_acquire_it_reads_a_stale_avail_entry() {
    loom_finds(tx_kicks, EVENT_IDX, &[Barrier::AvailIndexAcquire], "stale avail entry");
    loom_finds(rx_refill_kicks, NO_EVENT_IDX, &[Barrier::AvailIndexAcquire], "stale avail entry");
}

#[test]
fn without_the_devices_used_release_the_driver_reads_a_stale_used_entry() {
    let release = &[Barrier::UsedIndexRelease];
    loom_finds(rx_interrupts_in_process, EVENT_IDX, release, "stale used entry");
    loom_finds(rx_interrupts_unikernel, NO_EVENT_IDX, release, "stale used entry");
}

#[test]
fn without_the_drivers_used_acquire_it_reads_a_stale_used_entry() {
    let acquire = &[Barrier::UsedIndexAcquire];
    loom_finds(rx_interrupts_in_process, EVENT_IDX, acquire, "stale used entry");
    loom_finds(rx_interrupts_unikernel, NO_EVENT_IDX, acquire, "stale used entry");
}
