//! Running a virtio-drivers driver inside an ordinary process.
//!
//! pier runs one driver everywhere: the same `VirtQueue` code that
//! runs in the unikernel also runs in the Wasm host shim, against the
//! same device model. virtio-drivers reaches hardware only through two
//! traits, so this module implements both for a process:
//!
//! * [`InProcessHal`] plays the platform. "Physical" memory is a
//!   [`DmaRegion`]: a `GuestMemoryMmap` with one region at guest-physical 0,
//!   so a physical address is simply an offset into it, and the device
//!   reads it through vm-memory exactly as it reads guest RAM under KVM.
//! * [`InProcessTransport`] plays the bus. Register accesses become calls
//!   on an [`MmioBus`] (normally the device's [`VsockMmio`](crate::mmio::VsockMmio)
//!   behind a mutex); queue kicks become writes to per-queue eventfds, like
//!   KVM's ioeventfd; device interrupts arrive on an eventfd, like irqfd. So
//!   the device can run on its own thread and be woken exactly as a VMM
//!   would wake it.
//!
//! `Hal` methods have no `self`, so the regions live in a process-wide
//! registry. Translation (`share`, `dma_dealloc`) looks the address up among
//! all registered regions, so it works from any thread; allocation
//! (`dma_alloc`) needs to know *which* region, and takes it from the calling
//! thread's [`DmaScope`]. Independent devices, each with its own region,
//! therefore coexist in one process (tests run them on parallel threads).
//!
//! A buffer outside every region cannot be reached by the device, and
//! silently handing it an unrelated physical address would corrupt memory,
//! so `share` panics loudly instead. That rules out virtio-drivers'
//! indirect descriptors (allocated on the heap), so do not offer
//! VIRTIO_F_INDIRECT_DESC on this transport; every other buffer must come
//! from `Hal::dma_alloc` (virtio-drivers 0.13 does not export its `Dma`
//! wrapper, so drivers call `dma_alloc` directly for their buffer pools).
//!
//! The transport is exactly as strict as virtio-drivers' `MmioTransport`
//! where a driver could otherwise get away with something here and not on
//! a real bus: config space is read and written only in naturally aligned
//! pieces of at most 4 bytes (it asserts, as `MmioTransport` does), and
//! every register access is one 32-bit access.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use virtio_bindings::virtio_mmio as reg;
use virtio_drivers::transport::mmio::MmioError;
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{BufferDirection, Error as VirtioError, Hal, PAGE_SIZE, PhysAddr};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::mmio::{
    CONFIG_OFFSET, CONFIG_SIZE, MAGIC_VALUE, MMIO_VERSION, MmioBus, MmioEvent, NUM_QUEUES,
};

/// Every region ever registered and not yet retired.
static REGIONS: RwLock<Vec<Arc<Region>>> = RwLock::new(Vec::new());

thread_local! {
    /// The region `dma_alloc` allocates from on this thread.
    static CURRENT: RefCell<Option<Arc<Region>>> = const { RefCell::new(None) };
}

struct Region {
    mem: Arc<GuestMemoryMmap>,
    host_base: usize,
    len: usize,
    pages: Mutex<PageMap>,
}

struct PageMap {
    used: Vec<bool>,
    allocated: usize,
    /// The owning [`DmaRegion`] was dropped; retire once empty.
    closed: bool,
}

impl Region {
    fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.host_base
            && addr.checked_add(len).is_some_and(|end| end <= self.host_base + self.len)
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, PageMap> {
        self.pages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// First-fit allocation of `n` contiguous pages. Allocation happens at
    /// setup time (rings, buffer pools), so a linear scan is fine.
    fn alloc(&self, n: usize) -> Option<(PhysAddr, NonNull<u8>)> {
        let mut map = self.pages();
        if n == 0 || map.closed {
            return None;
        }
        let mut run = 0usize;
        let mut found = None;
        for (i, used) in map.used.iter().enumerate() {
            run = if *used { 0 } else { run + 1 };
            if run == n {
                found = Some(i + 1 - n);
                break;
            }
        }
        let first = found?;
        map.used[first..first + n].fill(true);
        map.allocated += n;
        drop(map);
        let offset = first * PAGE_SIZE;
        let vaddr = (self.host_base + offset) as *mut u8;
        // SAFETY: the pages lie inside the mapping owned by `self.mem`, and
        // were just marked used, so nothing else references them.
        unsafe { std::ptr::write_bytes(vaddr, 0, n * PAGE_SIZE) };
        Some((offset as PhysAddr, NonNull::new(vaddr)?))
    }

    /// Frees `n` pages at `paddr`. Returns whether the region is now
    /// retired and should leave the registry.
    fn free(&self, paddr: PhysAddr, n: usize) -> Result<bool, ()> {
        let mut map = self.pages();
        let first = usize::try_from(paddr).map_err(|_| ())? / PAGE_SIZE;
        let pages = map.used.get_mut(first..first.checked_add(n).ok_or(())?);
        let pages = pages.ok_or(())?;
        if !pages.iter().all(|u| *u) {
            return Err(());
        }
        pages.fill(false);
        map.allocated -= n;
        Ok(map.closed && map.allocated == 0)
    }
}

fn registry_read() -> std::sync::RwLockReadGuard<'static, Vec<Arc<Region>>> {
    REGIONS.read().unwrap_or_else(PoisonError::into_inner)
}

