//! `pier run`: one component, or several from a config file, on one
//! in-process vsock endpoint (pier-shim), until they end or a signal stops
//! them.
//!
//! The exit code is the first non-zero component exit code (0 when all
//! succeeded). SIGINT, SIGTERM or SIGHUP stop the components: running
//! WebAssembly traps, waits on vsock sockets end, queued bytes still go
//! out. A component that does not stop within [`STOP_GRACE`] (it sleeps,
//! or reads stdin), or a second signal, cuts the endpoint instead: host
//! connections close and the socket files are removed. The exit code is
//! then 128 + the signal's number. A signal after every component ended,
//! while pier waits for host programs to read what they wrote last, cuts
//! the endpoint at once and keeps the components' exit code.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pier_shim::{
    ComponentSpec, ComponentStdio, ConnectGrant, GrantNames, Grants, PcapOptions, PortGrant, Shim,
    ShimConfig, ShimOptions,
};

use crate::config;
use crate::lifecycle::{self, CaptureArgs, Lifecycle};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The component (a wasm32-wasip2 command).
    #[arg(required_unless_present = "config", conflicts_with = "config")]
    app: Option<PathBuf>,
    /// Run the components listed in this TOML file instead (see below).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The endpoint's CID [default: 3, or the config file's].
    #[arg(long, value_name = "N")]
    cid: Option<u32>,
    /// The hybrid vsock Unix socket [default: $XDG_RUNTIME_DIR/pier-<cid>.vsock,
    /// or /tmp/pier-<cid>.vsock].
    #[arg(long, value_name = "PATH")]
    uds: Option<PathBuf>,
    /// Grant binding and listening on a port (`*`: every port above 1023).
    /// Repeatable.
    #[arg(long, value_name = "PORT|*", conflicts_with = "config")]
    listen: Vec<PortGrant>,
    /// Grant connecting (and sending datagrams) to CID:PORT, either part
    /// may be `*`; `*` alone grants everything. Repeatable.
    #[arg(long, value_name = "CID:PORT|*", conflicts_with = "config")]
    connect: Vec<ConnectGrant>,
    /// Set an environment variable for the component, as NAME=VALUE, or
    /// NAME to pass on the host's value (as `wasmtime run --env`).
    /// Repeatable. The component sees no other variable.
    #[arg(long, value_name = "NAME[=VALUE]", value_parser = env_var, conflicts_with = "config")]
    env: Vec<(String, String)>,
    /// Give the component a host directory, as HOST or HOST::GUEST.
    /// Repeatable. No directory is visible otherwise.
    #[arg(long, value_name = "HOST[::GUEST]", conflicts_with = "config")]
    dir: Vec<pier_shim::Preopen>,
    /// Let the component(s) use wasi:sockets TCP on loopback addresses
    /// (for baselines). Off by default.
    #[arg(long)]
    wasi_tcp: bool,
    /// Compile the component(s) afresh instead of loading the machine
    /// code kept from an earlier run (in $XDG_CACHE_HOME/pier/components,
    /// or ~/.cache/pier/components).
    #[arg(long)]
    no_compile_cache: bool,
    /// Sockets one component may hold at once.
    #[arg(long, value_name = "N", default_value_t = pier_shim::DEFAULT_SOCKET_LIMIT)]
    socket_limit: usize,
    /// The most linear memory the component may hold (bytes, or a number
    /// with K, M or G). Growing past it ends the component with exit code
    /// 137, as a container's OOM kill does. Unlimited by default.
    #[arg(long, value_name = "SIZE", value_parser = memory_size, conflicts_with = "config")]
    max_memory: Option<u64>,
    /// Testing: bytes per receive buffer the in-process driver posts,
    /// header included (a guest with tiny buffers makes the device split
    /// every packet).
    #[arg(long, value_name = "BYTES", hide = true)]
    driver_rx_buffer_size: Option<usize>,
    /// Testing: the in-process driver's transmit buffers (1: a transmit
    /// queue that is full whenever a packet is in flight).
    #[arg(long, value_name = "N", hide = true)]
    driver_tx_buffers: Option<usize>,
    /// Testing: each SIGUSR2 sets off a reset, alternately the guest
    /// restarting its driver and the device sending TRANSPORT_RESET, and
    /// says which on stderr.
    #[arg(long, hide = true)]
    inject_resets_on_sigusr2: bool,
    #[command(flatten)]
    capture: CaptureArgs,
    /// Print every counter (bytes, packets, connections, drops and resets
    /// by reason, full queues, per component) when pier exits. SIGUSR1
    /// prints them at any time, with or without this flag.
    #[arg(long)]
    stats: bool,
    /// Arguments for the component: everything after it, as with
    /// `wasmtime run` (from the first argument that is not one of pier's
    /// options), or everything after `--`.
    #[arg(last = true, value_name = "ARGS", conflicts_with = "config")]
    args: Vec<String>,
}

