//! Operations in flight, and every way this platform waits for them.
//!
//! - [`Pending`]: one operation a socket keeps in flight (a read, an
//!   accept, a connect, a receive) and its result until a call takes it.
//!   Whoever waits for it polls it, so the component model wakes that
//!   waiter.
//! - [`Sending`]: a send in flight. Sends run in the [`background`] set
//!   instead, so they progress while the app waits on anything at all; the
//!   sender learns the outcome through a shared slot. A socket dropped
//!   with a send in flight leaves it there to finish, which is how a close
//!   still delivers what was written.
//! - [`block`] and [`try_now`]: the blocking and the non-blocking wait on
//!   a condition, both driving the background set.
//! - [`Wasi3Wait`]: the `Poller`'s wait, over any number of conditions and
//!   a `wasi:clocks@0.3.0` timer.
//! - The entries `pier_rt::main!` calls: [`run_main`], [`run_async_main`].

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::bindings::wasi::clocks::monotonic_clock;
use super::convert::nanos;
use crate::platform::contract::Wait;

std::thread_local! {
    /// Set while the app runs inside the `run@0.3.0` export.
    static IN_ASYNC_RUN: Cell<bool> = const { Cell::new(false) };
}

/// `Unsupported` unless the app runs inside `run@0.3.0`, whose task the
/// component model's async calls need.
pub(super) fn in_async_run() -> io::Result<()> {
    if IN_ASYNC_RUN.with(Cell::get) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "vsock: this app was built for WASI 0.3 (pier-rt's wasi-0-3 feature) and must run \
             through wasi:cli/run@0.3.0; this host called the WASI 0.2 run instead",
        ))
    }
}

/// An operation in flight, owning what it works on.
pub(super) type Op<T> = Pin<Box<dyn Future<Output = T>>>;

/// Something a wait can poll for readiness: ready once the operation it
/// stands for has finished (or there is none).
pub(crate) trait Ready {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()>;
}

/// One operation in flight on a socket, and its result until taken.
pub(super) struct Pending<T> {
    op: RefCell<Option<Op<T>>>,
    done: RefCell<Option<T>>,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self { op: RefCell::new(None), done: RefCell::new(None) }
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.done.borrow().is_some() {
            "done"
        } else if self.op.borrow().is_some() {
            "in flight"
        } else {
            "idle"
        };
        f.write_str(state)
    }
}

impl<T> Pending<T> {
    /// Nothing in flight and no result waiting.
    pub(super) fn is_idle(&self) -> bool {
        self.op.borrow().is_none() && self.done.borrow().is_none()
    }

    /// A result is waiting to be taken.
    pub(super) fn is_done(&self) -> bool {
        self.done.borrow().is_some()
    }

    /// Looks at the result without taking it.
    pub(super) fn with_done<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        f(self.done.borrow().as_ref())
    }

    /// Starts `op`; the caller checked [`is_idle`](Self::is_idle).
    pub(super) fn start(&self, op: impl Future<Output = T> + 'static) {
        *self.op.borrow_mut() = Some(Box::pin(op));
    }

    /// The result, once the operation finished (polled by a wait first).
    pub(super) fn take(&self) -> Option<T> {
        self.done.borrow_mut().take()
    }

    /// Forgets the operation, cancelling it if it is still in flight, and
    /// its result.
    pub(super) fn cancel(&self) {
        // Taken out before dropping: the drop runs wit-bindgen's cancel.
        let op = self.op.borrow_mut().take();
        drop(op);
        self.done.borrow_mut().take();
    }
}

impl<T> Ready for Pending<T> {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut op = self.op.borrow_mut();
        let Some(fut) = op.as_mut() else { return Poll::Ready(()) };
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => {
                *op = None;
                *self.done.borrow_mut() = Some(out);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What a send in flight and its sender share.
struct SendSlot<T> {
    busy: bool,
    done: Option<T>,
    waiter: Option<Waker>,
}

/// A send in flight in the [`background`] set, and its outcome.
pub(super) struct Sending<T> {
    slot: Rc<RefCell<SendSlot<T>>>,
}

impl<T> Default for Sending<T> {
    fn default() -> Self {
        Self { slot: Rc::new(RefCell::new(SendSlot { busy: false, done: None, waiter: None })) }
    }
}

impl<T> std::fmt::Debug for Sending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.slot.borrow().busy { "in flight" } else { "idle" })
    }
}

