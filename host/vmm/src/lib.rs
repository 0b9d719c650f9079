//! pier-vmm: pier's hypervisor, and the only crate that touches KVM.
//!
//! It boots a unikernel image (an ELF64 with a PVH note, see [`image`]) in
//! a KVM VM with one vCPU and KVM's in-kernel interrupt controllers, and
//! runs it until the guest writes its exit code to the exit port, or dies.
//!
//! What the guest sees:
//!
//! - RAM from 0 to [`VmConfig::mem_size`], described by the PVH memory
//!   map; the layout is in [`layout`];
//! - a 16550 serial port at COM1 (I/O ports 0x3f8–0x3ff), whose output goes
//!   to the [`VmConfig::serial`] sink (stdout for `pier boot`);
//! - the exit port, I/O port 0xf4 ([`EXIT_PORT`]): a 32-bit write of code
//!   `c` stops the VM and [`Vm::run`] returns `Ok(Exit::Code(c))`. It is the port of
//!   QEMU's `isa-debug-exit`, so the same image stops QEMU too, whose own
//!   exit status is then `(c << 1) | 1`;
//! - a command line: `virtio_mmio.device=4K@0xd0000000:5` (where the vsock
//!   device sits), `pier.tsc_khz=N` (the TSC rate, from
//!   `KVM_GET_TSC_KHZ`, since no CPUID leaf has it on every host), then
//!   [`VmConfig::boot_args`], then `--` and [`VmConfig::app_args`];
//! - CPUID as KVM supports it, plus the TSC-deadline bit (see [`cpu`]).
//!
//! A guest that stops any other way (a triple fault, a KVM internal
//! error, an exit pier-vmm does not handle) makes [`Vm::run`] return
//! [`Error::Crash`] with what happened and the guest's registers; it never
//! hangs the caller on such a guest. A guest that runs or halts forever is
//! stopped from another thread with a [`StopHandle`].
//!
//! Modules: [`error`] (the typed errors), [`image`] (checking and loading
//! the ELF, the PVH boot data), [`cpu`] (CPUID and the entry registers),
//! [`layout`] (guest-physical addresses), [`vsock`] (pier-device's
//! virtio-vsock device on KVM: MMIO exits, ioeventfds, irqfd, the bridge),
//! `coalesced` (the device's setup registers written without exits).
//!
//! [`Vm::new`] does everything at once. [`PreparedVm`] splits it: what does
//! not depend on the image (the VM, its memory registered, the vCPU) ahead
//! of time, then [`PreparedVm::boot`] with an [`Image`]; `pier pool` keeps
//! such VMs waiting. [`PreparedVm::preboot`] goes further: the guest runs
//! ([`Vm::run_until_paused`]) before its device's host side exists, which
//! [`Vm::start_device`] binds when a user asks for the guest.

mod coalesced;
pub mod cpu;
pub mod error;
pub mod image;
pub mod layout;
pub mod vsock;

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use linux_loader::cmdline::Cmdline;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vm_superio::Serial;
use vm_superio::serial::NoEvents;

pub use error::{Crash, CrashKind, Error, GuestRegisters};
pub use pier_device::DeviceStats;
pub use pier_device::capture::CaptureReport;
pub use pier_device::{CaptureSpec, DeviceSpec, GuestCid};
pub use vsock::{Fault, FaultInjector, StatsHandle};

/// The I/O port a guest writes its 32-bit exit code to.
pub const EXIT_PORT: u16 = 0xf4;
/// COM1's first I/O port; the 16550 spans eight.
pub const COM1: u16 = 0x3f8;
/// The default guest memory size.
pub const DEFAULT_MEM_SIZE: u64 = 128 << 20;

