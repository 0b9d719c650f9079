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
//! For the same reason a receive buffer lent to a host read
//! ([`RxPayload`]) is handed out as raw iovecs, never as a `&mut [u8]`,
//! and a transmit payload left in guest memory ([`GuestPayload`]) is only
//! copied out of, or handed to the kernel by address.

use std::marker::PhantomData;

use vm_memory::bitmap::Bitmap;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::volatile_memory::{PtrGuard, PtrGuardMut};
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

/// A transmit payload left where the driver put it, in one piece of
/// guest memory, for the host stack ([`pier_stack::SharedPayload`]) to
/// copy out of and the bridge to send from by address: the guest's
/// bytes cross into the host once, by the kernel's copy into the host
/// socket or by the copy into a socket buffer, not first into a staging
/// buffer of the device's.
///
/// A vCPU may write these bytes at any time, so no `&[u8]` of them is
/// ever made: each copy reads them as they are at that moment. A guest
/// that rewrites a payload it published changes only the bytes it sends,
/// which the device passes on without parsing.
pub struct GuestPayload {
    /// Keeps the piece mapped; its pointer is where the payload starts.
    guard: PtrGuard,
    len: usize,
}

impl std::fmt::Debug for GuestPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestPayload").field("len", &self.len).finish_non_exhaustive()
    }
}

impl GuestPayload {
    /// The `len` bytes of guest memory at `addr`, when they are one mapped
    /// piece; `None` otherwise (the caller copies them instead).
    pub(crate) fn map<M: GuestMemory>(mem: &M, addr: GuestAddress, len: usize) -> Option<Self> {
        let mut slices = mem.get_slices(addr, len, Permissions::Read).ok()?;
        let slice = slices.next()?.ok()?;
        (slice.len() == len).then(|| Self { guard: slice.ptr_guard(), len })
    }

    /// The guard that keeps the piece mapped, for a caller that may lend
    /// the bytes as a slice (the in-process bus: see `TxLending::InPlace`).
    pub(crate) fn into_guard(self) -> PtrGuard {
        self.guard
    }

    /// The piece's bytes from `range`, as the kernel takes them (one
    /// `iovec`); `None` when `range` is not inside the payload. The iovec
    /// is valid while `self` lives, for reads only, and must not be made
    /// into a reference: hand it to a system call.
    pub(crate) fn iovec(&self, range: std::ops::Range<usize>) -> Option<libc::iovec> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        // `range.start <= self.len`, so the pointer stays inside the piece.
        let base = self.guard.as_ptr().wrapping_add(range.start);
        Some(libc::iovec { iov_base: base.cast_mut().cast(), iov_len: range.len() })
    }
}

impl pier_stack::SharedPayload for GuestPayload {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let end = offset.checked_add(dst.len());
        assert!(end.is_some_and(|end| end <= self.len), "a copy past the payload's end");
        // SAFETY: `offset + dst.len()` bytes from the guard's pointer lie in
        // the piece, which the guard keeps mapped and readable; `dst` is
        // the caller's memory, not guest memory, so the two do not overlap.
        unsafe {
            pier_copy::copy_raw(dst.as_mut_ptr(), self.guard.as_ptr().add(offset), dst.len())
        };
    }
}

/// Most pieces of guest memory one [`RxPayload`] covers: a receive buffer
/// in more pieces than this is filled only as far as its first ones reach
/// (the rest of the chain is left unused; the packet is shorter).
const MAX_PIECES: usize = 16;

/// The payload area of a receive buffer, lent to a host read that writes
/// guest memory itself (`readv`, `recvmsg` into it, as the kernel does for
/// QEMU's devices) instead of the device copying bytes in afterwards.
///
/// The area is handed out as raw `iovec`s, never as a `&mut [u8]`: a vCPU
/// may touch these bytes while the kernel writes them, and a Rust reference
/// would promise that nobody does. The guards that keep the memory mapped
/// live as long as the payload.
pub struct RxPayload<'a> {
    iovecs: [libc::iovec; MAX_PIECES],
    pieces: usize,
    capacity: usize,
    _guards: [Option<PtrGuardMut>; MAX_PIECES],
    _memory: PhantomData<&'a ()>,
}

impl std::fmt::Debug for RxPayload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxPayload")
            .field("pieces", &self.pieces)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl RxPayload<'_> {
    /// Bytes the area holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Lets `read` write up to `limit` bytes at the start of the area
    /// through the iovecs it is given (they cover exactly that much, or the
    /// whole area if smaller), and returns what `read` returned, at most
    /// `limit`. The iovecs point at guest memory that stays mapped and
    /// writable until `read` returns; `read` must not make references of
    /// them, only hand them to the kernel (or write through raw pointers).
    pub fn read_with<E>(
        &mut self,
        limit: usize,
        read: impl FnOnce(&[libc::iovec]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let mut trimmed = self.iovecs;
        let mut left = limit.min(self.capacity);
        let mut count = 0;
        for iov in &mut trimmed[..self.pieces] {
            if left == 0 {
                break;
            }
            iov.iov_len = iov.iov_len.min(left);
            left -= iov.iov_len;
            count += 1;
        }
        read(&trimmed[..count]).map(|n| n.min(limit))
    }
}

/// The guest memory of `ranges` (device-writable buffers, already checked
/// to lie in guest memory) as an [`RxPayload`]; pieces past
/// [`MAX_PIECES`], or that fail to map, end it early.
pub(crate) fn rx_payload<M: GuestMemory>(
    mem: &M,
    ranges: impl Iterator<Item = (GuestAddress, usize)>,
) -> RxPayload<'_> {
    let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
    let mut payload = RxPayload {
        iovecs: [empty; MAX_PIECES],
        pieces: 0,
        capacity: 0,
        _guards: Default::default(),
        _memory: PhantomData,
    };
    'ranges: for (addr, len) in ranges {
        let Ok(slices) = mem.get_slices(addr, len, Permissions::Write) else { break };
        for slice in slices {
            let Ok(slice) = slice else { break 'ranges };
            if payload.pieces == MAX_PIECES {
                break 'ranges;
            }
            let guard = slice.ptr_guard_mut();
            payload.iovecs[payload.pieces] =
                libc::iovec { iov_base: guard.as_ptr().cast(), iov_len: slice.len() };
            payload._guards[payload.pieces] = Some(guard);
            payload.pieces += 1;
            payload.capacity += slice.len();
        }
    }
    payload
}

/// Marks `len` bytes of guest memory at `addr` dirty, for bytes a host
/// read wrote there itself (see [`RxPayload`]), as [`write_guest`] does
/// for its copies.
pub(crate) fn mark_dirty<M: GuestMemory>(mem: &M, addr: GuestAddress, len: usize) {
    let Ok(slices) = mem.get_slices(addr, len, Permissions::Write) else { return };
    for slice in slices.flatten() {
        slice.bitmap().mark_dirty(0, slice.len());
    }
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
