//! Threads that run the two halves of the in-process chain.
//!
//! [`DeviceThread`] is the device: one event loop (mio over epoll) that
//! waits on the queue eventfds the driver kicks (as KVM's ioeventfd would
//! deliver them), on the host stack's timers, and on whatever a
//! [`HostService`] registers (the Unix-socket bridge). Each wakeup runs one
//! round: take the guest's packets, let the service move data, answer.
//!
//! [`GuestThread`] is the guest: a driver and stack behind one lock that the
//! application polls inline after each call, the device thread polls as
//! its interrupt handler, and a guest thread polls for timers (and when the
//! interrupt found the lock taken). Wakers always fire after the lock is
//! released.
//!
//! Why the interrupt runs on the device thread: on two cores, handing every
//! interrupt to a thread that only polls and wakes the application cost
//! more than the work itself (an echo through the shim ran at half the
//! speed; docs/benchmarks.md).
//!
//! The same [`HostEndpoint`] and driver run in the single-thread
//! [`crate::chain::Chain`]; these threads only add the waiting.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as WallClock};

use mio::unix::SourceFd;
use mio::{Events, Interest as MioInterest, Poll, Token};
use pier_stack::wire::RawHeader;
use pier_stack::{Instant, Interest, SocketHandle, Stack, TxSink, WakeList};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::chain::{InProcessDriver, SharedMmio};
use crate::endpoint::{HostEndpoint, RelayHooks};
use crate::inprocess::DeviceEvents;
use crate::mmio::NUM_QUEUES;

/// Something that lives in the device's event loop beside the host
/// endpoint and works on the host stack's sockets: the Unix-socket bridge.
pub trait HostService: Send {
    /// Registers the service's sources. Tokens below `FIRST_SERVICE_TOKEN`
    /// belong to the device loop.
    fn register(&mut self, stack: &mut Stack, registry: &mio::Registry) -> io::Result<()>;
    /// One of the service's sources is ready.
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant);
    /// The stack took packets or fired timers: move data, accept, finish handshakes.
    fn service(&mut self, stack: &mut Stack, now: Instant);
    /// The service's earliest deadline.
    fn poll_at(&self) -> Option<Instant>;
    /// A guest datagram; `true` if the service took it instead of the host stack.
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        let _ = (header, payload);
        false
    }
    /// Guest stream bytes offered before the host stack buffers them
    /// (see [`RelayHooks::guest_stream_bytes`]); returns how many it took.
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: &[u8]) -> usize {
        let _ = (socket, data);
        0
    }
    /// Datagrams the service wants delivered to the guest.
    fn drain_guest_datagrams(&mut self, sink: &mut dyn TxSink) {
        let _ = sink;
    }
}

/// A service that does nothing: the host stack alone.
#[derive(Debug, Default)]
pub struct NoService;

impl HostService for NoService {
    fn register(&mut self, _: &mut Stack, _: &mio::Registry) -> io::Result<()> {
        Ok(())
    }
    fn handle_event(&mut self, _: &mut Stack, _: &mio::event::Event, _: Instant) {}
    fn service(&mut self, _: &mut Stack, _: Instant) {}
    fn poll_at(&self) -> Option<Instant> {
        None
    }
}

/// The first token a [`HostService`] may use.
pub const FIRST_SERVICE_TOKEN: usize = 16;
const CONTROL_TOKEN: usize = NUM_QUEUES;
const STOP_TOKEN: usize = NUM_QUEUES + 1;

/// Converts the wall clock into the stacks' clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock(WallClock);

impl Clock {
    pub fn new() -> Self {
        Self(WallClock::now())
    }
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

/// Adapts a service to the endpoint's relay hooks.
struct ServiceHooks<'a, S: HostService>(&'a mut S);

impl<S: HostService> RelayHooks for ServiceHooks<'_, S> {
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        self.0.guest_datagram(header, payload)
    }
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: &[u8]) -> usize {
        self.0.guest_stream_bytes(socket, data)
    }
}

/// The device's event loop on its own thread.
#[derive(Debug)]
pub struct DeviceThread {
    stop: Arc<mio::Waker>,
    /// Behind a lock so that [`Self::halt`] works through a shared reference.
    handle: Mutex<Option<JoinHandle<io::Result<()>>>>,
}