pub fn run(args: RunArgs) -> Result<i32> {
    let (ring_trace, trace_run) = args.capture.start_ring_trace()?;
    let options = ShimOptions {
        wasi_tcp: args.wasi_tcp,
        socket_limit: args.socket_limit,
        pcap: pcap_options(&args.capture),
        ring_trace,
        compile_cache: compile_cache(&args),
        driver: driver_config(&args),
        grant_names: GrantNames::PIER_RUN,
    };
    let (config, options) = match &args.config {
        Some(path) => {
            let file = config::ConfigFile::load(path)?;
            let cid = args.cid.or(file.cid).unwrap_or(pier_shim::DEFAULT_CID);
            let uds = args
                .uds
                .clone()
                .or(file.uds.clone())
                .unwrap_or_else(|| lifecycle::default_uds(cid));
            let options = ShimOptions { wasi_tcp: args.wasi_tcp || file.wasi_tcp, ..options };
            let components = file.components().with_context(|| format!("in {}", path.display()))?;
            (ShimConfig { cid, uds, components }, options)
        }
        None => {
            let Some(app) = args.app.clone() else { bail!("no component given") };
            let cid = args.cid.unwrap_or(pier_shim::DEFAULT_CID);
            let uds = args.uds.clone().unwrap_or_else(|| lifecycle::default_uds(cid));
            let name = app
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "app".to_owned());
            let spec = ComponentSpec {
                name,
                wasm: app,
                args: args.args.clone(),
                env: args.env.clone(),
                grants: Grants { listen: args.listen.clone(), connect: args.connect.clone() },
                dirs: args.dir.clone(),
                stdio: ComponentStdio::default(),
                memory_limit: args.max_memory,
            };
            (ShimConfig { cid, uds, components: vec![spec] }, options)
        }
    };
    let port_hint = config
        .components
        .iter()
        .flat_map(|c| &c.grants.listen)
        .find_map(|g| match g {
            PortGrant::Port(p) => Some(p.to_string()),
            PortGrant::Any => None,
        })
        .unwrap_or_else(|| "<PORT>".to_owned());
    // Said once the socket listens (a start that fails shows no hint) and
    // before the components start, so it comes before their output.
    let (cid, uds) = (config.cid, config.uds.clone());
    let announce = || lifecycle::announce(cid, &uds, &port_hint);
    let shim = Shim::start_announced(config, options, announce).context("starting the shim")?;
    let monitor = shim.monitor();
    let injector =
        args.inject_resets_on_sigusr2.then(|| inject_resets_on_sigusr2(&shim)).transpose()?;
    let (tx, rx) = mpsc::channel();
    let lifecycle = {
        let monitor = monitor.clone();
        let tx = tx.clone();
        Lifecycle::start(
            args.stats,
            move || Ok(monitor.stats().to_string()),
            move |signal| {
                let _ = tx.send(Event::Signal(signal));
            },
        )?
    };
    let code = supervise(shim, tx, &rx);
    if let Some(injector) = injector {
        injector.close();
    }
    lifecycle.finish(|| {
        let capture = args.capture.pcap.clone().zip(monitor.finish_capture());
        lifecycle::summaries(capture, trace_run.as_ref())
    });
    code
}

/// `--inject-resets-on-sigusr2`: a thread that sets off the next reset on
/// each SIGUSR2. The handle stops it.
fn inject_resets_on_sigusr2(shim: &Shim) -> Result<signal_hook::iterator::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR2])
        .context("installing the SIGUSR2 handler")?;
    let handle = signals.handle();
    let injector = shim.fault_injector();
    std::thread::Builder::new().name("pier-faults".into()).spawn(move || {
        let faults = [pier_shim::Fault::DriverRestart, pier_shim::Fault::TransportReset];
        for (fault, _) in faults.into_iter().cycle().zip(signals.forever()) {
            // Said first, so that it is not interleaved with what the
            // reset makes components print.
            eprintln!("pier: injecting {fault:?}");
            if let Err(e) = injector.inject(fault) {
                eprintln!("pier: injecting {fault:?} failed: {e:#}");
            }
        }
    })?;
    Ok(handle)
}

/// `--pcap` and `--pcap-snaplen` as the shim takes them.
fn pcap_options(args: &CaptureArgs) -> Option<PcapOptions> {
    let path = args.pcap.clone()?;
    Some(PcapOptions { path, snaplen: args.pcap_snaplen })
}

