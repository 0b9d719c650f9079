//! `pier pool`: VMs prepared before they are asked for, so that `pier boot
//! --pool` boots in a few milliseconds instead of waiting for KVM.
//!
//! Most of a plain boot's time is not the guest's: making the KVM VM and
//! registering its memory (an SRCU grace period, milliseconds on a nested
//! host), making the vCPU, and before all that starting a large process.
//! None of it depends on the image, so a pool does it ahead of time.
//!
//! A KVM VM belongs to the process that made it (its ioctls fail in any
//! other), so a prepared VM cannot be handed to the client, nor kept by
//! a forked child. Each VM therefore lives in a worker process of its
//! own, started by the pool with fork and exec of this very binary
//! (`pier pool-worker`, hidden), never by a bare fork of the threaded pool:
//!
//! - the pool binds the socket and starts `--size` workers; each gets the
//!   listening socket as its stdin and a pipe to the pool as its stdout;
//! - a worker prepares its VM ([`PreparedVm`]), says `ready` on the pipe,
//!   then accepts on the shared socket itself (the kernel gives each
//!   connection to one worker; there is no hop through the pool);
//! - it takes the client's job: the image as a file descriptor the client
//!   opened itself (so a client boots only what it can read), its working
//!   folder, its stdin, stdout and stderr, and the boot's options. It says
//!   `taken` on the pipe, at which the pool starts a replacement (50 ms
//!   later while other prepared VMs remain, so that the replacement's
//!   start does not share the CPUs with the boot's), moves onto the
//!   client's descriptors, and runs the boot exactly as `pier boot` does:
//!   console on the client's stdout, messages on its stderr;
//! - the client relays SIGINT, SIGTERM, SIGHUP and SIGUSR1 to the worker,
//!   which raises them on itself, so they act as on `pier boot`; a client
//!   that goes away stops its VM. The worker's last word is the exit code,
//!   which becomes the client's.
//!
//! With `--preboot IMAGE`, each worker also boots that image before it is
//! asked for ([`PreparedVm::preboot`]): the guest runs on the worker's
//! main thread, its device attached but not served and its console held,
//! while another thread waits for the boot. A boot of the same image
//! (compared byte for byte), CID, memory and arguments pauses the vCPU,
//! takes the client's descriptors, gets the held console, starts the
//! device with its own socket path and runs the guest on; any other boot
//! is refused, naming what differs, and the guest stays for the next.
//!
//! Hostile local users: only the pool owner's uid may boot (each worker
//! checks `SO_PEERCRED` on the connection, and refuses and logs anyone
//! else), and the default socket sits in a folder only its owner can
//! enter (`$XDG_RUNTIME_DIR/pier`, mode 0700). Every failure reaches the
//! client as a message naming it: no pool there, a pool that is gone, a
//! refusal, a worker that died, a bad image.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;
use pier_vmm::{Image, PreparedVm, Vm, VmConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use crate::boot::{self, BootJob};
use crate::lifecycle::{self, Lifecycle};
use crate::size;

#[derive(Args, Debug)]
pub struct PoolArgs {
    /// The pool's Unix socket, which `pier boot --pool PATH` connects to
    /// [default: $XDG_RUNTIME_DIR/pier/pool.sock, or /tmp/pier-<uid>/pool.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// How many VMs to keep prepared; each used one is replaced (50 ms
    /// after its boot starts while others remain prepared).
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    size: u32,
    /// Each VM's memory: bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE", default_value = "128M")]
    mem: String,
    /// Boot IMAGE in every VM ahead of time, with ARGS, up to where it
    /// waits (a server: listening). `pier boot --pool` of the same image,
    /// CID, memory and arguments then only binds its socket and hands
    /// over the console; any other boot is refused.
    #[arg(long, value_name = "IMAGE")]
    preboot: Option<PathBuf>,
    /// The prebooted guests' CID.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "preboot")]
    cid: u32,
    /// The prebooted app's arguments: everything after `--`.
    #[arg(last = true, value_name = "ARGS", requires = "preboot")]
    args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The VM's memory, in bytes.
    #[arg(long)]
    mem: u64,
    /// The image to preboot, if any.
    #[arg(long)]
    preboot: Option<PathBuf>,
    /// The prebooted guest's CID.
    #[arg(long, default_value_t = 3)]
    cid: u32,
    /// The prebooted app's arguments.
    #[arg(last = true)]
    args: Vec<String>,
}

/// What every VM of a pool boots ahead of time (`--preboot`), which the
/// pool hands to each worker it starts.
#[derive(Clone, Debug)]
struct PrebootSpec {
    image: PathBuf,
    cid: u32,
    args: Vec<String>,
}

/// Guest RAM a worker touches before it is asked for a boot: the image
/// loads at 1 MiB, and the guest's heap and stacks follow it.
const PREFAULT_BYTES: u64 = 8 << 20;
/// How long a used worker's replacement waits before it starts while
/// other prepared VMs remain ([`Slot::wait_for_the_boot_to_start`]).
const REPLACE_AFTER: Duration = Duration::from_millis(50);
/// How often that wait looks whether the last prepared VM was taken.
const REPLACE_CHECK: Duration = Duration::from_millis(5);
/// How long a worker waits for a connected client's job before it drops
/// the connection and serves the next one.
const JOB_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest job message (the guest's whole command line is 4 KiB).
const MAX_JOB: usize = 64 * 1024;
/// What a job message starts with: the protocol between `pier boot
/// --pool` and the workers of the same binary.
const JOB_MAGIC: &str = "pier-boot-job/1";
/// The descriptors a job carries, in order.
const JOB_FDS: usize = 5;
/// The most of a prebooted guest's console a worker keeps for its boot.
const MAX_HELD_CONSOLE: usize = 1 << 20;

// ---------------------------------------------------------------- the pool

pub fn serve(args: PoolArgs) -> Result<i32> {
    let socket = match args.socket {
        Some(path) => {
            private_dir(&path, false)?;
            path
        }
        None => {
            let path = default_socket();
            private_dir(&path, true)?;
            path
        }
    };
    let mem = size::parse_size("--mem", &args.mem)?;
    let preboot = args.preboot.map(|image| PrebootSpec { image, cid: args.cid, args: args.args });
    let listener = bind(&socket)?;
    listener.set_nonblocking(true).context("making the pool's socket non-blocking")?;
    let exe = std::env::current_exe().context("finding the pier binary")?;
    let state = Arc::new(PoolState::default());

    let (first_tx, first_rx) = mpsc::channel();
    for _ in 0..args.size {
        let slot = Slot {
            exe: exe.clone(),
            mem,
            preboot: preboot.clone(),
            listener: listener.try_clone().context("sharing the pool's socket")?,
            state: state.clone(),
        };
        let first = first_tx.clone();
        std::thread::Builder::new()
            .name("pier-pool-slot".into())
            .spawn(move || slot.run(first))
            .context("starting a worker slot")?;
    }
    drop(first_tx);
    for _ in 0..args.size {
        match first_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                let _ = std::fs::remove_file(&socket);
                bail!("preparing a VM: {why}");
            }
            Err(_) => bail!("the pool's workers ended before they were ready"),
        }
    }
    eprintln!("pier: pool of {} VMs ready at {}", args.size, socket.display());
    match &preboot {
        None => eprintln!("pier: boot with: pier boot --pool {} IMAGE", socket.display()),
        Some(spec) => eprintln!(
            "pier: each VM has booted {} (CID {}); boot with: pier boot --pool {} --cid {} {}{}",
            spec.image.display(),
            spec.cid,
            socket.display(),
            spec.cid,
            spec.image.display(),
            if spec.args.is_empty() {
                String::new()
            } else {
                format!(" -- {}", spec.args.join(" "))
            }
        ),
    }

    let (stop_tx, stop_rx) = mpsc::channel();
    let stats_state = state.clone();
    let lifecycle = Lifecycle::start(
        false,
        move || {
            Ok(format!(
                "VMs ready: {}\nboots served: {}\n",
                stats_state.ready.load(Ordering::Relaxed),
                stats_state.served.load(Ordering::Relaxed)
            ))
        },
        move |signal| {
            let _ = stop_tx.send(signal);
        },
    )?;
    let signal = stop_rx.recv().unwrap_or(SIGTERM);
    // Idle workers see the pool's end of their pipes close and exit; the
    // running ones carry on with their clients' VMs.
    let _ = std::fs::remove_file(&socket);
    lifecycle.finish(std::iter::empty::<(PathBuf, String)>);
    eprintln!("pier: pool stopped (signal {signal})");
    Ok(lifecycle::stopped_by(signal))
}

