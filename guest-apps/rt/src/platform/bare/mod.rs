//! The bare-metal platform (`target_os = "none"`): the app as a bootable
//! x86-64 unikernel image, booted by pier-vmm or QEMU through PVH.
//!
//! - `boot`: the PVH note, the 32→64-bit trampoline, static page tables,
//!   GDT and TSS, and the drop to ring 3, where everything else runs;
//! - `traps`: the IDT and the one CPU-exception report;
//! - `start`: ring 3's entry: console, command line, the app, exit;
//! - `console`: COM1, the app's stdout and stderr;
//! - `clock`: the TSC at the hypervisor's rate;
//! - `cmdline`: boot options and app arguments from `hvm_start_info`;
//! - `heap`: the global allocator, over the RAM past the image;
//! - `exit`: the exit port and the panic handler;
//! - `virtio`: virtio-mmio devices named on the command line.
//!
//! The image is linked by `link.ld` (at 1 MiB, entry `pier_pvh_start`),
//! which `build.rs` puts on the linker's search path; the app's build
//! names it with `-C link-arg=-Tpier-rt.ld` and builds with
//! `-C relocation-model=static` (the trampoline's 32-bit absolute
//! addresses cannot be relocated at run time). `guest-apps/.cargo/config.toml`
//! sets both.
//!
//! - `irq`: the LAPIC and IOAPIC, the interrupt stubs, the TSC-deadline
//!   timer and the halt call;
//! - `hal`: virtio-drivers' platform layer (DMA memory from the heap);
//! - `net`: pier-driver and pier-stack, driven by the app's calls, and how
//!   a blocked call waits (poll briefly, then halt);
//! - `socket`: the sockets over the stack, and [`Bare`], the platform
//!   contract's name for them.

mod boot;
pub(crate) mod clock;
pub(crate) mod cmdline;
pub(crate) mod console;
pub(crate) mod exit;
mod hal;
mod heap;
mod irq;
pub(crate) mod net;
mod socket;
mod start;
mod traps;
pub(crate) mod virtio;

pub(crate) use socket::Bare;
