//! The vrings vhost-user-backend keeps, tied to pier's device model.
//!
//! vhost-user-backend turns the frontend's messages into calls on its
//! vrings: SET_VRING_NUM, _ADDR and _BASE configure one, SET_VRING_KICK
//! readies it, SET_VRING_ENABLE enables it, GET_VRING_BASE stops it and
//! reads where its rings stopped. pier's device model has queues of its
//! own ([`pier_device::DeviceQueue`], inside [`VsockDevice`]), served by the
//! device loop. [`PierVring`] wraps the crate's [`VringRwLock`] and, after
//! every call that can start or stop the vring, brings the device's queue
//! to the same state, the way a register write does on virtio-mmio:
//!
//! - ready, enabled and with a kick eventfd: the device's queue starts at
//!   the vring's rings and indices ([`VsockDevice::start_queue`]);
//! - anything less: the device's queue stops, and its indices go back into
//!   the vring, so that GET_VRING_BASE answers with where the device
//!   really stopped ([`VsockDevice::stop_queue`]);
//! - a call eventfd becomes the queue's own interrupt line ([`CallLines`],
//!   the device's [`Notify`] on this bus: virtio-mmio's `InterruptStatus`
//!   has no counterpart here).
//!
//! vhost-user-backend makes vrings itself (`VringT::new`), with no way to
//! pass them anything, so they find their device through [`bind_vrings`]:
//! the vrings made while its guard lives belong to that device, numbered
//! in the order they are made (which is the queue order).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::{Arc, Mutex};

use pier_device::device::NUM_QUEUES;
use pier_device::{DeviceEvents, InlineKick, Notify, QueueRings, SharedDevice, VsockDevice};
use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as QueueError, QueueT};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Guest memory as vhost-user-backend shares it with its backends.
pub type GuestMemory = GuestMemoryAtomic<GuestMemoryMmap>;

/// The device as vhost-user shares it: the device loop and the
/// vhost-user worker each lock it.
pub type SharedVsock = Mutex<VsockDevice<GuestMemory>>;

/// The queues' call eventfds, which the frontend hands over
/// (SET_VRING_CALL) and may replace at any time.
#[derive(Debug, Default)]
pub struct CallLines([Mutex<Option<EventFd>>; NUM_QUEUES]);

impl CallLines {
    /// `queue`'s used-buffer notifications go to `line` from now on, or
    /// nowhere with `None`.
    pub fn set(&self, queue: usize, line: Option<EventFd>) {
        if let Some(slot) = self.0.get(queue) {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = line;
        }
    }
}

/// The device's notifications as vhost-user delivers them: a write to the
/// queue's call eventfd. A config change has no way to the guest here (it
/// would need the backend request channel, which pier does not negotiate),
/// so it is dropped.
#[derive(Debug, Clone, Default)]
pub struct CallNotify(pub Arc<CallLines>);

impl Notify for CallNotify {
    fn used_buffer(&mut self, queue: usize) {
        if let Some(slot) = self.0.0.get(queue)
            && let Some(line) = &*slot.lock().unwrap_or_else(|p| p.into_inner())
        {
            // A failed write only loses a wakeup the guest also recovers
            // from by polling.
            let _ = line.write(1);
        }
    }

    fn config_changed(&mut self) {}
}

/// The device a set of vrings drives.
#[derive(Debug, Clone)]
pub struct VringLink {
    /// The device model's queues and lifecycle state.
    pub device: Arc<SharedVsock>,
    /// Where the device's notifications go.
    pub calls: Arc<CallLines>,
    /// The device loop's eventfds: a queue that starts or stops wakes it.
    pub events: Arc<DeviceEvents>,
    /// The device loop's round, run on the thread that hears a kick when
    /// the loop sleeps (see [`crate::VsockBackend`]'s `handle_event`).
    pub kick: InlineKick,
}

thread_local! {
    /// The device that vrings made on this thread now belong to, and the
    /// index of the next one.
    static BINDING: RefCell<Option<(VringLink, usize)>> = const { RefCell::new(None) };
}

/// While the returned guard lives, vrings made on this thread are tied to
/// `link`'s device, the first as queue 0.
pub fn bind_vrings(link: VringLink) -> BindingGuard {
    BINDING.with(|b| *b.borrow_mut() = Some((link, 0)));
    BindingGuard(())
}

/// Ends a [`bind_vrings`] binding when dropped.
#[derive(Debug)]
pub struct BindingGuard(());