/// `$XDG_RUNTIME_DIR/pier/pool.sock`, or `/tmp/pier-<uid>/pool.sock`.
fn default_socket() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .map(|d| d.join("pier"))
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/pier-{}", current_uid())));
    dir.join("pool.sock")
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Makes the socket's folder (mode 0700) if it is missing. The default
/// one must also be the caller's and closed to others, or the pool does
/// not start; a folder the user named is only warned about, since the
/// peer check still refuses other users.
fn private_dir(socket: &Path, enforce: bool) -> Result<()> {
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("making the pool's folder {}", dir.display()))?;
    }
    let meta = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    let open_to_others = meta.mode() & 0o077 != 0 || meta.uid() != current_uid();
    if open_to_others && enforce {
        bail!(
            "the pool's folder {} must be yours and closed to others (mode 0700); it is mode {:o}, owner uid {}",
            dir.display(),
            meta.mode() & 0o7777,
            meta.uid()
        );
    }
    if open_to_others {
        tracing::warn!(
            "{} is open to other users: the pool refuses them, but a 0700 folder would keep them from reaching it",
            dir.display()
        );
    }
    Ok(())
}

/// Binds `socket`, replacing a stale socket file a dead pool left, but
/// never a live pool's.
fn bind(socket: &Path) -> Result<UnixListener> {
    if socket.exists() {
        match UnixStream::connect(socket) {
            Ok(_) => bail!("a pool already serves {}", socket.display()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(socket)
                    .with_context(|| format!("removing the stale socket {}", socket.display()))?;
            }
            Err(e) => bail!("{} exists and is not a pool's socket: {e}", socket.display()),
        }
    }
    UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))
}

