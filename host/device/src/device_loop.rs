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
//! A round need not run on the loop's thread. Its state sits behind one
//! lock, and a bus whose kicks come from a thread that may do the work
//! itself (the in-process bus: the application's thread, just done with
//! the guest) runs the round there through an [`InlineKick`] while the
//! loop is idle, instead of waking the loop for it; while the loop is
//! awake, the kick is only noted for its next round.
//!
//! Its counters (the endpoint's, the host stack's, the bridge's) belong
//! to the loop; [`DeviceThread::stats`] asks the loop for a copy,
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
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
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
use crate::ring_trace::RingTrace;

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
///
/// It is the bus's hand in every round, so it also runs first in each
/// one ([`InterruptDelivery::before_round`]).
pub trait InterruptDelivery: Send {
    /// The register file has raised `raised` interrupts so far. Returns
    /// whether the guest kicked a queue meanwhile without its eventfd
    /// (see [`DeviceEvents::absorb_kick`]): the loop must look again.
    fn deliver(&mut self, raised: u64) -> bool;

    /// Runs at the start of each round, before it looks at the register
    /// file. A bus that lets the driver's register writes wait in a queue
    /// of its own (KVM's coalesced MMIO, where a write that needs no
    /// answer does not exit) applies them here: a write that starts the
    /// device (`DRIVER_OK`) may be followed by nothing that exits, only
    /// by kicks, which reach this loop without passing the VMM.
    fn before_round(&mut self) {}

    /// Runs on the device loop's own thread before it sleeps in its poll.
    /// A bus whose guest runs on a thread of this process may move the
    /// loop's thread nearer to it here (see `crate::inprocess`).
    fn before_sleep(&mut self) {}
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
    /// The stop drops what it would still deliver
    /// ([`DeviceThread::make_stop_urgent`]).
    urgent_stop: AtomicBool,
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
    inline: InlineKick,
}

/// What a round works on. The loop's thread and [`InlineKick`]s take
/// turns at it behind [`LoopShared::state`].
struct LoopState<B> {
    endpoint: HostEndpoint,
    host_side: B,
    wakes: WakeList,
    interrupts: Box<dyn InterruptDelivery>,
    memory: MemoryReturn,
}

impl<B: HostSide> LoopState<B> {
    /// One [`round`], then what follows every round: the host side's
    /// wakers, and memory handed back after a burst. Returns whether the
    /// loop must go again at once.
    fn run_round<D: SharedDevice>(&mut self, device: &D, now: Instant) -> bool {
        let again = round(
            device,
            &mut self.endpoint,
            &mut self.host_side,
            now,
            &mut self.wakes,
            &mut *self.interrupts,
        );
        self.wakes.wake_all();
        self.memory.after_round(self.endpoint.stack().socket_count(), now);
        again
    }

    /// Before the loop ends: guest bytes the host stack still holds for
    /// host programs (their Unix sockets were full when the bytes came) go
    /// to them as they read. The device gave the guest its buffers back
    /// for those bytes, so the guest counts them as sent, and an app that
    /// writes and then ends its VM at once must not lose its last bytes,
    /// as Linux keeps sending a process's data after it exits. A program
    /// that reads nothing for [`STOP_LINGER`] loses the rest, and the log
    /// says how much; so does every program once the stop is `urgent`.
    fn deliver_before_stop(
        &mut self,
        poll: &mut Poll,
        events: &mut Events,
        clock: &Clock,
        urgent: &AtomicBool,
    ) {
        self.host_side.service(self.endpoint.stack(), clock.now());
        let mut held = self.host_side.undelivered_guest_bytes(self.endpoint.stack());
        let mut last_progress = WallClock::now();
        while held > 0 {
            if urgent.load(Ordering::Acquire) {
                return warn_undelivered(held, "the stop was made urgent");
            }
            let left = STOP_LINGER.saturating_sub(last_progress.elapsed());
            if left.is_zero() {
                let why =
                    format!("their host programs read nothing for {} s", STOP_LINGER.as_secs());
                return warn_undelivered(held, why);
            }
            if let Err(e) = poll.poll(events, Some(left)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return warn_undelivered(held, e);
            }
            let now = clock.now();
            for event in events.iter() {
                self.host_side.handle_event(self.endpoint.stack(), event, now);
            }
            self.host_side.events_handled();
            let still_held = self.host_side.undelivered_guest_bytes(self.endpoint.stack());
            if still_held < held {
                last_progress = WallClock::now();
            }
            held = still_held;
        }
    }

