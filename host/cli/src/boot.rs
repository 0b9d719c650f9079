//! `pier boot IMAGE`: boot a unikernel image in pier-vmm, with the guest's
//! console on stdout and its vsock device behind the same hybrid Unix
//! socket `pier run` uses.
//!
//! The guest's exit code becomes pier's. SIGINT, SIGTERM or SIGHUP stop
//! the VM wherever the guest is; the socket files are removed, and the
//! exit code is 128 + the signal's number, as for `pier run`. SIGUSR1
//! prints the device's counters (`--stats` prints them at the end too).
//! With the hidden `--inject-resets-on-sigusr2` (for the soak), SIGUSR2
//! sets off a device fault.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use pier_vmm::{
    CaptureSpec, DEFAULT_MEM_SIZE, DeviceSpec, Exit, Fault, FaultInjector, GuestCid, StatsHandle,
    Vm, VmConfig,
};

use crate::lifecycle::{self, CaptureArgs, Lifecycle, RingTraceRun, Stats};
use crate::size::parse_size;
use pier_device::RingTrace;

#[derive(Args, Debug)]
pub struct BootArgs {
    /// The image: an app built for x86_64-unknown-none (`cargo xtask image
    /// NAME` builds one).
    image: PathBuf,
    /// The guest's CID.
    #[arg(long, value_name = "N", default_value_t = 3)]
    cid: u32,
    /// The hybrid vsock Unix socket [default: $XDG_RUNTIME_DIR/pier-<cid>.vsock,
    /// or /tmp/pier-<cid>.vsock].
    #[arg(long, value_name = "PATH")]
    uds: Option<PathBuf>,
    /// Guest memory: bytes, or with a K, M or G suffix [default: 128M, or
    /// the pool's with --pool].
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// Boot in a VM that `pier pool --socket PATH` prepared ahead of time,
    /// in a few milliseconds less. Console, exit code and signals are as
    /// without it.
    #[arg(long, value_name = "PATH")]
    pub pool: Option<PathBuf>,
    #[command(flatten)]
    capture: CaptureArgs,
    /// Print the device's counters (packets, bytes, connections, drops
    /// and resets by reason) when the VM ends. SIGUSR1 prints them at any
    /// time, with or without this flag. The guest's own counters live in
    /// the guest.
    #[arg(long)]
    stats: bool,
    /// Testing: each SIGUSR2 sets off a fault in the device, alternately
    /// a TRANSPORT_RESET and a request that the guest reset the device
    /// (which pier-rt's driver follows by restarting), and says which on
    /// stderr.
    #[arg(long, hide = true, conflicts_with = "pool")]
    inject_resets_on_sigusr2: bool,
    /// Arguments for the app: everything after the image (from the first
    /// argument that is not one of pier's options), or after `--`.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

impl BootArgs {
    /// Whether `--ring-trace` was given (which a pool's VM cannot record:
    /// its device lives in another process).
    pub fn traces_rings(&self) -> bool {
        self.capture.ring_trace.is_some()
    }
}

/// One boot, its defaults resolved: what `pier boot` runs, and what
/// `pier boot --pool` sends a pool's VM to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootJob {
    pub image: PathBuf,
    pub cid: u32,
    pub uds: PathBuf,
    /// `None`: the default (128M, or the pool's).
    pub mem_size: Option<u64>,
    pub pcap: Option<PathBuf>,
    pub pcap_snaplen: u32,
    pub stats: bool,
    pub args: Vec<String>,
}

impl BootJob {
    pub fn from_args(args: BootArgs) -> Result<Self> {
        let mem_size = args.mem.as_deref().map(|m| parse_size("--mem", m)).transpose()?;
        let uds = args.uds.unwrap_or_else(|| lifecycle::default_uds(args.cid));
        Ok(Self {
            image: args.image,
            cid: args.cid,
            uds,
            mem_size,
            pcap: args.capture.pcap,
            pcap_snaplen: args.capture.pcap_snaplen,
            stats: args.stats,
            args: args.args,
        })
    }

    /// The VM's configuration (its console on stdout), its device
    /// recording into `ring_trace` when set.
    pub(crate) fn config(&self, mem_size: u64, ring_trace: Option<RingTrace>) -> Result<VmConfig> {
        Ok(VmConfig {
            mem_size,
            app_args: self.args.clone(),
            vsock: Some(DeviceSpec {
                capture: self
                    .pcap
                    .clone()
                    .map(|path| CaptureSpec { path, snaplen: self.pcap_snaplen }),
                ring_trace,
                ..DeviceSpec::new(GuestCid::new(self.cid)?, &self.uds)
            }),
            ..VmConfig::default()
        })
    }
}

