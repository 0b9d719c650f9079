//! What a shim runs and how: the components, each with its grants,
//! arguments, directories and standard streams, and the settings beyond
//! them (socket limit, capture, compile cache, driver buffers).

use std::path::PathBuf;
use std::sync::Arc;

use pier_device::GuestCid;
use pier_driver::DriverConfig;

use crate::compile_cache;
use crate::grants::{GrantNames, Grants};

/// The CID a shim uses unless told otherwise.
pub const DEFAULT_CID: u32 = GuestCid::DEFAULT.get();
/// Sockets one component may hold at once unless told otherwise: Linux's
/// default `RLIMIT_NOFILE` soft limit, so a server that serves a thousand
/// clients at once there serves them here too.
pub const DEFAULT_SOCKET_LIMIT: usize = 1024;
/// The exit code of a component that `Stopper::stop` ended, as a shell
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
    /// The most linear memory its instances may hold together, in bytes;
    /// growing past it ends the component with
    /// [`OUT_OF_MEMORY_EXIT_CODE`](crate::OUT_OF_MEMORY_EXIT_CODE), as a
    /// container's OOM kill does ([`crate::memory_limit`]). `None`: only
    /// wasmtime's own bounds.
    pub memory_limit: Option<u64>,
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
    /// The component may read, not create, change or remove anything
    /// (a container's read-only mount).
    pub read_only: bool,
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
        Ok(Self { host: PathBuf::from(host), guest: guest.to_owned(), read_only: false })
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
    /// Record every virtqueue event into a ring trace
    /// (`pier_device::ring_trace`). Off by default.
    pub ring_trace: Option<pier_device::RingTrace>,
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
            ring_trace: None,
            compile_cache: compile_cache::default_dir(),
            driver: DriverConfig::default(),
            grant_names: GrantNames::default(),
        }
    }
}

/// Where and how much a packet capture records: the device's own
/// [`CaptureSpec`](pier_device::CaptureSpec).
pub use pier_device::CaptureSpec as PcapOptions;
