//! The executor of an app built for WASI 0.3: wit-bindgen's, the one the
//! `run@0.3.0` export already runs in. [`spawn`] makes a task of the
//! export's component-model task (`wit_bindgen::spawn_local`), and a task
//! waits by polling its operation with its own waker, so the component
//! model wakes it; there is no run queue or reactor here. `main!(async
//! serve)` awaits `serve` in the export, so its tasks and its sends share
//! one event loop.

use core::future::Future;

pub use super::join::JoinHandle;
use super::join::JoinState;

/// Starts `future` as a task of its own and returns a handle to its
/// output. The task runs while the app's `main` runs, whether or not the
/// handle is awaited; dropping the handle detaches it.
///
/// Tasks run on the app's one thread, so they need not be `Send`.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
{
    let (task, handle) = JoinState::task(future);
    wit_bindgen::spawn_local(task);
    handle
}

/// Runs `future` to completion, blocking the app meanwhile, and returns
/// its output. Tasks spawned inside it run inside it, and it returns only
/// once they are done too (wit-bindgen's `block_on`). An async app needs
/// none: `main!(async serve)` awaits `serve` in the export.
pub fn block_on<F: Future>(future: F) -> F::Output {
    crate::platform::wasi3::wait::block_on(future)
}
