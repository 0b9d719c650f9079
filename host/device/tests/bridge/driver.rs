//! Test support: the loop that drives a bridge, shaped like the device's.
//!
//! One thread owns everything a device loop owns: the host stack (here
//! stack `b` of a [`Loopback`], at CID 2), the guest side (stack `a`, CID 3,
//! standing in for the guest behind the virtqueues), the [`Bridge`] and a
//! [`mio::Poll`]. Each turn it
//!
//! 1. runs jobs the test sent (closures with access to both stacks),
//! 2. maps wall time to the stacks' clock and fires due timers,
//! 3. lets the guest apps run,
//! 4. moves datagrams between the guest and the bridge (they bypass the
//!    host stack, as the device routes them),
//! 5. moves packets, calls [`Bridge::service`], moves packets again,
//! 6. sleeps in `epoll` until a socket is ready, a deadline of either stack
//!    or the bridge passes, or, if anything moved, not at all; then hands
//!    every event to [`Bridge::handle_event`].
//!
//! The virtio integration does the same with the device's queues in place
//! of the loopback: steps 4 and 5 become "take the tx queue into the host
//! stack (datagrams to the bridge), service, dispatch into the rx queue".
//!
//! Host programs are the test itself, in the test's thread, with ordinary
//! blocking Unix sockets (always with timeouts, so a dead loop fails the
//! test instead of hanging it).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::{Events, Poll, Token};
use pier_device::GuestCid;
use pier_device::bridge::{Bridge, BridgeConfig, BridgeStats};
use pier_stack::phy::{Loopback, Middleware, Side, Verdict};
use pier_stack::wire::{self, HEADER_LEN, RawHeader, SocketType};
use pier_stack::{Config, Instant, Stack, WakeList};
use tempfile::TempDir;

const WAKE_TOKEN: Token = Token(0);
const FIRST_TOKEN: usize = 1;
/// Longest sleep when nothing is due: guest apps are polled, not woken.
const IDLE_POLL: Duration = Duration::from_millis(2);
/// How long any blocking step of a test may take before it fails.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// What a guest app reports after one poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppStatus {
    /// It made progress: poll again without sleeping.
    Busy,
    /// Nothing to do until packets arrive.
    Idle,
    /// Finished: drop it.
    Done,
}

/// A program on the guest's stack, polled every turn of the loop.
pub trait GuestApp: Send {
    /// Runs once, before `spawn` returns (bind, listen, connect).
    fn start(&mut self, _guest: &mut Stack, _now: Instant) {}
    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus;
}

/// A guest app from a closure.
pub struct FnApp<F>(pub F);

impl<F: FnMut(&mut Stack, Instant) -> AppStatus + Send> GuestApp for FnApp<F> {
    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus {
        (self.0)(guest, now)
    }
}

/// Everything a job sent to the loop may touch.
pub struct World<'a> {
    pub guest: &'a mut Stack,
    pub host: &'a mut Stack,
    pub bridge: &'a mut Bridge,
    pub now: Instant,
    /// Most bytes the host stack's buffers held at any turn so far.
    pub max_host_buffered: usize,
}

impl World<'_> {
    /// Delivers a packet to the host stack as if the guest had sent it.
    pub fn inject_from_guest(&mut self, header: &RawHeader, payload: &[u8]) {
        let mut wakes = WakeList::new();
        let mut batch = self.host.rx_batch(self.now);
        batch.receive_parts(header, payload);
        batch.finish(&mut wakes);
        wakes.wake_all();
    }
}

