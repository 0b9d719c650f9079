//! Diagnostics: facts about how the app runs, for tests and reports.

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

/// A virtio-mmio device the boot command line names and whose registers
/// answer with the virtio magic value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioDevice {
    /// Guest-physical address of its register file.
    pub base: u64,
    /// Size of its register window.
    pub size: u64,
    /// Its interrupt (an IOAPIC pin).
    pub irq: u32,
    /// The virtio-mmio `Version` register (2 for a modern device).
    pub version: u32,
    /// The virtio device ID (19 for vsock).
    pub device_id: u32,
}

/// The virtio-mmio devices of a bare-metal app's VM (none on hosted
/// targets, where devices are the host's business).
pub fn virtio_devices() -> impl Iterator<Item = VirtioDevice> {
    #[cfg(target_os = "none")]
    {
        crate::backend::bare::virtio::devices()
    }
    #[cfg(not(target_os = "none"))]
    {
        core::iter::empty()
    }
}
