//! Diagnostics: facts about how the app runs, for tests and reports.

pub use crate::unikernel::VirtioDevice;

/// The CPU privilege level the app runs at (3 in a pier unikernel, where
/// only a thin layer runs in ring 0), or `None` where there is no such
/// thing to read (WASI).
pub fn privilege_level() -> Option<u8> {
    #[cfg(target_os = "none")]
    {
        let cs: u16;
        // SAFETY: reading CS has no side effects.
        unsafe {
            core::arch::asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags))
        };
        Some((cs & 3) as u8)
    }
    #[cfg(not(target_os = "none"))]
    {
        None
    }
}

/// The virtio-mmio devices of a bare-metal app's VM (none on hosted
/// targets, where devices are the host's business).
pub fn virtio_devices() -> impl Iterator<Item = VirtioDevice> {
    #[cfg(target_os = "none")]
    {
        crate::platform::bare::virtio::devices()
    }
    #[cfg(not(target_os = "none"))]
    {
        core::iter::empty()
    }
}

/// How the stack copies payload bytes in this app: whether the vector
/// loop can run (on bare metal, only once the boot has turned the YMM
/// state on) and the strategy chosen for this CPU. For tests that check
/// the boot did its part, and for reports.
pub fn copy_routine() -> (bool, pier_stack::copy::CopyStrategy) {
    (pier_stack::copy::vector_copy_available(), pier_stack::copy::copy_strategy())
}
