//! pier-shim: a wasmtime host that gives WASI components vsock sockets.
//!
//! A shim process is one vsock endpoint with one CID (3 by default). It
//! runs pier's whole in-process chain: pier-driver and a pier-stack (the
//! "guest" side, where components live) talk to pier's virtio-vsock device
//! model through the in-process transport, and the device's host side is
//! the Firecracker-style Unix-socket bridge at [`ShimConfig::uds`]. Host
//! programs therefore reach components exactly as they would reach a VM:
//! `CONNECT <port>\n` on `<uds>` (see `docs/host-sockets.md`).
//!
//! Why the whole chain and not a bare stack: the components then exercise
//! the very driver, device and bridge a unikernel guest uses, so the shim
//! is a faithful (and debuggable) stand-in for a VM, and every protocol
//! rule, credit limit and timer comes from the one implementation.
//!
//! Each component gets:
//! - the `vsock:sockets@0.1.0` imports (`wit/`), implemented with real
//!   resources: stream sockets whose data moves over ordinary `wasi:io`
//!   streams, seqpacket sockets with batched message receive, datagram
//!   sockets;
//! - wasmtime-wasi's `wasi:cli/command` world: its args, inherited stdio
//!   (or files of the host's choosing, [`ComponentStdio`]),
//!   no environment, no directories, and no IP networking unless
//!   [`ShimOptions::wasi_tcp`] allows loopback TCP;
//! - its own [`Grants`] (deny by default) and a socket quota
//!   ([`ShimOptions::socket_limit`]).
//!
//! One thread runs each component instance with wasmtime's synchronous
//! bindings; the guest stack wakes a component parked in `wasi:io/poll`
//! through the wakers its pollables registered. Components
//! of one shim share the CID and reach each other over CID 1 or the shim's
//! own CID; the stack delivers those packets internally.
//!
//! wasmtime is a heavy dependency (minutes to compile), so this is the
//! only crate of the workspace that depends on it.
//!
//! # Modules
//!
//! - `bindings`: the host side of the `vsock:sockets` WIT, generated, and
//!   the error type every binding returns.
//! - `host`: one component instance: its store, the shared linker, and
//!   the thread that runs it.
//! - `grants`: what a component may bind, listen on and connect to.
//! - `net`: what every socket resource stands on: the shim's vsock
//!   `Endpoint`, the per-component quota, one stack socket per resource
//!   and the wait for its readiness.
//! - `conn`: the lifecycle stream and seqpacket sockets share (bind,
//!   listen, connect, accept, options), and the host methods that forward
//!   to it.
//! - `stream`: stream sockets, whose data moves over `wasi:io` streams.
//! - `messages`: batched receive and the permit rule for sending, shared
//!   by seqpacket messages and datagrams.
//! - `seqpacket`: seqpacket sockets: the stream lifecycle with a message
//!   receiver and sender.
//! - `datagram`: datagram sockets, with the destination and sender checks
//!   the shim makes around `messages`.
//! - `stats`: every counter of the chain as one report ([`Monitor`]), for
//!   `pier run --stats`.
//!
//! With [`ShimOptions::pcap`], every packet that crosses the virtio device
//! is also written to a pcap file (pier-device's `capture`).

mod bindings;
pub mod compile_cache;
mod conn;
mod datagram;
mod grants;
mod host;
mod messages;
mod net;
mod seqpacket;
mod stats;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context as _, anyhow, bail};
use pier_device::{DeviceSpec, InProcessDevice};
use wasmtime::{Config, Engine};
use wasmtime_wasi::p2::bindings::sync::CommandPre;

pub use bindings::ErrorCode;
pub use grants::{ConnectGrant, GrantError, GrantNames, Grants, PortGrant};
pub use pier_device::{CaptureReport, CidError, DeviceStats, GuestCid, GuestStats};
pub use pier_driver::DriverConfig;
pub use pier_stack::phy::{DEFAULT_SNAPLEN, MIN_SNAPLEN};
pub use stats::{ComponentStats, Monitor, ShimStats};

