//! The device's event loop, on a thread of its own, whatever the bus.
//!
//! A virtio device sleeps until the driver kicks a queue, the host side has
//! something to do, or a timer is due; then it runs a round (take the
//! guest's packets, let the host_side move data, answer) and sleeps again.
//! [`DeviceThread`] is that loop: mio over epoll, waiting on
//!
//! - the queue eventfds of [`DeviceEvents`] (one per queue) and its control
//!   eventfd (the driver reset, failed or started the device);
//! - the host side's own sources (the Unix-socket bridge's sockets);
//! - the host stack's and the host side's next deadline.
//!
//! Its counters (the endpoint's, the host stack's, the bridge's) belong
//! to the loop's thread; [`DeviceThread::stats`] asks the loop for a copy,
//! so the rounds pay nothing for being observable.
//!
//! The loop knows nothing of the bus. A bus plugs in from outside, through
//! two things:
//!
//! - **guest → device**: it makes [`DeviceEvents`]' queue eventfds fire on
//!   a kick (a KVM VMM registers them as ioeventfds on QueueNotify; the
//!   in-process transport writes them) and the control eventfd on a status
//!   change;
//! - **device → guest**: an [`InterruptDelivery`] runs after every round.
//!   Where the register file's interrupt line is the bus's own (a KVM
//!   irqfd, an eventfd the guest waits on), that is [`IrqLine`] and does
//!   nothing more; the in-process bus instead runs the guest's interrupt
//!   handler inline (`crate::inprocess`).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as WallClock};

use mio::unix::SourceFd;
use mio::{Events, Interest as MioInterest, Poll, Registry, Token};
use pier_stack::{Instant, Stack, Stats, WakeList};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::device::{NUM_QUEUES, SharedDevice};
use crate::endpoint::{EndpointStats, HostEndpoint};
use crate::host_side::BridgeStats;
use crate::host_side::HostSide;

/// The eventfds between a bus and the device loop: one kick per queue (an
/// ioeventfd under KVM), one for lifecycle changes, and the interrupt line
/// (an irqfd under KVM).
#[derive(Debug)]
pub struct DeviceEvents {
    queues: [EventFd; NUM_QUEUES],
    control: EventFd,
    irq: EventFd,
    /// Whether the device loop is running the guest's interrupt handler on
    /// its own thread right now (see [`Self::absorb_kick`]).
    inline_guest: AtomicU8,
}

/// `inline_guest`: the device loop is not running the guest.
const GUEST_NOT_INLINE: u8 = 0;
/// `inline_guest`: it is, and nobody kicked a queue meanwhile.
const GUEST_INLINE: u8 = 1;
/// `inline_guest`: it is, and a queue was kicked meanwhile.
const GUEST_INLINE_KICKED: u8 = 2;

impl DeviceEvents {
    /// Creates non-blocking eventfds.
    pub fn new() -> io::Result<Self> {
        let fd = || EventFd::new(EFD_NONBLOCK);
        Ok(DeviceEvents {
            queues: [fd()?, fd()?, fd()?],
            control: fd()?,
            irq: fd()?,
            inline_guest: AtomicU8::new(GUEST_NOT_INLINE),
        })
    }

    /// Runs `handler`, a guest's interrupt handler, on the device loop's
    /// thread, and returns whether a queue was kicked while it ran: the
    /// kicks [`Self::absorb_kick`] took instead of their eventfd, which
    /// the loop then answers by looking at its queues again at once.
    pub fn run_guest_inline(&self, handler: impl FnOnce()) -> bool {
        self.inline_guest.store(GUEST_INLINE, Ordering::SeqCst);
        handler();
        self.inline_guest.swap(GUEST_NOT_INLINE, Ordering::SeqCst) == GUEST_INLINE_KICKED
    }

    /// A driver's queue kick, taken without its eventfd when the device
    /// loop is running the guest inline (see [`Self::run_guest_inline`]):
    /// the loop looks at its queues again when the handler returns, so the
    /// write, the wakeup it causes and the empty round after it would be
    /// for nothing. The kick is usually the handler's own (the driver
    /// refilling its receive buffers), on the device loop's thread. Returns
    /// `false` when the kick must go out on the eventfd as usual.
    pub fn absorb_kick(&self) -> bool {
        match self.inline_guest.compare_exchange(
            GUEST_INLINE,
            GUEST_INLINE_KICKED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => true,
            Err(state) => state == GUEST_INLINE_KICKED,
        }
    }

    /// Signalled when the driver kicks `queue`.
    pub fn queue(&self, queue: usize) -> Option<&EventFd> {
        self.queues.get(queue)
    }

    /// Signalled after a status write that resets, fails or activates the
    /// device.
    pub fn control(&self) -> &EventFd {
        &self.control
    }