type Job = Box<dyn FnOnce(&mut World<'_>) + Send>;

enum Command {
    Job(Job),
    App(Box<dyn GuestApp>),
    Stop,
}

/// Settings for one harness.
pub struct Setup {
    pub bridge: Box<dyn FnOnce(&mut BridgeConfig) + Send>,
    pub guest: Config,
    pub host: Config,
}

impl Default for Setup {
    fn default() -> Self {
        Setup { bridge: Box::new(|_| {}), guest: Config::new(3), host: Config::new(2) }
    }
}

/// A running loop with a bridge at `<dir>/v.sock`.
pub struct Harness {
    _dir: TempDir,
    pub uds: PathBuf,
    commands: Sender<Command>,
    waker: Arc<mio::Waker>,
    blackhole: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Harness {
    pub fn start() -> Self {
        Self::with_setup(Setup::default())
    }

    pub fn with_bridge(configure: impl FnOnce(&mut BridgeConfig) + Send + 'static) -> Self {
        Self::with_setup(Setup { bridge: Box::new(configure), ..Setup::default() })
    }

    pub fn with_setup(setup: Setup) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let uds = dir.path().join("v.sock");
        let poll = Poll::new().expect("epoll");
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE_TOKEN).expect("waker"));
        let blackhole = Arc::new(AtomicBool::new(false));
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let uds = uds.clone();
            let blackhole = blackhole.clone();
            std::thread::Builder::new()
                .name("bridge-loop".into())
                .spawn(move || run_loop(poll, uds, setup, blackhole, inbox, ready_tx))
                .expect("spawn loop")
        };
        ready_rx.recv_timeout(TIMEOUT).expect("the loop did not start");
        Harness { _dir: dir, uds, commands, waker, blackhole, thread: Some(thread) }
    }

    fn send(&self, command: Command) {
        if self.commands.send(command).is_err() {
            panic!("the bridge loop thread died (see its panic above)");
        }
        let _ = self.waker.wake();
    }

    /// Runs `job` on the loop thread and returns its result.
    pub fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut World<'_>) -> R + Send + 'static,
    ) -> R {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Job(Box::new(move |world| {
            let _ = tx.send(job(world));
        })));
        rx.recv_timeout(TIMEOUT).expect("the bridge loop did not answer (it died or hangs)")
    }

    /// Starts a guest app; returns once its `start` ran.
    pub fn spawn(&self, app: impl GuestApp + 'static) {
        let (tx, rx) = mpsc::channel();
        let mut app: Box<dyn GuestApp> = Box::new(app);
        self.send(Command::Job(Box::new(move |world| {
            app.start(world.guest, world.now);
            let _ = tx.send(app);
        })));
        let app = rx.recv_timeout(TIMEOUT).expect("the bridge loop did not start the app");
        self.send(Command::App(app));
    }

    pub fn stats(&self) -> BridgeStats {
        self.run(|w| w.bridge.stats())
    }

    /// Waits until `check` holds on the loop thread; panics with `what` after `timeout`.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&mut World<'_>) -> bool + Send + Sync + 'static,
    ) {
        let check = Arc::new(check);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let c = check.clone();
            if self.run(move |w| c(w)) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the bridge's counters satisfy `check`.
    pub fn wait_stats(
        &self,
        what: &str,
        check: impl Fn(&BridgeStats) -> bool + Send + Sync + 'static,
    ) -> BridgeStats {
        self.wait_for(what, TIMEOUT, move |w| check(&w.bridge.stats()));
        self.stats()
    }

    /// Like [`Harness::wait_stats`], with a tighter deadline.
    pub fn wait_for_stats_within(
        &self,
        within: Duration,
        check: impl Fn(&BridgeStats) -> bool + Send + Sync + 'static,
    ) -> BridgeStats {
        self.wait_for("the bridge's counters", within, move |w| check(&w.bridge.stats()));
        self.stats()
    }

    /// Drops every packet between guest and host while set: a guest that
    /// never answers.
    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Ordering::SeqCst);
    }

    pub fn uds(&self) -> &Path {
        &self.uds
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
            && !std::thread::panicking()
        {
            panic!("the bridge loop thread panicked");
        }
    }
}

/// Sends the guest's datagrams to the bridge instead of the host stack, and
/// drops everything while the blackhole is on.
struct Router {
    datagrams: Rc<RefCell<VecDeque<Vec<u8>>>>,
    blackhole: Arc<AtomicBool>,
}

