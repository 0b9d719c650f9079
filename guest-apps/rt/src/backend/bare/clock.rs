//! The monotonic clock: the TSC, read in ring 3 (about 10 ns), at the rate
//! the hypervisor passed as `pier.tsc_khz` (pier-vmm reads it with
//! KVM_GET_TSC_KHZ; no CPUID leaf gives it on every host).

use core::sync::atomic::{AtomicU64, Ordering};

use super::cmdline;

/// TSC ticks per millisecond; 0 until `init` found the rate.
static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// Reads the rate from the command line.
pub(crate) fn init() {
    if let Some(khz) = cmdline::boot_option("pier.tsc_khz").and_then(|v| v.parse::<u64>().ok()) {
        TSC_KHZ.store(khz, Ordering::Relaxed);
    }
}

fn rdtsc() -> u64 {
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
        panic!("pier-rt: the TSC rate is unknown; boot with pier.tsc_khz=N on the command line");
    }
    (u128::from(rdtsc()) * 1_000_000 / u128::from(khz)) as u64
}

/// The TSC value at `micros` microseconds since the TSC started: the
/// timer's deadline for that moment.
pub(crate) fn tsc_at_micros(micros: u64) -> u64 {
    let khz = TSC_KHZ.load(Ordering::Relaxed);
    (u128::from(micros) * u128::from(khz) / 1000).min(u128::from(u64::MAX)) as u64
}
