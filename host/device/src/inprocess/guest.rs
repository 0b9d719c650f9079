//! The guest side of the in-process bus: pier-driver and a guest stack,
//! and the threads that run them.
//!
//! [`GuestThread`] holds a driver and stack behind one lock that the
//! application polls inline after each call, the device thread polls as its
//! interrupt handler ([`InlineInterrupts`]), and a guest thread polls for
//! timers (and when the interrupt found the lock taken). Wakers always fire
//! after the lock is released.
//!
//! Why the interrupt runs on the device thread: on two cores, handing every
//! interrupt to a thread that only polls and wakes the application cost
//! more than the work itself (an echo through the shim ran at half the
//! speed; docs/benchmarks.md). For the same reason the device loop's
//! thread sleeps on the CPU the application last called in from
//! ([`InlineInterrupts`]' `before_sleep`): the two hand buffers to each
//! other all the time. Both tricks belong to this bus: the device loop
//! only sees an [`InterruptDelivery`].

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as WallClock};

use pier_stack::{Instant, Interest, SocketHandle, Stack, WakeList};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::transport::{DeferredKicks, EventWaiter, InProcessDriver, SetupError};
use crate::device_loop::{Clock, DeviceEvents, InterruptDelivery};
use crate::mmio::VsockMmio;

/// What the guest thread shares with the application.
#[derive(Debug)]
struct GuestState {
    stack: Stack,
    /// `None` only after a [`GuestThread::restart_driver`] whose new driver
    /// could not start: the stack stays, but no packet moves.
    driver: Option<InProcessDriver>,
}

/// Starts a new driver on the same device and memory, its kicks deferred
/// through the guest thread's [`DeferredKicks`].
pub type DriverFactory =
    Box<dyn Fn(&Arc<DeferredKicks>) -> Result<InProcessDriver, SetupError> + Send + Sync>;

/// The guest side: its state, and what the threads that drive it share.
///
/// Three kinds of thread run the driver, each only while it holds the
/// state's lock:
///
/// - **the application**, inline, after every call that may produce
///   packets ([`GuestThread::with`]): its packets reach the tx queue and
///   the device's kick at once, with no handoff to another thread;
/// - **the device thread**, as the interrupt handler
///   ([`GuestThread::interrupt_handler`]): received packets reach the stack
///   and the application's wakers without waking a guest thread first,
///   which is what a vCPU taking an interrupt does;
/// - **the guest thread**, for timers, for a tx queue that was full, and as
///   the backstop when the interrupt found the lock taken.
///
/// Every path polls the whole driver, so whichever thread gets there first
/// does the work and the others find nothing to do.
pub struct GuestThread {
    shared: Arc<GuestShared>,
    /// Behind a lock so that [`Self::halt`] works through a shared reference.
    handle: Mutex<Option<JoinHandle<()>>>,
}

struct GuestShared {
    state: Mutex<GuestState>,
    /// Wakes the guest thread (as the device's interrupt eventfd does).
    kick: EventFd,
    /// When the guest thread plans to look next, in the stacks' clock
    /// (microseconds; `u64::MAX` for no deadline): an application call
    /// that needs it sooner (a new timer, a full tx queue) kicks it.
    planned: AtomicU64,
    stop: AtomicBool,
    clock: Clock,
    /// The driver's kicks, sent after each release of `state`'s lock.
    kicks: Arc<DeferredKicks>,
    /// What [`GuestThread::restart_driver`] starts in place of the driver.
    restart: DriverFactory,
    /// The CPU the application last called in from (-1 before its first
    /// call), for the device loop to follow ([`InlineInterrupts`]).
    app_cpu: Arc<AtomicI32>,
}

/// How long the guest thread waits before retrying packets that found the
/// tx queue full.
const TX_RETRY: Duration = Duration::from_micros(200);
/// The longest the guest thread sleeps, so it sees `stop`.
const GUEST_SLEEP_CAP: Duration = Duration::from_millis(100);

thread_local! {
    /// Wakers collected under the guest lock and woken after it, one list
    /// per thread so that its capacity is reused.
    static WAKES: std::cell::RefCell<WakeList> = std::cell::RefCell::new(WakeList::new());
}