/// How to build a VM.
pub struct VmConfig {
    /// Guest RAM in bytes: a multiple of 4 KiB, from
    /// [`layout::MIN_MEM_SIZE`] to [`layout::MAX_MEM_SIZE`].
    pub mem_size: u64,
    /// The KVM device, normally `/dev/kvm`.
    pub kvm_path: PathBuf,
    /// Options for the image's boot layer, before `--` on the command line
    /// (for example `pier.test=triple-fault`).
    pub boot_args: Vec<String>,
    /// The app's arguments, after `--` on the command line.
    pub app_args: Vec<String>,
    /// Where the guest's serial console goes.
    pub serial: Box<dyn Write + Send>,
    /// The vsock device and its host sockets; `None` leaves the slot on
    /// the command line empty (the guest reads no device there).
    pub vsock: Option<DeviceSpec>,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            mem_size: DEFAULT_MEM_SIZE,
            kvm_path: PathBuf::from("/dev/kvm"),
            boot_args: Vec::new(),
            app_args: Vec::new(),
            serial: Box::new(io::stdout()),
            vsock: None,
        }
    }
}

impl fmt::Debug for VmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmConfig")
            .field("mem_size", &self.mem_size)
            .field("kvm_path", &self.kvm_path)
            .field("boot_args", &self.boot_args)
            .field("app_args", &self.app_args)
            .field("vsock", &self.vsock)
            .finish_non_exhaustive()
    }
}

/// The serial port's interrupt line: not wired, because the guest's
/// console polls and never enables the UART's interrupts.
struct NoIrq;

impl vm_superio::Trigger for NoIrq {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        Ok(())
    }
}

/// How a run ended, when it ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The guest wrote this code to [`EXIT_PORT`].
    Code(u32),
    /// [`StopHandle::stop`] stopped it.
    Stopped,
}

/// Stops a VM from another thread (Ctrl-C, a timeout), wherever the guest
/// is: running, spinning, or halted with interrupts off.
#[derive(Clone, Debug)]
pub struct StopHandle {
    state: Arc<StopState>,
    /// The vsock device's, for a stop that comes once the guest is done.
    device: Option<vsock::UrgentStop>,
}

#[derive(Debug, Default)]
struct StopState {
    requested: AtomicBool,
    /// A [`PauseHandle`] asks [`Vm::run_until_paused`] to return.
    pause_requested: AtomicBool,
    /// [`Vm::run`] has returned: what is left is the device's stop.
    ran: AtomicBool,
    /// The thread inside [`Vm::run_until_paused`], while it is there.
    vcpu_thread: Mutex<Option<libc::pthread_t>>,
}

impl StopHandle {
    /// Asks the VM to stop and waits until [`Vm::run`] has returned
    /// [`Exit::Stopped`] (at once if it is not running; a later `run`
    /// returns at once).
    ///
    /// A stop asked for again, or once `run` has returned, is a user who
    /// will not wait (a second Ctrl-C, or one while pier finishes): the
    /// stopping vsock device then drops the guest's last bytes that host
    /// programs have not read yet instead of waiting up to 5 s for them.
    ///
    /// KVM_RUN returns only on an exit, so the vCPU thread is sent a
    /// signal, which interrupts the ioctl.
    pub fn stop(&self) {
        let asked_before = self.state.requested.swap(true, Ordering::SeqCst);
        if (asked_before || self.state.ran.load(Ordering::SeqCst))
            && let Some(device) = &self.device
        {
            device.make_urgent();
        }
        kick_until_returned(&self.state, || false);
    }
}

/// Pauses a VM that [`Vm::run_until_paused`] runs, from another thread.
#[derive(Clone, Debug)]
pub struct PauseHandle(Arc<StopState>);

impl PauseHandle {
    /// Asks the run to return `Ok(None)` wherever the guest is (running,
    /// or halted waiting for an interrupt), and waits until the vCPU
    /// thread has left it; a run that starts later returns at once. The
    /// guest's state stays whole: a later run continues it.
    pub fn pause(&self) {
        let state = &self.0;
        state.pause_requested.store(true, Ordering::SeqCst);
        // Until the run took the request: the thread may be inside a run
        // again by the time this looks (a [`Vm::run`] goes on after it).
        kick_until_returned(state, || !state.pause_requested.load(Ordering::SeqCst));
    }
}

