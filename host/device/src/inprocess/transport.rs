//! The bus half of running virtio-drivers inside an ordinary process: its
//! [`Transport`].
//!
//! Register accesses become calls on an [`MmioBus`] (normally the device's
//! [`MmioDevice`](crate::mmio::MmioDevice)); queue kicks become writes to
//! per-queue eventfds, like KVM's ioeventfd; device interrupts arrive on an
//! eventfd, like irqfd. So the device can run on its own thread and be
//! woken exactly as a VMM would wake it.
//!
//! The transport is exactly as strict as virtio-drivers' `MmioTransport`
//! where a driver could otherwise get away with something here and not on
//! a real bus: config space is read and written only in naturally aligned
//! pieces of at most 4 bytes (it asserts, as `MmioTransport` does), and
//! every register access is one 32-bit access.

use std::fmt;
use std::io;
use std::mem::{align_of, size_of};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pier_driver::{DriverError, VsockDriver};
use virtio_bindings::virtio_mmio as reg;
use virtio_drivers::transport::mmio::MmioError;
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{Error as VirtioError, PhysAddr};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::hal::InProcessHal;
use crate::device::CONFIG_SIZE;
use crate::device_loop::{DeviceEvents, InlineKick};
use crate::mmio::{CONFIG_OFFSET, MAGIC_VALUE, MMIO_VERSION, MmioBus, MmioDevice, MmioEvent};
use crate::ring_trace::RingTrace;

/// The register file as the in-process transport reaches it.
pub type SharedMmio = MmioDevice<Arc<GuestMemoryMmap>>;
/// pier-driver over the in-process transport.
pub type InProcessDriver = VsockDriver<InProcessHal, InProcessTransport<SharedMmio>>;

/// Blocks on a fixed set of eventfds, consuming the ones that fired.
#[derive(Debug)]
pub struct EventWaiter {
    epoll: Epoll,
    fds: Vec<EventFd>,
}

impl EventWaiter {
    /// Watches up to 64 eventfds; bit `i` of [`EventWaiter::wait`] stands
    /// for `fds[i]`.
    pub fn new(fds: &[&EventFd]) -> io::Result<Self> {
        if fds.len() > 64 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let epoll = Epoll::new()?;
        let mut owned = Vec::with_capacity(fds.len());
        for (i, fd) in fds.iter().enumerate() {
            let fd = fd.try_clone()?;
            epoll.ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
            owned.push(fd);
        }
        Ok(EventWaiter { epoll, fds: owned })
    }

    /// Waits until at least one fd fires or `timeout` passes (`None`:
    /// forever). Returns the mask of fds that fired, 0 on timeout.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<u64> {
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        let mut events = [EpollEvent::default(); 8];
        let n = match self.epoll.wait(ms, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        let mut mask = 0u64;
        for ev in &events[..n] {
            let i = ev.data();
            if let Some(fd) = usize::try_from(i).ok().and_then(|i| self.fds.get(i)) {
                // Non-blocking read resets the counter; WouldBlock means a
                // racing reader already consumed it.
                let _ = fd.read();
                mask |= 1 << i;
            }
        }
        Ok(mask)
    }
}

/// A virtio-drivers [`Transport`] whose registers are an [`MmioBus`] in
/// this process.
pub struct InProcessTransport<B: MmioBus> {
    bus: Arc<B>,
    events: Arc<DeviceEvents>,
    device_type: DeviceType,
    deferred: Arc<DeferredKicks>,
    /// Where the driver's kicks are recorded, when a ring trace runs.
    ring_trace: Option<RingTrace>,
}

/// Kicks a driver made under its guest's lock, sent once the lock is
/// released ([`DeferredKicks::flush`]) when a [`GuestThread`] runs it.
///
/// A kick wakes the device loop, which soon raises an interrupt and runs
/// the guest's handler, which needs the guest lock: a kick sent while the
/// kicking thread still holds it (finishing its poll, or the application
/// call around it) finds the lock taken, and the interrupt goes to the
/// guest thread instead, a second wakeup. Sent after the release, the
/// handler usually runs at once on the device loop.
///
/// [`GuestThread`]: super::GuestThread
#[derive(Debug)]
pub struct DeferredKicks {
    events: Arc<DeviceEvents>,
    /// Whether kicks wait for [`Self::flush`]; off until a guest thread
    /// (which flushes after every release of its lock) takes the driver.
    enabled: AtomicBool,
    /// Queues kicked since the last flush, one bit each.
    pending: AtomicU32,
    /// The device loop's round on the flushing thread, tried before the
    /// eventfds (see [`InlineKick`]).
    inline: OnceLock<InlineKick>,
}

impl DeferredKicks {
    /// From now on kicks wait for [`Self::flush`].
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    /// Holds back a kick of `queue`; `false` if kicks are not deferred.
    fn defer(&self, queue: u16) -> bool {
        if !self.enabled.load(Ordering::Acquire) || queue >= 32 {
            return false;
        }
        self.pending.fetch_or(1 << queue, Ordering::AcqRel);
        true
    }

