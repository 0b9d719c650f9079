//! The platform half of running virtio-drivers inside an ordinary process:
//! its [`Hal`].
//!
//! "Physical" memory is a [`DmaRegion`]: a `GuestMemoryMmap` with one
//! region at guest-physical 0, so a physical address is simply an offset
//! into it, and the device reads it through vm-memory exactly as it reads
//! guest RAM under KVM.
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

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE, PhysAddr};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

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