/// Signals the vCPU thread until it has left [`Vm::run_until_paused`], or
/// `done` says the request was taken: KVM_RUN returns only on an exit,
/// and a signal that lands just before the thread enters KVM_RUN is lost,
/// so it is repeated until the run loop has seen the request.
fn kick_until_returned(state: &StopState, done: impl Fn() -> bool) {
    loop {
        if done() {
            return;
        }
        {
            let thread = state.vcpu_thread.lock().unwrap_or_else(|p| p.into_inner());
            let Some(thread) = *thread else { return };
            // SAFETY: the thread is alive: the run clears the field, under
            // this lock, before it returns.
            unsafe { libc::pthread_kill(thread, kick_signal()) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The real-time signal that kicks a vCPU thread out of KVM_RUN.
fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN() + 1
}

extern "C" fn ignore_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the kick signal's handler, once per process: a handler that
/// does nothing, without `SA_RESTART`, so a blocked KVM_RUN returns EINTR
/// instead of the process dying of the signal.
fn install_kick_handler() -> Result<(), Error> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        vmm_sys_util::signal::register_signal_handler(kick_signal(), ignore_kick)
            .map_err(|e| e.errno())
    });
    installed.map_err(|errno| Error::KickSignal(io::Error::from_raw_os_error(errno)))
}

/// Clears the running thread when [`Vm::run_until_paused`] returns,
/// however it returns.
struct RunningGuard<'a>(&'a StopState);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        *self.0.vcpu_thread.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A VM ready to run: memory loaded, vCPU at the PVH entry.
pub struct Vm {
    /// Kept open for the VM's lifetime (KVM holds its own references, but
    /// the VM file descriptor is what owns the guest).
    _vm: VmFd,
    vcpu: VcpuFd,
    /// Writes to the device's setup registers that KVM queued
    /// instead of exiting (see `coalesced`), when it does.
    coalesced: Option<coalesced::QueuedWrites>,
    /// Mapped into the VM; must outlive it (the device holds it too).
    _mem: Arc<GuestMemoryMmap>,
    /// Its thread stops, and the bridge removes its socket files, when the
    /// VM is dropped.
    vsock: Option<vsock::VmVsock>,
    serial: Serial<NoIrq, NoEvents, Box<dyn Write + Send>>,
    tsc_khz: Option<u32>,
    stop: Arc<StopState>,
    /// How a run before [`Self::run`] ended, which `run` then returns
    /// ([`Self::keep_end`]).
    ended: Option<Result<Exit, Error>>,
}

impl fmt::Debug for Vm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vm").field("tsc_khz", &self.tsc_khz).finish_non_exhaustive()
    }
}

impl Vm {
    /// Builds a VM that boots `image` as `config` says. Every problem with
    /// the image or the host comes back as an [`Error`] before any guest
    /// code runs.
    pub fn new(image: &Path, config: VmConfig) -> Result<Self, Error> {
        check_mem_size(config.mem_size)?;
        let image = Image::read(image)?;
        let info = image.inspect(config.mem_size)?;
        let machine = Machine::new(config.mem_size, &config.kvm_path)?;
        // KVM_SET_USER_MEMORY_REGION waits for an SRCU grace period: 4 to
        // 9 ms on a nested host whatever the size, the longest step of
        // boot. Nothing else here needs it (the vCPU, CPUID, loading the
        // image into the mapping, the entry registers), so it runs beside
        // them; the device's KVM_IOEVENTFD, which takes the same lock,
        // comes after.
        let (vcpu, tsc_khz) = machine.beside_registration(|machine| {
            let (vcpu, tsc_khz) = machine.create_vcpu()?;
            load_guest(&vcpu, &machine.mem, &image, info, &config, tsc_khz)?;
            Ok((vcpu, tsc_khz))
        })?;
        let coalesced = machine.coalesce(&vcpu);
        machine.into_vm(vcpu, coalesced, tsc_khz, config, DeviceStart::Now)
    }

    /// Reads the vsock device's counters from any thread (`None` without a
    /// vsock device).
    pub fn stats_handle(&self) -> Option<StatsHandle> {
        self.vsock.as_ref().and_then(vsock::VmVsock::stats_handle)
    }

