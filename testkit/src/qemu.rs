//! The cross-check against the world's own vsock stack: a pier image
//! booted by QEMU's microvm, its vsock device served by rust-vmm's
//! `vhost-device-vsock` over vhost-user, and host programs reaching the
//! guest through that backend's Firecracker-style hybrid socket, the same
//! protocol as `pier boot`'s.
//!
//! [`QemuVm::start`] installs what is missing (QEMU from apt,
//! vhost-device-vsock with cargo; see [`crate::tools`]), starts the
//! backend, then QEMU, and stops both when dropped. `cargo xtask qemu`
//! and the cross-check tests share it.
//!
//! What the QEMU command line needs, and why:
//!
//! - `-M microvm,acpi=off`: QEMU then names each virtio-mmio device on the
//!   kernel command line (`virtio_mmio.device=512@0xfeb00e00:12`),
//!   appended after the `-append` text; pier-rt reads it wherever it is;
//! - `-global virtio-mmio.force-legacy=false`: microvm's virtio-mmio is
//!   the legacy version 1 layout unless told otherwise, and pier-driver
//!   needs VIRTIO_F_VERSION_1;
//! - a shared memfd memory backend: a vhost-user backend maps guest RAM;
//! - `-cpu host,-arch-capabilities`: plain `-cpu host` aborts on nested
//!   hosts ("failed to set MSR 0x10a");
//! - `isa-debug-exit` on port 0xf4: the app's exit code `c` ends QEMU
//!   with status `(c << 1) | 1`, which [`QemuVm::wait`] maps back. Exit
//!   statuses are one byte, so only codes up to 127 survive the mapping.
//!
//! The guest learns the TSC rate from kvmclock under QEMU (pier-vmm
//! passes it on the command line instead).

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::linux_vm::{Backend, BackendProcess, GuestSlot};
use crate::tools::{self, QEMU};

/// How to run one image under QEMU.
#[derive(Clone, Debug)]
pub struct QemuConfig {
    /// The PVH image (`cargo xtask image NAME`).
    pub image: PathBuf,
    /// The hybrid vsock socket host programs use; the backend also creates
    /// `<uds>_<port>` listeners' peers there, as `pier boot` does.
    pub uds: PathBuf,
    /// The guest's CID.
    pub cid: u32,
    /// Guest memory in MiB.
    pub mem_mib: u32,
    /// The app's arguments (after `--` on the command line).
    pub app_args: Vec<String>,
    /// Where the guest console (QEMU's serial port) goes.
    pub console: Console,
    /// Let microvm name its virtio-mmio devices on the kernel command line
    /// (its `auto-kernel-cmdline`, on by default). Off, the guest has to
    /// find them by scanning.
    pub name_devices: bool,
    /// Which program serves the vsock device over vhost-user; `None` for
    /// one the caller already runs on the vhost-user socket beside the
    /// hybrid one ([`vhost_socket`]), left running when the VM ends, so that
    /// several VMs in a row can use it.
    pub backend: Option<Backend>,
}

/// Where the guest console goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Console {
    /// This process's stdout.
    Inherit,
    /// A pipe, read through [`QemuVm::console`].
    Piped,
}

impl QemuConfig {
    /// Defaults: CID 3, 128 MiB, no arguments, the console on stdout.
    pub fn new(image: impl Into<PathBuf>, uds: impl Into<PathBuf>) -> Self {
        Self {
            image: image.into(),
            uds: uds.into(),
            cid: 3,
            mem_mib: 128,
            app_args: Vec::new(),
            console: Console::Inherit,
            name_devices: true,
            backend: Some(Backend::VhostDeviceVsock),
        }
    }
}

/// QEMU and its vhost-user vsock backend, running; both are killed (and
/// the backend's sockets removed) when this is dropped.
#[derive(Debug)]
pub struct QemuVm {
    qemu: Child,
    /// `None` for a backend the caller runs, which outlives the VM.
    backend: Option<BackendProcess>,
}

/// The vhost-user control socket beside `uds`.
pub fn vhost_socket(uds: &Path) -> PathBuf {
    let mut s = uds.as_os_str().to_owned();
    s.push(".vhost-user");
    PathBuf::from(s)
}

impl QemuVm {
    /// Starts the vhost-user backend, waits for its control socket, then
    /// starts QEMU with the image.
    pub fn start(config: &QemuConfig) -> Result<Self, String> {
        let qemu = tools::ensure(QEMU)?;
        if !config.image.is_file() {
            return Err(format!("no image at {}", config.image.display()));
        }
        let socket = vhost_socket(&config.uds);
        let backend = match &config.backend {
            Some(backend) => Some(BackendProcess::start(
                backend,
                &[GuestSlot {
                    cid: config.cid,
                    vhost_socket: socket.clone(),
                    uds: config.uds.clone(),
                }],
            )?),
            None => None,
        };
        let mem = format!("{}M", config.mem_mib);
        let mut append = String::from("--");
        for arg in &config.app_args {
            append.push(' ');
            append.push_str(arg);
        }
        let machine = if config.name_devices {
            "microvm,acpi=off,memory-backend=mem"
        } else {
            "microvm,acpi=off,auto-kernel-cmdline=off,memory-backend=mem"
        };
        let mut cmd = Command::new(&qemu);
        cmd.args(["-M", machine])
            .args(["-global", "virtio-mmio.force-legacy=false"])
            .args(["-accel", "kvm", "-cpu", "host,-arch-capabilities", "-smp", "1"])
            .args(["-m", &mem])
            .arg("-object")
            .arg(format!("memory-backend-memfd,id=mem,size={mem},share=on"))
            .args(["-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio"])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
            .arg("-chardev")
            .arg(format!("socket,id=vsock0,path={}", socket.display()))
            .args(["-device", "vhost-user-vsock-device,chardev=vsock0"])
            .arg("-kernel")
            .arg(&config.image)
            .args(["-append", &append])
            .stdin(Stdio::null())
            .stdout(match config.console {
                Console::Inherit => Stdio::inherit(),
                Console::Piped => Stdio::piped(),
            })
            .stderr(Stdio::piped());
        let qemu = cmd.spawn().map_err(|e| format!("starting {}: {e}", qemu.display()))?;
        Ok(Self { qemu, backend })
    }