impl GuestShared {
    fn lock(&self) -> MutexGuard<'_, GuestState> {
        self.state.lock().expect("guest lock")
    }

    /// Polls the driver on the locked state; returns when the guest thread
    /// should look next.
    fn poll(&self, state: &mut GuestState, now: Instant, wakes: &mut WakeList) -> Option<Instant> {
        let GuestState { stack, driver } = state;
        let driver = driver.as_mut()?;
        driver.poll(stack, now, wakes);
        if stack.has_pending_tx() { Some(now + TX_RETRY) } else { stack.poll_at() }
    }

    /// Polls the driver for an application call and kicks the guest thread
    /// if the stack now needs it before it planned to look.
    fn poll_for_caller(&self, state: &mut GuestState, now: Instant, wakes: &mut WakeList) {
        if let Some(next) = self.poll(state, now, wakes)
            && next.total_micros() < self.planned.load(Ordering::Acquire)
        {
            self.planned.store(next.total_micros(), Ordering::Release);
            let _ = self.kick.write(1);
        }
    }

    /// The device's interrupt, run on the device thread. `false` if the
    /// lock was taken; the caller then raises the interrupt eventfd so the
    /// guest thread polls once the holder is done.
    fn interrupt(&self) -> bool {
        let Ok(mut state) = self.state.try_lock() else { return false };
        WAKES.with_borrow_mut(|wakes| {
            self.poll_for_caller(&mut state, self.clock.now(), wakes);
            drop(state);
            wakes.wake_all();
        });
        self.kicks.flush();
        true
    }

    /// The guest thread's loop.
    fn run(&self, mut waiter: EventWaiter) {
        let mut wakes = WakeList::new();
        while !self.stop.load(Ordering::Acquire) {
            let now = self.clock.now();
            let next = {
                let mut state = self.lock();
                let next = self.poll(&mut state, now, &mut wakes);
                let next = next.map_or(u64::MAX, |n| n.total_micros());
                self.planned.store(next, Ordering::Release);
                next
            };
            wakes.wake_all();
            self.kicks.flush();
            let timeout = if next == u64::MAX {
                GUEST_SLEEP_CAP
            } else {
                self.clock.until(Instant::from_micros(next)).min(GUEST_SLEEP_CAP)
            };
            let _ = waiter.wait(Some(timeout));
        }
    }
}

impl std::fmt::Debug for GuestThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestThread").finish_non_exhaustive()
    }
}

/// An interrupt handler the device thread runs in place of raising the
/// interrupt eventfd; `false` means it could not run now, and the device
/// raises the eventfd after all.
pub type InterruptHandler = Box<dyn FnMut() -> bool + Send>;

