//! Running the Linux test guest ([`crate::linux_guest`]) under QEMU, with
//! its vsock device served over vhost-user by a backend process: `pier
//! vhost-user`, or rust-vmm's `vhost-device-vsock` as the reference. Both
//! take the same command line (`--vm guest-cid=N,socket=PATH,uds-path=PATH`,
//! once per guest) and give host programs the same Firecracker-style
//! hybrid socket at `uds-path`.
//!
//! [`BackendProcess`] and [`LinuxVm`] are separate because one backend
//! serves several guests (siblings reach each other through it), and
//! because a test may stop and restart the backend under a running guest.
//!
//! Why the QEMU command line is what it is:
//!
//! - `-accel tcg,thread=single`: Debian's kernel does not boot under the
//!   nested KVM some hosts offer (it sits in the decompressor for
//!   minutes); TCG boots it in about 5 seconds;
//! - `-M microvm,acpi=on`: Debian builds virtio-mmio without its
//!   command-line device list, so the guest finds the vsock device through
//!   the ACPI tables microvm writes (as `LNRO0005`);
//! - a shared memfd memory backend: a vhost-user backend maps guest RAM;
//! - `tsc_early_khz=<the host's TSC rate>` on the kernel command line:
//!   under TCG the guest's TSC is the host's, and the kernel measures its
//!   rate against the emulated PIT; on a busy host that measurement fails
//!   ("Unable to calibrate against PIT"), and the boot then hangs for good
//!   right after "Marking TSC unstable". Told the rate, it never measures.
//!
//! Both processes are killed when their handles drop, and also when the
//! thread that started them ends (`PR_SET_PDEATHSIG`): a test binary that
//! keeps a guest in a static for all its tests must start it from a thread
//! that lives as long as the process, and its guests then die with it
//! instead of outliving the run.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::linux_guest::LinuxGuest;
use crate::tools::{self, QEMU, VHOST_DEVICE_VSOCK};

/// Which program serves the guests' vsock devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `pier vhost-user`, from this `pier` binary.
    Pier(PathBuf),
    /// rust-vmm's vhost-device-vsock (installed with cargo when missing).
    VhostDeviceVsock,
}

impl Backend {
    /// The name failures use: the command as a user would type it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pier(_) => "pier vhost-user",
            Self::VhostDeviceVsock => "vhost-device-vsock",
        }
    }
}

/// One guest's place on a backend.
#[derive(Clone, Debug)]
pub struct GuestSlot {
    /// The guest's CID.
    pub cid: u32,
    /// The vhost-user socket QEMU connects to.
    pub vhost_socket: PathBuf,
    /// The hybrid vsock socket host programs connect to (and the prefix of
    /// `<uds>_<port>` listeners for the guest's connections).
    pub uds: PathBuf,
}

impl GuestSlot {
    /// A slot with both sockets in `dir`: `vm<cid>.vhost` and `vm<cid>.vsock`.
    pub fn in_dir(dir: &Path, cid: u32) -> Self {
        Self {
            cid,
            vhost_socket: dir.join(format!("vm{cid}.vhost")),
            uds: dir.join(format!("vm{cid}.vsock")),
        }
    }
}

/// Kills the child when the thread that spawned it ends: see the module
/// documentation.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe, and the closure touches nothing
    // else between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Collects everything `pipe` yields into a string, on a thread of its
/// own, optionally echoing it to this process's stderr; a serial
/// console's `\r\n` arrives as `\n`. For a guest's console or a
/// backend's log, read while the process still runs.
pub fn collect_output(mut pipe: impl Read + Send + 'static, echo: bool) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let chunk = String::from_utf8_lossy(&buf[..n]).replace('\r', "");
            if echo {
                eprint!("{chunk}");
            }
            sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&chunk);
        }
    });
    text
}

/// A running backend; killed (and its sockets removed) when dropped.
#[derive(Debug)]
pub struct BackendProcess {
    child: Child,
    name: &'static str,
    command_line: String,
    stderr: Arc<Mutex<String>>,
    slots: Vec<GuestSlot>,
}