use grants::ComponentGrants;
use host::Instance;
use net::{Endpoint, Quota, VsockCtx};
use stats::ComponentCounters;

/// The CID a shim uses unless told otherwise.
pub const DEFAULT_CID: u32 = GuestCid::DEFAULT.get();
/// Sockets one component may hold at once unless told otherwise: Linux's
/// default `RLIMIT_NOFILE` soft limit, so a server that serves a thousand
/// clients at once there serves them here too.
pub const DEFAULT_SOCKET_LIMIT: usize = 1024;
/// The exit code of a component that [`Stopper::stop`] ended, as a shell
/// reports a command ended by Ctrl-C (128 + SIGINT).
pub const STOPPED_EXIT_CODE: i32 = 130;

/// What one shim runs.
#[derive(Clone, Debug)]
pub struct ShimConfig {
    /// The endpoint's CID (3 or above; 0, 1, 2 and `u32::MAX` are reserved).
    pub cid: u32,
    /// The hybrid vsock Unix socket host programs connect to.
    pub uds: PathBuf,
    /// The components, each on its own thread.
    pub components: Vec<ComponentSpec>,
}

/// One component: a `wasm32-wasip2` command (a std binary).
#[derive(Clone, Debug)]
pub struct ComponentSpec {
    /// Its name in logs and exit reports; also its `argv[0]`.
    pub name: String,
    /// The component file.
    pub wasm: PathBuf,
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Its environment variables, `(NAME, VALUE)`. None by default: the
    /// host's environment is not the component's.
    pub env: Vec<(String, String)>,
    /// What it may bind, listen on and connect to.
    pub grants: Grants,
    /// Host directories it may read and write. None by default: like the
    /// sockets, the filesystem is granted, never ambient.
    pub dirs: Vec<Preopen>,
    /// Where its standard streams go.
    pub stdio: ComponentStdio,
}

/// A component's standard streams. Each one left `None` is the host
/// process's own (what `pier run` wants); a host that runs components on
/// someone else's behalf, like the containerd shim, hands each its own
/// files (containerd's log pipes) instead. Without a stdin file, a
/// component reads the host's stdin.
#[derive(Clone, Debug, Default)]
pub struct ComponentStdio {
    pub stdin: Option<Arc<std::fs::File>>,
    pub stdout: Option<Arc<std::fs::File>>,
    pub stderr: Option<Arc<std::fs::File>>,
}

/// A host directory made visible to a component under a guest path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preopen {
    pub host: PathBuf,
    pub guest: String,
}

impl std::str::FromStr for Preopen {
    type Err = String;

    /// `HOST` (seen under the same path) or `HOST::GUEST`, as the wasmtime
    /// CLI writes it.
    fn from_str(s: &str) -> Result<Self, String> {
        let (host, guest) = s.split_once("::").unwrap_or((s, s));
        if host.is_empty() || guest.is_empty() {
            return Err(format!("{s:?}: expected HOST or HOST::GUEST"));
        }
        Ok(Self { host: PathBuf::from(host), guest: guest.to_owned() })
    }
}

/// Settings beyond the components themselves.
#[derive(Clone, Debug)]
pub struct ShimOptions {
    /// Let every component use `wasi:sockets` TCP on loopback addresses
    /// (for a baseline benchmark). Off by default: components get no IP
    /// networking at all.
    pub wasi_tcp: bool,
    /// Sockets one component may hold at once; past it, creating or
    /// accepting one fails with `new-socket-limit`.
    pub socket_limit: usize,
    /// Record every packet that crosses the virtio device into a pcap
    /// file. Off by default.
    pub pcap: Option<PcapOptions>,
    /// Where compiled components are kept between runs
    /// ([`compile_cache`]); `None` compiles every time.
    pub compile_cache: Option<PathBuf>,
    /// The in-process driver's buffers. The default is the fast one;
    /// tests shrink it to play a guest with tiny receive buffers or a
    /// transmit queue that fills.
    pub driver: DriverConfig,
    /// How denials name the missing grant (`pier run`'s options by
    /// default).
    pub grant_names: GrantNames,
}