fn registry_write() -> std::sync::RwLockWriteGuard<'static, Vec<Arc<Region>>> {
    REGIONS.write().unwrap_or_else(PoisonError::into_inner)
}

fn retire(region: &Arc<Region>) {
    registry_write().retain(|r| !Arc::ptr_eq(r, region));
}

fn find_region(addr: usize, len: usize) -> Option<Arc<Region>> {
    registry_read().iter().find(|r| r.contains(addr, len)).cloned()
}

/// A region of this process that plays "physical memory" for one device.
///
/// Physical address = offset into the region. Page 0 is never handed out,
/// because virtio-drivers treats physical address 0 as an allocation
/// failure.
pub struct DmaRegion {
    inner: Arc<Region>,
}

impl fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaRegion")
            .field("host_base", &(self.inner.host_base as *const u8))
            .field("len", &self.inner.len)
            .finish()
    }
}

impl DmaRegion {
    /// Maps a region of at least `size` bytes (rounded up to whole pages,
    /// at least two) and registers it with [`InProcessHal`].
    pub fn new(size: usize) -> io::Result<Self> {
        let pages = size.div_ceil(PAGE_SIZE).max(2);
        let len = pages * PAGE_SIZE;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)])
            .map_err(|e| io::Error::other(e.to_string()))?;
        let host_base = mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| io::Error::other(e.to_string()))? as usize;
        let mut used = vec![false; pages];
        used[0] = true;
        let inner = Arc::new(Region {
            mem: Arc::new(mem),
            host_base,
            len,
            pages: Mutex::new(PageMap { used, allocated: 0, closed: false }),
        });
        registry_write().push(inner.clone());
        Ok(DmaRegion { inner })
    }

    /// The region as guest memory, for the device side.
    pub fn memory(&self) -> Arc<GuestMemoryMmap> {
        self.inner.mem.clone()
    }

    /// Size of the region in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false: a region has at least two pages.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Pages currently allocated through [`InProcessHal::dma_alloc`].
    pub fn allocated_pages(&self) -> usize {
        self.inner.pages().allocated
    }

    /// The physical address of a pointer into the region.
    pub fn paddr_of(&self, ptr: *const u8) -> Option<PhysAddr> {
        let addr = ptr as usize;
        self.inner.contains(addr, 1).then(|| (addr - self.inner.host_base) as PhysAddr)
    }

    /// Makes this region the one `dma_alloc` uses on the current thread
    /// until the returned scope is dropped.
    pub fn enter(&self) -> DmaScope {
        let previous = CURRENT.with(|c| c.replace(Some(self.inner.clone())));
        DmaScope { previous, _not_send: PhantomData }
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        // Outstanding allocations (a VirtQueue dropped later) must still be
        // freeable, so retire only once the last page comes back.
        let empty = {
            let mut map = self.inner.pages();
            map.closed = true;
            map.allocated == 0
        };
        if empty {
            retire(&self.inner);
        }
    }
}

/// Keeps a [`DmaRegion`] current on this thread; see [`DmaRegion::enter`].
pub struct DmaScope {
    previous: Option<Arc<Region>>,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for DmaScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaScope").finish_non_exhaustive()
    }
}

impl Drop for DmaScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// virtio-drivers' platform layer for a driver running in this process.
#[derive(Debug)]
pub struct InProcessHal;