    /// From now on a flush first offers its kicks to `inline`, the device
    /// loop's, which answers them on the flushing thread when the loop is
    /// idle. Set once; later calls do nothing.
    pub fn answer_inline(&self, inline: InlineKick) {
        let _ = self.inline.set(inline);
    }

    /// Sends the kicks held back; call it after releasing the guest lock.
    /// One device round answers every queue's kick, so when the loop is
    /// idle it runs here, and no eventfd is written.
    pub fn flush(&self) {
        let mut pending = self.pending.swap(0, Ordering::AcqRel);
        if pending == 0 || self.inline.get().is_some_and(|inline| inline.try_round(pending)) {
            return;
        }
        while pending != 0 {
            let queue = pending.trailing_zeros() as u16;
            pending &= pending - 1;
            MmioEvent::Notify(queue).signal(&self.events);
        }
    }
}

impl<B: MmioBus> fmt::Debug for InProcessTransport<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessTransport")
            .field("device_type", &self.device_type)
            .finish_non_exhaustive()
    }
}

impl<B: MmioBus> InProcessTransport<B> {
    /// Probes the register file like `MmioTransport::new` does (magic,
    /// version 2, a known device id).
    pub fn new(bus: Arc<B>, events: Arc<DeviceEvents>) -> Result<Self, MmioError> {
        let deferred = Arc::new(DeferredKicks {
            events: events.clone(),
            enabled: AtomicBool::new(false),
            pending: AtomicU32::new(0),
            inline: OnceLock::new(),
        });
        Self::with_deferred_kicks(bus, events, deferred)
    }

    /// [`Self::new`] for a driver that takes over from another under the
    /// same guest thread: its kicks wait in the same [`DeferredKicks`], the
    /// one the thread flushes.
    pub fn with_deferred_kicks(
        bus: Arc<B>,
        events: Arc<DeviceEvents>,
        deferred: Arc<DeferredKicks>,
    ) -> Result<Self, MmioError> {
        let read = |off: u32| {
            let mut b = [0u8; 4];
            bus.mmio_read(u64::from(off), &mut b);
            u32::from_le_bytes(b)
        };
        let magic = read(reg::VIRTIO_MMIO_MAGIC_VALUE);
        if magic != MAGIC_VALUE {
            return Err(MmioError::BadMagic(magic));
        }
        let version = read(reg::VIRTIO_MMIO_VERSION);
        if version != MMIO_VERSION {
            return Err(MmioError::UnsupportedVersion(version));
        }
        let device_type = DeviceType::try_from(read(reg::VIRTIO_MMIO_DEVICE_ID))
            .map_err(MmioError::InvalidDeviceID)?;
        Ok(InProcessTransport { bus, events, device_type, deferred, ring_trace: None })
    }

    /// Records each kick of the driver into `trace`: on this bus the
    /// device sees every kick the driver makes, as it makes it.
    pub fn set_ring_trace(&mut self, trace: Option<RingTrace>) {
        self.ring_trace = trace;
    }

    /// The kicks this transport holds back while deferring is on.
    pub fn deferred_kicks(&self) -> &Arc<DeferredKicks> {
        &self.deferred
    }

    /// The eventfds shared with the device.
    pub fn events(&self) -> &Arc<DeviceEvents> {
        &self.events
    }

    fn read32(&self, off: u32) -> u32 {
        let mut b = [0u8; 4];
        self.bus.mmio_read(u64::from(off), &mut b);
        u32::from_le_bytes(b)
    }

    fn write32(&self, off: u32, value: u32) {
        self.bus.mmio_write(u64::from(off), &value.to_le_bytes()).signal(&self.events);
    }
}

