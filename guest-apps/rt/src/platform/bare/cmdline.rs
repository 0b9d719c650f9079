//! The command line the hypervisor passed in the PVH `hvm_start_info`:
//! boot options (`key=value` words) for pier-rt, then `--` and the app's
//! arguments. Words are separated by spaces; there is no quoting.
//!
//! One exception: QEMU's microvm appends its `virtio_mmio.device=` words
//! at the very end, after whatever `-append` gave, so after the `--`.
//! Those words are boot options wherever they stand, and never app
//! arguments.
//!
//! It is copied out of the hypervisor's low-memory page at boot, so that
//! page can be reused later.

use core::cell::UnsafeCell;

/// `hvm_start_info.magic`.
const START_INFO_MAGIC: u32 = 0x336e_c578;
/// Offset of `cmdline_paddr` in `hvm_start_info`.
const CMDLINE_PADDR: usize = 24;
const MAX_LEN: usize = 4096;

struct Buffer {
    bytes: UnsafeCell<[u8; MAX_LEN]>,
    len: UnsafeCell<usize>,
}

// SAFETY: written once by `init`, on the only CPU, before the app runs;
// read-only after.
unsafe impl Sync for Buffer {}

static CMDLINE: Buffer = Buffer { bytes: UnsafeCell::new([0; MAX_LEN]), len: UnsafeCell::new(0) };

/// Copies the command line out of `hvm_start_info`; returns whether there
/// was a valid start_info.
///
/// # Safety
///
/// `start_info` must be mapped (it is, in the boot layer's identity map),
/// and this must run once, before anything reads the command line.
pub(crate) unsafe fn init(start_info: u64) -> bool {
    let base = start_info as *const u8;
    // SAFETY: mapped, per the contract; unaligned reads for any layout.
    let magic = unsafe { base.cast::<u32>().read_unaligned() };
    if start_info == 0 || magic != START_INFO_MAGIC {
        return false;
    }
    // SAFETY: as above.
    let paddr = unsafe { base.add(CMDLINE_PADDR).cast::<u64>().read_unaligned() };
    if paddr == 0 {
        return true;
    }
    let src = paddr as *const u8;
    // SAFETY: `init` runs once before any reader (contract), so this is
    // the only reference to the buffer.
    let (buf, len) = unsafe { (&mut *CMDLINE.bytes.get(), &mut *CMDLINE.len.get()) };
    let mut n = 0;
    while n < MAX_LEN {
        // SAFETY: the hypervisor's NUL-terminated string, in mapped memory.
        let b = unsafe { src.add(n).read_volatile() };
        if b == 0 {
            break;
        }
        buf[n] = b;
        n += 1;
    }
    *len = n;
    true
}

/// The whole command line (empty when there was none, or when it was not
/// UTF-8).
pub fn cmdline() -> &'static str {
    // SAFETY: written only by `init`, before any reader.
    let (buf, len) = unsafe { (&*CMDLINE.bytes.get(), *CMDLINE.len.get()) };
    core::str::from_utf8(&buf[..len]).unwrap_or("")
}

/// The part before `--`, and the part after it.
fn split() -> (&'static str, &'static str) {
    let line = cmdline();
    let mut at = 0;
    for word in line.split(' ') {
        if word == "--" {
            return (&line[..at], &line[at + 2..]);
        }
        at += word.len() + 1;
    }
    (line, "")
}

/// The value of boot option `key` (`key=value` before `--`), if given.
pub fn boot_option(key: &str) -> Option<&'static str> {
    boot_options(key).next()
}

/// The option hypervisors add after the app's arguments (see the module
/// documentation).
const APPENDED_OPTION: &str = "virtio_mmio.device=";

/// Every value of boot option `key`, in order (some, like
/// `virtio_mmio.device`, may be given more than once).
pub fn boot_options(key: &str) -> impl Iterator<Item = &'static str> {
    let (options, args) = split();
    let appended = args.split(' ').filter(|w| w.starts_with(APPENDED_OPTION));
    options
        .split(' ')
        .chain(appended)
        .filter_map(move |word| word.strip_prefix(key)?.strip_prefix('='))
}

/// The app's arguments: the words after `--`, less those a hypervisor
/// appended.
pub fn app_args() -> impl Iterator<Item = &'static str> {
    split().1.split(' ').filter(|w| !w.is_empty() && !w.starts_with(APPENDED_OPTION))
}
