//! The heap: the RAM past the image, as the PVH memory map describes it,
//! managed by linked_list_allocator.
//!
//! The machine has one CPU and nothing allocates outside the app's own
//! thread of control (no interrupt handler runs in ring 3), so the
//! allocator needs no lock: a cell around linked_list_allocator's `Heap`.
//! Pages are not touched in advance: first touches cost about 5 µs each on
//! a nested host, so pre-touching 128 MiB would cost over 100 ms of boot.
//!
//! The heap starts at the image's end, inside the image's last 2 MiB
//! page. A host that shadows the guest's page tables (kvm_pvm) maps a
//! 2 MiB page that holds any of them in 4 KiB pieces, each first touch a
//! fault of about 25 µs, while any other takes one fault for the whole
//! 2 MiB; `link.ld` gives the page tables the first 2 MiB page to
//! themselves, so the boot's allocations (the driver's rings and
//! buffers) fault once per 2 MiB wherever they land.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};

use linked_list_allocator::Heap;

/// Offsets in `hvm_start_info`: the memory map's address and length.
const MEMMAP_PADDR: usize = 40;
const MEMMAP_ENTRIES: usize = 48;
/// One memory map entry: `addr: u64, size: u64, type: u32, reserved: u32`.
const ENTRY_SIZE: usize = 24;
const E820_RAM: u32 = 1;
/// The boot layer maps the low 4 GiB, and RAM stops below the MMIO
/// window at 3 GiB.
const MAPPED_RAM_END: u64 = 0xc000_0000;

unsafe extern "C" {
    /// The first page past the image (`link.ld`).
    static pier_image_end: u8;
}

struct GuestHeap(UnsafeCell<Heap>);

// SAFETY: one CPU, and only the app's thread of control allocates (see
// the module documentation), so accesses never overlap.
unsafe impl Sync for GuestHeap {}

// SAFETY: linked_list_allocator returns blocks that fit the layout, or
// an error, which becomes a null pointer as GlobalAlloc requires.
unsafe impl GlobalAlloc for GuestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: no other access is in progress (see `Sync`).
        let heap = unsafe { &mut *self.0.get() };
        heap.allocate_first_fit(layout).map_or(ptr::null_mut(), NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above; `ptr` came from `alloc` with `layout`
        // (GlobalAlloc's contract), so it is not null.
        unsafe { (*self.0.get()).deallocate(NonNull::new_unchecked(ptr), layout) }
    }
}

#[global_allocator]
static HEAP: GuestHeap = GuestHeap(UnsafeCell::new(Heap::empty()));

/// Gives the allocator the RAM region the image ends in, from the
/// image's end to the region's end. Returns the heap's size in bytes
/// (0 when the map has no such region: every allocation then fails).
///
/// # Safety
///
/// `start_info` must be the hypervisor's valid `hvm_start_info` (its magic
/// checked), its memory map intact, and this must run once, before the
/// first allocation.
pub(crate) unsafe fn init(start_info: u64) -> usize {
    let base = start_info as *const u8;
    // SAFETY: a valid start_info in mapped memory (contract).
    let (map, entries) = unsafe {
        (
            base.add(MEMMAP_PADDR).cast::<u64>().read_unaligned() as *const u8,
            base.add(MEMMAP_ENTRIES).cast::<u32>().read_unaligned(),
        )
    };
    let image_end = &raw const pier_image_end as u64;
    for i in 0..entries as usize {
        // SAFETY: the map has `entries` entries (contract).
        let (addr, size, kind) = unsafe {
            let e = map.add(i * ENTRY_SIZE);
            (
                e.cast::<u64>().read_unaligned(),
                e.add(8).cast::<u64>().read_unaligned(),
                e.add(16).cast::<u32>().read_unaligned(),
            )
        };
        let end = addr.saturating_add(size).min(MAPPED_RAM_END);
        if kind == E820_RAM && addr <= image_end && image_end < end {
            let len = (end - image_end) as usize;
            // SAFETY: RAM nothing else uses (past the image, inside a RAM
            // region), mapped writable for ring 3; first and only init.
            unsafe { (*HEAP.0.get()).init(image_end as *mut u8, len) };
            return len;
        }
    }
    0
}
