//! DMA buffers: memory the device can see, owned by the driver.
//!
//! Every buffer the driver shares with the device comes from
//! `Hal::dma_alloc`, never from the heap, so that a transport that cannot
//! expose arbitrary memory (the in-process one, an IOMMU) still works.

use core::marker::PhantomData;
use core::ptr::NonNull;

use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE, PhysAddr};

pub struct DmaBuffer<H: Hal> {
    /// Where the buffer starts, `lead` bytes into its first page.
    paddr: PhysAddr,
    vaddr: NonNull<u8>,
    len: usize,
    /// Bytes of the allocation before the buffer (see [`Self::with_lead`]).
    lead: usize,
    pages: usize,
    _hal: PhantomData<H>,
}

// SAFETY: the buffer is plain memory owned by this value.
unsafe impl<H: Hal> Send for DmaBuffer<H> {}
// SAFETY: shared references only read (`as_slice`); the one way to write
// through one, `as_mut_slice_unchecked`, is unsafe and leaves exclusivity
// to its caller.
unsafe impl<H: Hal> Sync for DmaBuffer<H> {}

impl<H: Hal> DmaBuffer<H> {
    pub fn new(len: usize) -> Result<Self, virtio_drivers::Error> {
        Self::with_lead(len, 0)
    }

    /// A buffer that starts `lead` bytes into its first page (`lead` is
    /// less than a page), so that a given offset in it falls on a page
    /// boundary.
    pub fn with_lead(len: usize, lead: usize) -> Result<Self, virtio_drivers::Error> {
        debug_assert!(lead < PAGE_SIZE);
        let pages = (lead + len).div_ceil(PAGE_SIZE).max(1);
        let (paddr, vaddr) = H::dma_alloc(pages, BufferDirection::Both);
        if paddr == 0 {
            return Err(virtio_drivers::Error::DmaError);
        }
        // SAFETY: `lead` is within the first of the `pages` pages allocated.
        let vaddr = unsafe { NonNull::new_unchecked(vaddr.as_ptr().add(lead)) };
        Ok(Self { paddr: paddr + lead as PhysAddr, vaddr, len, lead, pages, _hal: PhantomData })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `dma_alloc` gave us `pages` pages, and `lead + len` fits.
        unsafe { core::slice::from_raw_parts(self.vaddr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { core::slice::from_raw_parts_mut(self.vaddr.as_ptr(), self.len) }
    }

    /// A mutable view of a buffer others can reach through shared
    /// references (the driver's receive buffers, which it lends the stack).
    ///
    /// # Safety
    ///
    /// No other reference to the buffer's bytes may be alive while the
    /// returned one is.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice_unchecked(&self) -> &mut [u8] {
        // SAFETY: as for `as_slice`; the caller vouches for exclusivity.
        unsafe { core::slice::from_raw_parts_mut(self.vaddr.as_ptr(), self.len) }
    }
}

impl<H: Hal> Drop for DmaBuffer<H> {
    fn drop(&mut self) {
        // SAFETY: less `lead`, these are exactly the values `dma_alloc`
        // returned.
        unsafe {
            let vaddr = NonNull::new_unchecked(self.vaddr.as_ptr().sub(self.lead));
            H::dma_dealloc(self.paddr - self.lead as PhysAddr, vaddr, self.pages);
        }
    }
}

impl<H: Hal> core::fmt::Debug for DmaBuffer<H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DmaBuffer").field("paddr", &self.paddr).field("len", &self.len).finish()
    }
}
