//! The executor: a run queue of spawned tasks, polled one at a time on
//! the app's only thread, and [`block_on`], which drives them and the
//! app's main future until that future finishes.
//!
//! A waker is a task's slot number and nothing else: waking pushes the
//! number on the run queue (once, however often it is woken), so waking
//! never allocates and a waker needs no reference count. A slot may be
//! reused by a later task; a stale waker then costs that task one
//! spurious poll, which futures allow.
//!
//! When nothing is runnable, the executor hands over to the reactor,
//! which blocks the app (in `wasi:io/poll`, or halted until the device's
//! interrupt on bare metal) until a socket some task waits on is ready.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

pub use super::join::JoinHandle;
use super::join::JoinState;
use super::local::local;
use super::{budget, reactor};

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// The slot number of `block_on`'s own future, which lives on its stack
/// rather than in a slot.
const MAIN: usize = usize::MAX;

#[derive(Default)]
struct Tasks {
    /// Spawned tasks; `None` while a task is being polled, or when the
    /// slot is free (then it is also in `free`).
    slots: Vec<Option<Task>>,
    free: Vec<usize>,
}

struct Queue {
    runnable: VecDeque<usize>,
    /// Per slot: already in `runnable`, so a second wake adds nothing.
    queued: Vec<bool>,
    main_woken: bool,
}

local! { static TASKS: Option<Tasks> = None; }
local! {
    static QUEUE: Queue = Queue { runnable: VecDeque::new(), queued: Vec::new(), main_woken: false };
}

fn wake_slot(slot: usize) {
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        if slot == MAIN {
            q.main_woken = true;
        } else if let Some(queued) = q.queued.get_mut(slot)
            && !*queued
        {
            *queued = true;
            q.runnable.push_back(slot);
        }
    })
}

static VTABLE: RawWakerVTable = RawWakerVTable::new(
    |data| RawWaker::new(data, &VTABLE),
    |data| wake_slot(data as usize),
    |data| wake_slot(data as usize),
    |_| {},
);

fn waker(slot: usize) -> Waker {
    // SAFETY: the vtable's functions only read the pointer as a number;
    // cloning and dropping own nothing.
    unsafe { Waker::from_raw(RawWaker::new(slot as *const (), &VTABLE)) }
}

/// Starts `future` as a task of its own and returns a handle to its
/// output. The task runs when [`block_on`] drives the executor, whether or
/// not the handle is awaited; dropping the handle detaches it.
///
/// Tasks run on the app's one thread, so they need not be `Send`.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
{
    let (task, handle) = JoinState::task(future);
    let task: Task = Box::pin(task);
    let slot = TASKS.with(|t| {
        let mut tasks = t.borrow_mut();
        let tasks = tasks.get_or_insert_with(Tasks::default);
        match tasks.free.pop() {
            Some(slot) => {
                tasks.slots[slot] = Some(task);
                slot
            }
            None => {
                tasks.slots.push(Some(task));
                tasks.slots.len() - 1
            }
        }
    });
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        if q.queued.len() <= slot {
            q.queued.resize(slot + 1, false);
        }
    });
    wake_slot(slot);
    handle
}

/// Runs `future` to completion on this thread, running every spawned task
/// meanwhile, and returns its output. This is the async app's `main`
/// loop; [`main!`](crate::main)`(async f)` calls it for the app.
///
/// Tasks still running when `future` finishes stay in the executor: a
/// later `block_on` runs them on.
///
/// # Panics
///
/// When every task, `future` included, waits and none waits on a socket
/// (a `JoinHandle` of a task that waits on the first one, say): nothing
/// could ever wake them. Also when called from inside a task.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = core::pin::pin!(future);
    let main_waker = waker(MAIN);
    let mut main_cx = Context::from_waker(&main_waker);
    QUEUE.with(|q| q.borrow_mut().main_woken = true);
    loop {
        if QUEUE.with(|q| core::mem::take(&mut q.borrow_mut().main_woken)) {
            budget::refill();
            if let Poll::Ready(output) = future.as_mut().poll(&mut main_cx) {
                return output;
            }
        }
        // Only the tasks queued now: a task that wakes itself runs again
        // after the reactor has had a look.
        let batch = QUEUE.with(|q| q.borrow().runnable.len());
        for _ in 0..batch {
            let Some(slot) = QUEUE.with(|q| {
                let mut q = q.borrow_mut();
                let slot = q.runnable.pop_front()?;
                q.queued[slot] = false;
                Some(slot)
            }) else {
                break;
            };
            run(slot);
        }
        let busy = QUEUE.with(|q| {
            let q = q.borrow();
            q.main_woken || !q.runnable.is_empty()
        });
        if busy {
            // Something can run now: only look at the sockets.
            reactor::turn(true);
        } else if !reactor::turn(false) {
            panic!("pier-rt: every task waits, and none on a socket: nothing can wake them");
        }
    }
}

/// Polls the task in `slot` once, freeing the slot when it finishes.
fn run(slot: usize) {
    let Some(mut task) =
        TASKS.with(|t| t.borrow_mut().as_mut().and_then(|tasks| tasks.slots.get_mut(slot)?.take()))
    else {
        return; // a stale wake of a finished task
    };
    let waker = waker(slot);
    budget::refill();
    // Polled with no borrow held, so the task may spawn.
    let done = task.as_mut().poll(&mut Context::from_waker(&waker)).is_ready();
    let finished = TASKS.with(|t| {
        let mut tasks = t.borrow_mut();
        let tasks = tasks.as_mut().expect("the executor lost its tasks");
        if done {
            tasks.free.push(slot);
            Some(task)
        } else {
            tasks.slots[slot] = Some(task);
            None
        }
    });
    // Dropped after the borrow ends: dropping a task drops its sockets
    // and whatever else it owns, which may spawn or wake.
    drop(finished);
}