impl Default for ShimOptions {
    fn default() -> Self {
        Self {
            wasi_tcp: false,
            socket_limit: DEFAULT_SOCKET_LIMIT,
            pcap: None,
            compile_cache: compile_cache::default_dir(),
            driver: DriverConfig::default(),
            grant_names: GrantNames::default(),
        }
    }
}

/// Where and how much a packet capture records: the device's own
/// [`CaptureSpec`](pier_device::CaptureSpec).
pub use pier_device::CaptureSpec as PcapOptions;

/// A running shim: the vsock endpoint and its components.
pub struct Shim {
    uds: PathBuf,
    cid: u32,
    net: Arc<Endpoint>,
    engine: Engine,
    components: Vec<(String, JoinHandle<i32>)>,
    monitor: Monitor,
}

/// Stops a running shim's components from another thread (a signal
/// handler's, say) while [`Shim::wait`] blocks.
#[derive(Clone)]
pub struct Stopper {
    net: Arc<Endpoint>,
    engine: Engine,
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopper").finish_non_exhaustive()
    }
}

impl Stopper {
    /// Stops every component: one running WebAssembly code traps at its
    /// next loop iteration or call (wasmtime's epoch interruption), one
    /// waiting on a vsock socket wakes and then traps. Each reports
    /// [`STOPPED_EXIT_CODE`]. Their sockets close as a process's do when it
    /// is killed: queued bytes still go out, then the connection ends.
    ///
    /// A component blocked in another WASI call (a sleep, a read from
    /// stdin) stops only when that call returns; see [`Self::cut`].
    pub fn stop(&self) {
        self.net.stop();
        self.engine.increment_epoch();
    }

    /// Ends the vsock endpoint at once, for when components did not stop
    /// in time: the Unix-socket bridge closes every host connection and
    /// removes its socket files, and the guest's timer thread ends.
    /// Components still running then see every vsock peer gone.
    pub fn cut(&self) {
        self.net.stop_device();
    }
}

impl std::fmt::Debug for Shim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shim")
            .field("uds", &self.uds)
            .field("cid", &self.cid)
            .field("components", &self.components.len())
            .finish_non_exhaustive()
    }
}

impl Shim {
    /// Starts the endpoint and every component, with default options.
    pub fn start(config: ShimConfig) -> anyhow::Result<Shim> {
        Self::start_with(config, ShimOptions::default())
    }

    /// Starts the endpoint and every component.
    ///
    /// Every component is compiled and linked before any starts, so a bad
    /// file or an import the shim does not provide fails here. When this
    /// returns, `<uds>` is listening; the components may still be setting
    /// up their listeners, so host programs should retry a refused CONNECT
    /// for a moment (as with a booting VM).
    pub fn start_with(config: ShimConfig, options: ShimOptions) -> anyhow::Result<Shim> {
        Self::start_announced(config, options, || {})
    }