    /// What the backend (when it is this VM's) wrote to stderr so far.
    pub fn backend_stderr(&self) -> String {
        self.backend.as_ref().map(BackendProcess::stderr).unwrap_or_default()
    }

    /// QEMU's process, for its pid or its pipes.
    pub fn qemu(&mut self) -> &mut Child {
        &mut self.qemu
    }

    /// The guest console's pipe, when [`Console::Piped`] (taken once).
    pub fn console(&mut self) -> Option<std::process::ChildStdout> {
        self.qemu.stdout.take()
    }

    /// Waits up to `timeout` (`Duration::MAX`: for ever) for QEMU to end, and returns the app's exit
    /// code: QEMU's status `(c << 1) | 1` back to `c`. Any other ending
    /// (QEMU failing, a signal, a guest that stops without the exit port)
    /// is an error with QEMU's own message.
    pub fn wait(&mut self, timeout: Duration) -> Result<i32, String> {
        let deadline = Instant::now().checked_add(timeout);
        let status = loop {
            match self.qemu.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if deadline.is_none_or(|d| Instant::now() < d) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => return Err(format!("QEMU still running after {timeout:?}")),
                Err(e) => return Err(format!("waiting for QEMU: {e}")),
            }
        };
        match status.code().and_then(Self::exit_code) {
            Some(code) => Ok(code),
            None => {
                let mut stderr = String::new();
                if let Some(mut pipe) = self.qemu.stderr.take() {
                    use std::io::Read;
                    let _ = pipe.read_to_string(&mut stderr);
                }
                Err(format!("QEMU ended with {status} and no exit code from the guest: {stderr}"))
            }
        }
    }

    /// The app's exit code in QEMU's exit status, if it holds one: see
    /// [`Self::wait`].
    pub fn exit_code(status: i32) -> Option<i32> {
        (status & 1 == 1).then_some(status >> 1)
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
        // The backend, when it is this VM's, goes with it, sockets and all.
        self.backend.take();
    }
}

/// Whether a `CONNECT port` through the hybrid socket at `uds` gets `OK`
/// within a second (the connection is closed again at once).
///
/// A second, not longer: vhost-device-vsock 0.3.0 may never answer a
/// CONNECT that arrives before the guest's driver has set up the queues
/// ("Received a backend event before vring initialization"), while a
/// later one works, so a caller waiting for the guest retries instead.
pub fn connects(uds: &Path, port: u32) -> bool {
    pier_client::HybridStream::connect_timeout(uds, port, Duration::from_secs(1)).is_ok()
}

/// The connection a guest opens to `listener` (a blocking stream), or why
/// none came: `guest_ended` said the guest is gone, or `limit` passed.
///
/// A plain `accept` waits for good when a guest never connects, and
/// vhost-device-vsock 0.3.0 now and then leaves a guest's CONNECT
/// unanswered (the guest ends with "connection timed out"), which held
/// whole test and benchmark runs until they were killed.
pub fn accept_from_guest(
    listener: &UnixListener,
    limit: Duration,
    guest_ended: impl FnMut() -> bool,
) -> Result<UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| format!("listener: {e}"))?;
    let conn = accept_within(|| listener.accept().map(|(conn, _)| conn), limit, guest_ended)?;
    conn.set_nonblocking(false).map_err(|e| format!("connection: {e}"))?;
    Ok(conn)
}

/// [`accept_from_guest`] for any listener (a `pier_client`
/// `HybridListener`, say): `accept` is its accept on the listener made
/// non-blocking, tried every few milliseconds until it gives a
/// connection, fails otherwise than with `WouldBlock`, `guest_ended`
/// says the guest is gone, or `limit` passes.
pub fn accept_within<T>(
    mut accept: impl FnMut() -> std::io::Result<T>,
    limit: Duration,
    mut guest_ended: impl FnMut() -> bool,
) -> Result<T, String> {
    let waiting = Instant::now();
    loop {
        match accept() {
            Ok(conn) => return Ok(conn),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                return Err(format!("accept: {e}"));
            }
            Err(_) => {}
        }
        if guest_ended() {
            return Err(format!("the guest ended without connecting ({:?})", waiting.elapsed()));
        }
        if waiting.elapsed() > limit {
            return Err(format!("the guest did not connect within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