    /// When the loop must run next without being woken, in the stacks'
    /// clock's microseconds ([`NO_DEADLINE`] for never).
    fn next_round(&self, again: bool) -> u64 {
        if again {
            return 0;
        }
        [self.endpoint.poll_at(), self.host_side.poll_at(), self.memory.poll_at()]
            .into_iter()
            .flatten()
            .min()
            .map_or(NO_DEADLINE, |d| d.total_micros())
    }
}

/// Logs the guest bytes a stopping device drops, and `why`.
fn warn_undelivered(held: usize, why: impl std::fmt::Display) {
    tracing::warn!("the device stops with {held} bytes from the guest undelivered: {why}");
}

/// How long a stopping device loop waits for a host program to read
/// before the guest bytes still held for it are dropped
/// ([`LoopState::deliver_before_stop`]): as long as the unikernel's exit
/// waits for its own queued bytes to leave.
const STOP_LINGER: Duration = Duration::from_secs(5);

/// `LoopShared::sleeps_until`: the loop sleeps until it is woken.
const NO_DEADLINE: u64 = u64::MAX;

/// What the loop's thread shares with its [`InlineKick`]s.
struct LoopShared<D, B> {
    device: Arc<D>,
    /// `None` once the loop has ended: the host side (the bridge, which
    /// removes its socket files) goes with the loop, not with the last
    /// holder of this.
    state: Mutex<Option<LoopState<B>>>,
    clock: Clock,
    /// Interrupts the loop's poll.
    waker: Arc<mio::Waker>,
    /// Until when the loop's next poll sleeps ([`LoopState::next_round`]),
    /// stored under `state`'s lock before the loop releases it to sleep:
    /// an inline round that leaves an earlier deadline wakes the loop.
    sleeps_until: AtomicU64,
    /// Whether the loop's thread is in its poll (set under `state`'s lock
    /// before it sleeps, cleared as soon as the poll returns). A kick runs
    /// the round inline only then: once the loop is awake it wants the
    /// state for its own events, and an inline round would only make it
    /// wait for the lock.
    polling: AtomicBool,
    /// Queues kicked while the loop was awake (one bit each), noted here
    /// instead of on their eventfds: the loop takes them before it sleeps
    /// and runs a round for them then (see [`InlineRound::try_round`]).
    noted_kicks: AtomicU32,
    ring_trace: Option<RingTrace>,
}

impl<D: SharedDevice, B: HostSide> LoopShared<D, B> {
    fn lock(&self) -> MutexGuard<'_, Option<LoopState<B>>> {
        self.state.lock().expect("device loop state")
    }
}

/// A round run on the kicking thread; see [`InlineKick`].
trait InlineRound: Send + Sync {
    /// Answers kicks of `queues` without their eventfds if it can: by a
    /// round now if the loop is idle, or by a note the loop takes before it
    /// sleeps if it is awake. `false` if the kicks must go to the eventfds.
    fn try_round(&self, queues: u32) -> bool;
}

impl<D: SharedDevice, B: HostSide + Send> InlineRound for LoopShared<D, B> {
    fn try_round(&self, queues: u32) -> bool {
        // Awake, the loop will look at its queues again before it sleeps
        // if told so: the note is enough, and the eventfd's write, the
        // loop's read of it and an empty round are saved. The note and
        // the flag are checked in the opposite order by the loop (flag
        // set, then notes taken), all sequentially consistent, so either
        // the loop sees the note or this thread sees it asleep.
        if !self.polling.load(Ordering::SeqCst) {
            self.noted_kicks.fetch_or(queues, Ordering::SeqCst);
            if !self.polling.load(Ordering::SeqCst) {
                if let Some(trace) = &self.ring_trace {
                    for_each_queue(queues, |q| trace.kick(q, "noted", 1));
                }
                return true;
            }
            // It went to sleep meanwhile, perhaps without the note: answer
            // as for a sleeping loop.
        }
        let Ok(mut guard) = self.state.try_lock() else { return false };
        let Some(state) = guard.as_mut() else { return false };
        if !self.polling.load(Ordering::Acquire) {
            return false;
        }
        if let Some(trace) = &self.ring_trace {
            for_each_queue(queues, |q| trace.kick(q, "inline", 1));
        }
        let again = state.run_round(&*self.device, self.clock.now());
        let next = state.next_round(again);
        drop(guard);
        if next < self.sleeps_until.load(Ordering::Acquire) {
            let _ = self.waker.wake();
        }
        true
    }
}