    /// Sets off faults in the vsock device from any thread (`None` without
    /// a vsock device); for tests.
    pub fn fault_injector(&self) -> Option<FaultInjector> {
        self.vsock.as_ref().and_then(vsock::VmVsock::fault_injector)
    }

    /// Ends the packet capture, if one runs: what is queued is written and
    /// the file flushed. Returns its final counters. Call it after
    /// [`Self::run`], before the VM is dropped.
    pub fn finish_capture(&self) -> Option<CaptureReport> {
        self.vsock.as_ref()?.capture().map(|c| c.finish())
    }

    /// Stops the vsock device once [`Self::run`] has returned, as dropping
    /// the VM would: guest bytes its host stack still holds go to their
    /// host programs first (for as long as they read), so the counters a
    /// [`StatsHandle`] reads afterwards are the device's last, with those
    /// bytes in them. Fails only if the device thread could not be
    /// stopped cleanly.
    pub fn stop_device(&self) -> io::Result<()> {
        self.vsock.as_ref().map_or(Ok(()), vsock::VmVsock::stop)
    }

    /// The TSC rate passed to the guest, if KVM reported one.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.tsc_khz
    }

    /// A handle that stops [`Self::run`] from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            state: self.stop.clone(),
            device: self.vsock.as_ref().and_then(vsock::VmVsock::urgent_stop),
        }
    }

    /// A handle that pauses [`Self::run_until_paused`] from another thread.
    pub fn pause_handle(&self) -> PauseHandle {
        PauseHandle(self.stop.clone())
    }

    /// Starts the vsock device of a VM made by [`PreparedVm::preboot`],
    /// with `spec`'s host side: its socket is bound now, and the loop
    /// answers the kicks the guest made meanwhile. `spec` must name the
    /// CID the VM was prebooted with. A device already running is left
    /// as it is.
    pub fn start_device(&mut self, spec: &DeviceSpec) -> Result<(), Error> {
        match &mut self.vsock {
            Some(device) => device.start(spec),
            None => Err(Error::Config("this VM has no vsock device to start".into())),
        }
    }

    /// Makes the next [`Self::run`] return `end` at once: how a run that
    /// [`Self::run_until_paused`] made ended, for the caller that runs the
    /// VM on (a prebooted guest that exited before it was asked for).
    pub fn keep_end(&mut self, end: Result<Exit, Error>) {
        self.ended = Some(end);
    }

    /// Runs the guest until it writes its exit code to [`EXIT_PORT`]
    /// ([`Exit::Code`]) or a [`StopHandle`] stops it ([`Exit::Stopped`]);
    /// a guest that crashes is [`Error::Crash`].
    pub fn run(&mut self) -> Result<Exit, Error> {
        let end = match self.ended.take() {
            Some(end) => end,
            // A pause asked of a run that does not pause: go on.
            None => loop {
                if let Some(end) = self.run_until_paused().transpose() {
                    break end;
                }
            },
        };
        self.stop.ran.store(true, Ordering::SeqCst);
        end
    }

    /// As [`Self::run`], but a [`PauseHandle`] may also end it, with
    /// `Ok(None)`: the guest then stays as it was, and a later run (on
    /// this same thread: KVM makes a vCPU that changes threads wait for
    /// an RCU grace period) continues it.
    pub fn run_until_paused(&mut self) -> Result<Option<Exit>, Error> {
        install_kick_handler()?;
        let stop = self.stop.clone();
        // SAFETY: pthread_self has no preconditions.
        *stop.vcpu_thread.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(unsafe { libc::pthread_self() });
        let _running = RunningGuard(&stop);
        loop {
            if stop.requested.load(Ordering::SeqCst) {
                let _ = self.serial.writer_mut().flush();
                return Ok(Some(Exit::Stopped));
            }
            if stop.pause_requested.swap(false, Ordering::SeqCst) {
                let _ = self.serial.writer_mut().flush();
                return Ok(None);
            }
            let exit = match self.vcpu.run() {
                Ok(exit) => exit,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
                Err(e) => return Err(Error::Kvm { op: "KVM_RUN", source: e }),
            };
            // Queued writes come before whatever made this exit.
            if let (Some(writes), Some(device)) = (&self.coalesced, &self.vsock) {
                writes.apply(|offset, data| device.write(offset, data));
            }
            let crash = match exit {
                VcpuExit::IoOut(EXIT_PORT, data) => {
                    let mut code = [0u8; 4];
                    let n = data.len().min(4);
                    code[..n].copy_from_slice(&data[..n]);
                    let _ = self.serial.writer_mut().flush();
                    return Ok(Some(Exit::Code(u32::from_le_bytes(code))));
                }
                VcpuExit::IoOut(port, data) => {
                    if let Some(offset) = com1_offset(port) {
                        // A failed console write must not kill the guest.
                        let _ = self.serial.write(offset, data.first().copied().unwrap_or(0));
                    }
                    continue;
                }
                VcpuExit::IoIn(port, data) => {
                    let value = com1_offset(port).map_or(0xff, |offset| self.serial.read(offset));
                    data.fill(value);
                    continue;
                }
                VcpuExit::MmioRead(addr, data) => {
                    match (&self.vsock, layout::vsock_offset(addr)) {
                        (Some(device), Some(offset)) => device.read(offset, data),
                        // Nothing there: reads see no device, as on a bus
                        // with nothing attached.
                        _ => data.fill(0),
                    }
                    continue;
                }
                VcpuExit::MmioWrite(addr, data) => {
                    if let (Some(device), Some(offset)) = (&self.vsock, layout::vsock_offset(addr))
                    {
                        device.write(offset, data);
                    }
                    continue;
                }
                VcpuExit::Shutdown => CrashKind::Shutdown,
                VcpuExit::InternalError => {
                    // SAFETY: KVM filled the `internal` member of the union
                    // for this exit reason.
                    let internal = unsafe { self.vcpu.get_kvm_run().__bindgen_anon_1.internal };
                    let n = (internal.ndata as usize).min(internal.data.len()).min(4);
                    CrashKind::InternalError {
                        suberror: internal.suberror,
                        data: internal.data[..n].to_vec(),
                    }
                }
                VcpuExit::FailEntry(reason, _) => CrashKind::FailEntry { reason },
                VcpuExit::SystemEvent(kind, _) => CrashKind::SystemEvent { kind },
                other => CrashKind::Unhandled(format!("{other:?}")),
            };
            let _ = self.serial.writer_mut().flush();
            return Err(Crash { kind: crash, regs: GuestRegisters::read(&self.vcpu) }.into());
        }
    }
}

