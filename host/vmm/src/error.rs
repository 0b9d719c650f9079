//! What can go wrong when pier-vmm builds or runs a VM, as typed errors.
//!
//! Two kinds: the VM could not be built (bad image, bad configuration,
//! `/dev/kvm` unusable, a KVM call refused), or the guest stopped in a way
//! no healthy guest does ([`Crash`]). A crash always carries the guest's
//! registers, because "the VM died" is useless without knowing where.

use std::fmt;
use std::io;
use std::path::PathBuf;

use kvm_ioctls::VcpuFd;

/// Why a VM could not be built or did not finish cleanly.
#[derive(Debug)]
pub enum Error {
    /// The KVM device could not be opened (missing, or not permitted).
    KvmOpen {
        /// The device path that was tried, normally `/dev/kvm`.
        path: PathBuf,
        /// What `open` said.
        source: io::Error,
    },
    /// A KVM ioctl failed.
    Kvm {
        /// The operation, named after the ioctl.
        op: &'static str,
        /// The errno KVM returned.
        source: kvm_ioctls::Error,
    },
    /// The configuration cannot describe a VM (for example a memory size
    /// out of range).
    Config(String),
    /// Guest memory could not be mapped or written.
    Memory(String),
    /// The image file could not be read.
    ImageRead {
        /// The image.
        path: PathBuf,
        /// What the read said.
        source: io::Error,
    },
    /// The image is not an ELF file.
    NotElf {
        /// The image.
        path: PathBuf,
    },
    /// The image is an ELF file pier-vmm cannot boot (not ELF64 x86-64,
    /// truncated headers, segments in the boot-data area, ...).
    BadElf {
        /// The image.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The image has no PVH entry note (a Xen `PHYS32_ENTRY` ELF note), so
    /// there is no entry point pier-vmm knows how to start.
    NoPvhNote {
        /// The image.
        path: PathBuf,
    },
    /// The image's segments reach past the end of guest memory.
    ImageTooBig {
        /// The image.
        path: PathBuf,
        /// The first guest-physical address past the image.
        image_end: u64,
        /// The configured guest memory size.
        mem_size: u64,
    },
    /// linux-loader refused the image after pier-vmm's own checks passed.
    Load {
        /// The image.
        path: PathBuf,
        /// linux-loader's description.
        reason: String,
    },
    /// The kernel command line could not be built (too long, bad
    /// characters).
    Cmdline(String),
    /// The vsock device could not be set up or its thread failed.
    Device(io::Error),
    /// The signal that kicks the vCPU out of KVM_RUN (for
    /// `StopHandle`) could not get its handler.
    KickSignal(io::Error),
    /// The guest crashed; see [`Crash`].
    Crash(Crash),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KvmOpen { path, source } => {
                write!(f, "cannot open {}: {source}", path.display())?;
                match source.kind() {
                    io::ErrorKind::NotFound => write!(
                        f,
                        " (KVM is not available: load the kvm module, or run where \
                         hardware virtualisation is exposed)"
                    ),
                    io::ErrorKind::PermissionDenied => write!(
                        f,
                        " (add your user to the group owning {}, usually `kvm`)",
                        path.display()
                    ),
                    _ => Ok(()),
                }
            }
            Self::Kvm { op, source } => write!(f, "KVM {op} failed: {source}"),
            Self::Config(e) => write!(f, "bad VM configuration: {e}"),
            Self::Memory(e) => write!(f, "guest memory: {e}"),
            Self::ImageRead { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            Self::NotElf { path } => write!(f, "{} is not an ELF file", path.display()),
            Self::BadElf { path, reason } => {
                write!(f, "{} cannot be booted: {reason}", path.display())
            }
            Self::NoPvhNote { path } => write!(
                f,
                "{} has no PVH entry note (an ELF note named \"Xen\" of type 18), so it is not a \
                 PVH boot image",
                path.display()
            ),
            Self::ImageTooBig { path, image_end, mem_size } => write!(
                f,
                "{} needs guest memory up to {image_end:#x} ({} KiB) but the VM has {} KiB; \
                 give it more memory",
                path.display(),
                image_end.div_ceil(1024),
                mem_size / 1024
            ),
            Self::Load { path, reason } => write!(f, "loading {}: {reason}", path.display()),
            Self::Cmdline(e) => write!(f, "kernel command line: {e}"),
            Self::Device(e) => write!(f, "vsock device: {e}"),
            Self::KickSignal(e) => write!(f, "installing the vCPU kick signal's handler: {e}"),
            Self::Crash(c) => write!(f, "{c}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::KvmOpen { source, .. } | Self::ImageRead { source, .. } => Some(source),
            Self::Kvm { source, .. } => Some(source),
            Self::Device(e) | Self::KickSignal(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Crash> for Error {
    fn from(c: Crash) -> Self {
        Self::Crash(c)
    }
}

/// Wraps a failed KVM call with its name.
pub(crate) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { op, source }
}

/// How a guest died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashKind {
    /// KVM_EXIT_SHUTDOWN: a triple fault (an exception while delivering a
    /// double fault), or a guest-initiated reset.
    Shutdown,
    /// KVM_EXIT_INTERNAL_ERROR: KVM could not go on (on nested or
    /// emulating hosts, typically an instruction its emulator refuses).
    InternalError {
        /// KVM's `suberror` (1 = emulation failure, 2 = simultaneous
        /// exceptions, 3 = unknown exit reason, 4 = delivery event).
        suberror: u32,
        /// The first words of KVM's diagnostic data.
        data: Vec<u64>,
    },
    /// KVM_EXIT_FAIL_ENTRY: the hardware refused to enter the guest.
    FailEntry {
        /// The hardware's reason code.
        reason: u64,
    },
    /// KVM_EXIT_SYSTEM_EVENT: the guest asked for a reset or power-off
    /// some other way than the exit port.
    SystemEvent {
        /// KVM's event type.
        kind: u32,
    },
    /// An exit pier-vmm does not handle.
    Unhandled(String),
}

impl fmt::Display for CrashKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shutdown => write!(f, "shut down (triple fault)"),
            Self::InternalError { suberror, data } => {
                write!(f, "hit a KVM internal error (suberror {suberror}, data {data:x?})")
            }
            Self::FailEntry { reason } => write!(f, "could not be entered (reason {reason:#x})"),
            Self::SystemEvent { kind } => write!(f, "raised system event {kind}"),
            Self::Unhandled(exit) => write!(f, "made an exit pier-vmm does not handle: {exit}"),
        }
    }
}