/// Calls `f` with each queue whose bit is set in `queues` (not
/// [`PACKETS_WAITING`], which names no queue).
fn for_each_queue(queues: u32, mut f: impl FnMut(usize)) {
    let mut queues = queues & !PACKETS_WAITING;
    while queues != 0 {
        f(queues.trailing_zeros() as usize);
        queues &= queues - 1;
    }
}

/// Answers a driver's queue kick with a device round on the kicking
/// thread itself, when the device loop is idle (asleep in its poll); when
/// it is awake, by a note it takes before it sleeps again, so that it runs
/// one more round. Either way no eventfd is written; only a kick that
/// finds the loop's state taken by another inline round goes to its
/// eventfd.
///
/// On the in-process bus the kicking thread is the application's, just
/// done with the guest lock. Handing every kick to the device thread
/// costs an eventfd write, the loop's wakeup (a context switch on two
/// cores) and the eventfd read, several microseconds each on a nested
/// host, for work (take the tx queue, write the payload to a Unix socket)
/// that takes about as long. A vCPU whose queue notification a VMM handles
/// synchronously makes the same trade. On the vhost-user bus the kick fd
/// is read by vhost-user-backend's worker thread, which is woken anyway:
/// it runs the round, and the loop's thread stays asleep. A KVM
/// ioeventfd has no thread to borrow, but one device's loop can lend its
/// own to another's: on the vhost-user bus a guest's packet for a
/// sibling guest is delivered by a round of the sibling's device run on
/// the sender's thread ([`Self::try_deliver`]), one thread's wakeup
/// fewer per packet.
#[derive(Clone)]
pub struct InlineKick(Weak<dyn InlineRound>);

/// The bit [`InlineKick::try_deliver`] asks a round with: packets wait for
/// the guest's receive queue, and no driver kicked.
const PACKETS_WAITING: u32 = 1 << 31;
const _: () = assert!(NUM_QUEUES < 31, "the bit must name no queue");

impl InlineKick {
    /// A kick with no device loop behind it: every try fails, so kicks go
    /// to the eventfds (a harness that drives the queues without a loop).
    pub fn without_loop() -> Self {
        /// Never upgraded: the `Weak` below points at nothing.
        struct NoLoop;
        impl InlineRound for NoLoop {
            fn try_round(&self, _queues: u32) -> bool {
                false
            }
        }
        InlineKick(Weak::<NoLoop>::new())
    }

    /// Runs a round for the kicks of `queues` (one bit per queue) if the
    /// loop is idle; `false` means the kicks must go out on the eventfds.
    pub fn try_round(&self, queues: u32) -> bool {
        self.0.upgrade().is_some_and(|shared| shared.try_round(queues))
    }

    /// Runs a round for packets another thread left for this device (a
    /// sibling guest's, on the vhost-user bus) if the loop is idle, or has
    /// the loop run one more round if it is awake. `false` means the loop
    /// must be woken some other way. The delivering thread holds locks of
    /// its own device: this never blocks on the other loop's state (it
    /// only tries it), so two devices delivering to each other at once
    /// cannot deadlock; each then wakes the other.
    pub fn try_deliver(&self) -> bool {
        self.try_round(PACKETS_WAITING)
    }
}

