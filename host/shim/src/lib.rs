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
//! From the bottom up; each module uses only modules above it in this
//! list.
//!
//! - `compile_cache`: compiled components kept between runs.
//! - `memory_limit`: the most linear memory a component may hold, and the
//!   exit code for passing it.
//! - `network`: the `vsock:sockets/network` interface, generated on its
//!   own: error codes, addresses, the `network` resource, and the error
//!   type every binding returns.
//! - `grants`: what a component may bind, listen on and connect to.
//! - `config`: what a shim runs and how ([`ShimConfig`], [`ShimOptions`]).
//! - `net`: what every socket resource stands on: the shim's vsock
//!   `GuestEndpoint`, the per-component quota, one stack socket per resource
//!   and the wait for its readiness.
//! - `messages`: batched receive and the permit rule for sending, shared
//!   by seqpacket messages and datagrams.
//! - `conn`: the lifecycle stream and seqpacket sockets share (bind,
//!   listen, connect, accept, options).
//! - `stream`: stream sockets, whose data moves over `wasi:io` streams.
//! - `seqpacket`: seqpacket sockets: the stream lifecycle with a message
//!   receiver and sender.
//! - `datagram`: datagram sockets, with the destination and sender checks
//!   the shim makes around `messages`.
//! - `bindings`: the rest of the `vsock:sockets` WIT, generated, with each
//!   resource mapped to its socket type.
//! - `host`: one component instance: its store, the shared linker, and
//!   the thread that runs it; its submodules implement the generated host
//!   traits by forwarding to the socket types.
//! - `stats`: every counter of the chain as one report ([`Monitor`]), for
//!   `pier run --stats`.
//!
//! With [`ShimOptions::pcap`], every packet that crosses the virtio device
//! is also written to a pcap file (pier-device's `capture`).

mod bindings;
pub mod compile_cache;
mod config;
mod conn;
mod datagram;
mod faults;
mod grants;
mod host;
mod line_stderr;
pub mod memory_limit;
mod messages;
mod net;
mod network;
mod seqpacket;
mod stats;
mod stream;
mod v2;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context as _, anyhow, bail};
use pier_device::{DeviceSpec, InProcessDevice};
use wasmtime::{Config, Engine};
use wasmtime_wasi::p2::bindings::sync::CommandPre;

pub use config::{
    ComponentSpec, ComponentStdio, DEFAULT_CID, DEFAULT_SOCKET_LIMIT, PcapOptions, Preopen,
    STOPPED_EXIT_CODE, ShimConfig, ShimOptions,
};
pub use faults::{Fault, FaultInjector};
pub use grants::{ConnectGrant, GrantError, GrantNames, Grants, PortGrant};
pub use memory_limit::{OUT_OF_MEMORY_EXIT_CODE, OutOfMemory};
pub use network::ErrorCode;
pub use pier_device::{CaptureReport, CidError, DeviceStats, GuestCid, GuestStats};
pub use pier_driver::DriverConfig;
pub use pier_stack::phy::{DEFAULT_SNAPLEN, MIN_SNAPLEN};
pub use stats::{ComponentStats, Monitor, ShimStats};

use grants::ComponentGrants;
use host::Instance;
use net::{GuestEndpoint, Quota, VsockCtx};
use stats::ComponentCounters;

/// A running shim: the vsock endpoint and its components.
pub struct Shim {
    uds: PathBuf,
    cid: u32,
    net: Arc<GuestEndpoint>,
    engine: Engine,
    components: Vec<(String, JoinHandle<i32>)>,
    monitor: Monitor,
}