    /// Signalled by the device to interrupt the driver.
    pub fn irq(&self) -> &EventFd {
        &self.irq
    }

    /// A duplicate of the interrupt eventfd, to hand to
    /// [`VsockMmio::set_irq`](crate::mmio::VsockMmio::set_irq).
    pub fn irq_line(&self) -> io::Result<EventFd> {
        self.irq.try_clone()
    }
}

/// How the device's interrupts reach the guest, run after every round
/// with the register file's interrupt count (see
/// [`VsockDevice::interrupts_raised`](crate::device::VsockDevice::interrupts_raised)).
pub trait InterruptDelivery: Send {
    /// The register file has raised `raised` interrupts so far. Returns
    /// whether the guest kicked a queue meanwhile without its eventfd
    /// (see [`DeviceEvents::absorb_kick`]): the loop must look again.
    fn deliver(&mut self, raised: u64) -> bool;
}

/// Interrupts go out on the register file's own line (a KVM irqfd, or an
/// eventfd the guest waits on), which raising already signalled.
#[derive(Debug, Default, Clone, Copy)]
pub struct IrqLine;

impl InterruptDelivery for IrqLine {
    fn deliver(&mut self, _raised: u64) -> bool {
        false
    }
}

/// The first mio token a host_side may use; lower ones are the loop's.
pub const FIRST_BACKEND_TOKEN: usize = 16;
const CONTROL_TOKEN: usize = NUM_QUEUES;
const STOP_TOKEN: usize = NUM_QUEUES + 1;

/// Converts the wall clock into the stacks' clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock(WallClock);

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self(WallClock::now())
    }
    /// The stacks' time: microseconds since the clock was made.
    pub fn now(&self) -> Instant {
        Instant::from_micros(self.0.elapsed().as_micros() as u64)
    }
    /// Wall time until `deadline`, for a poll timeout.
    pub fn until(&self, deadline: Instant) -> Duration {
        deadline.saturating_duration_since(self.now())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// The host side's counters, as one copy taken between two rounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// What the endpoint saw at the queue boundary.
    pub endpoint: EndpointStats,
    /// The host stack's protocol counters (CID 2).
    pub host_stack: Stats,
    /// The Unix-socket bridge's, when that is the host_side.
    pub bridge: Option<BridgeStats>,
}

/// How long [`DeviceThread::stats`] waits for the loop to answer.
const STATS_WAIT: Duration = Duration::from_secs(2);

/// Requests for the loop, and the loop's last copy of its counters.
#[derive(Debug, Default)]
struct Control {
    /// Set with the waker to end the loop; otherwise the waker asks for
    /// counters.
    stopping: AtomicBool,
    stats_wanted: AtomicBool,
    /// Asks the loop to send the driver a TRANSPORT_RESET
    /// ([`DeviceThread::reset_transport`]).
    transport_reset_wanted: AtomicBool,
    /// Asks the loop to ask the driver for a reset
    /// ([`DeviceThread::request_reset`]).
    reset_wanted: AtomicBool,
    /// The latest copy and how many copies were made before it.
    stats: Mutex<(u64, DeviceStats)>,
    stats_ready: Condvar,
}

impl Control {
    fn publish(&self, endpoint: &mut HostEndpoint, host_side: &impl HostSide) {
        let copy = DeviceStats {
            endpoint: endpoint.stats(),
            host_stack: endpoint.stack().stats().clone(),
            bridge: host_side.bridge_stats(),
        };
        let mut slot = self.stats.lock().expect("device stats");
        *slot = (slot.0 + 1, copy);
        self.stats_ready.notify_all();
    }
}

/// The device's event loop on its own thread; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct DeviceThread {
    stop: Arc<mio::Waker>,
    control: Arc<Control>,
    /// Behind a lock so that [`Self::stop`] works through a shared reference.
    handle: Mutex<Option<JoinHandle<io::Result<()>>>>,
}