/// Builds a VM from `image` and runs it to the end; see [`Vm::new`] and
/// [`Vm::run`].
pub fn boot(image: &Path, config: VmConfig) -> Result<Exit, Error> {
    Vm::new(image, config)?.run()
}

/// A VM made before its image is known: KVM's VM with its irqchip, guest
/// RAM mapped and registered, the vCPU made with its CPUID. That is most
/// of [`Vm::new`]'s time (the memory registration alone waits for an SRCU
/// grace period, milliseconds on a nested host), so a process that makes
/// one ahead of time boots an image later in a fraction of it.
///
/// A KVM VM belongs to the process that created it (its ioctls fail in
/// any other), so a prepared VM serves only its own process: it cannot be
/// handed to another process, nor used by a forked child.
pub struct PreparedVm {
    machine: Machine,
    vcpu: VcpuFd,
    coalesced: Option<coalesced::Ring>,
    tsc_khz: Option<u32>,
}

impl fmt::Debug for PreparedVm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedVm")
            .field("mem_size", &self.machine.mem_size)
            .field("tsc_khz", &self.tsc_khz)
            .finish_non_exhaustive()
    }
}

impl PreparedVm {
    /// Makes a VM with `mem_size` bytes of RAM on the KVM device at
    /// `kvm_path`, ready for [`Self::boot`].
    pub fn new(mem_size: u64, kvm_path: &Path) -> Result<Self, Error> {
        check_mem_size(mem_size)?;
        let machine = Machine::new(mem_size, kvm_path)?;
        let (vcpu, tsc_khz) = machine.beside_registration(Machine::create_vcpu)?;
        let coalesced = machine.coalesce(&vcpu);
        Ok(Self { machine, vcpu, coalesced, tsc_khz })
    }