impl Middleware for Router {
    fn on_frame(&mut self, from: Side, _now: Instant, frame: &mut Vec<u8>) -> Verdict {
        if self.blackhole.load(Ordering::SeqCst) {
            return Verdict::Drop;
        }
        let is_datagram = frame.len() >= HEADER_LEN
            && u16::from_le_bytes([frame[28], frame[29]]) == SocketType::Datagram as u16;
        if from == Side::A && is_datagram {
            self.datagrams.borrow_mut().push_back(std::mem::take(frame));
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

fn run_loop(
    mut poll: Poll,
    uds: PathBuf,
    setup: Setup,
    blackhole: Arc<AtomicBool>,
    inbox: Receiver<Command>,
    ready: Sender<()>,
) {
    let mut lb = Loopback::new(setup.guest, setup.host);
    let datagrams = Rc::new(RefCell::new(VecDeque::new()));
    lb.add_middleware(Router { datagrams: datagrams.clone(), blackhole });
    let mut config = BridgeConfig::new(&uds, GuestCid::DEFAULT);
    (setup.bridge)(&mut config);
    let mut bridge =
        Bridge::new(config, &mut lb.b, poll.registry(), FIRST_TOKEN).expect("Bridge::new");
    let _ = ready.send(());

    let start = std::time::Instant::now();
    let clock = || Instant::from_micros(start.elapsed().as_micros() as u64);
    let mut apps: Vec<Box<dyn GuestApp>> = Vec::new();
    let mut events = Events::with_capacity(256);
    let mut wakes = WakeList::new();
    let mut max_host_buffered = 0;
    loop {
        // 1. jobs from the test
        loop {
            match inbox.try_recv() {
                Ok(Command::Job(job)) => {
                    let now = lb.now();
                    let (guest, host) = (&mut lb.a, &mut lb.b);
                    let mut world =
                        World { guest, host, bridge: &mut bridge, now, max_host_buffered };
                    job(&mut world);
                }
                Ok(Command::App(app)) => apps.push(app),
                Ok(Command::Stop) | Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => break,
            }
        }
        // 2. time: fire both stacks' due timers, move what they produced
        let now = clock();
        let mut busy = lb.advance(now.saturating_duration_since(lb.now())) > 0;
        let now = lb.now();
        // 3. the guest's programs
        apps.retain_mut(|app| match app.poll(&mut lb.a, now) {
            AppStatus::Busy => {
                busy = true;
                true
            }
            AppStatus::Idle => true,
            AppStatus::Done => false,
        });
        // 4. datagrams bypass the host stack, both ways
        for frame in datagrams.borrow_mut().drain(..) {
            let (header, payload) = wire::decode(&frame).expect("the guest stack sent a bad frame");
            bridge.forward_guest_datagram(&header, payload);
        }
        {
            let mut batch = lb.a.rx_batch(now);
            let moved = bridge.drain_host_datagrams(|header, payload| {
                batch.receive_parts(header, payload);
                Ok(())
            });
            busy |= moved > 0;
            batch.finish(&mut wakes);
            wakes.wake_all();
        }
        // 5. packets, then the bridge, then the bridge's packets
        busy |= lb.run() > 0;
        bridge.service(&mut lb.b, now);
        busy |= lb.run() > 0;
        max_host_buffered = max_host_buffered.max(lb.b.buffered_bytes());
        // 6. sleep until a socket is ready or something falls due
        let mut timeout = if busy { Duration::ZERO } else { IDLE_POLL };
        let deadline =
            [lb.a.poll_at(), lb.b.poll_at(), bridge.poll_at()].into_iter().flatten().min();
        if let Some(deadline) = deadline {
            timeout = timeout.min(deadline.saturating_duration_since(clock()));
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout))
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            panic!("epoll: {e}");
        }
        let now = clock().max(lb.now());
        for event in events.iter() {
            if event.token() != WAKE_TOKEN {
                bridge.handle_event(&mut lb.b, event, now);
            }
        }
        bridge.events_handled();
    }
}