/// A guest that stopped without writing its exit code, and where it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    /// What happened.
    pub kind: CrashKind,
    /// The vCPU's registers at that moment (`None` if KVM would not give
    /// them).
    pub regs: Option<GuestRegisters>,
}

impl fmt::Display for Crash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the guest {}", self.kind)?;
        match &self.regs {
            Some(r) => write!(f, "; {r}"),
            None => write!(f, "; its registers could not be read"),
        }
    }
}

/// The registers that say where a guest was and in what mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestRegisters {
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Flags.
    pub rflags: u64,
    /// Control registers: protection/paging, fault address, page-table
    /// root, extensions.
    pub cr0: u64,
    /// The last page-fault address.
    pub cr2: u64,
    /// The page-table root.
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER (long mode, syscall enable, ...).
    pub efer: u64,
    /// The code segment selector; its low two bits are the privilege
    /// level the guest ran at.
    pub cs: u16,
}

impl GuestRegisters {
    /// Reads the registers of `vcpu`.
    pub(crate) fn read(vcpu: &VcpuFd) -> Option<Self> {
        let regs = vcpu.get_regs().ok()?;
        let sregs = vcpu.get_sregs().ok()?;
        Some(Self {
            rip: regs.rip,
            rsp: regs.rsp,
            rflags: regs.rflags,
            cr0: sregs.cr0,
            cr2: sregs.cr2,
            cr3: sregs.cr3,
            cr4: sregs.cr4,
            efer: sregs.efer,
            cs: sregs.cs.selector,
        })
    }
}

impl fmt::Display for GuestRegisters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rip={:#x} rsp={:#x} rflags={:#x} cs={:#x} (ring {}) cr0={:#x} cr2={:#x} cr3={:#x} \
             cr4={:#x} efer={:#x}",
            self.rip,
            self.rsp,
            self.rflags,
            self.cs,
            self.cs & 3,
            self.cr0,
            self.cr2,
            self.cr3,
            self.cr4,
            self.efer
        )
    }
}
