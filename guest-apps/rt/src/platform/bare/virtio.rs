//! Finding virtio-mmio devices: the `virtio_mmio.device=SIZE@ADDR:IRQ`
//! words of the boot command line (pier-vmm writes one for its vsock
//! device; QEMU's microvm writes them with `acpi=off`), each checked
//! through its registers (magic, version, device ID).
//!
//! When the command line names none (a hypervisor told not to, such as
//! microvm with `auto-kernel-cmdline=off`), the windows where the common
//! VMMs put their slots are scanned instead, IRQs by their convention:
//! Firecracker's and pier-vmm's (4 KiB slots from 0xd000_0000, IRQ 5 on),
//! and QEMU microvm's (512-byte slots from 0xfeb0_0000, IRQ 5 on).
//!
//! Register reads are MMIO exits to the hypervisor (over 10 µs each on a
//! nested host), so devices are probed when asked for, not at boot.

use crate::unikernel::VirtioDevice;

use super::cmdline;

/// "virt", the first register of every virtio-mmio device.
const MAGIC: u32 = 0x7472_6976;

/// Slots scanned when the command line names no device: (first slot's
/// address, slot size, IRQ of the first slot).
const SCANNED_WINDOWS: [(u64, u64, u32); 2] = [(0xd000_0000, 0x1000, 5), (0xfeb0_0000, 0x200, 5)];
/// Slots scanned in each window.
const SCANNED_SLOTS: u64 = 8;

/// The devices the command line names whose registers answer, or, when
/// it names none, the devices the scan finds.
pub(crate) fn devices() -> impl Iterator<Item = VirtioDevice> {
    windows().filter_map(probe).filter(|d| d.device_id != 0)
}

/// The windows a device may answer in, `(base, size, irq)`, not yet read:
/// the ones the command line names, or, when it names none, the scanned
/// slots. Each lies in the identity-mapped MMIO range and is large enough
/// for the virtio-mmio registers. A caller that reads the registers anyway
/// (virtio-drivers' `MmioTransport::new` checks the magic and reads the
/// version and device ID) takes windows rather than [`devices`], and
/// saves the three exits of a second probe.
pub(crate) fn windows() -> impl Iterator<Item = (u64, u64, u32)> {
    let named = cmdline::boot_options("virtio_mmio.device").next().is_some();
    let from_cmdline = cmdline::boot_options("virtio_mmio.device").filter_map(parse);
    let scanned =
        SCANNED_WINDOWS.into_iter().filter(move |_| !named).flat_map(|(base, size, irq)| {
            (0..SCANNED_SLOTS).map(move |i| (base + i * size, size, irq + i as u32))
        });
    from_cmdline.chain(scanned).filter(|&(base, size, _)| {
        size >= 0x100 && base.checked_add(size).is_some_and(|end| end <= 1 << 32)
    })
}

/// Parses `SIZE@ADDR:IRQ` (SIZE with an optional K, M or G suffix;
/// numbers in decimal or `0x` hex) into `(base, size, irq)`.
fn parse(value: &str) -> Option<(u64, u64, u32)> {
    let (size, rest) = value.split_once('@')?;
    let (addr, irq) = rest.split_once(':')?;
    let (digits, shift) = match size.as_bytes().last()? {
        b'K' | b'k' => (&size[..size.len() - 1], 10),
        b'M' | b'm' => (&size[..size.len() - 1], 20),
        b'G' | b'g' => (&size[..size.len() - 1], 30),
        _ => (size, 0),
    };
    let size = number(digits)?.checked_shl(shift)?;
    Some((number(addr)?, size, u32::try_from(number(irq)?).ok()?))
}

fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn probe((base, size, irq): (u64, u64, u32)) -> Option<VirtioDevice> {
    let reg = |offset: u64| {
        // SAFETY: the boot layer identity-maps the low 4 GiB (uncached in
        // the MMIO window) and `windows` checked the range lies there; a read
        // of a device register has no effect beyond the read.
        unsafe { ((base + offset) as *const u32).read_volatile() }
    };
    if reg(0) != MAGIC {
        return None;
    }
    Some(VirtioDevice { base, size, irq, version: reg(4), device_id: reg(8) })
}