#[derive(Default)]
struct PoolState {
    /// Workers whose VM is prepared and waiting.
    ready: AtomicUsize,
    /// Boots handed to workers.
    served: AtomicU64,
}

/// One place in the pool: a worker at a time, replaced when it takes a
/// boot or dies.
struct Slot {
    exe: PathBuf,
    mem: u64,
    preboot: Option<PrebootSpec>,
    listener: UnixListener,
    state: Arc<PoolState>,
}

impl Slot {
    /// Keeps a prepared worker in this slot for as long as the pool runs.
    /// The first worker's readiness (or why it could not prepare) goes to
    /// `first`, so the pool does not claim to be ready when it cannot be.
    fn run(self, first: mpsc::Sender<Result<(), String>>) {
        let mut first = Some(first);
        loop {
            let (mut child, mut reports) = match self.start_worker() {
                Ok(worker) => worker,
                Err(why) => {
                    match first.take() {
                        Some(first) => {
                            let _ = first.send(Err(why));
                            return;
                        }
                        None => tracing::error!("a worker could not prepare its VM: {why}"),
                    }
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            self.state.ready.fetch_add(1, Ordering::Relaxed);
            if let Some(first) = first.take() {
                let _ = first.send(Ok(()));
                // Replacements start while a boot is under way (they
                // follow its start), and would take CPU from it: they
                // prepare with what is left over. Workers inherit the
                // policy of this thread, which spawns them; each returns
                // to the normal policy when it takes a boot.
                set_policy(libc::SCHED_IDLE);
            }
            let report = read_report(&mut reports);
            self.state.ready.fetch_sub(1, Ordering::Relaxed);
            if report.as_deref() == Some("taken") {
                self.state.served.fetch_add(1, Ordering::Relaxed);
                // The worker now runs its client's VM; it is only reaped.
                std::thread::spawn(move || child.wait());
                self.wait_for_the_boot_to_start();
            } else {
                tracing::warn!("an idle worker ended ({}); replacing it", wait_status(&mut child));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Holds the replacement back while the boot that took this slot's
    /// worker starts, unless no prepared VM is left for the next boot.
    /// A replacement's start (an exec of this large binary, a VM made,
    /// its memory touched) takes milliseconds of CPU, and idle priority
    /// does not keep it off the booting vCPU's CPU: the scheduler may
    /// still pick a newly started task and leave it the CPU for its
    /// slice (traced on a 2-CPU host, the vCPU thread waited 2.4 ms).
    /// In five comparisons of 96 boots each, alternating pools with and
    /// without this wait, the median boot was 0.14 to 0.64 ms lower
    /// with it.
    fn wait_for_the_boot_to_start(&self) {
        let deadline = Instant::now() + REPLACE_AFTER;
        while self.state.ready.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(REPLACE_CHECK);
        }
    }

    /// Starts a worker and waits until its VM is prepared; or why not.
    fn start_worker(&self) -> Result<(Child, BufReader<std::process::ChildStdout>), String> {
        let (mut child, mut reports) =
            self.spawn().map_err(|e| format!("starting a worker: {e}"))?;
        match read_report(&mut reports) {
            Some(report) if report == "ready" => Ok((child, reports)),
            Some(report) if report.starts_with("error ") => {
                let _ = child.wait();
                Err(report["error ".len()..].to_owned())
            }
            _ => Err(format!("the worker ended ({})", wait_status(&mut child))),
        }
    }

    fn spawn(&self) -> io::Result<(Child, BufReader<std::process::ChildStdout>)> {
        let listener = OwnedFd::from(self.listener.try_clone()?);
        let mut command = Command::new(&self.exe);
        command.arg("pool-worker").arg("--mem").arg(self.mem.to_string());
        if let Some(spec) = &self.preboot {
            command
                .arg("--preboot")
                .arg(&spec.image)
                .arg("--cid")
                .arg(spec.cid.to_string())
                .arg("--")
                .args(&spec.args);
        }
        let mut child = command
            .stdin(Stdio::from(listener))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let reports = BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok((child, reports))
    }
}

/// Puts the calling thread under the scheduling `policy` (nice 0); a
/// refusal only costs speed, so it is logged, no more.
fn set_policy(policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is valid for the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        tracing::debug!("scheduling policy {policy}: {}", io::Error::last_os_error());
    }
}

/// The next line a worker wrote on its pipe; `None` at its end.
fn read_report(reports: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    match reports.read_line(&mut line) {
        Ok(n) if n > 0 => Some(line.trim_end().to_owned()),
        _ => None,
    }
}

fn wait_status(child: &mut Child) -> String {
    match child.wait() {
        Ok(status) => status.to_string(),
        Err(e) => format!("its status is unknown: {e}"),
    }
}

// -------------------------------------------------------------- the worker

/// `pier pool-worker`: stdin is the pool's listening socket, stdout the
/// pipe to the pool.
pub fn worker(args: WorkerArgs) -> Result<i32> {
    let prepared = match PreparedVm::new(args.mem, Path::new("/dev/kvm")) {
        Ok(prepared) => prepared,
        Err(e) => {
            report(&format!("error {}", one_line(&e.to_string())));
            return Ok(1);
        }
    };
    prepared.prefault(PREFAULT_BYTES);
    // SAFETY: the pool passes its listening socket as stdin, and nothing
    // else in this process uses descriptor 0.
    let listener = unsafe { UnixListener::from_raw_fd(0) };
    let Some(image) = args.preboot else {
        report("ready");
        let Some((conn, job, fds)) = accept_job(listener, |_, _| Ok(()))? else {
            return Ok(0);
        };
        return run_job(Waiting::Prepared(prepared), conn, job, fds);
    };
    let spec = PrebootSpec { image, cid: args.cid, args: args.args };
    let console = HeldConsole::default();
    let (vm, image) = match preboot(prepared, &spec, &console) {
        Ok(booted) => booted,
        Err(e) => {
            report(&format!("error {}", one_line(&format!("{e:#}"))));
            return Ok(1);
        }
    };
    report("ready");
    serve_prebooted(vm, Prebooted { spec, image, mem: args.mem }, console, listener)
}

/// Boots `spec`'s image in `prepared`, its device waiting and its console
/// held.
fn preboot(prepared: PreparedVm, spec: &PrebootSpec, console: &HeldConsole) -> Result<(Vm, Image)> {
    let image = Image::read(&spec.image)?;
    let mem = prepared.mem_size();
    let job = BootJob {
        image: spec.image.clone(),
        cid: spec.cid,
        // Bound only when a boot starts the device, with that boot's path.
        uds: PathBuf::new(),
        mem_size: Some(mem),
        pcap: None,
        pcap_snaplen: 0,
        stats: false,
        args: spec.args.clone(),
    };
    let config = VmConfig { serial: Box::new(console.clone()), ..job.config(mem, None)? };
    let vm = prepared
        .preboot(&image, config)
        .with_context(|| format!("prebooting {}", spec.image.display()))?;
    Ok((vm, image))
}

/// The guest a prebooted worker runs, as the pool's owner asked for it.
struct Prebooted {
    spec: PrebootSpec,
    image: Image,
    mem: u64,
}

impl Prebooted {
    /// Refuses a boot that asks for anything but the guest this VM
    /// booted: the same image (byte for byte: the client opened its file
    /// itself), CID, memory and arguments. The socket, the capture and
    /// `--stats` are the boot's own.
    fn refuse_unless_booted(&self, job: &BootJob, image: &OwnedFd) -> Result<()> {
        let mut bytes = Vec::new();
        File::from(image.try_clone().context("reading the boot's image")?)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", job.image.display()))?;
        let mut differs = Vec::new();
        if bytes != self.image.bytes() {
            differs.push(format!("the image {}", job.image.display()));
        }
        if job.cid != self.spec.cid {
            differs.push(format!("CID {}", job.cid));
        }
        if let Some(mem) = job.mem_size.filter(|mem| *mem != self.mem) {
            differs.push(format!("{} MiB", mem >> 20));
        }
        if job.args != self.spec.args {
            differs.push(format!("the arguments {:?}", job.args));
        }
        if differs.is_empty() {
            return Ok(());
        }
        bail!(
            "this pool booted {} ahead of time (CID {}, {} MiB, arguments {:?}), and the boot asks for {}: boot it without --pool, or from a pool started with --preboot for it",
            self.spec.image.display(),
            self.spec.cid,
            self.mem >> 20,
            self.spec.args,
            differs.join(", ")
        )
    }
}

/// Runs the prebooted guest on this thread (the vCPU's own) while another
/// takes the boot that asks for it, then hands the guest over.
fn serve_prebooted(
    mut vm: Vm,
    prebooted: Prebooted,
    console: HeldConsole,
    listener: UnixListener,
) -> Result<i32> {
    let mem = prebooted.mem;
    let pause = vm.pause_handle();
    let (job_tx, job_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("pier-pool-accept".into())
        .spawn(move || {
            let job = accept_job(listener, |job, image| prebooted.refuse_unless_booted(job, image));
            let _ = job_tx.send(job);
            // Paused with the guest wherever it is; most often halted,
            // listening.
            pause.pause();
        })
        .context("starting the worker's accept thread")?;
    if let Some(end) = vm.run_until_paused().transpose() {
        // The guest ended before anyone asked for it: the boot that does
        // gets its console and its end, as if it had just happened.
        vm.keep_end(end);
    }
    let Some((conn, job, fds)) = job_rx.recv().context("the accept thread ended")?? else {
        return Ok(0);
    };
    // The accept thread left idle priority for itself only; this thread
    // is the vCPU's, and the device thread it starts inherits its policy.
    set_policy(libc::SCHED_OTHER);
    run_job(Waiting::Prebooted { vm: Box::new(vm), console, mem }, conn, job, fds)
}

/// A worker's VM, as it waits for its boot.
enum Waiting {
    /// Made, with no image yet.
    Prepared(PreparedVm),
    /// With `--preboot`'s guest already running, its device waiting.
    Prebooted { vm: Box<Vm>, console: HeldConsole, mem: u64 },
}

/// Takes the first boot from the pool's owner that `check` accepts
/// (answering the others with why not), and says `taken` on the pipe;
/// `None` if the pool went away first.
fn accept_job(
    listener: UnixListener,
    check: impl Fn(&BootJob, &OwnedFd) -> Result<()>,
) -> Result<Option<(UnixStream, BootJob, [OwnedFd; JOB_FDS])>> {
    loop {
        if !wait_for_client(&listener)? {
            // The pool is gone: nobody will replace or count this worker.
            return Ok(None);
        }
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("accepting a boot: {e}");
                continue;
            }
        };
        match take_job(&conn).and_then(|(job, fds)| check(&job, &fds[0]).map(|()| (job, fds))) {
            Ok((job, fds)) => {
                report("taken");
                set_policy(libc::SCHED_OTHER);
                // Descriptor 0 becomes the client's stdin: this worker
                // accepts no more.
                std::mem::forget(listener);
                return Ok(Some((conn, job, fds)));
            }
            Err(refusal) => {
                tracing::warn!("{refusal:#}");
                let _ = (&conn)
                    .write_all(format!("error {}\n", one_line(&refusal.to_string())).as_bytes());
            }
        }
    }
}

/// The prebooted guest's console until a boot takes it: kept, up to
/// [`MAX_HELD_CONSOLE`] bytes, then written to the boot's stdout and
/// passed through from there on.
#[derive(Clone, Default)]
struct HeldConsole(Arc<Mutex<HeldBytes>>);

#[derive(Default)]
struct HeldBytes {
    kept: Vec<u8>,
    /// Bytes past the cap, which the boot is told it lost.
    dropped: usize,
    released: bool,
}

impl HeldConsole {
    /// Writes what was kept to stdout (the boot's, by now) and passes
    /// the console through from here on.
    fn release(&self) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = io::stdout().lock();
        let _ = out.write_all(&held.kept).and_then(|()| out.flush());
        if held.dropped > 0 {
            eprintln!(
                "pier: the guest wrote {} bytes to its console before this boot beyond the {MAX_HELD_CONSOLE} the pool keeps; they are lost",
                held.dropped
            );
        }
        held.kept = Vec::new();
        held.released = true;
    }
}

impl Write for HeldConsole {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if held.released {
            drop(held);
            return io::stdout().write(buf);
        }
        let room = MAX_HELD_CONSOLE.saturating_sub(held.kept.len()).min(buf.len());
        held.kept.extend_from_slice(&buf[..room]);
        held.dropped += buf.len() - room;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.0.lock().unwrap_or_else(|p| p.into_inner()).released {
            return io::stdout().flush();
        }
        Ok(())
    }
}