/// The device's counters, or why there are none.
fn stats(stats: Option<&StatsHandle>) -> Stats {
    match stats.map(StatsHandle::stats) {
        Some(Some(device)) => Ok(device.to_string()),
        Some(None) => Err("the device did not answer"),
        None => Err("the VM has no vsock device"),
    }
}

/// `pier boot` without `--pool` (`main` hands a `--pool` boot to
/// `pool::boot`).
pub fn run(args: BootArgs) -> Result<i32> {
    let ring_trace = args.capture.start_ring_trace()?;
    let inject_resets = args.inject_resets_on_sigusr2;
    let job = BootJob::from_args(args)?;
    let mem_size = job.mem_size.unwrap_or(DEFAULT_MEM_SIZE);
    let make_vm = |config| Vm::new(&job.image, config).map_err(Into::into);
    let mut injector = None;
    let code = serve(&job, ring_trace, make_vm, mem_size, |vm| {
        if inject_resets {
            injector = vm.fault_injector().map(inject_resets_on_sigusr2).transpose()?;
        }
        Ok(())
    });
    if let Some(injector) = injector {
        injector.close();
    }
    code
}

/// `--inject-resets-on-sigusr2`: a thread that sets off the next fault on
/// each SIGUSR2. The handle stops it.
fn inject_resets_on_sigusr2(injector: FaultInjector) -> Result<signal_hook::iterator::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR2])
        .context("installing the SIGUSR2 handler")?;
    let handle = signals.handle();
    std::thread::Builder::new().name("pier-faults".into()).spawn(move || {
        let faults = [Fault::TransportReset, Fault::DeviceReset];
        for (fault, _) in faults.into_iter().cycle().zip(signals.forever()) {
            // Said first, in one write, so that nothing the guest's
            // console prints on the same terminal cuts into it.
            let line = format!("pier: injecting {fault:?}\n");
            eprint!("{line}");
            if let Err(e) = injector.inject(fault) {
                eprintln!("pier: injecting {fault:?} failed: {e}");
            }
        }
    })?;
    Ok(handle)
}

/// Builds the VM with `make_vm` and runs it to its end, as `pier boot`
/// does: the announcement, the signals (`serving` is called with the VM
/// once they are watched, before it runs), `--stats`, `--pcap` and
/// `--ring-trace` at the end, the exit code.
pub fn serve(
    job: &BootJob,
    (ring_trace, trace_run): (Option<RingTrace>, Option<RingTraceRun>),
    make_vm: impl FnOnce(VmConfig) -> Result<Vm>,
    mem_size: u64,
    serving: impl FnOnce(&Vm) -> Result<()>,
) -> Result<i32> {
    let config = job.config(mem_size, ring_trace)?;
    let mut vm = make_vm(config).with_context(|| format!("booting {}", job.image.display()))?;
    // The app's ports are its own business (the unikernel has no grants),
    // so the hint names none.
    lifecycle::announce(job.cid, &job.uds, "<PORT>");

    let stop = vm.stop_handle();
    let handle = vm.stats_handle();
    let lifecycle =
        Lifecycle::start(job.stats, move || stats(handle.as_ref()), move |_| stop.stop())?;
    serving(&vm)?;
    let result = vm.run();
    // Before the counters are printed: a stopping device first delivers
    // the guest bytes its host stack still holds, and those belong in them.
    if let Err(e) = vm.stop_device() {
        tracing::warn!("stopping the vsock device: {e}");
    }
    let signal = lifecycle.finish(|| {
        lifecycle::summaries(job.pcap.clone().zip(vm.finish_capture()), trace_run.as_ref())
    });
    // The device thread ends and the socket files go before pier exits.
    drop(vm);
    match result.with_context(|| format!("running {}", job.image.display()))? {
        Exit::Code(code) => Ok(i32::try_from(code).unwrap_or(-1)),
        Exit::Stopped => {
            let signal = signal.unwrap_or(0);
            eprintln!("pier: stopped the VM (signal {signal})");
            Ok(lifecycle::stopped_by(signal))
        }
    }
}
