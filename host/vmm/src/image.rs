//! The boot image: check it, load it, and write what a PVH entry expects.
//!
//! pier boots one format, an ELF64 with a PVH note (Xen's
//! `XEN_ELFNOTE_PHYS32_ENTRY`, note type 18): the CPU starts at the note's
//! address in 32-bit protected mode with paging off, and `rbx` points at an
//! `hvm_start_info` (magic, command line, memory map). The same image
//! boots under QEMU `-kernel`.
//!
//! linux-loader does the loading, but it reports problems vaguely ("Invalid
//! entry address" for a host executable, a memory write error for an image
//! that does not fit), so [`inspect`] reads the headers first and turns
//! each problem into its own [`Error`]. linux-loader finds the PVH note only
//! when it is given no load offset, so segments land at their physical
//! addresses (`p_paddr`); it copies `p_filesz` bytes and leaves the rest of
//! each segment (`.bss`) as it is, which is zero in fresh guest memory.

use std::io::Cursor;
use std::path::Path;

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::Elf;
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_start_info};
use linux_loader::loader::{KernelLoader, PvhBootCapability, load_cmdline};
use vm_memory::{Address, GuestAddress, GuestMemoryMmap};

use crate::error::Error;
use crate::layout;

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const EM_X86_64: u16 = 62;
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// `hvm_start_info.magic`.
const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
/// E820 type of ordinary RAM.
const E820_RAM: u32 = 1;

/// What [`inspect`] learned from an image's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ImageInfo {
    /// The PVH entry point (32-bit, physical).
    pub pvh_entry: u64,
    /// The first guest-physical address past every loadable segment.
    pub end: u64,
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Checks that `bytes` (the image at `path`) is a bootable PVH ELF64 that
/// fits `mem_size` bytes of guest memory.
pub(crate) fn inspect(path: &Path, bytes: &[u8], mem_size: u64) -> Result<ImageInfo, Error> {
    if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err(Error::NotElf { path: path.to_owned() });
    }
    let bad = |reason: &str| Error::BadElf { path: path.to_owned(), reason: reason.to_owned() };
    let truncated = || bad("its headers are truncated");
    if bytes.get(4) != Some(&2) {
        return Err(bad("it is not a 64-bit ELF (PVH images must be ELF64)"));
    }
    if bytes.get(5) != Some(&1) {
        return Err(bad("it is not little-endian"));
    }
    if le_u16(bytes, 18).ok_or_else(truncated)? != EM_X86_64 {
        return Err(bad("it is not built for x86-64"));
    }
    let phoff = le_u64(bytes, 32).ok_or_else(truncated)?;
    let phentsize = usize::from(le_u16(bytes, 54).ok_or_else(truncated)?);
    let phnum = usize::from(le_u16(bytes, 56).ok_or_else(truncated)?);
    if phentsize < 56 {
        return Err(bad("its program header entries are too small"));
    }
    let phoff = usize::try_from(phoff).map_err(|_| truncated())?;
    let mut end = 0u64;
    let mut pvh_entry = None;
    for i in 0..phnum {
        let ph = phoff
            .checked_add(i * phentsize)
            .and_then(|at| bytes.get(at..at.checked_add(56)?))
            .ok_or_else(truncated)?;
        let p_type = le_u32(ph, 0).ok_or_else(truncated)?;
        let offset = le_u64(ph, 8).ok_or_else(truncated)?;
        let paddr = le_u64(ph, 24).ok_or_else(truncated)?;
        let filesz = le_u64(ph, 32).ok_or_else(truncated)?;
        let memsz = le_u64(ph, 40).ok_or_else(truncated)?;
        match p_type {
            PT_LOAD if memsz > 0 => {
                if paddr < layout::HIMEM_START {
                    return Err(bad(&format!(
                        "a segment loads at {paddr:#x}, below 1 MiB where the boot data goes"
                    )));
                }
                let seg_end = paddr
                    .checked_add(memsz)
                    .filter(|_| filesz <= memsz)
                    .ok_or_else(|| bad("a segment's size overflows"))?;
                end = end.max(seg_end);
            }
            PT_NOTE => {
                let notes = usize::try_from(offset)
                    .ok()
                    .zip(usize::try_from(filesz).ok())
                    .and_then(|(o, n)| bytes.get(o..o.checked_add(n)?))
                    .ok_or_else(truncated)?;
                pvh_entry = pvh_entry.or_else(|| find_pvh_note(notes));
            }
            _ => {}
        }
    }
    let pvh_entry = pvh_entry.ok_or_else(|| Error::NoPvhNote { path: path.to_owned() })?;
    if end == 0 {
        return Err(bad("it has no loadable segment"));
    }
    if end > mem_size {
        return Err(Error::ImageTooBig { path: path.to_owned(), image_end: end, mem_size });
    }
    Ok(ImageInfo { pvh_entry, end })
}