/// One line on the pipe to the pool.
fn report(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Waits until a client connects (`true`) or the pool's end of the pipe
/// closes (`false`).
fn wait_for_client(listener: &UnixListener) -> Result<bool> {
    let mut fds = [
        libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        // A pipe's write end polls POLLERR once its reader is gone.
        libc::pollfd { fd: 1, events: 0, revents: 0 },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("waiting for a boot");
        }
        if fds[1].revents != 0 {
            return Ok(false);
        }
        if fds[0].revents != 0 {
            return Ok(true);
        }
    }
}

/// Checks the client is the pool's owner and reads its job.
fn take_job(conn: &UnixStream) -> Result<(BootJob, [OwnedFd; JOB_FDS])> {
    let (uid, pid) =
        pier_device::bridge::peer_credentials(conn).context("reading the client's credentials")?;
    let owner = current_uid();
    if uid != owner {
        bail!(
            "the pool refused a boot from uid {uid} (pid {pid}): only its owner, uid {owner}, may boot there"
        );
    }
    conn.set_read_timeout(Some(JOB_TIMEOUT)).context("setting the job's timeout")?;
    let (payload, fds) = recv_frame(conn).context("reading the boot's job")?;
    conn.set_read_timeout(None).context("clearing the job's timeout")?;
    let fds: [OwnedFd; JOB_FDS] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
        anyhow!("the job carried {} descriptors, not {JOB_FDS}", fds.len())
    })?;
    Ok((decode_job(&payload)?, fds))
}

