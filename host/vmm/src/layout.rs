//! Where things sit in the guest's physical address space.
//!
//! ```text
//! 0x0000_6000  hvm_start_info            (PVH, rbx at entry)
//! 0x0000_7000  memory map                (hvm_memmap_table_entry[])
//! 0x0002_0000  command line              (NUL-terminated, CMDLINE_MAX bytes)
//! 0x0010_0000  the image, then free RAM  (up to the memory size)
//! 0xd000_0000  virtio-mmio vsock slot    (4 KiB, GSI 5)
//! 0xfec0_0000  IOAPIC, 0xfee0_0000 LAPIC (KVM's in-kernel irqchip)
//! 0xfffb_d000  KVM's TSS pages           (KVM_SET_TSS_ADDR, 3 pages)
//! ```
//!
//! The virtio-mmio slot follows Firecracker's and Cloud Hypervisor's
//! convention (4 KiB slots from 0xd000_0000, IRQs from 5), and the guest
//! learns it from `virtio_mmio.device=4K@0xd0000000:5` on the command line,
//! as Linux does. RAM is one region below the slot, so a guest's memory is
//! at most [`MAX_MEM_SIZE`].

/// `hvm_start_info`.
pub const START_INFO: u64 = 0x6000;
/// The memory map `hvm_start_info` points at.
pub const MEMMAP_START: u64 = 0x7000;
/// The kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// The longest command line, NUL included.
pub const CMDLINE_MAX: usize = 4096;
/// The end of the low RAM the memory map reports (the legacy video and
/// BIOS area above it is not RAM on a PC).
pub const LOW_RAM_END: u64 = 0x9_fc00;
/// Where images load: nothing may sit below, where the boot data goes.
pub const HIMEM_START: u64 = 0x10_0000;
/// The vsock device's register file.
pub const VSOCK_MMIO_BASE: u64 = 0xd000_0000;
/// The size of one virtio-mmio slot.
pub const VSOCK_MMIO_SIZE: u64 = 0x1000;

/// The offset of `addr` in the vsock device's register file, if it falls
/// there: the vCPU's MMIO exits and KVM's coalesced ring both name
/// guest-physical addresses.
pub(crate) fn vsock_offset(addr: u64) -> Option<u64> {
    addr.checked_sub(VSOCK_MMIO_BASE).filter(|o| *o < VSOCK_MMIO_SIZE)
}

/// The vsock device's interrupt (an IOAPIC pin).
pub const VSOCK_GSI: u32 = 5;
/// KVM's three-page TSS area, which Intel hosts need for real-mode
/// emulation; placed out of the way below 4 GiB, as Firecracker does.
pub const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// The largest guest memory: RAM must end below the MMIO slots.
pub const MAX_MEM_SIZE: u64 = VSOCK_MMIO_BASE;
/// The smallest guest memory that holds the boot data and a small image.
pub const MIN_MEM_SIZE: u64 = 2 << 20;
