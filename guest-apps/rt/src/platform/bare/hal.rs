//! virtio-drivers' platform layer for the unikernel: DMA memory is heap
//! memory, and addresses are the same to the CPU and the device.
//!
//! The boot layer identity-maps guest-physical memory, so a buffer's
//! pointer is its physical address: `share` and `unshare` have nothing
//! to translate or copy, and the device reads and writes the driver's
//! buffers in place.

use alloc::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use core::ptr::NonNull;

use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE, PhysAddr};

/// The unikernel's [`Hal`].
#[derive(Debug)]
pub(crate) struct BareHal;

fn pages_layout(pages: usize) -> Layout {
    match Layout::from_size_align(pages.max(1) * PAGE_SIZE, PAGE_SIZE) {
        Ok(layout) => layout,
        Err(_) => panic!("pier-rt: a DMA allocation of {pages} pages overflows"),
    }
}

// SAFETY: allocations are page-aligned, zeroed and unaliased (they come
// from the global allocator), and every address is identity-mapped, so
// the physical address handed to the device is the memory the driver
// uses.
unsafe impl Hal for BareHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let layout = pages_layout(pages);
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        match NonNull::new(ptr) {
            Some(ptr) => (ptr.as_ptr() as PhysAddr, ptr),
            None => handle_alloc_error(layout),
        }
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        // SAFETY: `vaddr` came from `dma_alloc` with the same page count
        // (the trait's contract), hence with this layout.
        unsafe { dealloc(vaddr.as_ptr(), pages_layout(pages)) };
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).expect("an MMIO region at physical address 0")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}