impl BackendProcess {
    /// Starts `backend` for `slots` and waits (up to 10 s) for every
    /// vhost-user socket to appear. A backend that exits first is an error
    /// naming it, with its exit status and its stderr.
    pub fn start(backend: &Backend, slots: &[GuestSlot]) -> Result<Self, String> {
        let mut cmd = match backend {
            Backend::Pier(pier) => {
                let mut cmd = Command::new(pier);
                cmd.arg("vhost-user");
                cmd
            }
            Backend::VhostDeviceVsock => Command::new(tools::ensure(VHOST_DEVICE_VSOCK)?),
        };
        for slot in slots {
            let _ = std::fs::remove_file(&slot.vhost_socket);
            let _ = std::fs::remove_file(&slot.uds);
            cmd.arg("--vm").arg(format!(
                "guest-cid={},socket={},uds-path={}",
                slot.cid,
                slot.vhost_socket.display(),
                slot.uds.display()
            ));
        }
        let command_line = format!("{cmd:?}").replace('"', "");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            format!("{} failed to start: {e} (command: {command_line})", backend.name())
        })?;
        let stderr = collect_output(child.stderr.take().expect("piped stderr"), false);
        let mut process =
            Self { child, name: backend.name(), command_line, stderr, slots: slots.to_vec() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !slots.iter().all(|s| s.vhost_socket.exists()) {
            if let Ok(Some(status)) = process.child.try_wait() {
                thread::sleep(Duration::from_millis(50));
                return Err(format!(
                    "{} failed to start: it exited with {status}\ncommand: {}\nstderr:\n{}",
                    process.name,
                    process.command_line,
                    process.stderr()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} failed to start: no vhost-user socket after 10 s\ncommand: {}\n\
                     stderr:\n{}",
                    process.name,
                    process.command_line,
                    process.stderr()
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
        Ok(process)
    }

    /// The command that started it, for reports.
    pub fn command_line(&self) -> &str {
        &self.command_line
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills it now (a crash, as far as QEMU can tell).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BackendProcess {
    fn drop(&mut self) {
        self.kill();
        for slot in &self.slots {
            let _ = std::fs::remove_file(&slot.vhost_socket);
            let _ = std::fs::remove_file(&slot.uds);
        }
    }
}

/// How to boot one Linux guest.
#[derive(Clone, Debug)]
pub struct LinuxVmConfig {
    /// The kernel (`LinuxGuest::kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`LinuxGuest::initrd`).
    pub initrd: PathBuf,
    /// The backend's vhost-user socket for this guest.
    pub vhost_socket: PathBuf,
    /// Guest memory in MiB.
    pub mem_mib: u32,
    /// The kernel command line.
    pub append: String,
    /// QEMU's `reconnect=N` on the vhost-user chardev: retry a lost backend
    /// every N seconds (without it QEMU waits for the backend at start and
    /// never reconnects).
    pub reconnect: Option<u32>,
    /// Copy the guest console to this process's stderr as it arrives
    /// (`cargo xtask linux`); it is collected either way.
    pub echo_console: bool,
    /// More QEMU arguments (a network device for a guest that needs one).
    pub extra_args: Vec<String>,
}

impl LinuxVmConfig {
    /// 256 MiB, `console=ttyS0 quiet tsc_early_khz=<host's>`, no
    /// reconnect, console collected only.
    pub fn new(guest: &LinuxGuest, vhost_socket: impl Into<PathBuf>) -> Self {
        let mut append = "console=ttyS0 quiet".to_owned();
        if let Some(khz) = host_tsc_khz() {
            append.push_str(&format!(" tsc_early_khz={khz}"));
        }
        Self {
            kernel: guest.kernel.clone(),
            initrd: guest.initrd.clone(),
            vhost_socket: vhost_socket.into(),
            mem_mib: 256,
            append,
            reconnect: None,
            echo_console: false,
            extra_args: Vec::new(),
        }
    }
}

/// The host's TSC rate in kHz, measured against the monotonic clock over
/// 50 ms (once per process), which a TCG guest's TSC shares: see the
/// module documentation. `None` off x86-64.
pub fn host_tsc_khz() -> Option<u64> {
    static KHZ: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: rdtsc reads a counter; every x86-64 CPU has it.
            let tsc = || unsafe { std::arch::x86_64::_rdtsc() };
            let (start, first) = (Instant::now(), tsc());
            thread::sleep(Duration::from_millis(50));
            let (cycles, elapsed) = (tsc().wrapping_sub(first), start.elapsed());
            let khz = u128::from(cycles) * 1_000_000 / elapsed.as_nanos().max(1);
            u64::try_from(khz).ok().filter(|&k| k > 0)
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    })
}

/// QEMU running one Linux guest; killed when dropped.
#[derive(Debug)]
pub struct LinuxVm {
    qemu: Child,
    command_line: String,
    console: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    started: Instant,
}

impl LinuxVm {
    /// Starts QEMU (installing it when missing). The backend must already
    /// listen on `config.vhost_socket`.
    pub fn start(config: &LinuxVmConfig) -> Result<Self, String> {
        let qemu = tools::ensure(QEMU)?;
        for (what, path) in [("kernel", &config.kernel), ("initramfs", &config.initrd)] {
            if !path.is_file() {
                return Err(format!("no {what} at {}", path.display()));
            }
        }
        let mem = format!("{}M", config.mem_mib);
        let mut chardev = format!("socket,id=vsock0,path={}", config.vhost_socket.display());
        if let Some(seconds) = config.reconnect {
            chardev.push_str(&format!(",reconnect={seconds}"));
        }
        let mut cmd = Command::new(&qemu);
        cmd.args(["-M", "microvm,acpi=on,memory-backend=mem"])
            // A modern (version 2) virtio-mmio device, as pier's own VMM has:
            // microvm's default is the legacy layout, without VERSION_1.
            .args(["-global", "virtio-mmio.force-legacy=false"])
            .args(["-accel", "tcg,thread=single", "-smp", "1", "-m", &mem])
            .arg("-object")
            .arg(format!("memory-backend-memfd,id=mem,size={mem},share=on"))
            .args(["-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio"])
            .arg("-kernel")
            .arg(&config.kernel)
            .arg("-initrd")
            .arg(&config.initrd)
            .args(["-append", &config.append])
            .args(["-chardev", &chardev])
            .args(["-device", "vhost-user-vsock-device,chardev=vsock0"])
            .args(&config.extra_args);
        let command_line = format!("{cmd:?}").replace('"', "");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut qemu = cmd.spawn().map_err(|e| format!("starting {}: {e}", qemu.display()))?;
        let console =
            collect_output(qemu.stdout.take().expect("piped stdout"), config.echo_console);
        let stderr = collect_output(qemu.stderr.take().expect("piped stderr"), config.echo_console);
        Ok(Self { qemu, command_line, console, stderr, started: Instant::now() })
    }

    /// The guest console so far (`\r` removed).
    pub fn console(&self) -> String {
        self.console.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What QEMU wrote to stderr so far.
    pub fn qemu_stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// QEMU's command line, for reports.
    pub fn command_line(&self) -> &str {
        &self.command_line
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.qemu.id()
    }

    /// Whether QEMU has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.qemu.try_wait().ok().flatten()
    }

    /// Waits until the console shows `needle` and returns the time since
    /// QEMU started. Fails after `timeout`, or when QEMU exits first, with
    /// the console and QEMU's stderr in the message.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<Duration, String> {
        // None: a timeout too long to add to now, which is for ever.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if self.console().contains(needle) {
                return Ok(self.started.elapsed());
            }
            let why = if let Some(status) = self.exited() {
                thread::sleep(Duration::from_millis(100));
                format!("QEMU exited ({status}) before the guest printed {needle:?}")
            } else if deadline.is_some_and(|d| Instant::now() > d) {
                format!("the guest did not print {needle:?} within {timeout:?}")
            } else {
                thread::sleep(Duration::from_millis(20));
                continue;
            };
            return Err(format!(
                "{why}\nQEMU: {}\nQEMU's stderr:\n{}\nconsole:\n{}",
                self.command_line,
                self.qemu_stderr(),
                self.console()
            ));
        }
    }

    /// Waits up to `timeout` (`Duration::MAX`: for ever) for QEMU to exit
    /// (the guest powered off).
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LinuxVm {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }
}
