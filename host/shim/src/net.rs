//! What every vsock resource stands on: the shared endpoint, one stack
//! socket per resource, the per-component socket quota, the wait-for-
//! readiness future, and the mapping from stack errors to WIT error codes.
//!
//! The guest stack (pier-driver + pier-stack over the in-process device)
//! lives behind a mutex, shared by every component of the shim. A resource
//! method locks it, makes one or a few non-blocking stack calls and
//! unlocks; calls that may produce packets go through
//! [`GuestThread::with`], which also polls the driver on the calling
//! thread so the packets leave at once. Pure queries only lock.
//!
//! Waiting never spins. [`Sock::wait`] checks readiness and registers the
//! task's waker under the same lock, so a wakeup between the check and the
//! registration cannot be lost; whoever polled the driver wakes the waker
//! after it has released the lock (pier-stack's deferred wake list). The condition a
//! future waits for is always one under which the matching call makes
//! progress or fails, so wasmtime-wasi's "10 empty wakeups" rule for
//! blocking stream calls is never tripped.

use std::future::{Future, poll_fn};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use pier_device::GuestThread;
use pier_device::Running;
use pier_stack::{Error, Instant, Interest, Readiness, SocketHandle, SocketType, Stack, WakeList};

use wasmtime_wasi::runtime::AbortOnDropJoinHandle;

use crate::grants::ComponentGrants;
use crate::network::ErrorCode;

/// The shim's vsock endpoint: the in-process chain (driver, guest stack,
/// device, Unix-socket bridge) that every component of a shim shares. Not
/// a transport in the virtio sense (that is the device's
/// `InProcessTransport`, underneath): it is the one CID the components
/// live on, so every socket and every stop goes through it.
pub(crate) struct GuestEndpoint {
    running: Running,
    /// The shim is stopping: waits end at once, so components get back to
    /// their code, where the epoch deadline stops them.
    stopping: AtomicBool,
    /// The endpoint was cut ([`Self::cut`]): nothing waits for connections
    /// to finish closing any more.
    was_cut: AtomicBool,
    /// Sends that outlived their resources (see [`Self::finish_in_background`]).
    background: Mutex<Vec<AbortOnDropJoinHandle<()>>>,
}

impl GuestEndpoint {
    pub(crate) fn new(running: Running) -> Self {
        Self {
            running,
            stopping: AtomicBool::new(false),
            was_cut: AtomicBool::new(false),
            background: Mutex::new(Vec::new()),
        }
    }

