//! Facts about the unikernel that the public modules report and
//! `platform::bare` acts on: the exit code of a panic, and what a
//! virtio-mmio device is. They are plain data, kept below both, so the
//! bare platform never reaches up into [`process`](crate::process) or
//! [`diag`](crate::diag) for them.

/// The exit code of an app that panicked on bare metal: 101, Rust's own
/// code for a panic that ends a process.
pub const PANIC_EXIT_CODE: i32 = 101;

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