    /// [`Self::start_with`], calling `ready` once the endpoint listens and
    /// before any component runs: the moment to tell a user where to
    /// connect, after every check that could still fail, and before the
    /// components' own output.
    pub fn start_announced(
        config: ShimConfig,
        options: ShimOptions,
        ready: impl FnOnce(),
    ) -> anyhow::Result<Shim> {
        let ShimConfig { cid, uds, components } = config;
        let guest_cid = GuestCid::new(cid)?;
        if components.is_empty() {
            bail!("no components to run");
        }
        if options.socket_limit == 0 {
            bail!("the socket limit must be at least 1");
        }
        // Epoch interruption is how `Stopper::stop` reaches a component
        // that is running WebAssembly code rather than waiting in the host.
        let engine = Engine::new(Config::new().epoch_interruption(true))
            .map_err(wasmtime_error)
            .context("creating the wasmtime engine")?;
        let linker = host::linker(&engine)
            .map_err(wasmtime_error)
            .context("linking the WASI and vsock imports")?;
        let mut prepared = Vec::with_capacity(components.len());
        for spec in components {
            let component =
                compile_cache::load(&engine, &spec.wasm, options.compile_cache.as_deref())
                    .map_err(wasmtime_error)
                    .with_context(|| format!("loading component {}", spec.wasm.display()))?;
            let pre = linker
                .instantiate_pre(&component)
                .and_then(CommandPre::new)
                .map_err(wasmtime_error)
                .with_context(|| format!("linking component {}", spec.wasm.display()))?;
            prepared.push((spec, pre));
        }

        let spec = DeviceSpec { capture: options.pcap.clone(), ..DeviceSpec::new(guest_cid, &uds) };
        let device = InProcessDevice::new(spec.vsock_config(), options.driver)
            .map_err(|e| anyhow!("starting the virtio device: {e}"))?;
        let (running, capture) = device
            .start_spec(&spec)
            .with_context(|| format!("starting the vsock bridge at {}", uds.display()))?;
        let net = Arc::new(Endpoint::new(running));
        tracing::debug!(cid, uds = %uds.display(), "vsock endpoint up");
        ready();

        let mut threads = Vec::with_capacity(prepared.len());
        let mut counters = Vec::with_capacity(prepared.len());
        for (spec, pre) in prepared {
            let grants = ComponentGrants::new(&spec.name, spec.grants, options.grant_names);
            let quota = Quota::new(options.socket_limit);
            counters.push(ComponentCounters {
                name: spec.name.clone(),
                grants: grants.clone(),
                quota: quota.clone(),
            });
            let instance = Instance {
                name: spec.name.clone(),
                pre,
                args: spec.args,
                env: spec.env,
                dirs: spec.dirs,
                stdio: spec.stdio,
                vsock: VsockCtx { net: net.clone(), grants, quota },
                wasi_tcp: options.wasi_tcp,
            };
            let handle = std::thread::Builder::new()
                .name(format!("pier-component-{}", spec.name))
                .spawn(move || instance.run())
                .context("spawning a component thread")?;
            tracing::debug!(component = %spec.name, "started");
            threads.push((spec.name, handle));
        }
        let monitor = Monitor { net: net.clone(), components: counters.into(), capture };
        Ok(Shim { uds, cid, net, engine, components: threads, monitor })
    }

    /// Reads the shim's counters (and ends its capture) from any thread,
    /// also after [`Self::wait`].
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }

    /// The hybrid vsock Unix socket.
    pub fn uds(&self) -> &Path {
        &self.uds
    }

    /// The endpoint's CID.
    pub fn cid(&self) -> u32 {
        self.cid
    }

    /// A handle that stops the components while another thread waits.
    pub fn stopper(&self) -> Stopper {
        Stopper { net: self.net.clone(), engine: self.engine.clone() }
    }

    /// Bytes held in the stack's socket buffers, for every component
    /// together: what a component that never reads can make the shim hold.
    pub fn buffered_bytes(&self) -> usize {
        self.net.buffered_bytes()
    }

    /// Waits for every component to end and returns each one's exit code,
    /// in the order they were configured.
    ///
    /// It returns once the components' connections have finished closing
    /// too (at most the stack's close timeout, 8 s, after the last
    /// component ended; 1 s once [`Stopper::stop`] was called), so that bytes a component wrote just before it
    /// exited still reach their peers, as they would from a process that
    /// exits on Linux.
    pub fn wait(self) -> anyhow::Result<Vec<(String, i32)>> {
        let mut codes = Vec::with_capacity(self.components.len());
        for (name, handle) in self.components {
            let code =
                handle.join().map_err(|_| anyhow!("the thread of component {name} panicked"))?;
            tracing::debug!(component = %name, code, "exited");
            codes.push((name, code));
        }
        let open = self.net.linger();
        if open > 0 {
            tracing::warn!(open, "connections still closing when the shim stopped");
        }
        // Ends sends still waiting for credit, which would otherwise keep
        // the endpoint alive after the shim is gone.
        self.net.stop();
        Ok(codes)
    }
}

/// wasmtime 48 has its own error type, which (without wasmtime's `anyhow`
/// feature, left off to keep the build small) does not convert into
/// `anyhow::Error`; its `Debug` form keeps the whole cause chain.
fn wasmtime_error(e: wasmtime::Error) -> anyhow::Error {
    anyhow!("{e:?}")
}