/// Moves onto the client's folder and descriptors and boots its image.
fn run_job(
    waiting: Waiting,
    conn: UnixStream,
    job: BootJob,
    [image, cwd, stdin, stdout, stderr]: [OwnedFd; JOB_FDS],
) -> Result<i32> {
    // SAFETY: fchdir and dup2 on descriptors this process owns; 0, 1 and
    // 2 are replaced whole (the listener and the pipe are not used again).
    let moved = unsafe {
        libc::fchdir(cwd.as_raw_fd()) == 0
            && libc::dup2(stdin.as_raw_fd(), 0) == 0
            && libc::dup2(stdout.as_raw_fd(), 1) == 1
            && libc::dup2(stderr.as_raw_fd(), 2) == 2
    };
    if !moved {
        let e = io::Error::last_os_error();
        let _ =
            (&conn).write_all(format!("error taking the client's descriptors: {e}\n").as_bytes());
        return Ok(1);
    }
    drop((cwd, stdin, stdout, stderr));

    let (serving_tx, serving_rx) = mpsc::channel::<()>();
    let relay = conn.try_clone().context("sharing the client's connection")?;
    std::thread::Builder::new()
        .name("pier-pool-relay".into())
        .spawn(move || relay_signals(relay, serving_rx))
        .context("starting the signal relay")?;

    let image = File::from(image);
    let (mem_size, make_vm): (u64, Box<dyn FnOnce(VmConfig) -> Result<Vm>>) = match waiting {
        Waiting::Prepared(prepared) => (
            job.mem_size.unwrap_or(prepared.mem_size()),
            Box::new(|config| {
                let image = Image::from_file(image, &job.image)?;
                Ok(prepared.boot(&image, config)?)
            }),
        ),
        Waiting::Prebooted { mut vm, console, mem } => {
            console.release();
            (
                mem,
                Box::new(move |config: VmConfig| {
                    let spec = config.vsock.as_ref().context("the boot has no vsock device")?;
                    vm.start_device(spec)?;
                    Ok(*vm)
                }),
            )
        }
    };
    let result = boot::serve(&job, (None, None), make_vm, mem_size, |_| {
        let _ = serving_tx.send(());
        Ok(())
    });
    let last = match result {
        Ok(code) => format!("exit {code}\n"),
        Err(e) => format!("error {}\n", one_line(&format!("{e:#}"))),
    };
    let _ = (&conn).write_all(last.as_bytes());
    Ok(0)
}