/// Stops a running shim's components from another thread (a signal
/// handler's, say) while [`Shim::wait`] blocks.
#[derive(Clone)]
pub struct Stopper {
    net: Arc<GuestEndpoint>,
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
    /// in time or the user will not wait: the Unix-socket bridge closes
    /// every host connection and removes its socket files, and the guest's
    /// timer thread ends. Components still running then see every vsock
    /// peer gone. What ended components wrote and their host programs have
    /// not read yet is dropped, with a warning that says how many bytes,
    /// and [`Shim::wait`] stops waiting for their connections to close.
    pub fn cut(&self) {
        self.net.cut();
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
        let async_linker = host::async_linker(&engine)
            .map_err(wasmtime_error)
            .context("linking the async WASI and vsock imports")?;
        let mut prepared = Vec::with_capacity(components.len());
        for spec in components {
            let component =
                compile_cache::load(&engine, &spec.wasm, options.compile_cache.as_deref())
                    .map_err(wasmtime_error)
                    .with_context(|| format!("loading component {}", spec.wasm.display()))?;
            let exports_async_run = component
                .component_type()
                .exports(&engine)
                .any(|(name, _)| name == host::ASYNC_RUN);
            let entry = if exports_async_run {
                async_linker.instantiate_pre(&component).map(host::Entry::Async)
            } else {
                linker.instantiate_pre(&component).and_then(CommandPre::new).map(host::Entry::Sync)
            }
            .map_err(wasmtime_error)
            .with_context(|| {
                format!("linking component {} ({})", spec.wasm.display(), host::SERVED_IMPORTS)
            })?;
            prepared.push((spec, entry));
        }

        let spec = DeviceSpec {
            capture: options.pcap.clone(),
            ring_trace: options.ring_trace.clone(),
            ..DeviceSpec::new(guest_cid, &uds)
        };
        let device = InProcessDevice::new(spec.vsock_config(), options.driver)
            .map_err(|e| anyhow!("starting the virtio device: {e}"))?;
        let (running, capture) = device
            .start_spec(&spec)
            .with_context(|| format!("starting the vsock bridge at {}", uds.display()))?;
        let net = Arc::new(GuestEndpoint::new(running));
        tracing::debug!(cid, uds = %uds.display(), "vsock endpoint up");
        ready();

        let mut threads = Vec::with_capacity(prepared.len());
        let mut counters = Vec::with_capacity(prepared.len());
        for (spec, entry) in prepared {
            let grants = ComponentGrants::new(&spec.name, spec.grants, options.grant_names);
            let quota = Quota::new(options.socket_limit);
            counters.push(ComponentCounters {
                name: spec.name.clone(),
                grants: grants.clone(),
                quota: quota.clone(),
            });
            let instance = Instance {
                name: spec.name.clone(),
                entry,
                args: spec.args,
                env: spec.env,
                dirs: spec.dirs,
                stdio: spec.stdio,
                vsock: VsockCtx { net: net.clone(), grants, quota },
                wasi_tcp: options.wasi_tcp,
                memory_limit: spec.memory_limit,
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

    /// A handle that sets off faults in the running shim, for tests.
    pub fn fault_injector(&self) -> FaultInjector {
        FaultInjector { net: self.net.clone() }
    }

    /// The hybrid vsock Unix socket.
    pub fn uds(&self) -> &Path {
        &self.uds
    }

    /// The endpoint's CID.
    pub fn cid(&self) -> u32 {
        self.cid
    }

    /// Whether the component named `name` has ended (returned, trapped or
    /// been stopped), so a caller can let a client finish before it
    /// stops the servers that never end on their own; `None` when no
    /// component has that name.
    pub fn has_ended(&self, name: &str) -> Option<bool> {
        self.components.iter().find(|(n, _)| n == name).map(|(_, handle)| handle.is_finished())
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
        self.wait_noting_the_end(|| {})
    }

    /// [`Self::wait`], calling `components_ended` once every component has
    /// ended, before their connections finish closing: a supervisor then
    /// knows that a stop asked from now on can only drop what host
    /// programs have not read ([`Stopper::cut`]), since no component is
    /// left to stop.
    pub fn wait_noting_the_end(
        self,
        components_ended: impl FnOnce(),
    ) -> anyhow::Result<Vec<(String, i32)>> {
        let mut codes = Vec::with_capacity(self.components.len());
        for (name, handle) in self.components {
            let code =
                handle.join().map_err(|_| anyhow!("the thread of component {name} panicked"))?;
            tracing::debug!(component = %name, code, "exited");
            codes.push((name, code));
        }
        components_ended();
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

/// wasmtime (48 and 50) has its own error type, which (without wasmtime's `anyhow`
/// feature, left off to keep the build small) does not convert into
/// `anyhow::Error`; its `Debug` form keeps the whole cause chain.
fn wasmtime_error(e: wasmtime::Error) -> anyhow::Error {
    anyhow!("{e:?}")
}
