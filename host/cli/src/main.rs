//! `pier`: run WASI components with vsock sockets, and reach them from the
//! host.
//!
//! - `pier run APP.wasm` starts a shim (one vsock endpoint, CID 3 by
//!   default) with one component, or several from a config file, and
//!   exits with the component's exit code. Host programs reach it through
//!   the hybrid vsock Unix socket it prints.
//! - `pier boot IMAGE` boots an app built as a unikernel image in pier's
//!   KVM hypervisor (pier-vmm), console on stdout, behind the same hybrid
//!   vsock socket, and exits with the guest's exit code (`boot`).
//! - `pier connect UDS PORT` is the host-side client: it does the
//!   Firecracker `CONNECT` handshake and then joins stdin and stdout to
//!   the connection, like socat, with half-close.
//!
//! Logs go to stderr through `tracing`: pier's own crates at `info` (a
//! refused CONNECT, a grant denial, a reset), everything else (wasmtime,
//! cranelift) at `warn`. `-v` shows pier's `debug`, `-vv` its `trace`, `-q`
//! only warnings, `-qq` only errors; `RUST_LOG` replaces the filter
//! altogether. Besides logs, `pier run` prints the two lines that say
//! where its socket is, errors, and on request its counters (`--stats` at
//! exit, SIGUSR1 at any time) and a packet capture's summary (`--pcap`).
//!
//! Modules: `config` (the `--config` file of several components) and
//! `connect` (the `pier connect` client); `run` lives here.

mod boot;
mod config;
mod connect;
mod trailing;
mod vhost_user;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use pier_shim::{
    ComponentSpec, ComponentStdio, ConnectGrant, GrantNames, Grants, Monitor, PcapOptions,
    PortGrant, Shim, ShimConfig, ShimOptions,
};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