impl DeviceThread {
    /// Starts the loop. With `interrupt`, the loop runs that handler
    /// itself whenever the device raised an interrupt, and raises the
    /// interrupt eventfd only when the handler could not run; without it,
    /// interrupts go to the eventfd the register file was given.
    pub fn spawn<S: HostService + 'static>(
        mmio: Arc<SharedMmio>,
        events: Arc<DeviceEvents>,
        mut endpoint: HostEndpoint,
        mut service: S,
        clock: Clock,
        interrupt: Option<InterruptHandler>,
    ) -> io::Result<Self> {
        let mut irq = match interrupt {
            Some(handler) => {
                let mut mmio = mmio.lock().expect("device lock");
                mmio.take_irq();
                let seen = mmio.interrupts_raised();
                Some(InlineInterrupts { handler, fallback: events.irq_line()?, seen })
            }
            None => None,
        };
        let mut poll = Poll::new()?;
        let registry = poll.registry();
        for q in 0..NUM_QUEUES {
            let fd = events.queue(q).expect("three queues");
            registry.register(&mut SourceFd(&fd_of(fd)), Token(q), MioInterest::READABLE)?;
        }
        registry.register(
            &mut SourceFd(&fd_of(events.control())),
            Token(CONTROL_TOKEN),
            MioInterest::READABLE,
        )?;
        let stop = Arc::new(mio::Waker::new(registry, Token(STOP_TOKEN))?);
        service.register(endpoint.stack(), registry)?;
        let handle = std::thread::Builder::new().name("pier-device".into()).spawn(move || {
            let mut mio_events = Events::with_capacity(256);
            let mut wakes = WakeList::new();
            let mut again = false;
            loop {
                let deadline = [endpoint.poll_at(), service.poll_at()].into_iter().flatten().min();
                let timeout =
                    if again { Some(Duration::ZERO) } else { deadline.map(|d| clock.until(d)) };
                if let Err(e) = poll.poll(&mut mio_events, timeout) {
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                let now = clock.now();
                for event in mio_events.iter() {
                    match event.token().0 {
                        q if q < NUM_QUEUES => drain_eventfd(events.queue(q).expect("queue")),
                        CONTROL_TOKEN => drain_eventfd(events.control()),
                        STOP_TOKEN => return Ok(()),
                        _ => service.handle_event(endpoint.stack(), event, now),
                    }
                }
                again = round(&mmio, &mut endpoint, &mut service, now, &mut wakes, &mut irq);
                wakes.wake_all();
            }
        })?;
        Ok(Self { stop, handle: Mutex::new(Some(handle)) })
    }

    /// Ends the loop and waits for it, through a shared reference (the
    /// thread may be owned by something other threads still use). The
    /// host service (the bridge, which removes its socket files) is dropped
    /// as the loop ends.
    pub fn halt(&self) -> io::Result<()> {
        let Some(handle) = self.handle.lock().expect("device handle").take() else {
            return Ok(());
        };
        self.stop.wake()?;
        handle.join().map_err(|_| io::Error::other("device thread panicked"))?
    }

    /// Stops the loop and waits for it.
    pub fn stop(self) -> io::Result<()> {
        self.halt()
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// One device round: packets in, service, packets out, until nothing moves.
/// Returns whether tx chains are still waiting (the round's budget ran out
/// with driver notifications off), so the loop must go again at once.
fn round<S: HostService>(
    mmio: &SharedMmio,
    endpoint: &mut HostEndpoint,
    service: &mut S,
    now: Instant,
    wakes: &mut WakeList,
    irq: &mut Option<InlineInterrupts>,
) -> bool {
    // The register file's lock is also taken by the driver for most
    // register accesses (notify, status), so it is held only while queues
    // are touched, never across the service's socket I/O.
    {
        let mut mmio = mmio.lock().expect("device lock");
        endpoint.follow_driver(&mut mmio, wakes);
        if !mmio.driver_ok() {
            return false;
        }
    }
    for _ in 0..64 {
        let taken = {
            let mut mmio = mmio.lock().expect("device lock");
            endpoint.take_tx(&mut mmio, &mut ServiceHooks(service), now, wakes).unwrap_or(0)
        };
        endpoint.handle_timeout(now, wakes);
        // The service learns which sockets changed through their wakers,
        // so they must fire before it looks.
        wakes.wake_all();
        service.service(endpoint.stack(), now);
        let mut mmio = mmio.lock().expect("device lock");
        let mut datagrams = 0;
        service.drain_guest_datagrams(&mut |header: &RawHeader, payload: &[u8]| {
            endpoint.give_datagram(&mut mmio, header, payload)?;
            datagrams += 1;
            Ok(())
        });
        let given = endpoint.give_rx(&mut mmio, now, wakes);
        let raised = mmio.interrupts_raised();
        drop(mmio);
        if let Some(irq) = irq {
            irq.deliver(raised);
        }
        if taken == 0 && given == 0 && datagrams == 0 {
            break;
        }
    }
    endpoint.tx_pending()
}

/// Interrupts the device loop delivers by running the guest's handler.
struct InlineInterrupts {
    handler: InterruptHandler,
    /// Raised when the handler cannot run (the guest lock is taken).
    fallback: EventFd,
    /// The register file's interrupt count when last delivered.
    seen: u64,
}

impl InlineInterrupts {
    fn deliver(&mut self, raised: u64) {
        if raised == self.seen {
            return;
        }
        self.seen = raised;
        if !(self.handler)() {
            let _ = self.fallback.write(1);
        }
    }
}

fn fd_of(fd: &EventFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

fn drain_eventfd(fd: &EventFd) {
    // Non-blocking: a racing reader may have emptied it already.
    let _ = fd.read();
}

/// What the guest thread shares with the application.
#[derive(Debug)]
pub struct GuestState {
    pub stack: Stack,
    pub driver: InProcessDriver,
}

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
        true
    }

    /// The guest thread's loop.
    fn run(&self, mut waiter: crate::inprocess::EventWaiter) {
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
    pub fn spawn(driver: InProcessDriver, events: &DeviceEvents, clock: Clock) -> io::Result<Self> {
        let stack = Stack::new(driver.stack_config());
        let shared = Arc::new(GuestShared {
            state: Mutex::new(GuestState { stack, driver }),
            kick: EventFd::new(EFD_NONBLOCK)?,
            planned: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            clock,
        });
        let waiter = crate::inprocess::EventWaiter::new(&[events.irq(), &shared.kick])?;
        let handle = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("pier-guest".into())
                .spawn(move || shared.run(waiter))?
        };
        Ok(Self { shared, handle: Mutex::new(Some(handle)) })
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
        let now = self.now();
        WAKES.with_borrow_mut(|wakes| {
            let mut state = self.lock();
            let result = f(&mut state.stack, now);
            self.shared.poll_for_caller(&mut state, now, wakes);
            drop(state);
            wakes.wake_all();
            result
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, GuestState> {
        self.shared.lock()
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
    /// `step` gets the locked stack, the time and a waker to park on the
    /// sockets it waits for; between steps the thread sleeps until that
    /// waker fires (or 50 ms pass, so `stop` is seen).
    pub fn serve(&self, stop: &AtomicBool, mut step: impl FnMut(&mut Stack, Instant, &Waker)) {
        let signal = Arc::new(Signal::default());
        let waker = Waker::from(signal.clone());
        while !stop.load(Ordering::Acquire) {
            self.with(|stack, now| step(stack, now, &waker));
            signal.wait(Duration::from_millis(50));
        }
    }
}

impl GuestThread {
    /// Ends the guest thread (timers and tx retries stop) and waits for it;
    /// calls through [`Self::with`] still poll the driver. For a guest
    /// whose device is gone, where retrying would only burn CPU.
    pub fn halt(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.kick.write(1);
        if let Some(h) = self.handle.lock().expect("guest handle").take() {
            let _ = h.join();
        }
    }
}

impl Drop for GuestThread {
    fn drop(&mut self) {
        self.halt();
    }
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

/// The Unix-socket bridge as a service of the device loop.
#[derive(Debug)]
pub struct BridgeService {
    config: crate::bridge::BridgeConfig,
    bridge: Option<crate::bridge::Bridge>,
}

impl BridgeService {
    pub fn new(config: crate::bridge::BridgeConfig) -> Self {
        Self { config, bridge: None }
    }
}

impl HostService for BridgeService {
    fn register(&mut self, stack: &mut Stack, registry: &mio::Registry) -> io::Result<()> {
        let bridge =
            crate::bridge::Bridge::new(self.config.clone(), stack, registry, FIRST_SERVICE_TOKEN)?;
        self.bridge = Some(bridge);
        Ok(())
    }
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        if let Some(b) = &mut self.bridge {
            b.handle_event(stack, event, now);
        }
    }
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        if let Some(b) = &mut self.bridge {
            b.service(stack, now);
        }
    }
    fn poll_at(&self) -> Option<Instant> {
        self.bridge.as_ref().and_then(|b| b.poll_at())
    }
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        match &mut self.bridge {
            Some(b) => RelayHooks::guest_datagram(b, header, payload),
            None => false,
        }
    }
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: &[u8]) -> usize {
        match &mut self.bridge {
            Some(b) => b.guest_stream_bytes(socket, data),
            None => 0,
        }
    }
    fn drain_guest_datagrams(&mut self, sink: &mut dyn TxSink) {
        if let Some(b) = &mut self.bridge {
            b.drain_guest_datagrams(|h: &RawHeader, p: &[u8]| sink.transmit(h, p));
        }
    }
}