impl std::fmt::Debug for InlineKick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineKick").finish_non_exhaustive()
    }
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
        interrupts: Box<dyn InterruptDelivery>,
    ) -> io::Result<Self>
    where
        D: SharedDevice,
        B: HostSide + Send + 'static,
        F: FnOnce(&mut Stack, &Registry, usize) -> io::Result<B>,
    {
        let poll = Poll::new()?;
        let registry = poll.registry();
        for q in 0..NUM_QUEUES {
            let fd = events.queue(q).expect("three queues").as_raw_fd();
            registry.register(&mut SourceFd(&fd), Token(q), MioInterest::READABLE)?;
        }
        let control = events.control().as_raw_fd();
        registry.register(&mut SourceFd(&control), Token(CONTROL_TOKEN), MioInterest::READABLE)?;
        let stop = Arc::new(mio::Waker::new(registry, Token(STOP_TOKEN))?);
        let control = Arc::new(Control::default());
        let host_side = build_host_side(endpoint.stack(), registry, FIRST_BACKEND_TOKEN)?;
        let ring_trace = device.lock_device().ring_trace().cloned();
        let state = LoopState {
            endpoint,
            host_side,
            wakes: WakeList::new(),
            interrupts,
            memory: MemoryReturn::default(),
        };
        let shared = Arc::new(LoopShared {
            device,
            state: Mutex::new(Some(state)),
            clock,
            waker: stop.clone(),
            sleeps_until: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            noted_kicks: AtomicU32::new(0),
            ring_trace,
        });
        let inline = {
            let weak: Weak<dyn InlineRound> = Arc::downgrade(&shared) as Weak<LoopShared<D, B>>;
            InlineKick(weak)
        };
        let loop_control = control.clone();
        let handle = std::thread::Builder::new().name("pier-device".into()).spawn(move || {
            let result = run_loop(&shared, &events, poll, &loop_control);
            // The host side goes with the loop, whoever still holds
            // `shared` (an inline kick in flight).
            shared.lock().take();
            result
        })?;
        Ok(Self { stop, control, handle: Mutex::new(Some(handle)), inline })
    }

    /// The loop's [`InlineKick`], for a bus whose kicks come from a thread
    /// that may run the round itself.
    pub fn inline_kick(&self) -> InlineKick {
        self.inline.clone()
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

    /// Makes a stop, under way or to come, drop the guest bytes the host
    /// stack still holds instead of waiting for their host programs to
    /// read them: for a user who asked twice (a second Ctrl-C) and will
    /// not wait. The loop logs how many bytes it dropped.
    pub fn make_stop_urgent(&self) -> io::Result<()> {
        self.control.urgent_stop.store(true, Ordering::Release);
        self.stop.wake()
    }

    /// Ends the loop and waits for it, through a shared reference (the
    /// thread may be owned by something other threads still use). The
    /// host_side (the bridge, which removes its socket files) is dropped as
    /// the loop ends, once the guest bytes it holds have reached the host
    /// programs that read them (a program that reads nothing for five
    /// seconds holds the stop no longer). Later calls do nothing.
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

/// The loop's thread: poll, then a round under the state's lock, until
/// stopped.
fn run_loop<D: SharedDevice, B: HostSide>(
    shared: &LoopShared<D, B>,
    events: &DeviceEvents,
    mut poll: Poll,
    control: &Control,
) -> io::Result<()> {
    let mut mio_events = Events::with_capacity(256);
    let mut again = false;
    loop {
        let next = {
            let mut guard = shared.lock();
            let mut next = guard.as_mut().map_or(NO_DEADLINE, |state| {
                state.interrupts.before_sleep();
                state.next_round(again)
            });
            shared.polling.store(true, Ordering::SeqCst);
            if shared.noted_kicks.swap(0, Ordering::SeqCst) != 0 {
                // Kicked while awake: the poll only collects what else is
                // ready, and the round answers the kicks.
                next = 0;
            }
            shared.sleeps_until.store(next, Ordering::Release);
            next
        };
        let timeout = (next != NO_DEADLINE).then(|| shared.clock.until(Instant::from_micros(next)));
        let polled = poll.poll(&mut mio_events, timeout);
        shared.polling.store(false, Ordering::Release);
        if let Err(e) = polled {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let now = shared.clock.now();
        let mut guard = shared.lock();
        let Some(state) = guard.as_mut() else { return Ok(()) };
        let mut stopping = false;
        for event in mio_events.iter() {
            match event.token().0 {
                q if q < NUM_QUEUES => {
                    let kicks = drain_eventfd(events.queue(q).expect("queue"));
                    if let Some(trace) = &shared.ring_trace {
                        trace.kick(q, "eventfd", kicks);
                    }
                }
                CONTROL_TOKEN => {
                    drain_eventfd(events.control());
                }
                STOP_TOKEN if control.stopping.load(Ordering::Acquire) => stopping = true,
                STOP_TOKEN => {}
                _ => state.host_side.handle_event(state.endpoint.stack(), event, now),
            }
        }
        state.host_side.events_handled();
        if stopping {
            state.deliver_before_stop(
                &mut poll,
                &mut mio_events,
                &shared.clock,
                &control.urgent_stop,
            );
            // The last counters stay readable after the loop.
            control.publish(&mut state.endpoint, &state.host_side);
            return Ok(());
        }
        // The round looks at every queue: kicks noted until now are
        // answered by it.
        shared.noted_kicks.store(0, Ordering::SeqCst);
        if control.transport_reset_wanted.swap(false, Ordering::AcqRel) {
            let mut device = shared.device.lock_device();
            state.endpoint.reset_transport(&mut device, &mut state.host_side, &mut state.wakes);
        }
        if control.reset_wanted.swap(false, Ordering::AcqRel) {
            shared.device.lock_device().set_needs_reset();
        }
        again = state.run_round(&*shared.device, now);
        if control.stats_wanted.swap(false, Ordering::AcqRel) {
            control.publish(&mut state.endpoint, &state.host_side);
        }
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
    interrupts.before_round();
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
/// [`Self::DROP`]; when the last socket has closed; and when
/// [`Self::QUIET`] has passed since a socket last closed with no trim
/// since. The last catches the tail of a burst when sockets stay open
/// (listeners, a long-lived connection): the few connections that closed
/// after the last halving may hold most of the memory, as a stream's
/// receive buffer grows to a megabyte. A few trims per burst, however
/// large, and none while connections come and go faster than `QUIET`.
#[derive(Debug, Default)]
struct MemoryReturn {
    peak: usize,
    /// The socket count after the last round, to see closes.
    sockets: usize,
    /// When a socket last closed, if no trim has run since.
    closed_at: Option<Instant>,
}

impl MemoryReturn {
    /// How many sockets must have closed since the peak.
    const DROP: usize = 8;
    /// How long after the last close the memory it freed is handed back.
    const QUIET: Duration = Duration::from_millis(100);

    fn after_round(&mut self, sockets: usize, now: Instant) {
        if self.trim_due(sockets, now) {
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory; it takes the
            // allocator's own locks.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// Whether a round that left `sockets` open at `now` must trim.
    fn trim_due(&mut self, sockets: usize, now: Instant) -> bool {
        if sockets < self.sockets {
            self.closed_at = Some(now);
        }
        self.sockets = sockets;
        self.peak = self.peak.max(sockets);
        let halved = self.peak - sockets >= Self::DROP && sockets <= self.peak / 2;
        let all_closed = sockets == 0 && self.peak > 0;
        let quiet = self.closed_at.is_some_and(|closed| now >= closed + Self::QUIET);
        let due = halved || all_closed || quiet;
        if due {
            self.peak = sockets;
            self.closed_at = None;
        }
        due
    }

    /// When the loop must wake for a quiet trim.
    fn poll_at(&self) -> Option<Instant> {
        self.closed_at.map(|closed| closed + Self::QUIET)
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
    fn memory_is_trimmed_after_a_burst_halves_and_once_closes_go_quiet() {
        let at = Instant::from_millis;
        let mut memory = MemoryReturn::default();
        assert!(!memory.trim_due(40, at(0)), "opening trims nothing");
        assert!(!memory.trim_due(30, at(1)), "a quarter closed");
        assert!(memory.trim_due(20, at(2)), "half closed");
        assert!(!memory.trim_due(12, at(3)), "not half of 20 yet");
        assert_eq!(memory.poll_at(), Some(at(103)), "the loop wakes for the quiet trim");
        assert!(!memory.trim_due(11, at(90)), "closes keep coming");
        assert!(!memory.trim_due(11, at(189)));
        assert!(memory.trim_due(11, at(190)), "quiet for 100 ms since the last close");
        assert_eq!(memory.poll_at(), None);
        assert!(!memory.trim_due(11, at(500)), "nothing closed since");
        assert!(memory.trim_due(0, at(501)), "the last socket closed");
    }

    #[test]
    fn a_kick_without_a_loop_is_never_taken_inline() {
        let kick = InlineKick::without_loop();
        assert!(!kick.try_round(0b111), "the kicks must go to the eventfds");
        assert!(!kick.try_deliver());
    }

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