/// Raises on this process each signal the client relays, once the boot
/// watches them (`serving`), so they act as on `pier boot`. A client that
/// goes away is SIGTERM: its VM stops.
fn relay_signals(conn: UnixStream, serving: mpsc::Receiver<()>) {
    let mut lines = BufReader::new(conn).lines();
    let mut watched = false;
    loop {
        let (signal, last) = match lines.next() {
            Some(Ok(line)) => match line.strip_prefix("signal ").and_then(|n| n.parse().ok()) {
                Some(signal @ (SIGINT | SIGTERM | SIGHUP | SIGUSR1)) => (signal, false),
                _ => continue,
            },
            _ => (SIGTERM, true),
        };
        // The handlers are installed when the boot serves; before that a
        // signal would kill the worker with the socket files left behind.
        if !watched {
            if serving.recv().is_err() {
                return;
            }
            watched = true;
        }
        // SAFETY: kill(2) on this very process.
        unsafe { libc::kill(libc::getpid(), signal) };
        if last {
            return;
        }
    }
}

// -------------------------------------------------------------- the client

/// `pier boot --pool SOCKET`: sends `job` to a worker of the pool and
/// relays signals until its exit code comes back.
pub fn boot(socket: &Path, job: &BootJob) -> Result<i32> {
    let image = File::open(&job.image)
        .with_context(|| format!("booting {}: opening the image", job.image.display()))?;
    let cwd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(".")
        .context("opening the working folder")?;
    let conn = UnixStream::connect(socket).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            anyhow!("no pool at {} (start one with `pier pool --socket {0}`)", socket.display())
        }
        io::ErrorKind::ConnectionRefused => {
            anyhow!("the pool at {} is gone: nothing listens on its socket", socket.display())
        }
        _ => anyhow!("connecting to the pool at {}: {e}", socket.display()),
    })?;
    let fds = [image.as_raw_fd(), cwd.as_raw_fd(), 0, 1, 2];
    send_frame(&conn, &encode_job(job), &fds)
        .with_context(|| format!("sending the boot to the pool at {}", socket.display()))?;
    drop((image, cwd));

    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1]).context("installing signal handlers")?;
    let relay = conn.try_clone().context("sharing the pool's connection")?;
    std::thread::Builder::new().name("pier-signals".into()).spawn(move || {
        for signal in signals.forever() {
            if (&relay).write_all(format!("signal {signal}\n").as_bytes()).is_err() {
                break;
            }
        }
    })?;

    let mut reply = String::new();
    BufReader::new(&conn).read_line(&mut reply).ok();
    let reply = reply.trim_end();
    if let Some(code) = reply.strip_prefix("exit ") {
        return code
            .parse()
            .with_context(|| format!("the pool's VM sent a bad exit code {code:?}"));
    }
    if let Some(why) = reply.strip_prefix("error ") {
        bail!("{why}");
    }
    bail!(
        "the pool's VM for {} ended without an exit code: its worker died, or the pool at {} went away",
        job.image.display(),
        socket.display()
    )
}