    /// The guest RAM this VM was made with.
    pub fn mem_size(&self) -> u64 {
        self.machine.mem_size
    }

    /// Touches the first `len` bytes of guest RAM, so the host pages behind
    /// them exist before the guest runs: its first accesses then fault
    /// only in KVM, not in the host's memory manager as well, and loading
    /// the image writes to pages already there. The image and the heap's
    /// start sit there.
    pub fn prefault(&self, len: u64) {
        let len = len.min(self.machine.mem_size) as usize;
        let Ok(host) = self.machine.mem.get_host_address(GuestAddress(0)) else { return };
        for offset in (0..len).step_by(4096) {
            // A write, of the zero fresh memory holds anyway: a read would
            // map the shared zero page, and the guest's first write would
            // still fault.
            // SAFETY: within the mapping, which lives as long as `self`;
            // the guest does not run yet.
            unsafe { host.add(offset).write_volatile(0) };
        }
    }

    /// Boots `image` in this VM as `config` says (`config.mem_size` must
    /// be the size it was made with; `config.kvm_path` is not used).
    pub fn boot(self, image: &Image, config: VmConfig) -> Result<Vm, Error> {
        self.load(image, config, DeviceStart::Now)
    }

    /// As [`Self::boot`], but the vsock device waits: the guest can find
    /// it, set it up and kick it, and nothing answers until
    /// [`Vm::start_device`] binds its host socket. Run the VM with
    /// [`Vm::run_until_paused`] meanwhile: a server guest gets as far as
    /// listening and halts, so that a user who asks for it later meets it
    /// ready. Nothing the guest could observe differs from a slow device,
    /// but that its clock ran: its start happened before the user asked.
    pub fn preboot(self, image: &Image, config: VmConfig) -> Result<Vm, Error> {
        self.load(image, config, DeviceStart::Later)
    }

    fn load(self, image: &Image, config: VmConfig, device: DeviceStart) -> Result<Vm, Error> {
        if config.mem_size != self.machine.mem_size {
            return Err(Error::Config(format!(
                "this VM was made with {} MiB of memory, not {} MiB",
                self.machine.mem_size >> 20,
                config.mem_size >> 20
            )));
        }
        let info = image.inspect(config.mem_size)?;
        load_guest(&self.vcpu, &self.machine.mem, image, info, &config, self.tsc_khz)?;
        self.machine.into_vm(self.vcpu, self.coalesced, self.tsc_khz, config, device)
    }
}

/// Whether [`Machine::into_vm`] starts the vsock device's thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DeviceStart {
    Now,
    /// [`Vm::start_device`] starts it.
    Later,
}

/// A boot image read into memory, once: from its path, or from a file a
/// caller opened (a descriptor another process sent, say). Its path names
/// it in errors.
#[derive(Debug)]
pub struct Image {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Image {
    /// Reads the image at `path`.
    pub fn read(path: &Path) -> Result<Self, Error> {
        let bytes = std::fs::read(path)
            .map_err(|source| Error::ImageRead { path: path.to_owned(), source })?;
        Ok(Self { path: path.to_owned(), bytes })
    }

    /// Reads the image from `file`, which `path` names in errors.
    pub fn from_file(mut file: std::fs::File, path: &Path) -> Result<Self, Error> {
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|source| Error::ImageRead { path: path.to_owned(), source })?;
        Ok(Self { path: path.to_owned(), bytes })
    }

    /// The path that names the image.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image's bytes, as read.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn inspect(&self, mem_size: u64) -> Result<image::ImageInfo, Error> {
        image::inspect(&self.path, &self.bytes, mem_size)
    }
}

/// The parts of a VM that do not depend on the image: the KVM device, the
/// VM with its TSS and irqchip, and the guest RAM (mapped, and registered
/// by [`Self::beside_registration`]).
struct Machine {
    kvm: Kvm,
    vm: VmFd,
    mem: GuestMemoryMmap,
    mem_size: u64,
}