impl DeviceThread {
    /// Starts the loop for the device `mmio`, woken through `events`,
    /// serving the guest with `endpoint` and the host_side `build_host_side`
    /// makes, and delivering interrupts with `interrupts`.
    ///
    /// The host_side is built here, before the thread starts, because its
    /// sources must join the loop's poller: `build_host_side` gets the host
    /// stack, the poller's registry and the first token it may use.
    pub fn spawn<D, B, F>(
        device: Arc<D>,
        events: Arc<DeviceEvents>,
        mut endpoint: HostEndpoint,
        build_host_side: F,
        clock: Clock,
        mut interrupts: Box<dyn InterruptDelivery>,
    ) -> io::Result<Self>
    where
        D: SharedDevice,
        B: HostSide + Send + 'static,
        F: FnOnce(&mut Stack, &Registry, usize) -> io::Result<B>,
    {
        let mut poll = Poll::new()?;
        let registry = poll.registry();
        for q in 0..NUM_QUEUES {
            let fd = events.queue(q).expect("three queues").as_raw_fd();
            registry.register(&mut SourceFd(&fd), Token(q), MioInterest::READABLE)?;
        }
        let control = events.control().as_raw_fd();
        registry.register(&mut SourceFd(&control), Token(CONTROL_TOKEN), MioInterest::READABLE)?;
        let stop = Arc::new(mio::Waker::new(registry, Token(STOP_TOKEN))?);
        let control = Arc::new(Control::default());
        let mut host_side = build_host_side(endpoint.stack(), registry, FIRST_BACKEND_TOKEN)?;
        let ring_trace = device.lock_device().ring_trace().cloned();
        let loop_control = control.clone();
        let handle = std::thread::Builder::new().name("pier-device".into()).spawn(move || {
            let control = loop_control;
            let mut mio_events = Events::with_capacity(256);
            let mut wakes = WakeList::new();
            let mut again = false;
            let mut memory = MemoryReturn::default();
            loop {
                let timeout = if again {
                    Some(Duration::ZERO)
                } else {
                    let deadline =
                        [endpoint.poll_at(), host_side.poll_at()].into_iter().flatten().min();
                    deadline.map(|d| clock.until(d))
                };
                if let Err(e) = poll.poll(&mut mio_events, timeout) {
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                let now = clock.now();
                for event in mio_events.iter() {
                    match event.token().0 {
                        q if q < NUM_QUEUES => {
                            let kicks = drain_eventfd(events.queue(q).expect("queue"));
                            if let Some(trace) = &ring_trace {
                                trace.kick(q, "eventfd", kicks);
                            }
                        }
                        CONTROL_TOKEN => {
                            drain_eventfd(events.control());
                        }
                        STOP_TOKEN if control.stopping.load(Ordering::Acquire) => {
                            // The last counters stay readable after the loop.
                            control.publish(&mut endpoint, &host_side);
                            return Ok(());
                        }
                        STOP_TOKEN => {}
                        _ => host_side.handle_event(endpoint.stack(), event, now),
                    }
                }
                if control.transport_reset_wanted.swap(false, Ordering::AcqRel) {
                    let mut device = device.lock_device();
                    endpoint.reset_transport(&mut device, &mut host_side, &mut wakes);
                }
                if control.reset_wanted.swap(false, Ordering::AcqRel) {
                    device.lock_device().set_needs_reset();
                }
                again = round(
                    &*device,
                    &mut endpoint,
                    &mut host_side,
                    now,
                    &mut wakes,
                    &mut *interrupts,
                );
                wakes.wake_all();
                memory.after_round(endpoint.stack().socket_count());
                if control.stats_wanted.swap(false, Ordering::AcqRel) {
                    control.publish(&mut endpoint, &host_side);
                }
            }
        })?;
        Ok(Self { stop, control, handle: Mutex::new(Some(handle)) })
    }

    /// A copy of the host side's counters, taken by the loop between two
    /// rounds; once the loop has ended, its last counters. `None` if the
    /// loop did not answer within two seconds (or ended with an error
    /// before it could).
    pub fn stats(&self) -> Option<DeviceStats> {
        let running = self.handle.lock().expect("device handle").is_some();
        let mut slot = self.control.stats.lock().expect("device stats");
        if !running {
            return (slot.0 > 0).then(|| slot.1.clone());
        }
        let seen = slot.0;
        self.control.stats_wanted.store(true, Ordering::Release);
        self.stop.wake().ok()?;
        let deadline = WallClock::now() + STATS_WAIT;
        while slot.0 == seen {
            let left = deadline.saturating_duration_since(WallClock::now());
            if left.is_zero() {
                return None;
            }
            slot = self.control.stats_ready.wait_timeout(slot, left).expect("device stats").0;
        }
        Some(slot.1.clone())
    }

    /// Sends the driver a TRANSPORT_RESET on its current CID, as a device
    /// does once a VM's snapshot is restored: connections fail on both
    /// sides, listeners stay. The loop does it at its next round.
    pub fn reset_transport(&self) -> io::Result<()> {
        self.control.transport_reset_wanted.store(true, Ordering::Release);
        self.stop.wake()
    }

    /// Asks the driver to reset the device, as a device does that cannot
    /// go on without one: DEVICE_NEEDS_RESET and a configuration-change
    /// interrupt, at the loop's next round. The device serves no queue
    /// until the driver has reset it; the reset then ends the host side's
    /// connections, as any reset by the driver does. A driver that ignores
    /// the request keeps a device that does nothing (which is why only
    /// tests ask: `pier boot`'s hidden `--inject-resets-on-sigusr2`).
    pub fn request_reset(&self) -> io::Result<()> {
        self.control.reset_wanted.store(true, Ordering::Release);
        self.stop.wake()
    }

    /// Ends the loop and waits for it, through a shared reference (the
    /// thread may be owned by something other threads still use). The
    /// host_side (the bridge, which removes its socket files) is dropped as
    /// the loop ends. Later calls do nothing.
    pub fn stop(&self) -> io::Result<()> {
        let Some(handle) = self.handle.lock().expect("device handle").take() else {
            return Ok(());
        };
        self.control.stopping.store(true, Ordering::Release);
        self.stop.wake()?;
        handle.join().map_err(|_| io::Error::other("device thread panicked"))?
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One device round: packets in, host_side, packets out, until nothing
/// moves and no kick was taken inline. Returns whether tx chains are still
/// waiting (the round's budget ran out with driver notifications off) or
/// the last inline kick is unanswered, so the loop must go again at once.
fn round<D: SharedDevice, B: HostSide>(
    device: &D,
    endpoint: &mut HostEndpoint,
    host_side: &mut B,
    now: Instant,
    wakes: &mut WakeList,
    interrupts: &mut dyn InterruptDelivery,
) -> bool {
    // The register file's lock is also taken by the driver for most
    // register accesses (notify, status), so it is held only while queues
    // are touched, never across the host side's socket I/O.
    {
        let mut device = device.lock_device();
        endpoint.follow_driver(&mut device, wakes);
        if !device.driver_ok() {
            drop(device);
            // No driver to serve, but the host side must still hear that
            // the last one went away: the host_side closes the connections
            // the reset ended (a host program would otherwise wait on one
            // until a new driver comes, which under vhost-user may be
            // never).
            wakes.wake_all();
            host_side.service(endpoint.stack(), now);
            return false;
        }
    }
    let mut kicked = false;
    for _ in 0..64 {
        let taken = {
            let mut device = device.lock_device();
            endpoint.take_tx(&mut device, host_side, now, wakes).unwrap_or(0)
        };
        endpoint.handle_timeout(now, wakes);
        // The host_side learns which sockets changed through their wakers,
        // so they must fire before it looks.
        wakes.wake_all();
        host_side.service(endpoint.stack(), now);
        let mut device = device.lock_device();
        let given = endpoint.give_rx(&mut device, host_side, now, wakes);
        let raised = device.interrupts_raised();
        drop(device);
        kicked = interrupts.deliver(raised);
        if taken == 0 && given == 0 && !kicked {
            break;
        }
    }
    endpoint.tx_pending() || kicked
}

/// Hands memory back to the system after a burst of connections ends.
///
/// Every connection allocates its buffers on both stacks in this process;
/// when a burst closes, the allocator keeps the freed pages, so resident
/// memory stays at the burst's peak (the soak's 64 connections leave
/// 14 MiB of free heap resident; 1,000 clients left 129 MiB, from 27 MB).
/// glibc returns free pages of its per-thread arenas only when asked
/// (`malloc_trim`), which walks the heap: too slow for every close, cheap
/// once per burst. So it runs when the host stack's socket count has
/// fallen to half its peak since the last trim, and by at least
/// [`Self::DROP`]: a few trims per burst, however large, and none while
/// a handful of connections come and go.
#[derive(Debug, Default)]
struct MemoryReturn {
    peak: usize,
}

impl MemoryReturn {
    /// How many sockets must have closed since the peak.
    const DROP: usize = 8;

    fn after_round(&mut self, sockets: usize) {
        self.peak = self.peak.max(sockets);
        if self.peak - sockets >= Self::DROP && sockets <= self.peak / 2 {
            self.peak = sockets;
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory; it takes the
            // allocator's own locks.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// Empties `fd`; returns the writes it added up (0 if a racing reader
/// emptied it already: it is non-blocking).
fn drain_eventfd(fd: &EventFd) -> u64 {
    fd.read().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kicks_are_taken_inline_only_while_the_guest_runs_on_the_device_thread() {
        let events = DeviceEvents::new().unwrap();
        assert!(!events.absorb_kick(), "no guest is running inline");
        let kicked = events.run_guest_inline(|| {
            assert!(events.absorb_kick());
            assert!(events.absorb_kick(), "a second kick is taken too");
        });
        assert!(kicked, "the loop hears of the kicks it took");
        assert!(!events.run_guest_inline(|| {}), "a handler that kicks nothing reports none");
        assert!(!events.absorb_kick(), "the inline run is over");
    }
}
