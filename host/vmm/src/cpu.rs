//! The vCPU's features and its register state at the PVH entry.

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_segment};
use kvm_ioctls::{Kvm, VcpuFd};

use crate::error::{Error, kvm};

/// CPUID.1:ECX bit 24: the LAPIC timer's TSC-deadline mode.
const CPUID_1_ECX_TSC_DEADLINE: u32 = 1 << 24;

/// Gives the vCPU the host's supported CPUID, plus the TSC-deadline bit.
///
/// Without `KVM_SET_CPUID2` a vCPU has no long-mode bit, and the guest's
/// write of EFER.LME faults. KVM supports the TSC-deadline timer in its
/// LAPIC emulation but does not report the bit, so it is set here; the
/// guest's timer relies on it.
pub(crate) fn set_cpuid(kvm_fd: &Kvm, vcpu: &VcpuFd) -> Result<(), Error> {
    let mut cpuid = kvm_fd
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
    for entry in cpuid.as_mut_slice() {
        if entry.function == 1 {
            entry.ecx |= CPUID_1_ECX_TSC_DEADLINE;
        }
    }
    vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))
}

/// Puts the vCPU in the state the PVH boot protocol promises: 32-bit
/// protected mode, paging off, flat 4 GiB code and data segments, a valid
/// task register, interrupts off, `rbx` = the `hvm_start_info` address, and
/// `rip` = the note's entry.
pub(crate) fn set_pvh_entry(vcpu: &VcpuFd, entry: u64, start_info: u64) -> Result<(), Error> {
    let mut sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let flat = |selector: u16, type_: u8| kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cs = flat(0x08, 0xb); // execute/read, accessed
    let data = flat(0x10, 0x3); // read/write, accessed
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    // A busy 32-bit TSS; the guest loads its own before it needs one.
    sregs.tr = kvm_segment { limit: 0x67, selector: 0x18, type_: 0xb, s: 0, g: 0, ..data };
    sregs.cr0 = 0x11; // PE | ET
    sregs.cr4 = 0;
    sregs.efer = 0;
    vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    let mut regs = vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    regs.rflags = 0x2;
    regs.rip = entry;
    regs.rbx = start_info;
    vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))
}