impl Machine {
    fn new(mem_size: u64, kvm_path: &Path) -> Result<Self, Error> {
        let kvm = open_kvm(kvm_path)?;
        let vm = kvm.create_vm().map_err(error::kvm("KVM_CREATE_VM"))?;
        vm.set_tss_address(layout::KVM_TSS_ADDRESS).map_err(error::kvm("KVM_SET_TSS_ADDR"))?;
        // The irqchip must exist before the vCPU, which gets its LAPIC from it.
        vm.create_irq_chip().map_err(error::kvm("KVM_CREATE_IRQCHIP"))?;
        let mem = map_guest_memory(mem_size)?;
        Ok(Self { kvm, vm, mem, mem_size })
    }

    /// Registers the guest RAM with KVM on another thread while `work`
    /// runs on this one, and returns `work`'s result once both are done.
    fn beside_registration<T>(
        &self,
        work: impl FnOnce(&Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let region = memory_region(&self.mem, self.mem_size)?;
        std::thread::scope(|scope| {
            let registering = scope.spawn(|| {
                // SAFETY: the region is `mem`'s whole mapping, which the
                // `Vm` keeps alive as long as the VM file descriptor it is
                // registered with.
                unsafe { self.vm.set_user_memory_region(region) }
            });
            let worked = work(self);
            let registered = registering.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            registered.map_err(error::kvm("KVM_SET_USER_MEMORY_REGION"))?;
            worked
        })
    }

    /// The ring for coalesced writes to the device's setup
    /// registers, with their zones registered; `None` where KVM has no
    /// coalesced MMIO (the writes then exit as any other).
    fn coalesce(&self, vcpu: &VcpuFd) -> Option<coalesced::Ring> {
        let ring = coalesced::Ring::map(vcpu)?;
        coalesced::register_zones(&self.vm).then_some(ring)
    }

    /// The vCPU with its CPUID, and the TSC rate KVM reports.
    fn create_vcpu(&self) -> Result<(VcpuFd, Option<u32>), Error> {
        let vcpu = self.vm.create_vcpu(0).map_err(error::kvm("KVM_CREATE_VCPU"))?;
        cpu::set_cpuid(&self.kvm, &vcpu)?;
        // Hosts without a stable TSC rate refuse; the guest then has to
        // calibrate, which it learns from the option being absent.
        let tsc_khz = vcpu.get_tsc_khz().ok();
        Ok((vcpu, tsc_khz))
    }

    /// The loaded VM, with its vsock device attached and its console.
    fn into_vm(
        self,
        vcpu: VcpuFd,
        coalesced: Option<coalesced::Ring>,
        tsc_khz: Option<u32>,
        config: VmConfig,
        device_start: DeviceStart,
    ) -> Result<Vm, Error> {
        let mem = Arc::new(self.mem);
        let coalesced = coalesced.map(coalesced::QueuedWrites::new);
        let vsock = match &config.vsock {
            Some(spec) if device_start == DeviceStart::Now => {
                Some(vsock::VmVsock::attach(&self.vm, mem.clone(), coalesced.clone(), spec)?)
            }
            Some(spec) => Some(vsock::VmVsock::attach_waiting(
                &self.vm,
                mem.clone(),
                coalesced.clone(),
                spec,
            )?),
            None => None,
        };
        let serial = Serial::new(NoIrq, config.serial);
        Ok(Vm {
            _vm: self.vm,
            vcpu,
            coalesced,
            _mem: mem,
            vsock,
            serial,
            tsc_khz,
            stop: Arc::default(),
            ended: None,
        })
    }
}

/// Puts the image, the command line and the PVH boot data in guest RAM,
/// and the vCPU at the image's entry.
fn load_guest(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    image: &Image,
    info: image::ImageInfo,
    config: &VmConfig,
    tsc_khz: Option<u32>,
) -> Result<(), Error> {
    let entry = image::load(&image.path, &image.bytes, mem, info)?;
    let cmdline = command_line(config, tsc_khz)?;
    let start_info = image::write_boot_data(mem, config.mem_size, &cmdline)?;
    cpu::set_pvh_entry(vcpu, entry, start_info)
}

/// Refuses a memory size KVM could map but the guest's layout cannot use.
fn check_mem_size(mem_size: u64) -> Result<(), Error> {
    if !(layout::MIN_MEM_SIZE..=layout::MAX_MEM_SIZE).contains(&mem_size)
        || !mem_size.is_multiple_of(4096)
    {
        return Err(Error::Config(format!(
            "memory size {mem_size} must be a multiple of 4 KiB from {} MiB to {} MiB",
            layout::MIN_MEM_SIZE >> 20,
            layout::MAX_MEM_SIZE >> 20
        )));
    }
    Ok(())
}

fn com1_offset(port: u16) -> Option<u8> {
    port.checked_sub(COM1).filter(|o| *o < 8).map(|o| o as u8)
}

/// Opens the KVM device ourselves (rather than `Kvm::new`) so that a
/// failure names the path and keeps the OS error's kind.
fn open_kvm(path: &Path) -> Result<Kvm, Error> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| Error::KvmOpen { path: path.to_owned(), source })?;
    // SAFETY: the descriptor was just opened, is owned by nobody else, and
    // names a KVM device (its API version is checked next).
    let kvm = unsafe { Kvm::from_raw_fd(file.into_raw_fd()) };
    let version = kvm.get_api_version();
    if version != 12 {
        return Err(Error::KvmOpen {
            path: path.to_owned(),
            source: io::Error::other(format!("not a KVM device (API version {version})")),
        });
    }
    Ok(kvm)
}