impl GuestThread {
    /// Runs `stack`, the one `driver` feeds, on a guest thread.
    /// `restart` is what [`Self::restart_driver`] starts in its place.
    pub fn spawn(
        stack: Stack,
        driver: InProcessDriver,
        events: &DeviceEvents,
        clock: Clock,
        restart: DriverFactory,
    ) -> io::Result<Self> {
        let kicks = driver.transport().deferred_kicks().clone();
        kicks.enable();
        let shared = Arc::new(GuestShared {
            state: Mutex::new(GuestState { stack, driver: Some(driver) }),
            kick: EventFd::new(EFD_NONBLOCK)?,
            planned: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            clock,
            kicks,
            restart,
            app_cpu: Arc::new(AtomicI32::new(-1)),
        });
        let waiter = EventWaiter::new(&[events.irq(), &shared.kick])?;
        let handle = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("pier-guest".into())
                .spawn(move || shared.run(waiter))?
        };
        Ok(Self { shared, handle: Mutex::new(Some(handle)) })
    }

    /// The kicks its driver (and every driver a restart starts) holds back
    /// until the guest lock is released.
    pub fn deferred_kicks(&self) -> &Arc<DeferredKicks> {
        &self.shared.kicks
    }

    /// The CPU the application last called in from (-1 before its first
    /// call): where the device loop's thread does best to sleep.
    pub fn app_cpu(&self) -> Arc<AtomicI32> {
        self.shared.app_cpu.clone()
    }

    /// The handler for the device thread to run on an interrupt.
    pub fn interrupt_handler(&self) -> InterruptHandler {
        let shared = self.shared.clone();
        Box::new(move || shared.interrupt())
    }

    pub fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Runs `f` on the guest stack, then polls the driver so that what `f`
    /// queued leaves at once; wakes what the poll made ready after the lock
    /// is released.
    pub fn with<R>(&self, f: impl FnOnce(&mut Stack, Instant) -> R) -> R {
        self.with_driver(|stack, _, now| f(stack, now))
    }

    /// Sends stream bytes on `h` as [`Stack::send`] does, copied once,
    /// straight into the driver's tx buffers when they can go out at once
    /// ([`pier_driver::VsockDriver::send_in_place`]); then polls as
    /// [`Self::with`] does.
    pub fn send_in_place(&self, h: SocketHandle, data: &[u8]) -> pier_stack::Result<usize> {
        self.with_driver(|stack, driver, _| match driver {
            Some(driver) => driver.send_in_place(stack, h, data),
            None => stack.send(h, data),
        })
    }

    /// Restarts the driver under the running stack, as a guest does whose
    /// driver is unbound and bound again: the old driver resets the device
    /// as it goes (so the host side's connections end), a new one sets it
    /// up in the same memory, and the stack fails every connection with
    /// connection-reset and keeps its listeners and datagram sockets, as
    /// Linux resets its sockets when the device goes away. Bytes received
    /// before the restart stay readable: the stack copies what it held in
    /// the old driver's buffers first. If the new driver cannot start, the
    /// stack stays without one (nothing moves) and the error says why.
    pub fn restart_driver(&self) -> Result<(), SetupError> {
        let now = self.now();
        let result = WAKES.with_borrow_mut(|wakes| {
            let mut state = self.shared.lock();
            let GuestState { stack, driver } = &mut *state;
            stack.take_back_held_buffers();
            drop(driver.take());
            let started = (self.shared.restart)(&self.shared.kicks);
            let cid = match &started {
                Ok(new) => new.guest_cid() as u32,
                Err(_) => stack.local_cid(),
            };
            stack.transport_reset(cid, wakes);
            let result = started.map(|mut new| {
                new.lend_rx_buffers(stack);
                *driver = Some(new);
            });
            self.shared.poll_for_caller(&mut state, now, wakes);
            drop(state);
            wakes.wake_all();
            result
        });
        self.shared.kicks.flush();
        result
    }

    /// [`Self::with`], with the driver beside the stack.
    fn with_driver<R>(
        &self,
        f: impl FnOnce(&mut Stack, Option<&mut InProcessDriver>, Instant) -> R,
    ) -> R {
        let now = self.now();
        // SAFETY: sched_getcpu has no arguments; -1 (an error) means unknown.
        self.shared.app_cpu.store(unsafe { libc::sched_getcpu() }, Ordering::Relaxed);
        // The kicks go out after the thread's wake list is free again: a
        // flush may run the device's round here, whose interrupt runs this
        // guest's handler, which uses that list.
        let result = WAKES.with_borrow_mut(|wakes| {
            let mut state = self.shared.lock();
            let GuestState { stack, driver } = &mut *state;
            let result = f(stack, driver.as_mut(), now);
            self.shared.poll_for_caller(&mut state, now, wakes);
            drop(state);
            wakes.wake_all();
            result
        });
        self.shared.kicks.flush();
        result
    }

    /// Runs `f` on the stack, for calls that mostly look (addresses,
    /// options, queue sizes): the driver is polled afterwards only if `f`
    /// left packets to send, so a query costs no poll while nothing can
    /// wait for one.
    pub fn query<R>(&self, f: impl FnOnce(&mut Stack) -> R) -> R {
        let result = WAKES.with_borrow_mut(|wakes| {
            let mut state = self.shared.lock();
            let result = f(&mut state.stack);
            if state.stack.has_pending_tx() {
                self.shared.poll_for_caller(&mut state, self.now(), wakes);
            }
            drop(state);
            wakes.wake_all();
            result
        });
        self.shared.kicks.flush();
        result
    }

    /// Calls `f` until it returns `Some`, sleeping on the socket's waker
    /// between tries; gives up at `timeout`.
    pub fn wait_for<R>(
        &self,
        socket: SocketHandle,
        interest: Interest,
        timeout: Duration,
        mut f: impl FnMut(&mut Stack, Instant) -> Option<R>,
    ) -> Option<R> {
        let signal = Arc::new(Signal::default());
        let waker = Waker::from(signal.clone());
        let deadline = WallClock::now() + timeout;
        loop {
            let done = self.with(|stack, now| {
                let r = f(stack, now);
                if r.is_none() {
                    let _ = stack.register_waker(socket, interest, &waker);
                }
                r
            });
            if done.is_some() {
                return done;
            }
            let left = deadline.saturating_duration_since(WallClock::now());
            if left.is_zero() {
                return None;
            }
            signal.wait(left.min(Duration::from_millis(50)));
        }
    }

    /// Runs an application loop on the calling thread until `stop` is set:
    /// `step` gets the locked stack, the driver (for sends straight into
    /// its tx buffers, as [`Self::send_in_place`] makes them; `None` while
    /// the device is gone), the time and a waker to park on the sockets it
    /// waits for; between steps the thread sleeps until that waker fires
    /// (or 50 ms pass, so `stop` is seen).
    pub fn serve(
        &self,
        stop: &AtomicBool,
        mut step: impl FnMut(&mut Stack, Option<&mut InProcessDriver>, Instant, &Waker),
    ) {
        let signal = Arc::new(Signal::default());
        let waker = Waker::from(signal.clone());
        while !stop.load(Ordering::Acquire) {
            self.with_driver(|stack, driver, now| step(stack, driver, now, &waker));
            signal.wait(Duration::from_millis(50));
        }
    }
}

