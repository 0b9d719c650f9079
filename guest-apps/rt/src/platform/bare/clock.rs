//! The monotonic clock: the TSC, read in ring 3 (about 10 ns), at a rate
//! learnt at boot. No CPUID leaf gives the rate on every host, so it comes
//! from, in order:
//!
//! 1. `pier.tsc_khz=N` on the command line (pier-vmm passes what
//!    KVM_GET_TSC_KHZ says);
//! 2. KVM's paravirtual clock (kvmclock), which any KVM hypervisor offers
//!    (QEMU with `-accel kvm` among them): the boot layer registers a
//!    `pvclock_vcpu_time_info` page in ring 0 ([`register_kvmclock`]) and
//!    the rate follows from its TSC-to-nanoseconds scale.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::cmdline;

/// TSC ticks per millisecond; 0 until `init` found the rate.
static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// KVM's `pvclock_vcpu_time_info`, which the hypervisor keeps up to date
/// once registered. Only the scale is read here.
#[repr(C, align(64))]
struct PvClock {
    version: AtomicU32,
    _pad0: u32,
    _tsc_timestamp: u64,
    _system_time: u64,
    tsc_to_system_mul: AtomicU32,
    /// `tsc_shift` (i8), `flags`, two bytes of padding.
    shift_and_flags: AtomicU32,
    _pad: [u32; 8],
}

static PVCLOCK: PvClock = PvClock {
    version: AtomicU32::new(0),
    _pad0: 0,
    _tsc_timestamp: 0,
    _system_time: 0,
    tsc_to_system_mul: AtomicU32::new(0),
    shift_and_flags: AtomicU32::new(0),
    _pad: [0; 8],
};

/// "KVMKVMKVM\0\0\0" in CPUID 0x4000_0000's EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];
/// CPUID 0x4000_0001 EAX: KVM_FEATURE_CLOCKSOURCE2, the MSR below.
const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// MSR_KVM_SYSTEM_TIME_NEW: the pvclock page's physical address, bit 0
/// enabling it.
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;

/// Ring 0 at boot: registers the pvclock page if the hypervisor is KVM
/// and offers it. A handful of emulated instructions (two `cpuid`, one
/// `wrmsr`).
///
/// # Safety
///
/// Ring 0 (the MSR write is privileged); memory is identity-mapped, so the
/// static's address is its physical address.
pub(super) unsafe fn register_kvmclock() {
    // Hypervisor leaves read as zero where there is no hypervisor.
    let signature = core::arch::x86_64::__cpuid(0x4000_0000);
    if [signature.ebx, signature.ecx, signature.edx] != KVM_SIGNATURE || signature.eax < 0x4000_0001
    {
        return;
    }
    let features = core::arch::x86_64::__cpuid(0x4000_0001).eax;
    if features & KVM_FEATURE_CLOCKSOURCE2 == 0 {
        return;
    }
    let address = &raw const PVCLOCK as u64 | 1;
    // SAFETY: ring 0 (contract), an MSR KVM advertised, and a static page
    // that lives for ever.
    unsafe {
        core::arch::asm!(
            "wrmsr",
            in("ecx") MSR_KVM_SYSTEM_TIME_NEW,
            in("eax") address as u32,
            in("edx") (address >> 32) as u32,
            options(nostack, preserves_flags)
        )
    };
}

/// The TSC rate kvmclock implies, if it was registered and filled in:
/// `ns = (ticks << shift) * mul / 2^32`, so ticks per millisecond are
/// `10^6 * 2^32 / mul`, shifted back.
fn kvmclock_khz() -> Option<u64> {
    let version = PVCLOCK.version.load(Ordering::Acquire);
    let mul = u64::from(PVCLOCK.tsc_to_system_mul.load(Ordering::Acquire));
    let shift = PVCLOCK.shift_and_flags.load(Ordering::Acquire) as u8 as i8;
    // An odd version is an update in progress; 0 means never written.
    if version == 0 || version % 2 == 1 || mul == 0 {
        return None;
    }
    let khz = (1_000_000u128 << 32) / u128::from(mul);
    let khz = if shift >= 0 { khz >> shift } else { khz << -shift };
    u64::try_from(khz).ok().filter(|&k| k > 0)
}

/// Finds the rate: the command line's, else kvmclock's.
pub(crate) fn init() {
    let given = cmdline::boot_option("pier.tsc_khz").and_then(|v| v.parse::<u64>().ok());
    if let Some(khz) = given.or_else(kvmclock_khz) {
        TSC_KHZ.store(khz, Ordering::Relaxed);
    }
}

/// The time-stamp counter now: what the TSC-deadline timer compares with.
pub(crate) fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: `rdtsc` only reads the time-stamp counter (CR4.TSD is off,
    // so ring 3 may).
    unsafe {
        core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Nanoseconds since the TSC started (the VM's start).
///
/// Panics when the hypervisor gave no rate: a clock that silently runs at
/// a guessed speed would make every timeout wrong.
pub(crate) fn now_nanos() -> u64 {
    let khz = TSC_KHZ.load(Ordering::Relaxed);
    if khz == 0 {
        panic!(
            "pier-rt: the TSC rate is unknown (no kvmclock); boot with pier.tsc_khz=N on the command line"
        );
    }
    (u128::from(rdtsc()) * 1_000_000 / u128::from(khz)) as u64
}

/// The TSC value at `micros` microseconds since the TSC started: the
/// timer's deadline for that moment.
pub(crate) fn tsc_at_micros(micros: u64) -> u64 {
    let khz = TSC_KHZ.load(Ordering::Relaxed);
    (u128::from(micros) * u128::from(khz) / 1000).min(u128::from(u64::MAX)) as u64
}