// ----------------------------------------------------------------- the wire

/// The job as NUL-separated fields after [`JOB_MAGIC`]; the app's
/// arguments come last.
fn encode_job(job: &BootJob) -> Vec<u8> {
    let mut fields: Vec<Vec<u8>> = vec![
        JOB_MAGIC.into(),
        job.image.as_os_str().as_bytes().to_vec(),
        job.cid.to_string().into(),
        job.uds.as_os_str().as_bytes().to_vec(),
        job.mem_size.map(|m| m.to_string()).unwrap_or_default().into(),
        job.pcap.as_ref().map(|p| p.as_os_str().as_bytes().to_vec()).unwrap_or_default(),
        job.pcap_snaplen.to_string().into(),
        if job.stats { "1" } else { "0" }.into(),
    ];
    fields.extend(job.args.iter().map(|a| a.as_bytes().to_vec()));
    fields.join(&0u8)
}

fn decode_job(payload: &[u8]) -> Result<BootJob> {
    let mut fields = payload.split(|b| *b == 0);
    let mut next = |what: &str| fields.next().ok_or_else(|| anyhow!("the job has no {what}"));
    if next("header")? != JOB_MAGIC.as_bytes() {
        bail!("not a boot job from this pier (a different version?)");
    }
    let path = |b: &[u8]| PathBuf::from(std::ffi::OsString::from_vec(b.to_vec()));
    let text = |b: &[u8], what: &str| {
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| anyhow!("the job's {what} is not text"))
    };
    let number = |b: &[u8], what: &str| -> Result<u64> {
        text(b, what)?.parse().map_err(|_| anyhow!("the job's {what} is not a number"))
    };
    let image = path(next("image")?);
    let cid = u32::try_from(number(next("CID")?, "CID")?).context("the job's CID")?;
    let uds = path(next("socket")?);
    let mem = next("memory size")?;
    let mem_size = if mem.is_empty() { None } else { Some(number(mem, "memory size")?) };
    let pcap = next("capture")?;
    let pcap = (!pcap.is_empty()).then(|| path(pcap));
    let pcap_snaplen =
        u32::try_from(number(next("snaplen")?, "snaplen")?).context("the job's snaplen")?;
    let stats = next("stats flag")? == b"1";
    let args = fields.map(|a| text(a, "argument")).collect::<Result<_>>()?;
    Ok(BootJob { image, cid, uds, mem_size, pcap, pcap_snaplen, stats, args })
}