#[derive(Parser, Debug)]
#[command(name = "pier", version, about = "Run WASI components with vsock sockets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log more: -v for pier's debug output, -vv for its trace output.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log less: -q for warnings only, -qq for errors only.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "verbose")]
    quiet: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one component, or several from a config file, on one vsock
    /// endpoint.
    #[command(after_long_help = config::HELP)]
    Run(RunArgs),
    /// Boot an app's unikernel image in pier's KVM hypervisor, console on
    /// stdout; the guest's exit code is pier's.
    Boot(boot::BootArgs),
    /// Serve the vsock devices of VMs another VMM runs (QEMU's
    /// vhost-user-vsock), as a drop-in for vhost-device-vsock.
    VhostUser(vhost_user::VhostUserArgs),
    /// Connect to a component's port through the hybrid vsock socket and
    /// join stdin/stdout to the connection.
    Connect(ConnectArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
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
    /// Testing: bytes per receive buffer the in-process driver posts,
    /// header included (a guest with tiny buffers makes the device split
    /// every packet).
    #[arg(long, value_name = "BYTES", hide = true)]
    driver_rx_buffer_size: Option<usize>,
    /// Testing: the in-process driver's transmit buffers (1: a transmit
    /// queue that is full whenever a packet is in flight).
    #[arg(long, value_name = "N", hide = true)]
    driver_tx_buffers: Option<usize>,
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

#[derive(Args, Debug)]
struct ConnectArgs {
    /// The hybrid vsock Unix socket (`pier run` prints it).
    uds: PathBuf,
    /// The component's port.
    port: u32,
    /// Use a seqpacket connection (`<uds>_seqpacket`): each chunk read from
    /// stdin becomes one message; each message received is written out.
    #[arg(long)]
    seqpacket: bool,
}

fn main() -> ExitCode {
    let args = trailing::rewrite(&Cli::command(), std::env::args_os().collect());
    let cli = Cli::parse_from(args);
    init_logging(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Boot(args) => boot::run(args),
        Command::VhostUser(args) => vhost_user::run(args),
        Command::Connect(args) => connect::run(&args.uds, args.port, args.seqpacket).map(|()| 0),
    };
    match result {
        Ok(code) => exit_code(code),
        Err(e) => {
            eprintln!("pier: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// pier's crates, whose logs `-v` and `-q` adjust.
const PIER_TARGETS: [&str; 7] = [
    "pier",
    "pier_shim",
    "pier_device",
    "pier_stack",
    "pier_driver",
    "pier_vmm",
    "pier_vhost_user",
];

/// The filter without `RUST_LOG`: pier's crates at the level `-v` and `-q`
/// choose (info without either), every other crate at warn (wasmtime and
/// cranelift are very talkative below it), or error with `-qq`.
fn default_filter(verbose: u8, quiet: u8) -> String {
    let (pier, others) = match i16::from(verbose) - i16::from(quiet) {
        ..=-2 => ("error", "error"),
        -1 => ("warn", "warn"),
        0 => ("info", "warn"),
        1 => ("debug", "warn"),
        _ => ("trace", "warn"),
    };
    let mut filter = others.to_owned();
    for target in PIER_TARGETS {
        filter.push_str(&format!(",{target}={pier}"));
    }
    filter
}

/// Logs to stderr, filtered by `RUST_LOG` when it is set and valid, or
/// else by [`default_filter`].
fn init_logging(verbose: u8, quiet: u8) {
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = match from_env.map(|v| EnvFilter::try_new(&v).map_err(|e| (v, e))) {
        Some(Ok(filter)) => filter,
        Some(Err((value, e))) => {
            eprintln!("pier: ignoring RUST_LOG={value:?}: {e}");
            EnvFilter::new(default_filter(verbose, quiet))
        }
        None => EnvFilter::new(default_filter(verbose, quiet)),
    };
    // Colours only for a person at a terminal, not in a file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
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

/// Exit statuses are one byte; a component's `exit(256)` must not read as
/// success.
fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

fn default_uds(cid: u32) -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    dir.join(format!("pier-{cid}.vsock"))
}

fn run(args: RunArgs) -> Result<i32> {
    let (config, options) = match &args.config {
        Some(path) => {
            let file = config::ConfigFile::load(path)?;
            let cid = args.cid.or(file.cid).unwrap_or(pier_shim::DEFAULT_CID);
            let uds = args.uds.clone().or(file.uds.clone()).unwrap_or_else(|| default_uds(cid));
            let options = ShimOptions {
                wasi_tcp: args.wasi_tcp || file.wasi_tcp,
                socket_limit: args.socket_limit,
                pcap: pcap_options(&args.capture),
                compile_cache: compile_cache(&args),
                driver: driver_config(&args),
                grant_names: GrantNames::PIER_RUN,
            };
            let components = file.components().with_context(|| format!("in {}", path.display()))?;
            (ShimConfig { cid, uds, components }, options)
        }
        None => {
            let Some(app) = args.app.clone() else { bail!("no component given") };
            let cid = args.cid.unwrap_or(pier_shim::DEFAULT_CID);
            let uds = args.uds.clone().unwrap_or_else(|| default_uds(cid));
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
            };
            let options = ShimOptions {
                wasi_tcp: args.wasi_tcp,
                socket_limit: args.socket_limit,
                pcap: pcap_options(&args.capture),
                compile_cache: compile_cache(&args),
                driver: driver_config(&args),
                grant_names: GrantNames::PIER_RUN,
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
    let announce = || {
        let uds = uds.display();
        eprintln!("pier: guest CID {cid}, hybrid vsock socket {uds}");
        eprintln!("pier: connect with: {}", connect_command(&uds.to_string(), &port_hint));
    };
    let shim = Shim::start_announced(config, options, announce).context("starting the shim")?;
    let monitor = shim.monitor();
    let code = supervise(shim, &monitor);
    if args.stats {
        print_stats(&monitor);
    }
    if let (Some(path), Some(report)) = (&args.capture.pcap, monitor.finish_capture()) {
        eprintln!("pier: capture {}: {report}", path.display());
    }
    code
}

/// `--pcap` and `--pcap-snaplen`, the same for `pier run` and `pier boot`.
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// Write every packet that crosses the virtio device, both ways, to
    /// FILE as pcap (link type 271, LINKTYPE_VSOCK: Wireshark and tshark
    /// decode it). Never slows the device: if the file cannot keep up,
    /// packets are dropped from the capture and counted.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bytes of each packet the capture keeps, counting its 32-byte
    /// vsockmon and 44-byte virtio headers.
    #[arg(
        long,
        value_name = "N",
        requires = "pcap",
        default_value_t = pier_shim::DEFAULT_SNAPLEN,
        value_parser = clap::value_parser!(u32).range(i64::from(pier_shim::MIN_SNAPLEN)..=i64::from(pier_shim::DEFAULT_SNAPLEN))
    )]
    pub pcap_snaplen: u32,
}

fn pcap_options(args: &CaptureArgs) -> Option<PcapOptions> {
    let path = args.pcap.clone()?;
    Some(PcapOptions { path, snaplen: args.pcap_snaplen })
}

/// Prints every counter to stderr, as one block.
fn print_stats(monitor: &Monitor) {
    let report = format!("pier: stats\n{}", monitor.stats());
    eprint!("{report}");
}

/// The `pier connect` command line for `uds` and `port`, naming the
/// program as it was started (a path, when it is not on PATH), so the
/// hint can be pasted as it is.
pub(crate) fn connect_command(uds: &str, port: &str) -> String {
    let program = std::env::args_os().next().unwrap_or_else(|| "pier".into());
    format!("{} connect {uds} {port}", program.to_string_lossy())
}

/// How long components get to stop after SIGINT or SIGTERM before pier
/// closes the endpoint and exits anyway.
const STOP_GRACE: Duration = Duration::from_secs(3);

enum Event {
    Ended(Result<Vec<(String, i32)>>),
    Signal(i32),
    /// SIGUSR1: print the counters and carry on.
    StatsWanted,
}

/// Waits for the components to end, and stops them on SIGINT, SIGTERM or
/// SIGHUP: running WebAssembly traps, waits on vsock sockets end, queued
/// bytes still go out. A component that does not stop within
/// [`STOP_GRACE`] (it sleeps, or reads stdin), or a second signal, cuts
/// the endpoint instead: host connections close and the socket files are
/// removed. The exit code is then 128 + the signal's number, as a shell
/// reports it. SIGUSR1 prints the counters at any point.
fn supervise(shim: Shim, monitor: &Monitor) -> Result<i32> {
    let stopper = shim.stopper();
    let (tx, rx) = mpsc::channel();
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1]).context("installing signal handlers")?;
    let signals_handle = signals.handle();
    {
        let tx = tx.clone();
        std::thread::Builder::new().name("pier-signals".into()).spawn(move || {
            for signal in signals.forever() {
                let event =
                    if signal == SIGUSR1 { Event::StatsWanted } else { Event::Signal(signal) };
                if tx.send(event).is_err() {
                    break;
                }
            }
        })?;
    }
    std::thread::Builder::new().name("pier-wait".into()).spawn(move || {
        let _ = tx.send(Event::Ended(shim.wait()));
    })?;
    let signal = loop {
        match rx.recv().context("the shim's waiting thread ended")? {
            Event::Ended(codes) => {
                signals_handle.close();
                return Ok(codes?.iter().map(|(_, code)| *code).find(|&c| c != 0).unwrap_or(0));
            }
            Event::StatsWanted => print_stats(monitor),
            Event::Signal(signal) => break signal,
        }
    };
    eprintln!("pier: stopping (signal {signal})");
    stopper.stop();
    let deadline = std::time::Instant::now() + STOP_GRACE;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Ended(_)) => return Ok(128 + signal),
            Ok(Event::StatsWanted) => {
                print_stats(monitor);
                continue;
            }
            // A second signal: the user does not want to wait.
            Ok(Event::Signal(_)) => {}
            Err(_) => eprintln!(
                "pier: components still running after {} s; closing the endpoint",
                STOP_GRACE.as_secs()
            ),
        }
        break;
    }
    stopper.cut();
    Ok(128 + signal)
}