/// The entry address of the first `Xen` note of type `PHYS32_ENTRY` in a
/// note segment. The descriptor may be 4 or 8 bytes; the entry is its low
/// 32 bits either way (the address is a 32-bit physical one).
fn find_pvh_note(mut notes: &[u8]) -> Option<u64> {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let namesz = usize::try_from(le_u32(notes, 0)?).ok()?;
        let descsz = usize::try_from(le_u32(notes, 4)?).ok()?;
        let kind = le_u32(notes, 8)?;
        let desc_at = 12usize.checked_add(align4(namesz)?)?;
        let next = desc_at.checked_add(align4(descsz)?)?;
        let name = notes.get(12..12 + namesz)?;
        if name == b"Xen\0" && kind == XEN_ELFNOTE_PHYS32_ENTRY && descsz >= 4 {
            return le_u32(notes, desc_at).map(u64::from);
        }
        notes = notes.get(next..)?;
    }
    None
}

/// Loads the image into guest memory with linux-loader and returns its PVH
/// entry point.
pub(crate) fn load(
    path: &Path,
    bytes: &[u8],
    mem: &GuestMemoryMmap,
    info: ImageInfo,
) -> Result<u64, Error> {
    let mut file = Cursor::new(bytes);
    let loaded = Elf::load(mem, None, &mut file, Some(GuestAddress(layout::HIMEM_START)))
        .map_err(|e| Error::Load { path: path.to_owned(), reason: e.to_string() })?;
    match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) if entry.raw_value() == info.pvh_entry => {
            Ok(entry.raw_value())
        }
        other => Err(Error::Load {
            path: path.to_owned(),
            reason: format!(
                "linux-loader found {other:?}, pier-vmm's reading found the entry at {:#x}",
                info.pvh_entry
            ),
        }),
    }
}

/// Writes the command line, the memory map and `hvm_start_info` into guest
/// memory at their fixed places ([`layout`]); returns the start_info
/// address, which goes in `rbx` at entry.
pub(crate) fn write_boot_data(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    cmdline: &Cmdline,
) -> Result<u64, Error> {
    load_cmdline(mem, GuestAddress(layout::CMDLINE_START), cmdline)
        .map_err(|e| Error::Cmdline(e.to_string()))?;
    let memmap = [
        hvm_memmap_table_entry { addr: 0, size: layout::LOW_RAM_END, type_: E820_RAM, reserved: 0 },
        hvm_memmap_table_entry {
            addr: layout::HIMEM_START,
            size: mem_size - layout::HIMEM_START,
            type_: E820_RAM,
            reserved: 0,
        },
    ];
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: layout::CMDLINE_START,
        memmap_paddr: layout::MEMMAP_START,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(layout::START_INFO));
    params.set_sections(&memmap, GuestAddress(layout::MEMMAP_START));
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)
        .map_err(|e| Error::Memory(format!("writing the PVH start_info: {e}")))?;
    Ok(layout::START_INFO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend_from_slice(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    #[test]
    fn finds_the_pvh_note_after_others_with_either_descriptor_size() {
        let mut notes = note(b"GNU\0", 3, &[1, 2, 3, 4, 5]);
        notes.extend(note(b"Xen\0", 18, &0x10_0000u64.to_le_bytes()));
        assert_eq!(find_pvh_note(&notes), Some(0x10_0000));
        assert_eq!(
            find_pvh_note(&note(b"Xen\0", 18, &0x20_0000u32.to_le_bytes())),
            Some(0x20_0000)
        );
        assert_eq!(find_pvh_note(&note(b"Xen\0", 17, &[0; 8])), None);
        assert_eq!(find_pvh_note(&[0xff; 11]), None);
    }

    #[test]
    fn hostile_headers_are_errors_not_panics() {
        let path = Path::new("x");
        let mut elf = b"\x7fELF\x02\x01".to_vec();
        elf.resize(64, 0);
        elf[18] = 62;
        elf[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[54] = 56;
        elf[56] = 200;
        assert!(matches!(inspect(path, &elf, 1 << 20), Err(Error::BadElf { .. })));
        assert!(matches!(inspect(path, b"\x7fEL", 1 << 20), Err(Error::NotElf { .. })));
    }
}