/// A message header over one buffer (`iov`) and a control buffer; both
/// must outlive its use.
fn message(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    msg
}

/// One frame: its length (u32, little-endian), then `payload`, with `fds`
/// attached, in one message.
fn send_frame(conn: &UnixStream, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("job too large"))?;
    let mut data = len.to_le_bytes().to_vec();
    data.extend_from_slice(payload);
    let fds_len = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fds_len as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let msg = message(&mut iov, &mut control);
    // SAFETY: the control buffer has room for one header with `fds`
    // (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and CMSG_DATA in bounds.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fds_len as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
    }
    // SAFETY: msg points at live buffers for the call's duration.
    let sent = unsafe { libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The descriptors went with the first byte; the rest, if the socket
    // took only part, follows.
    (&*conn).write_all(&data[sent as usize..])
}

/// Reads one [`send_frame`] frame and the descriptors that came with it.
fn recv_frame(conn: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; 4 + MAX_JOB];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((8 * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut msg = message(&mut iov, &mut control);
    let got = loop {
        // SAFETY: msg points at live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen with
    // well-formed headers, which the CMSG macros walk.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("the job carried too many descriptors"));
    }
    if got < 4 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the client sent no job"));
    }
    let len = u32::from_le_bytes(data[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_JOB {
        return Err(io::Error::other(format!("a job of {len} bytes is too large")));
    }
    let mut payload = data[4..got.min(4 + len)].to_vec();
    if payload.len() < len {
        let have = payload.len();
        payload.resize(len, 0);
        (&*conn).read_exact(&mut payload[have..])?;
    }
    Ok((payload, fds))
}

/// A message as one line of the wire.
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_survives_the_wire() {
        let job = BootJob {
            image: "images/echo".into(),
            cid: 7,
            uds: "/run/x.vsock".into(),
            mem_size: Some(64 << 20),
            pcap: Some("out.pcap".into()),
            pcap_snaplen: 256,
            stats: true,
            args: vec!["--port".into(), "".into(), "a b".into()],
        };
        assert_eq!(decode_job(&encode_job(&job)).unwrap(), job);
        let defaults = BootJob { mem_size: None, pcap: None, stats: false, args: vec![], ..job };
        assert_eq!(decode_job(&encode_job(&defaults)).unwrap(), defaults);
        assert!(decode_job(b"pier-boot-job/0\0x").is_err());
    }
}
