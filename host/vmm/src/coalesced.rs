//! Coalesced MMIO: the vsock device's setup registers written without an
//! exit to userspace.
//!
//! A driver setting the device up writes about fifty registers, and each
//! write is an exit to the VMM and back: 20 to 80 µs on a nested host, a
//! millisecond or more of boot in all. Most of those writes only store a
//! value (a selector, a feature word, a queue's size or ring addresses)
//! that a later read or a write with an effect acts on. KVM can queue
//! writes to such registers in a ring shared with the VMM instead of
//! exiting (`KVM_REGISTER_COALESCED_MMIO`); the guest does not wait for
//! them.
//!
//! The rule that keeps the device's view the same: the ring is applied,
//! in order, before anything looks at the register file. The vCPU's
//! thread applies it at every exit, before handling the exit, so a read,
//! or a write to a register not coalesced (`InterruptACK`), sees every
//! write before it, as without the ring. The device loop applies it at
//! the start of every round (`InterruptDelivery::before_round`), so a
//! kick, which reaches the loop through an ioeventfd without an exit,
//! finds every write the driver made before it. That is what lets
//! `Status` be queued too: `DRIVER_OK`, which starts the device, is
//! followed by kicks and by nothing that exits, and the first round after
//! it applies it; `FEATURES_OK` is read back by the driver, and the read's
//! exit applies it first. `QueueReady` starts a queue, but a started
//! queue does nothing until `DRIVER_OK`; a driver that reads `QueueReady`
//! back gets it applied by that read's exit. Four status writes a boot
//! no longer exit: on a nested Intel host an exit cost about 65 µs there
//! against about 23 µs for a queued write (`perf record -e
//! kvm:kvm_mmio,kvm:kvm_userspace_exit` of a boot of echo).
//!
//! Both threads take the ring through one lock ([`QueuedWrites`]): KVM
//! adds to it, and each write is applied once, by whichever comes first.

use std::ptr::NonNull;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex};

use kvm_bindings::{KVM_COALESCED_MMIO_PAGE_OFFSET, kvm_coalesced_mmio, kvm_coalesced_mmio_ring};
use kvm_ioctls::{IoEventAddress, VcpuFd, VmFd};
use virtio_bindings::virtio_mmio as reg;

use crate::layout;

/// The register ranges (offset, bytes) whose writes need not exit:
/// `DeviceFeaturesSel`, `DriverFeatures` and `DriverFeaturesSel`,
/// `QueueSel` and `QueueNum`, `QueueReady` and `Status` (see the module's
/// rule), and the queue's six ring-address halves.
const QUEUED_WRITES: [(u32, u32); 6] = [
    (reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 4),
    (reg::VIRTIO_MMIO_DRIVER_FEATURES, 8),
    (reg::VIRTIO_MMIO_QUEUE_SEL, 12),
    (reg::VIRTIO_MMIO_QUEUE_READY, 4),
    (reg::VIRTIO_MMIO_STATUS, 4),
    (
        reg::VIRTIO_MMIO_QUEUE_DESC_LOW,
        reg::VIRTIO_MMIO_QUEUE_USED_HIGH + 4 - reg::VIRTIO_MMIO_QUEUE_DESC_LOW,
    ),
];

/// Queues writes to the vsock slot's setup registers. Returns
/// whether every zone was registered; a refusal leaves those writes as
/// ordinary exits, which only costs time.
pub(crate) fn register_zones(vm: &VmFd) -> bool {
    QUEUED_WRITES.iter().all(|&(offset, len)| {
        let addr = IoEventAddress::Mmio(layout::VSOCK_MMIO_BASE + u64::from(offset));
        vm.register_coalesced_mmio(addr, len).is_ok()
    })
}

/// The ring KVM queues coalesced writes in: a page of the vCPU's mapping.
/// KVM adds at `last`; the VMM takes from `first`.
pub(crate) struct Ring {
    ring: NonNull<kvm_coalesced_mmio_ring>,
    page: usize,
}

