//! Ring 3 from its first instruction: fill the IDT's gates, read the boot
//! data, run the app, exit.

use super::{clock, cmdline, exit, heap, irq, traps};

// The app's entry, which `crate::main!` defines in the app crate.
unsafe extern "Rust" {
    fn __pier_rt_main() -> i32;
}

/// The first Rust function in ring 3; `start_info` is the PVH
/// `hvm_start_info` address the hypervisor passed in `rbx`.
#[unsafe(no_mangle)]
pub(super) extern "C" fn pier_rt_user_entry(start_info: u64) -> ! {
    // SAFETY: first thing in ring 3, before anything can fault or
    // interrupt; the gates are the boot layer's entry points.
    unsafe { traps::fill(&irq::gates()) };
    // SAFETY: the boot layer maps all low memory, and the hypervisor put
    // the start_info there; nothing has written over it yet.
    let found = unsafe { cmdline::init(start_info) };
    if found {
        // SAFETY: a valid start_info (checked by `cmdline::init`), before
        // any allocation.
        unsafe { heap::init(start_info) };
    } else {
        crate::eprintln!("pier-rt: no PVH start_info at {start_info:#x}: no command line, no heap");
    }
    clock::init();
    irq::init();
    if cmdline::boot_option("pier.test") == Some("triple-fault") {
        triple_fault();
    }
    // SAFETY: `crate::main!` defines the symbol with this signature, and
    // an image cannot link without it.
    let code = unsafe { __pier_rt_main() };
    super::net::drain_before_exit();
    exit::exit(code)
}

/// Faults with the exception handler told to escalate to a triple fault
/// (see `traps`): the hypervisor's crash report is what a test of it
/// checks.
fn triple_fault() -> ! {
    super::traps::TRIPLE_FAULT_TEST.store(true, core::sync::atomic::Ordering::Relaxed);
    // SAFETY: `ud2` only raises #UD; there is no state to corrupt.
    unsafe { core::arch::asm!("ud2", options(noreturn, nomem, nostack)) }
}