impl GuestThread {
    /// The guest side's counters: its stack's and its driver's.
    pub fn stats(&self) -> GuestStats {
        let state = self.shared.lock();
        let driver = state.driver.as_ref().map(|d| d.stats()).unwrap_or_default();
        GuestStats { stack: state.stack.stats().clone(), driver }
    }

    /// Ends the guest thread (timers and tx retries stop) and waits for it;
    /// calls through [`Self::with`] still poll the driver. For a guest
    /// whose device is gone, where retrying would only burn CPU.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.kick.write(1);
        if let Some(h) = self.handle.lock().expect("guest handle").take() {
            let _ = h.join();
        }
    }
}

impl Drop for GuestThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The guest side's counters, copied under its lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestStats {
    /// The guest stack's protocol counters.
    pub stack: pier_stack::Stats,
    /// pier-driver's queue counters.
    pub driver: pier_driver::DriverStats,
}

/// A waker that unparks a thread blocked in [`Signal::wait`].
#[derive(Default)]
struct Signal {
    woken: Mutex<bool>,
    cond: Condvar,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        *self.woken.lock().expect("signal") = true;
        self.cond.notify_all();
    }
}

impl Signal {
    fn wait(&self, timeout: Duration) {
        let guard = self.woken.lock().expect("signal");
        let (mut guard, _) =
            self.cond.wait_timeout_while(guard, timeout, |woken| !*woken).expect("signal");
        *guard = false;
    }
}

/// Interrupts the device loop delivers by running the guest's handler on
/// its own thread, as a vCPU taking the interrupt would, instead of
/// waking a guest thread to do it.
pub struct InlineInterrupts {
    handler: InterruptHandler,
    /// Where the handler's kicks are taken inline, and whose interrupt
    /// line is raised when the handler cannot run (the guest lock is
    /// taken).
    events: Arc<DeviceEvents>,
    /// The register file's interrupt count when last delivered.
    seen: u64,
    /// The application's CPU ([`GuestThread::app_cpu`]), and the one the
    /// loop's thread is kept on (-1: not yet kept anywhere).
    app_cpu: Arc<AtomicI32>,
    kept_on: i32,
}

impl InlineInterrupts {
    /// Takes the register file's interrupt line (from now on the device
    /// loop delivers its interrupts); `events`' interrupt eventfd is raised
    /// instead when the handler cannot run. `app_cpu` is where the
    /// application runs ([`GuestThread::app_cpu`]), for the loop's thread
    /// to sleep beside it.
    pub fn new<A: GuestAddressSpace>(
        mmio: &mut VsockMmio<A>,
        handler: InterruptHandler,
        events: &Arc<DeviceEvents>,
        app_cpu: Arc<AtomicI32>,
    ) -> Self {
        mmio.take_irq();
        let seen = mmio.interrupts_raised();
        Self { handler, events: events.clone(), seen, app_cpu, kept_on: -1 }
    }
}

impl std::fmt::Debug for InlineInterrupts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineInterrupts").field("seen", &self.seen).finish_non_exhaustive()
    }
}

impl InterruptDelivery for InlineInterrupts {
    fn deliver(&mut self, raised: u64) -> bool {
        if raised == self.seen {
            return false;
        }
        self.seen = raised;
        let mut ran = false;
        let kicked = self.events.run_guest_inline(|| ran = (self.handler)());
        if !ran {
            let _ = self.events.irq().write(1);
        }
        kicked
    }

    /// Keeps the loop's thread on the CPU the application last ran on.
    ///
    /// The two hand every receive buffer back and forth (the device fills
    /// it and runs the interrupt, the application reads it, its refill
    /// kicks the device), a wakeup each way. On the two-CPU nested hosts
    /// pier is measured on, a wakeup across CPUs costs 15 to 19 µs and
    /// one on the same CPU about 2.4 µs (docs/benchmarks.md, the thread
    /// hop), and where the scheduler put the two apart, a host program's
    /// 64 KiB stream into the guest ran at 27 to 34 Gbit/s against 37 to
    /// 48 with them together. The host program, coupled to the device
    /// only through its socket's buffer, gets the other CPU. The thread
    /// follows when the application moves; the set of CPUs it may use is
    /// the application's own, so a process confined to some CPUs stays
    /// there.
    fn before_sleep(&mut self) {
        let cpu = self.app_cpu.load(Ordering::Relaxed);
        if cpu < 0 || cpu == self.kept_on {
            return;
        }
        // SAFETY: the set is a plain bitmask on the stack.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0
        };
        if !ok {
            tracing::debug!(cpu, "the device loop could not move to the application's CPU");
        }
        // Tried once per CPU: one this thread may not use is not asked
        // for again until the application moves.
        self.kept_on = cpu;
    }
}