impl<T: 'static> Sending<T> {
    pub(super) fn is_busy(&self) -> bool {
        self.slot.borrow().busy
    }

    /// Starts `op` in the background set and gives it a first look, so
    /// that a host with room takes the bytes before this returns.
    pub(super) fn start(&self, op: impl Future<Output = T> + 'static) {
        self.slot.borrow_mut().busy = true;
        let slot = self.slot.clone();
        background::add(Box::pin(async move {
            let out = op.await;
            let waiter = {
                let mut s = slot.borrow_mut();
                s.busy = false;
                s.done = Some(out);
                s.waiter.take()
            };
            if let Some(w) = waiter {
                w.wake();
            }
        }));
        background::drive_now();
    }

    /// The outcome of the last send, once it finished.
    pub(super) fn take(&self) -> Option<T> {
        self.slot.borrow_mut().done.take()
    }
}

impl<T> Ready for Sending<T> {
    /// Ready when no send is in flight. The background set does the
    /// polling; this only leaves the waker to be woken.
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.slot.borrow_mut();
        if !s.busy {
            return Poll::Ready(());
        }
        match &mut s.waiter {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// The sends in flight: every wait of this platform polls them, so they
/// progress whatever the app waits for.
pub(super) mod background {
    use super::*;

    std::thread_local! {
        static OPS: RefCell<Vec<Op<()>>> = const { RefCell::new(Vec::new()) };
        /// Whether a drive is running: an op that finishes may drop a
        /// socket, whose drop may add an op.
        static DRIVING: Cell<bool> = const { Cell::new(false) };
    }

    std::thread_local! {
        /// The async entry's waker, when the app is async: it drives the
        /// set as a task of its own, so the set's operations must keep
        /// waking it rather than whoever looked at them last.
        static DRIVER: RefCell<Option<Waker>> = const { RefCell::new(None) };
    }

    pub(in super::super) fn add(op: Op<()>) {
        OPS.with(|ops| ops.borrow_mut().push(op));
        DRIVER.with(|d| {
            if let Some(w) = &*d.borrow() {
                w.wake_by_ref();
            }
        });
    }

    /// Makes `cx`'s task the set's driver.
    pub(in super::super) fn set_driver(cx: &Context<'_>) {
        DRIVER.with(|d| {
            let mut d = d.borrow_mut();
            match &*d {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *d = Some(cx.waker().clone()),
            }
        });
    }

    /// Polls the set once, outside any wait: with the driver's waker when
    /// there is one, so the driver is still woken when a send progresses.
    pub(in super::super) fn drive_now() {
        let driver = DRIVER.with(|d| d.borrow().clone());
        let waker = driver.as_ref().unwrap_or(Waker::noop());
        drive(&mut Context::from_waker(waker));
    }

    /// Polls every send in flight once, with `cx`'s waker.
    pub(in super::super) fn drive(cx: &mut Context<'_>) {
        if DRIVING.with(|d| d.replace(true)) {
            return;
        }
        let mut ops = OPS.with(|ops| std::mem::take(&mut *ops.borrow_mut()));
        ops.retain_mut(|op| op.as_mut().poll(cx).is_pending());
        // Sends added while these were polled go after them.
        OPS.with(|o| {
            let mut o = o.borrow_mut();
            ops.append(&mut o);
            *o = ops;
        });
        DRIVING.with(|d| d.set(false));
    }

    pub(in super::super) fn is_empty() -> bool {
        OPS.with(|ops| ops.borrow().is_empty())
    }
}

/// Waits until `ready` holds, driving the background sends meanwhile.
///
/// The wait is `wit_bindgen::block_on`, which returns only once every
/// operation polled inside it has finished, not just the one it waited
/// for. The operations still in flight when `ready` holds (the other
/// conditions of a `Poller`, the sends) are therefore handed back to the
/// enclosing task first: `rehome` polls them once more under that task,
/// which moves their registration there, and a later wait picks them up
/// (an event that arrives meanwhile stays with the operation).
pub(super) fn block(
    mut ready: impl FnMut(&mut Context<'_>) -> Poll<()>,
    mut rehome: impl FnMut(&mut Context<'_>),
) {
    let outer = task::current();
    wit_bindgen::block_on(poll_fn(|cx| {
        background::drive(cx);
        if ready(cx).is_pending() {
            return Poll::Pending;
        }
        task::within(outer, || {
            let mut cx = Context::from_waker(Waker::noop());
            background::drive(&mut cx);
            rehome(&mut cx);
        });
        Poll::Ready(())
    }));
    // Hand the sends back to the async driver, if any.
    background::drive_now();
}

/// The component-model task that operations register with when polled:
/// wit-bindgen's `wasip3_task_set`, the C ABI its executors and its
/// generated imports share.
mod task {
    use std::ffi::c_void;
    use std::ptr;

    unsafe extern "C" {
        /// Makes `task` the current task and returns the one before.
        fn wasip3_task_set(task: *mut c_void) -> *mut c_void;
    }

    /// The current task (null outside any).
    pub(super) fn current() -> *mut c_void {
        // SAFETY: reading and restoring the slot, as wit-bindgen does.
        unsafe {
            let task = wasip3_task_set(ptr::null_mut());
            wasip3_task_set(task);
            task
        }
    }

    /// Runs `f` with `task` current. `task` came from [`current`] in a
    /// frame that encloses this call, so it is still alive.
    pub(super) fn within(task: *mut c_void, f: impl FnOnce()) {
        if task.is_null() {
            return f();
        }
        // SAFETY: see above; the previous task is restored before return.
        unsafe {
            let inner = wasip3_task_set(task);
            f();
            wasip3_task_set(inner);
        }
    }
}

/// Looks once, without waiting: whether `ready` holds now.
pub(super) fn try_now(ready: impl FnOnce(&mut Context<'_>) -> Poll<()>) -> bool {
    background::drive_now();
    ready(&mut Context::from_waker(Waker::noop())).is_ready()
}

/// The one place a blocking call waits and a non-blocking one gives up.
pub(super) fn wait(nonblocking: bool, ready: &dyn Ready) -> io::Result<()> {
    if nonblocking {
        if try_now(|cx| ready.poll_ready(cx)) {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    } else {
        block(
            |cx| ready.poll_ready(cx),
            |cx| {
                let _ = ready.poll_ready(cx);
            },
        );
        Ok(())
    }
}

/// A timer on the 0.3 monotonic clock.
pub(super) fn timer(after: Duration) -> Op<()> {
    Box::pin(monotonic_clock::wait_for(nanos(after)))
}

/// A condition of a `Poller`, borrowing its socket.
#[derive(Clone, Copy)]
pub(crate) enum PollRef<'a> {
    /// Ready once this finished.
    Op(&'a dyn Ready),
    /// The socket holds what the next call needs already.
    Ready,
}

impl std::fmt::Debug for PollRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Op(r) => write!(f, "Op({:p})", *r as *const dyn Ready as *const ()),
            Self::Ready => f.write_str("Ready"),
        }
    }
}

/// A condition without its borrow. The `Poller` holds the borrow while
/// it waits; the async API only uses one at once, while its socket is
/// borrowed (`asynch::reactor`), so one is always live when used.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll(pub(crate) *const dyn Ready);

impl RawPoll {
    /// Polls the condition with `cx`'s waker.
    ///
    /// # Safety
    ///
    /// The socket the condition came from is alive and not moved.
    pub(crate) unsafe fn poll_ready(self, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: the caller's promise.
        unsafe { (*self.0).poll_ready(cx) }
    }
}

/// This platform's readiness: operations in flight.
#[derive(Debug)]
pub(crate) enum Wasi3Wait {}

impl Wait for Wasi3Wait {
    type PollRef<'a> = PollRef<'a>;
    type RawPoll = RawPoll;

    fn raw(ready: &PollRef<'_>) -> Option<RawPoll> {
        match *ready {
            // SAFETY: only the lifetime is erased; see `RawPoll`.
            PollRef::Op(r) => {
                Some(RawPoll(unsafe { std::mem::transmute::<&dyn Ready, &'static dyn Ready>(r) }))
            }
            PollRef::Ready => None,
        }
    }

    /// One component-model wait over every condition and, for a timeout,
    /// a timer.
    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<RawPoll>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        let mut timer = timeout.filter(|t| !t.is_zero()).map(timer);
        let look = |cx: &mut Context<'_>, ready: &mut Vec<usize>| {
            for i in 0..count {
                let hit = match condition(i) {
                    None => true,
                    // SAFETY: the `Poller` borrows every socket it waits on.
                    Some(raw) => unsafe { raw.poll_ready(cx) }.is_ready(),
                };
                if hit {
                    ready.push(i);
                }
            }
        };
        if timeout == Some(Duration::ZERO) {
            try_now(|cx| {
                look(cx, ready);
                Poll::Ready(())
            });
            return Ok(());
        }
        let mut found = Vec::new();
        block(
            |cx| {
                look(cx, &mut found);
                let timed_out = timer.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready());
                if found.is_empty() && !timed_out {
                    return Poll::Pending;
                }
                // Cancelled here, inside the wait it was registered with.
                timer = None;
                Poll::Ready(())
            },
            |cx| look(cx, &mut Vec::new()),
        );
        ready.extend(found);
        Ok(())
    }
}

/// How long what the app sent may take to leave after it returns: the
/// unikernel's bound too (`process::exit` there).
const DRAIN: Duration = Duration::from_secs(5);

/// Runs the background sends to the end, for at most [`DRAIN`], so that
/// what the app wrote before it returned still reaches its peers.
async fn drain() {
    if background::is_empty() {
        return;
    }
    let mut deadline = timer(DRAIN);
    poll_fn(|cx| {
        background::drive(cx);
        if background::is_empty() { Poll::Ready(()) } else { deadline.as_mut().poll(cx) }
    })
    .await
}

/// An exit code as `run@0.3.0`'s result: 0 is ok, 1 is err, and any other
/// code leaves through `exit-with-code`, as only it can say it.
fn outcome(code: i32) -> Result<(), ()> {
    match code {
        0 => Ok(()),
        1 => Err(()),
        code => crate::process::exit(code),
    }
}

/// `run@0.3.0` for `pier_rt::main!(main)`: runs the app's blocking `main`
/// inside the export's task; `main` gives its exit code (through
/// `process::Termination`).
pub async fn run_main(main: impl FnOnce() -> i32) -> Result<(), ()> {
    IN_ASYNC_RUN.with(|r| r.set(true));
    let code = main();
    drain().await;
    outcome(code)
}

/// `run@0.3.0` for `pier_rt::main!(async serve)`: awaits `serve` in the
/// export's task, driving the background sends beside it, so its spawned
/// tasks and its sends share the component model's one event loop.
pub async fn run_async_main<F: Future>(serve: F) -> Result<(), ()>
where
    F::Output: crate::process::Termination,
{
    IN_ASYNC_RUN.with(|r| r.set(true));
    let mut serve = std::pin::pin!(serve);
    let out = poll_fn(|cx| {
        background::set_driver(cx);
        background::drive(cx);
        serve.as_mut().poll(cx)
    })
    .await;
    let code = crate::process::Termination::report(out);
    drain().await;
    outcome(code)
}

/// std's `main` in an app built for WASI 0.3 with `main!(async ..)`: a host
/// that calls the WASI 0.2 `run` gets here, and hears why nothing runs.
pub fn wrong_world() -> std::process::ExitCode {
    eprintln!(
        "this app was built for WASI 0.3 (pier-rt's wasi-0-3 feature); run it where \
         wasi:cli/run@0.3.0 is called, as `pier run` does"
    );
    std::process::ExitCode::FAILURE
}

/// `asynch::block_on` in this build: `future` to completion in a
/// component-model wait, driving the background sends beside it.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut output = None;
    block(
        |cx| match future.as_mut().poll(cx) {
            Poll::Ready(out) => {
                output = Some(out);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        },
        |_| {},
    );
    output.expect("block_on returned before its future finished")
}