// SAFETY: the mapping is owned by the `Ring` and only read and advanced
// through `&mut self`, by one thread at a time (`QueuedWrites`' lock).
unsafe impl Send for Ring {}

impl Ring {
    /// Maps `vcpu`'s ring page; `None` if KVM has none.
    pub(crate) fn map(vcpu: &VcpuFd) -> Option<Self> {
        use std::os::fd::AsRawFd;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        let offset = libc::off_t::from(KVM_COALESCED_MMIO_PAGE_OFFSET) * page as libc::off_t;
        // SAFETY: a fresh shared mapping of the vCPU's ring page, which KVM
        // provides at that offset when it has coalesced MMIO.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return None;
        }
        Some(Self { ring: NonNull::new(addr.cast())?, page })
    }

    /// A ring over a page of plain memory, for tests that play KVM's
    /// part with [`Ring::queue`].
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        // SAFETY: a fresh private anonymous mapping, zeroed (an empty ring).
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap of a ring page");
        Self { ring: NonNull::new(addr.cast()).unwrap(), page }
    }

    /// Queues a write as KVM does: the entry, then `last` moved past it.
    #[cfg(test)]
    pub(crate) fn queue(&mut self, addr: u64, value: u32) {
        let ring = self.ring.as_ptr();
        // SAFETY: `ring` is the mapped page, valid while `self` lives.
        unsafe {
            let last = std::ptr::addr_of!((*ring).last).read_volatile();
            let entries =
                std::ptr::addr_of_mut!((*ring).coalesced_mmio).cast::<kvm_coalesced_mmio>();
            let mut entry = kvm_coalesced_mmio { phys_addr: addr, len: 4, ..Default::default() };
            entry.data[..4].copy_from_slice(&value.to_le_bytes());
            entries.add(last as usize).write_volatile(entry);
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*ring).last).write_volatile((last + 1) % self.capacity());
        }
    }

    fn capacity(&self) -> u32 {
        ((self.page - size_of::<kvm_coalesced_mmio_ring>()) / size_of::<kvm_coalesced_mmio>())
            as u32
    }

    /// Takes the oldest queued write: its guest-physical address and data.
    pub(crate) fn pop(&mut self) -> Option<(u64, [u8; 8], usize)> {
        let ring = self.ring.as_ptr();
        // SAFETY: `ring` is the mapped page, valid while `self` lives; KVM
        // writes `last` and the entries, the VMM `first`, as the ring's
        // protocol says, so the accesses are volatile.
        unsafe {
            let first = std::ptr::addr_of!((*ring).first).read_volatile();
            let last = std::ptr::addr_of!((*ring).last).read_volatile();
            if first == last || first >= self.capacity() {
                return None;
            }
            // The entry KVM wrote before it moved `last`.
            fence(Ordering::Acquire);
            let entries = std::ptr::addr_of!((*ring).coalesced_mmio).cast::<kvm_coalesced_mmio>();
            let entry = entries.add(first as usize).read_volatile();
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*ring).first).write_volatile((first + 1) % self.capacity());
            let len = (entry.len as usize).min(entry.data.len());
            Some((entry.phys_addr, entry.data, len))
        }
    }
}

/// The ring as the vCPU's thread and the device loop share it.
#[derive(Clone)]
pub(crate) struct QueuedWrites(Arc<Mutex<Ring>>);

impl QueuedWrites {
    pub(crate) fn new(ring: Ring) -> Self {
        Self(Arc::new(Mutex::new(ring)))
    }

    /// Applies every queued write to the vsock slot, oldest first, through
    /// `write(offset into the slot, bytes)`.
    pub(crate) fn apply(&self, mut write: impl FnMut(u64, &[u8])) {
        let mut ring = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((addr, data, len)) = ring.pop() {
            if let Some(offset) = crate::layout::vsock_offset(addr) {
                write(offset, &data[..len]);
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the page was mapped by `map` and nothing refers to it now.
        unsafe { libc::munmap(self.ring.as_ptr().cast(), self.page) };
    }
}
