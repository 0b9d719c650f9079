//! The in-process `Hal`: per-thread allocation, process-wide translation,
//! and loud failure for memory the device cannot see.

use std::ptr::NonNull;

use pier_device::{DmaRegion, InProcessHal};
use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE};
use vm_memory::{Bytes, GuestAddress};

#[test]
fn independent_regions_on_parallel_threads() {
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            std::thread::spawn(move || {
                let region = DmaRegion::new(64 * PAGE_SIZE).unwrap();
                let _scope = region.enter();
                let mut held = Vec::new();
                for round in 0..200usize {
                    let pages = round % 3 + 1;
                    let (paddr, vaddr) = InProcessHal::dma_alloc(pages, BufferDirection::Both);
                    assert_ne!(paddr, 0);
                    assert_eq!(paddr as usize % PAGE_SIZE, 0);
                    assert_eq!(vaddr.as_ptr() as usize % PAGE_SIZE, 0);
                    assert_eq!(region.paddr_of(vaddr.as_ptr()), Some(paddr));
                    // SAFETY: freshly allocated, `pages` pages long.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(vaddr.as_ptr(), pages * PAGE_SIZE)
                    };
                    assert!(bytes.iter().all(|&b| b == 0), "dma_alloc must zero");
                    bytes.fill(t);
                    // share translates any sub-slice to its physical address.
                    let sub = NonNull::from(&mut bytes[100..200]);
                    let shared = unsafe { InProcessHal::share(sub, BufferDirection::Both) };
                    assert_eq!(shared, paddr + 100);
                    // The device sees the driver's bytes at that address.
                    let mut seen = [0u8; 4];
                    region.memory().read_slice(&mut seen, GuestAddress(shared)).unwrap();
                    assert_eq!(seen, [t; 4]);
                    held.push((paddr, vaddr, pages));
                    if held.len() > 8 {
                        let (p, v, n) = held.remove(0);
                        assert_eq!(unsafe { InProcessHal::dma_dealloc(p, v, n) }, 0);
                    }
                }
                for (p, v, n) in held {
                    assert_eq!(unsafe { InProcessHal::dma_dealloc(p, v, n) }, 0);
                }
                assert_eq!(region.allocated_pages(), 0);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn exhaustion_is_an_error_not_a_panic() {
    let region = DmaRegion::new(4 * PAGE_SIZE).unwrap();
    let _scope = region.enter();
    // Page 0 is reserved, so three pages are left.
    let (p, v) = InProcessHal::dma_alloc(3, BufferDirection::Both);
    assert_eq!(p, PAGE_SIZE as u64);
    let (failed, _) = InProcessHal::dma_alloc(1, BufferDirection::Both);
    assert_eq!(failed, 0, "physical address 0 signals failure to virtio-drivers");
    // Double free and foreign frees are refused.
    assert_eq!(unsafe { InProcessHal::dma_dealloc(p, v, 3) }, 0);
    assert_eq!(unsafe { InProcessHal::dma_dealloc(p, v, 3) }, -1);
    let mut local = [0u8; 8];
    let foreign = NonNull::from(&mut local).cast::<u8>();
    assert_eq!(unsafe { InProcessHal::dma_dealloc(0, foreign, 1) }, -1);
}

#[test]
fn region_outlives_its_handle_until_freed() {
    let region = DmaRegion::new(8 * PAGE_SIZE).unwrap();
    let scope = region.enter();
    let (p, v) = InProcessHal::dma_alloc(2, BufferDirection::Both);
    drop(scope);
    drop(region);
    // A queue dropped after its region can still free its pages.
    assert_eq!(unsafe { InProcessHal::dma_dealloc(p, v, 2) }, 0);
}

#[test]
#[should_panic(expected = "outside every DmaRegion")]
fn sharing_memory_outside_any_region_panics() {
    let _region = DmaRegion::new(4 * PAGE_SIZE).unwrap();
    let mut heap = vec![0u8; 64];
    let buf = NonNull::from(heap.as_mut_slice());
    unsafe { InProcessHal::share(buf, BufferDirection::DriverToDevice) };
}

#[test]
#[should_panic(expected = "no DmaRegion entered")]
fn allocating_without_a_region_panics() {
    let _ = InProcessHal::dma_alloc(1, BufferDirection::Both);
}
