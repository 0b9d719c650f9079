//! A spawned task's handle, shared by both executors: pier-rt's own and,
//! for WASI 0.3, wit-bindgen's.

use alloc::rc::Rc;
use core::cell::{Cell, RefCell};
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

/// What a task and its handle share: the output, once there, and the
/// waker of whoever awaits the handle.
pub(super) struct JoinState<T> {
    output: RefCell<Option<T>>,
    joiner: Cell<Option<Waker>>,
}

impl<T> JoinState<T> {
    /// `future` as a task that stores its output for the handle.
    pub(super) fn task<F>(future: F) -> (impl Future<Output = ()> + 'static, JoinHandle<T>)
    where
        F: Future<Output = T> + 'static,
        T: 'static,
    {
        let state = Rc::new(JoinState { output: RefCell::new(None), joiner: Cell::new(None) });
        let theirs = state.clone();
        let task = async move {
            let output = future.await;
            *theirs.output.borrow_mut() = Some(output);
            if let Some(w) = theirs.joiner.take() {
                w.wake();
            }
        };
        (task, JoinHandle { state })
    }
}

/// A spawned task's output, as a future: awaiting it waits for the task
/// to finish. Dropping it lets the task run on, detached.
pub struct JoinHandle<T> {
    state: Rc<JoinState<T>>,
}

impl<T> JoinHandle<T> {
    /// Whether the task has finished.
    pub fn is_finished(&self) -> bool {
        self.state.output.borrow().is_some()
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle").field("finished", &self.is_finished()).finish()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    /// Panics if polled again after it returned the output.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.state.output.borrow_mut().take() {
            Some(output) => Poll::Ready(output),
            None => {
                self.state.joiner.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}