impl<B: MmioBus> Transport for InProcessTransport<B> {
    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn read_device_features(&mut self) -> u64 {
        self.write32(reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        let low = self.read32(reg::VIRTIO_MMIO_DEVICE_FEATURES);
        self.write32(reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        let high = self.read32(reg::VIRTIO_MMIO_DEVICE_FEATURES);
        u64::from(low) | (u64::from(high) << 32)
    }

    fn write_driver_features(&mut self, driver_features: u64) {
        self.write32(reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        self.write32(reg::VIRTIO_MMIO_DRIVER_FEATURES, driver_features as u32);
        self.write32(reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write32(reg::VIRTIO_MMIO_DRIVER_FEATURES, (driver_features >> 32) as u32);
    }

    fn max_queue_size(&mut self, queue: u16) -> u32 {
        self.write32(reg::VIRTIO_MMIO_QUEUE_SEL, queue.into());
        self.read32(reg::VIRTIO_MMIO_QUEUE_NUM_MAX)
    }

    fn notify(&mut self, queue: u16) {
        if let Some(trace) = &self.ring_trace {
            trace.kick(usize::from(queue), "driver", 1);
        }
        // The ioeventfd path: the register file never sees the kick. While
        // the device loop runs this driver's interrupt handler it looks at
        // its queues again anyway, and takes the kick without the eventfd.
        // Otherwise, under a guest thread, it waits until the guest lock is
        // released (see `DeferredKicks`).
        if !self.events.absorb_kick() && !self.deferred.defer(queue) {
            MmioEvent::Notify(queue).signal(&self.events);
        }
    }

    fn get_status(&self) -> DeviceStatus {
        DeviceStatus::from_bits_retain(self.read32(reg::VIRTIO_MMIO_STATUS))
    }

    fn set_status(&mut self, status: DeviceStatus) {
        self.write32(reg::VIRTIO_MMIO_STATUS, status.bits());
    }

    fn set_guest_page_size(&mut self, _guest_page_size: u32) {
        // Only legacy (version 1) devices have GuestPageSize.
    }

    fn requires_legacy_layout(&self) -> bool {
        false
    }

    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        self.write32(reg::VIRTIO_MMIO_QUEUE_SEL, queue.into());
        self.write32(reg::VIRTIO_MMIO_QUEUE_NUM, size);
        self.write32(reg::VIRTIO_MMIO_QUEUE_DESC_LOW, descriptors as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, (descriptors >> 32) as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, driver_area as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH, (driver_area >> 32) as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_USED_LOW, device_area as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_USED_HIGH, (device_area >> 32) as u32);
        self.write32(reg::VIRTIO_MMIO_QUEUE_READY, 1);
    }

    fn queue_unset(&mut self, queue: u16) {
        self.write32(reg::VIRTIO_MMIO_QUEUE_SEL, queue.into());
        self.write32(reg::VIRTIO_MMIO_QUEUE_READY, 0);
        for off in [
            reg::VIRTIO_MMIO_QUEUE_NUM,
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW,
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH,
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW,
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
            reg::VIRTIO_MMIO_QUEUE_USED_LOW,
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH,
        ] {
            self.write32(off, 0);
        }
    }

    fn queue_used(&mut self, queue: u16) -> bool {
        self.write32(reg::VIRTIO_MMIO_QUEUE_SEL, queue.into());
        self.read32(reg::VIRTIO_MMIO_QUEUE_READY) != 0
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        let pending = self.read32(reg::VIRTIO_MMIO_INTERRUPT_STATUS);
        if pending != 0 {
            self.write32(reg::VIRTIO_MMIO_INTERRUPT_ACK, pending);
        }
        InterruptStatus::from_bits_truncate(pending)
    }

    fn read_config_generation(&self) -> u32 {
        self.read32(reg::VIRTIO_MMIO_CONFIG_GENERATION)
    }

    fn read_config_space<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, VirtioError> {
        assert_config_access::<T>(offset);
        if offset.checked_add(size_of::<T>()).is_none_or(|end| end as u64 > CONFIG_SIZE) {
            return Err(VirtioError::ConfigSpaceTooSmall);
        }
        let mut value = T::new_zeroed();
        self.bus.mmio_read(CONFIG_OFFSET + offset as u64, value.as_mut_bytes());
        Ok(value)
    }

    fn write_config_space<T: IntoBytes + Immutable>(
        &mut self,
        offset: usize,
        value: T,
    ) -> Result<(), VirtioError> {
        assert_config_access::<T>(offset);
        if offset.checked_add(size_of::<T>()).is_none_or(|end| end as u64 > CONFIG_SIZE) {
            return Err(VirtioError::ConfigSpaceTooSmall);
        }
        self.bus.mmio_write(CONFIG_OFFSET + offset as u64, value.as_bytes());
        Ok(())
    }
}

/// The checks virtio-drivers' MMIO and PCI transports make on every
/// config-space access, with the same message: virtio guarantees config
/// space only 4-byte alignment, so a 64-bit field must be read as two
/// 32-bit halves (spec 4.2.2.2). A driver that passes here passes there.
fn assert_config_access<T>(offset: usize) {
    assert!(
        align_of::<T>() <= 4,
        "Driver expected config space alignment of {} bytes, but VirtIO only guarantees 4 byte alignment.",
        align_of::<T>()
    );
    assert!(offset.is_multiple_of(align_of::<T>()));
}

impl<B: MmioBus> Drop for InProcessTransport<B> {
    fn drop(&mut self) {
        // Like virtio-drivers' MmioTransport: a dropped driver resets the
        // device so it stops touching the driver's memory.
        self.write32(reg::VIRTIO_MMIO_STATUS, 0);
    }
}

/// Why an in-process device could not be set up.
#[derive(Debug)]
pub enum SetupError {
    /// Mapping memory or creating eventfds failed.
    Io(io::Error),
    /// The device configuration, or the transport's probe, was refused.
    Transport(String),
    /// The driver could not start on the device.
    Driver(DriverError),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Transport(e) => write!(f, "transport: {e}"),
            Self::Driver(e) => write!(f, "driver: {e}"),
        }
    }
}

impl std::error::Error for SetupError {}