/// Maps `size` bytes of guest RAM, for guest-physical 0.
fn map_guest_memory(size: u64) -> Result<GuestMemoryMmap, Error> {
    let len = usize::try_from(size).map_err(|_| Error::Config("memory size too large".into()))?;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)])
        .map_err(|e| Error::Memory(format!("mapping {size} bytes: {e}")))?;
    let host = mem
        .get_host_address(GuestAddress(0))
        .map_err(|e| Error::Memory(format!("finding the mapping: {e}")))?;
    // Transparent huge pages: the guest's first touch of a 2 MiB page
    // then faults once on the host, not 512 times. Advice only, so a
    // refusal changes nothing but speed.
    // SAFETY: advice on our own fresh mapping; it changes no contents.
    unsafe { libc::madvise(host.cast(), len, libc::MADV_HUGEPAGE) };
    Ok(mem)
}

/// KVM's description of `mem` as slot 0 at guest-physical 0.
fn memory_region(mem: &GuestMemoryMmap, size: u64) -> Result<kvm_userspace_memory_region, Error> {
    let host = mem
        .get_host_address(GuestAddress(0))
        .map_err(|e| Error::Memory(format!("finding the mapping: {e}")))?;
    Ok(kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: host as u64,
    })
}

/// The guest's command line: the device slot, the TSC rate, the boot
/// options, then `--` and the app's arguments.
fn command_line(config: &VmConfig, tsc_khz: Option<u32>) -> Result<Cmdline, Error> {
    let err = |e: linux_loader::cmdline::Error| Error::Cmdline(e.to_string());
    let mut cmdline = Cmdline::new(layout::CMDLINE_MAX).map_err(err)?;
    cmdline
        .insert_str(format!(
            "virtio_mmio.device={}K@{:#x}:{}",
            layout::VSOCK_MMIO_SIZE / 1024,
            layout::VSOCK_MMIO_BASE,
            layout::VSOCK_GSI
        ))
        .map_err(err)?;
    if let Some(khz) = tsc_khz {
        cmdline.insert("pier.tsc_khz", &khz.to_string()).map_err(err)?;
    }
    for arg in &config.boot_args {
        cmdline.insert_str(arg).map_err(err)?;
    }
    if !config.app_args.is_empty() {
        cmdline.insert_init_args(config.app_args.join(" ")).map_err(err)?;
    }
    Ok(cmdline)
}