/// Where compiled components are kept, unless `--no-compile-cache`.
fn compile_cache(args: &RunArgs) -> Option<PathBuf> {
    if args.no_compile_cache { None } else { pier_shim::compile_cache::default_dir() }
}

/// The hidden `--driver-*` options over the driver's defaults.
fn driver_config(args: &RunArgs) -> pier_shim::DriverConfig {
    let mut config = pier_shim::DriverConfig::default();
    if let Some(size) = args.driver_rx_buffer_size {
        config.rx_buffer_size = size;
    }
    if let Some(n) = args.driver_tx_buffers {
        config.tx_buffers = n;
    }
    config
}

/// `--env NAME=VALUE`, or `--env NAME` for the host's value of NAME.
fn env_var(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some(("", _)) => Err(format!("{text:?}: the name is empty")),
        Some((name, value)) => Ok((name.to_owned(), value.to_owned())),
        None => match std::env::var(text) {
            Ok(value) => Ok((text.to_owned(), value)),
            Err(_) => Err(format!("{text:?} is not set on the host (give NAME=VALUE)")),
        },
    }
}

/// `--max-memory SIZE`, as `pier boot --mem` reads sizes.
fn memory_size(text: &str) -> Result<u64, String> {
    crate::size::parse_size("--max-memory", text).map_err(|e| format!("{e:#}"))
}

/// How long components get to stop after SIGINT or SIGTERM before pier
/// closes the endpoint and exits anyway.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long pier waits, once it cut the endpoint after every component
/// had ended, for the shim to hand back their exit codes.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// What the supervisor waits for: the components' end, or a stop signal.
enum Event {
    /// Every component has ended; the shim still lets their connections
    /// finish closing and their last bytes reach the host programs.
    ComponentsEnded,
    /// The shim is done: each component's exit code.
    Ended(Result<Vec<(String, i32)>>),
    Signal(i32),
}

/// Waits for the components to end, and stops them on the first stop
/// signal; cuts the endpoint after [`STOP_GRACE`] or on a second signal.
/// A signal after every component ended cuts it at once: the shim is then
/// only waiting for host programs to read what the components wrote, and
/// the user will not wait (as `pier boot` does once its app has exited).
/// `tx` is the channel the stop signals arrive on, for the components'
/// end.
fn supervise(shim: Shim, tx: mpsc::Sender<Event>, rx: &mpsc::Receiver<Event>) -> Result<i32> {
    let stopper = shim.stopper();
    let ended = tx.clone();
    std::thread::Builder::new().name("pier-wait".into()).spawn(move || {
        let codes = shim.wait_noting_the_end(|| {
            let _ = ended.send(Event::ComponentsEnded);
        });
        let _ = tx.send(Event::Ended(codes));
    })?;
    let exit_code = |codes: Result<Vec<(String, i32)>>| -> Result<i32> {
        Ok(codes?.iter().map(|(_, code)| *code).find(|&c| c != 0).unwrap_or(0))
    };
    let mut components_ended = false;
    let signal = loop {
        match rx.recv().context("the shim's waiting thread ended")? {
            Event::ComponentsEnded => components_ended = true,
            Event::Ended(codes) => return exit_code(codes),
            Event::Signal(signal) if components_ended => {
                eprintln!("pier: stopping (signal {signal}); the components have ended");
                stopper.cut();
                let cut_at = Instant::now();
                // A further signal changes nothing: the cut is made.
                while let Ok(event) = rx.recv_timeout(CUT_GRACE.saturating_sub(cut_at.elapsed())) {
                    if let Event::Ended(codes) = event {
                        return exit_code(codes);
                    }
                }
                return Ok(lifecycle::stopped_by(signal));
            }
            Event::Signal(signal) => break signal,
        }
    };
    eprintln!("pier: stopping (signal {signal})");
    stopper.stop();
    let grace_ends = Instant::now() + STOP_GRACE;
    loop {
        match rx.recv_timeout(grace_ends.saturating_duration_since(Instant::now())) {
            Ok(Event::Ended(_)) => return Ok(lifecycle::stopped_by(signal)),
            // Stopped as asked: what remains is their connections closing.
            Ok(Event::ComponentsEnded) => components_ended = true,
            // A second signal: the user does not want to wait.
            Ok(Event::Signal(_)) => break,
            Err(_) => {
                let what = if components_ended {
                    "connections still closing"
                } else {
                    "components still running"
                };
                eprintln!("pier: {what} after {} s; closing the endpoint", STOP_GRACE.as_secs());
                break;
            }
        }
    }
    stopper.cut();
    Ok(lifecycle::stopped_by(signal))
}
