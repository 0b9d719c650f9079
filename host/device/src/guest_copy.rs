//! Payload copies between guest memory and the device's own buffers.
//!
//! vm-memory's `read_slice`/`write_slice` copy with the platform's
//! `memcpy`. Payload bytes are the bulk of what the device moves, so they
//! go through pier-copy instead, the routine the stack's rings and the
//! driver's buffers use, chosen per CPU by measurement (on AMD CPUs glibc's
//! `memcpy` takes a `rep movsb` path that is several times slower for
//! these sizes). Guest memory is never borrowed as a `&[u8]`: a guest may
//! write it while the device copies, so the copy goes through raw pointers
//! from vm-memory's slices (`copy_raw`), as vm-memory's own copies do.

use vm_memory::bitmap::Bitmap;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryError, Permissions};

/// Copies `buf.len()` bytes of guest memory at `addr` into `buf`; an error
/// when any of them is outside guest memory (nothing is promised of `buf`
/// then).
pub(crate) fn read_guest<M: GuestMemory>(
    mem: &M,
    addr: GuestAddress,
    buf: &mut [u8],
) -> Result<(), GuestMemoryError> {
    let mut done = 0;
    for slice in mem.get_slices(addr, buf.len(), Permissions::Read)?.stop_on_error()? {
        let len = slice.len();
        let guard = slice.ptr_guard();
        // SAFETY: the guard keeps the mapping alive for `len` readable
        // bytes; `buf[done..done + len]` is ours, in bounds since the slices
        // cover exactly `buf.len()` bytes, and not guest memory.
        unsafe { pier_copy::copy_raw(buf[done..done + len].as_mut_ptr(), guard.as_ptr(), len) };
        done += len;
    }
    if done != buf.len() {
        return Err(GuestMemoryError::PartialBuffer { expected: buf.len(), completed: done });
    }
    Ok(())
}

/// Copies `data` into guest memory at `addr`, marking it dirty as
/// vm-memory's own writes do; an error when any of it is outside guest
/// memory.
pub(crate) fn write_guest<M: GuestMemory>(
    mem: &M,
    addr: GuestAddress,
    data: &[u8],
) -> Result<(), GuestMemoryError> {
    let mut done = 0;
    for slice in mem.get_slices(addr, data.len(), Permissions::Write)?.stop_on_error()? {
        let len = slice.len();
        let guard = slice.ptr_guard_mut();
        // SAFETY: the guard keeps the mapping alive for `len` writable
        // bytes; `data[done..done + len]` is in bounds since the slices
        // cover exactly `data.len()` bytes, and is not guest memory.
        unsafe { pier_copy::copy_raw(guard.as_ptr(), data[done..done + len].as_ptr(), len) };
        slice.bitmap().mark_dirty(0, len);
        done += len;
    }
    if done != data.len() {
        return Err(GuestMemoryError::PartialBuffer { expected: data.len(), completed: done });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    fn memory() -> GuestMemoryMmap {
        // Two regions back to back, so a copy across the seam takes two
        // slices.
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10000),
            (GuestAddress(0x10000), 0x10000),
        ])
        .unwrap()
    }

    #[test]
    fn a_copy_across_two_regions_reads_and_writes_every_byte() {
        let mem = memory();
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        let at = GuestAddress(0x10000 - 3000);
        write_guest(&mem, at, &data).unwrap();
        let mut via_vm_memory = vec![0u8; data.len()];
        mem.read_slice(&mut via_vm_memory, at).unwrap();
        assert_eq!(via_vm_memory, data, "write_guest wrote what vm-memory reads back");
        let mut back = vec![0u8; data.len()];
        read_guest(&mem, at, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_copy_past_the_end_of_guest_memory_is_an_error() {
        let mem = memory();
        let mut buf = vec![0u8; 4096];
        assert!(read_guest(&mem, GuestAddress(0x20000 - 100), &mut buf).is_err());
        assert!(write_guest(&mem, GuestAddress(0x20000 - 100), &buf).is_err());
        assert!(read_guest(&mem, GuestAddress(0x40000), &mut buf).is_err());
    }
}