    /// Finishes a send whose resource is gone: a message the component
    /// handed over (the permit rule made it accepted) but that still waits
    /// for the peer's credit when the sender is dropped, or the component
    /// exits. Linux keeps such bytes in the socket after close(2) and sends
    /// them; so does the shim, on wasmtime-wasi's runtime. The task holds
    /// the socket, so the connection closes only after the message left.
    /// It ends when the message is sent or fails, or when the shim stops.
    pub(crate) fn finish_in_background(&self, task: impl Future<Output = ()> + Send + 'static) {
        let handle = wasmtime_wasi::runtime::spawn(task);
        let mut tasks = self.background.lock().expect("background sends");
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    /// Ends every wait of every component, now and from now on.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let mut wakes = self.with(|s, _| {
            let mut wakes = WakeList::new();
            s.wake_all(&mut wakes);
            wakes
        });
        wakes.wake_all();
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Ends the device loop at once, which drops the bridge and removes
    /// its socket files: connections still open are cut, the components'
    /// bytes their host programs have not read are dropped (the loop logs
    /// how many), and a [`Self::linger`] under way ends.
    pub(crate) fn cut(&self) {
        self.was_cut.store(true, Ordering::Release);
        if let Err(e) = self.running.device.make_stop_urgent() {
            tracing::warn!("making the device's stop urgent: {e}");
        }
        if let Err(e) = self.running.device.stop() {
            tracing::warn!("stopping the device loop: {e}");
        }
        // With the device gone, the guest thread's tx retries would spin.
        self.running.guest.stop();
    }

    /// Restarts the guest's driver under its stack
    /// (`GuestThread::restart_driver`).
    pub(crate) fn restart_driver(&self) -> anyhow::Result<()> {
        self.guest().restart_driver().map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Has the device send the driver a TRANSPORT_RESET
    /// (`DeviceThread::reset_transport`).
    pub(crate) fn reset_transport(&self) -> std::io::Result<()> {
        self.running.device.reset_transport()
    }

    /// The device's host-side counters (see `DeviceThread::stats`).
    pub(crate) fn device_stats(&self) -> Option<pier_device::DeviceStats> {
        self.running.device.stats()
    }

    /// The guest stack's and driver's counters.
    pub(crate) fn guest_stats(&self) -> pier_device::GuestStats {
        self.guest().stats()
    }

    fn guest(&self) -> &GuestThread {
        &self.running.guest
    }

    /// Runs `f` on the locked stack, then polls the driver so that what it
    /// queued leaves at once.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Stack, Instant) -> R) -> R {
        self.guest().with(f)
    }

    /// Runs a query on the locked stack; nothing is sent.
    pub(crate) fn query<R>(&self, f: impl FnOnce(&mut Stack) -> R) -> R {
        self.guest().query(f)
    }

    pub(crate) fn local_cid(&self) -> u32 {
        self.query(|s| s.local_cid())
    }

    /// Bytes of socket buffers the stack holds, over all components.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.query(|s| s.buffered_bytes())
    }

    /// Waits until the stack holds no socket at all, for the close timeout
    /// (plus a margin), or until the endpoint is cut, whichever comes
    /// first; returns how many sockets were still open.
    ///
    /// This is what lets bytes a component wrote just before it exited
    /// still reach their peer: closing a connection only queues its data
    /// and SHUTDOWN, and the socket goes once the peer answered with RST
    /// (or the close timer sent one). Runs only when the shim is done, so
    /// it polls instead of parking wakers.
    pub(crate) fn linger(&self) -> usize {
        let limit = if self.stopping() {
            STOPPING_LINGER
        } else {
            self.query(|s| s.config().close_timeout) + Duration::from_millis(500)
        };
        let deadline = std::time::Instant::now() + limit;
        loop {
            let open = self.query(|s| s.socket_count());
            if open == 0
                || std::time::Instant::now() >= deadline
                || self.was_cut.load(Ordering::Acquire)
            {
                return open;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long a stopping shim waits for connections to finish closing.
const STOPPING_LINGER: Duration = Duration::from_secs(1);

/// What one component instance may use: the endpoint, its grants and its
/// socket quota. Cloned into every resource that needs it.
#[derive(Clone)]
pub(crate) struct VsockCtx {
    pub(crate) net: Arc<GuestEndpoint>,
    pub(crate) grants: Arc<ComponentGrants>,
    pub(crate) quota: Arc<Quota>,
}

impl VsockCtx {
    /// Creates a stack socket charged to this component.
    pub(crate) fn socket(&self, ty: SocketType) -> Result<Arc<Sock>, ErrorCode> {
        let lease = self.quota.lease().ok_or(ErrorCode::NewSocketLimit)?;
        let h = self.net.with(|s, _| s.socket(ty)).map_err(|e| match e {
            Error::SocketTypeNotSupported | Error::NotSupported => ErrorCode::NotSupported,
            Error::SocketLimit => ErrorCode::NewSocketLimit,
            e => code(e),
        })?;
        Ok(Sock::new(self.net.clone(), h, lease))
    }
}

/// How many sockets one component may hold at once, and how it has used
/// them (for `--stats`).
pub(crate) struct Quota {
    used: AtomicUsize,
    limit: usize,
    leased: AtomicU64,
    refused: AtomicU64,
}

impl Quota {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            limit,
            leased: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// Takes one socket's share, or `None` at the limit. The socket counts
    /// as opened only once a [`Sock`] holds the lease: an accept that finds
    /// the backlog empty takes one and gives it back.
    pub(crate) fn lease(self: &Arc<Self>) -> Option<Lease> {
        let leased = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if !leased {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        leased.then(|| Lease(self.clone()))
    }

    /// Sockets held now.
    pub(crate) fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Sockets taken since the component started.
    pub(crate) fn leased(&self) -> u64 {
        self.leased.load(Ordering::Relaxed)
    }

    /// Sockets refused at the limit.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// One socket's share of its component's quota, returned when dropped.
pub(crate) struct Lease(Arc<Quota>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One stack socket, shared by a socket resource and its children
/// (streams, receivers, senders). Dropping the last reference closes it
/// the way close(2) does: queued data still goes out, then SHUTDOWN.
pub(crate) struct Sock {
    pub(crate) net: Arc<GuestEndpoint>,
    pub(crate) h: SocketHandle,
    /// This side shut down sending: a later EPIPE is ours, not the peer's.
    shut_send: AtomicBool,
    /// SO_LINGER 0: the last reference resets the connection instead of
    /// closing it.
    abort_on_close: AtomicBool,
    _lease: Lease,
}

impl Sock {
    fn new(net: Arc<GuestEndpoint>, h: SocketHandle, lease: Lease) -> Arc<Self> {
        lease.0.leased.fetch_add(1, Ordering::Relaxed);
        Arc::new(Self {
            net,
            h,
            shut_send: AtomicBool::new(false),
            abort_on_close: AtomicBool::new(false),
            _lease: lease,
        })
    }

    /// A socket the stack created (an accepted connection), charged to the
    /// component with a lease the caller already took.
    pub(crate) fn adopt(ctx: &VsockCtx, h: SocketHandle, lease: Lease) -> Arc<Self> {
        Self::new(ctx.net.clone(), h, lease)
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Stack, SocketHandle, Instant) -> R) -> R {
        self.net.with(|s, now| f(s, self.h, now))
    }

    pub(crate) fn query<R>(&self, f: impl FnOnce(&mut Stack, SocketHandle) -> R) -> R {
        self.net.query(|s| f(s, self.h))
    }

    /// Sends stream bytes, copied straight into the driver's tx buffers
    /// when they can leave at once (`GuestThread::send_in_place`).
    pub(crate) fn send_in_place(&self, data: &[u8]) -> pier_stack::Result<usize> {
        self.net.guest().send_in_place(self.h, data)
    }

    pub(crate) fn note_shutdown(&self, how: pier_stack::Shutdown) {
        if matches!(how, pier_stack::Shutdown::Write | pier_stack::Shutdown::Both) {
            self.shut_send.store(true, Ordering::Release);
        }
    }

    pub(crate) fn send_shut(&self) -> bool {
        self.shut_send.load(Ordering::Acquire)
    }

    /// Waits until `ready` holds. `ready` runs on the locked stack and may
    /// act (send a held message, say); when it returns `false` the task's
    /// waker is parked on the socket for `interests` under the same lock.
    pub(crate) async fn wait(
        &self,
        interests: &[Interest],
        mut ready: impl FnMut(&mut Stack, SocketHandle) -> bool + Send,
    ) {
        poll_fn(|cx| self.poll_wait(cx, interests, &mut ready)).await;
    }

    /// [`Self::wait`] as a poll, for the stream producers and consumers
    /// of `vsock:sockets@0.2.0`, which wasmtime polls rather than awaits.
    pub(crate) fn poll_wait(
        &self,
        cx: &mut Context<'_>,
        interests: &[Interest],
        ready: &mut impl FnMut(&mut Stack, SocketHandle) -> bool,
    ) -> Poll<()> {
        // Through `query`, so whatever `ready` queued (a held message) is
        // handed to the driver at once rather than at the next poll.
        self.net.query(|stack| {
            // Checked under the lock that `GuestEndpoint::stop` takes after
            // setting the flag, so no wait can park after its wake-up.
            if self.net.stopping() {
                return Poll::Ready(());
            }
            if ready(stack, self.h) {
                return Poll::Ready(());
            }
            for &interest in interests {
                if stack.register_waker(self.h, interest, cx.waker()).is_err() {
                    // The handle is gone: the next call reports it.
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
    }

    /// Retries `send` (a whole message or datagram) until it no longer
    /// says `WouldBlock`, waiting for write space in between; returns its
    /// outcome, or `None` if the wait ended without one (the shim stops).
    /// A message it queued is on its way when this returns.
    pub(crate) async fn send_when_ready(
        &self,
        mut send: impl FnMut(&mut Stack, SocketHandle) -> Result<(), Error> + Send,
    ) -> Option<Result<(), Error>> {
        let mut outcome = None;
        self.wait(&[Interest::Write], |s, h| match send(s, h) {
            Err(Error::WouldBlock) => false,
            result => {
                outcome = Some(result);
                true
            }
        })
        .await;
        if matches!(outcome, Some(Ok(()))) {
            // Queued inside the wait, under the lock: let it leave.
            self.with(|_, _, _| ());
        }
        outcome
    }

    /// Waits until a call that needs the flags in `any` would not block:
    /// the flags are set, or the call would fail or end at once (an error,
    /// EOF, a send after SHUT_WR). That is what a `wasi:io` pollable
    /// reports: an output stream's pollable is ready once the stream is
    /// closed, although Linux's poll, and so the stack's `readiness`, has
    /// no POLLOUT for a socket shut for sending (`Stack::unblocked`).
    pub(crate) async fn wait_for(&self, any: Readiness, interests: &[Interest]) {
        poll_fn(|cx| self.poll_wait_for(cx, any, interests)).await;
    }

    /// [`Self::wait_for`] as a poll.
    pub(crate) fn poll_wait_for(
        &self,
        cx: &mut Context<'_>,
        any: Readiness,
        interests: &[Interest],
    ) -> Poll<()> {
        self.poll_wait(cx, interests, &mut |s, h| {
            s.unblocked(h).map_or(true, |r| r.intersects(any | Readiness::ERROR))
        })
    }
}

impl Sock {
    /// Makes the last reference's close abortive (SO_LINGER 0), or orderly
    /// again.
    pub(crate) fn set_abort_on_close(&self, abort: bool) {
        self.abort_on_close.store(abort, Ordering::Release);
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let h = self.h;
        let abort = self.abort_on_close.load(Ordering::Acquire);
        self.net.with(|s, now| {
            let _ = if abort { s.abort(h, now) } else { s.close(h, now) };
        });
    }
}

/// The generic mapping from a stack error to a WIT error code. Calls whose
/// errors mean something more specific map those first.
pub(crate) fn code(e: Error) -> ErrorCode {
    match e {
        Error::WouldBlock => ErrorCode::WouldBlock,
        Error::Already => ErrorCode::ConcurrencyConflict,
        Error::IsConnected | Error::NotConnected | Error::BadHandle => ErrorCode::InvalidState,
        Error::InvalidArgument => ErrorCode::InvalidArgument,
        Error::AddressInUse => ErrorCode::AddressInUse,
        Error::AddressNotAvailable => ErrorCode::AddressNotBindable,
        Error::PermissionDenied => ErrorCode::AccessDenied,
        Error::ConnectionReset | Error::BrokenPipe => ErrorCode::ConnectionReset,
        Error::TimedOut => ErrorCode::Timeout,
        Error::MessageTooLarge => ErrorCode::MessageTooLarge,
        Error::NotSupported | Error::SocketTypeNotSupported => ErrorCode::NotSupported,
        Error::Protocol => ErrorCode::ConnectionRefused,
        Error::SocketLimit => ErrorCode::NewSocketLimit,
        Error::Fault => ErrorCode::Unknown,
    }
}