impl Drop for BindingGuard {
    fn drop(&mut self) {
        BINDING.with(|b| *b.borrow_mut() = None);
    }
}

/// A vhost-user-backend vring whose state changes follow through to pier's
/// device model; see the [module documentation](self).
#[derive(Clone)]
pub struct PierVring {
    inner: VringRwLock<GuestMemory>,
    /// The device and the queue index; `None` for a vring made outside a
    /// binding, which then only keeps vhost-user-backend's own state.
    link: Option<(VringLink, usize)>,
}

impl std::fmt::Debug for PierVring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PierVring").field("queue", &self.link.as_ref().map(|l| l.1)).finish()
    }
}

impl PierVring {
    /// Brings the device's queue to the vring's state.
    fn follow(&self) {
        let Some((link, index)) = &self.link else {
            return;
        };
        let (live, rings) = {
            let state = self.inner.get_ref();
            let q = state.get_queue();
            let live = q.ready() && state.is_enabled() && state.get_kick().is_some();
            let rings = QueueRings {
                size: q.size(),
                desc: q.desc_table(),
                avail: q.avail_ring(),
                used: q.used_ring(),
                next_avail: q.next_avail(),
                next_used: q.next_used(),
            };
            (live, rings)
        };
        let mut device = link.device.lock_device();
        let running = device.queue(*index).is_some_and(|q| q.is_ready());
        if live && !running {
            if device.start_queue(*index, rings) {
                tracing::debug!(queue = index, ?rings, "vhost-user: queue started");
            } else {
                tracing::warn!(
                    queue = index,
                    ?rings,
                    "vhost-user: the frontend's rings are not in guest memory: queue left stopped"
                );
            }
        } else if !live && let Some(position) = device.stop_queue(*index) {
            tracing::debug!(queue = index, ?position, "vhost-user: queue stopped");
            drop(device);
            self.inner.set_queue_next_avail(position.next_avail);
            self.inner.set_queue_next_used(position.next_used);
        } else {
            return;
        }
        // The device loop follows the driver's lifecycle at its next round.
        let _ = link.events.control().write(1);
    }
}

impl<'a> VringStateGuard<'a, GuestMemory> for PierVring {
    type G = <VringRwLock<GuestMemory> as VringStateGuard<'a, GuestMemory>>::G;
}

impl<'a> VringStateMutGuard<'a, GuestMemory> for PierVring {
    type G = <VringRwLock<GuestMemory> as VringStateMutGuard<'a, GuestMemory>>::G;
}

impl VringT<GuestMemory> for PierVring {
    fn new(mem: GuestMemory, max_queue_size: u16) -> Result<Self, QueueError> {
        let inner = VringRwLock::new(mem, max_queue_size)?;
        let link = BINDING.with(|b| {
            b.borrow_mut().as_mut().map(|(link, next)| {
                *next += 1;
                (link.clone(), *next - 1)
            })
        });
        Ok(Self { inner, link })
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, GuestMemory>>::G {
        self.inner.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, GuestMemory>>::G {
        self.inner.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), QueueError> {
        self.inner.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.inner.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, QueueError> {
        self.inner.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), QueueError> {
        self.inner.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, QueueError> {
        self.inner.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.inner.set_enabled(enabled);
        self.follow();
    }

    fn set_queue_info(&self, desc: u64, avail: u64, used: u64) -> Result<(), QueueError> {
        self.inner.set_queue_info(desc, avail, used)
    }

    fn queue_next_avail(&self) -> u16 {
        self.inner.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.inner.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.inner.set_queue_next_used(idx)
    }

    fn queue_used_idx(&self) -> Result<u16, QueueError> {
        self.inner.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.inner.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.inner.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        self.inner.set_queue_ready(ready);
        self.follow();
    }

    fn set_kick(&self, file: Option<File>) {
        self.inner.set_kick(file);
        self.follow();
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.inner.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        if let Some((link, index)) = &self.link {
            // The device writes the call eventfd from its own thread: it
            // gets a duplicate, so each side owns its descriptor.
            let line = file.as_ref().and_then(|f| f.try_clone().ok()).map(|f| {
                // SAFETY: `f` is a freshly duplicated eventfd descriptor
                // that nothing else owns.
                unsafe { EventFd::from_raw_fd(f.into_raw_fd()) }
            });
            link.calls.set(*index, line);
        }
        self.inner.set_call(file);
    }

    fn set_err(&self, file: Option<File>) {
        self.inner.set_err(file)
    }
}