// SAFETY: `dma_alloc` returns page-aligned (the mapping is page-aligned and
// offsets are whole pages), zeroed memory from a live mapping, never handing
// out a page twice until it is freed; `share` only ever returns addresses of
// memory inside a registered region.
unsafe impl Hal for InProcessHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let region = CURRENT.with(|c| c.borrow().clone()).unwrap_or_else(|| {
            panic!(
                "InProcessHal::dma_alloc: no DmaRegion entered on this thread (DmaRegion::enter)"
            )
        });
        // Physical address 0 tells virtio-drivers the allocation failed.
        region.alloc(pages).unwrap_or((0, NonNull::dangling()))
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        let Some(len) = pages.checked_mul(PAGE_SIZE) else {
            return -1;
        };
        let Some(region) = find_region(vaddr.as_ptr() as usize, len) else {
            return -1;
        };
        if (vaddr.as_ptr() as usize - region.host_base) as PhysAddr != paddr {
            return -1;
        }
        match region.free(paddr, pages) {
            Ok(true) => {
                retire(&region);
                0
            }
            Ok(false) => 0,
            Err(()) => -1,
        }
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, size: usize) -> NonNull<u8> {
        panic!(
            "InProcessHal::mmio_phys_to_virt({paddr:#x}, {size}): the in-process transport has no MMIO BARs"
        )
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        let addr = buffer.cast::<u8>().as_ptr() as usize;
        let len = buffer.len();
        // Called for every buffer the driver adds: translate under the read
        // lock without touching reference counts.
        let paddr = registry_read()
            .iter()
            .find(|r| r.contains(addr, len))
            .map(|r| (addr - r.host_base) as PhysAddr);
        match paddr {
            Some(paddr) => paddr,
            None => panic!(
                "InProcessHal::share: buffer {addr:#x}+{len:#x} is outside every DmaRegion; \
                 allocate driver buffers with dma_alloc and do not negotiate INDIRECT_DESC"
            ),
        }
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {
        // The device accessed the buffer in place; nothing to copy back.
    }
}

/// The eventfds between an in-process driver and its device: one kick per
/// queue (ioeventfd), one for lifecycle changes, one interrupt (irqfd).
#[derive(Debug)]
pub struct DeviceEvents {
    queues: [EventFd; NUM_QUEUES],
    control: EventFd,
    irq: EventFd,
}

impl DeviceEvents {
    /// Creates non-blocking eventfds.
    pub fn new() -> io::Result<Self> {
        let fd = || EventFd::new(EFD_NONBLOCK);
        Ok(DeviceEvents { queues: [fd()?, fd()?, fd()?], control: fd()?, irq: fd()? })
    }

    /// Signalled when the driver kicks `queue`.
    pub fn queue(&self, queue: usize) -> Option<&EventFd> {
        self.queues.get(queue)
    }

    /// Signalled after a status write that resets, fails or activates the
    /// device.
    pub fn control(&self) -> &EventFd {
        &self.control
    }

    /// Signalled by the device to interrupt the driver.
    pub fn irq(&self) -> &EventFd {
        &self.irq
    }

    /// A duplicate of the interrupt eventfd, to hand to
    /// [`VsockMmio::set_irq`](crate::mmio::VsockMmio::set_irq).
    pub fn irq_line(&self) -> io::Result<EventFd> {
        self.irq.try_clone()
    }

    /// Waits for the device side: bit `q` of the result is set when queue
    /// `q` was kicked, bit [`NUM_QUEUES`] when the control fd fired.
    pub fn device_waiter(&self) -> io::Result<EventWaiter> {
        let mut fds: Vec<&EventFd> = self.queues.iter().collect();
        fds.push(&self.control);
        EventWaiter::new(&fds)
    }

    /// Waits for the driver side: bit 0 is set when an interrupt arrived.
    pub fn irq_waiter(&self) -> io::Result<EventWaiter> {
        EventWaiter::new(&[&self.irq])
    }
}

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
        Ok(InProcessTransport { bus, events, device_type })
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
        match self.bus.mmio_write(u64::from(off), &value.to_le_bytes()) {
            MmioEvent::None => {}
            MmioEvent::Notify(q) => self.kick(q),
            MmioEvent::Reset | MmioEvent::DriverOk | MmioEvent::Failed => {
                // A full counter only means the device has not looked yet.
                let _ = self.events.control.write(1);
            }
        }
    }

    fn kick(&self, queue: u16) {
        if let Some(fd) = self.events.queue(usize::from(queue)) {
            // An overflowing counter still leaves the fd readable.
            let _ = fd.write(1);
        }
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
        // The ioeventfd path: the register file never sees the kick.
        self.kick(queue);
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
