//! Leaving the VM: the exit code goes out on I/O port 0xf4, and a panic
//! prints its message and exits with [`PANIC_EXIT_CODE`] (101).
//!
//! pier-vmm stops at that write and returns the 32-bit code as written;
//! QEMU's `isa-debug-exit` device at the same port stops QEMU with status
//! `(code << 1) | 1`.

use core::panic::PanicInfo;

use crate::unikernel::PANIC_EXIT_CODE;

const EXIT_PORT: u16 = 0xf4;

/// Ends the VM with `code`.
pub fn exit(code: i32) -> ! {
    // SAFETY: an I/O port write (allowed by the TSS bitmap); the hypervisor
    // stops the VM on it.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") EXIT_PORT, in("eax") code, options(nomem, nostack, preserves_flags))
    };
    // A hypervisor without an exit device lets the write pass: wait here
    // (in ring 3 `hlt` would fault) rather than run on past the app.
    loop {
        core::hint::spin_loop();
    }
}

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    match info.location() {
        Some(at) => crate::eprintln!("panicked at {at}:\n{}", info.message()),
        None => crate::eprintln!("panicked:\n{}", info.message()),
    }
    exit(PANIC_EXIT_CODE)
}
