//! One container: a pier endpoint with one component, run inside this
//! shim process, through containerd's task lifecycle.
//!
//! - **create** (`new`) reads the bundle's runtime spec: the placement and
//!   grants from its annotations ([`crate::annotations`]), the component
//!   from `process.args[0]` inside the container's root filesystem, its
//!   arguments and environment from the rest of `process`, and opens
//!   containerd's stdout and stderr pipes. Everything that can be wrong
//!   with a container's configuration fails here, before anything runs.
//! - **start** compiles (or loads from the compile cache) and starts the
//!   component on pier's in-process endpoint, whose hybrid vsock socket is
//!   the annotation's path on the node.
//! - **kill** stops it as `pier run` stops on a signal: running
//!   WebAssembly traps at its next loop iteration or call, a wait on a
//!   vsock socket wakes and ends, queued bytes still go out; the exit code
//!   is 128 + the signal. SIGKILL also closes the endpoint at once and
//!   reports 137 without waiting for the component. Signals whose default
//!   action is to do nothing (SIGCHLD, SIGCONT, SIGURG, SIGWINCH) and
//!   signal 0 change nothing.
//! - **wait** resolves with the exit code: the component's own, or the
//!   signal's.
//! - **delete** closes the endpoint, which removes its socket files, and
//!   the Pod's socket folder ([`crate::pod_folder`]) when it is empty and
//!   this container owns it: outside Kubernetes every container is its
//!   own Pod; under Kubernetes the Pod's sandbox owns the folder.
//!
//! A Kubernetes Pod's sandbox container (`pause`) becomes a placeholder
//! that runs until it is stopped.
//!
//! Why in this process and not in a Linux container of its own, as
//! runwasi's youki-based engine does: the component's sandbox is
//! WebAssembly's plus pier's grants, both deny-by-default; in this process
//! the annotations are at hand (inside a youki container the engine sees
//! only the arguments and environment), the socket is made on the node
//! where host programs look for it, and a container costs no zygote and no
//! container init process.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use containerd_shimkit::sandbox::sync::WaitableCell;
use containerd_shimkit::sandbox::{Error, Instance, InstanceConfig};
use futures::FutureExt as _;
use oci_spec::runtime::Spec;
use pier_shim::{
    ComponentSpec, ComponentStdio, GrantNames, Preopen, Shim, ShimConfig, ShimOptions, Stopper,
    compile_cache,
};

use crate::annotations::{self, PodName};
use crate::confined_fs::open_at;
use crate::cpu_cgroup::{self, JoinedCgroup};
use crate::node_config::NodeConfig;
use crate::pod_folder::PodFolder;

/// SIGKILL's number, and the exit code a killed process reports.
const SIGKILL: u32 = 9;
const KILLED_EXIT_CODE: u32 = 128 + SIGKILL;
/// Exit code when the shim itself failed to run the component (its
/// thread panicked): what runwasi's shims report for a lost process.
const LOST_EXIT_CODE: u32 = 137;
/// The CRI annotation that tells a Pod's sandbox from its containers.
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// Signals whose default action is to do nothing.
const IGNORED_SIGNALS: [u32; 4] =
    [libc::SIGCHLD as u32, libc::SIGCONT as u32, libc::SIGURG as u32, libc::SIGWINCH as u32];
/// Where compiled components are kept when the shim's environment names
/// no cache folder (containerd under systemd has no `HOME`).
const SYSTEM_COMPILE_CACHE: &str = "/var/cache/pier/components";

/// A container of containerd's, run by pier.
pub struct PierInstance {
    id: String,
    socket: PathBuf,
    state: Mutex<State>,
    /// The first stopping signal sent, 0 before any: it decides the exit
    /// code of a component that ends because it was stopped.
    stop_signal: Arc<AtomicI32>,
    exit: WaitableCell<(u32, DateTime<Utc>)>,
}

enum State {
    Created(Box<Prepared>),
    /// A Kubernetes Pod's sandbox, the first container of every Pod: it
    /// only holds the Pod's place until it is stopped (see `new`), and
    /// owns the Pod's socket folder.
    Sandbox {
        folder: Option<PodFolder>,
        cgroup: Option<JoinedCgroup>,
    },
    Running {
        stopper: Stopper,
        place: Box<NodePlace>,
    },
    /// Killed before it started, or deleted.
    Gone,
}

/// What `start` needs, read and checked at create.
struct Prepared {
    config: ShimConfig,
    options: ShimOptions,
    /// The component file, opened inside the root filesystem; the shim
    /// reads it through `/proc/self/fd`, so a symlink in the image cannot
    /// point it at a file of the node's.
    wasm_file: OwnedFd,
    place: NodePlace,
}

/// A container's place on the node: its socket in its Pod's folder, and
/// the cgroup the shim joined for it.
struct NodePlace {
    folder: PodFolder,
    name: String,
    node: NodeConfig,
    /// Outside Kubernetes the container is its own Pod and removes the
    /// folder when it goes.
    owns_folder: bool,
    cgroup: Option<JoinedCgroup>,
}

impl NodePlace {
    /// Gives back what the container held: the cgroup, then the folder
    /// if it is the container's and empty.
    fn release(self) {
        if let Some(cgroup) = self.cgroup {
            cgroup.leave();
        }
        if self.owns_folder {
            self.folder.remove_if_empty();
        }
    }
}

impl std::fmt::Debug for PierInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PierInstance")
            .field("id", &self.id)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Instance for PierInstance {
    async fn new(id: String, cfg: &InstanceConfig) -> Result<Self, Error> {
        let spec = Spec::load(cfg.bundle.join("config.json"))?;
        let annotations = spec.annotations().clone().unwrap_or_default();
        let node = NodeConfig::load().map_err(|e| Error::FailedPrecondition(e.to_string()))?;
        let pod = PodName::of(&annotations, &cfg.namespace, &id);
        pod.check().map_err(Error::InvalidArgument)?;
        // Kubernetes starts every Pod with a sandbox container (`pause`)
        // through the Pod's runtime. Elsewhere it holds the namespaces the
        // Pod's containers join; pier components join none (their
        // sockets are vsock ones, their files granted), so the sandbox
        // here is a placeholder that runs until it is stopped, as `pause`
        // does, and exits 0 on SIGTERM.
        if annotations.get(CRI_CONTAINER_TYPE).map(String::as_str) == Some("sandbox") {
            log::info!("container {id}: a Pod sandbox");
            // The Pod's folder is made now, so that its containers find it
            // and the sandbox, deleted last, removes it.
            let folder = if pod.kubernetes {
                let folder = PodFolder::open(&node.sockets, &pod.namespace, &pod.name)
                    .map_err(Error::FailedPrecondition)?;
                Some(folder)
            } else {
                None
            };
            // The shim serves the whole Pod, so it takes the sandbox's
            // cgroup, inside the Pod's (see `cpu_cgroup`).
            let cgroup =
                cpu_cgroup::join(&spec, &id, pod.kubernetes).map_err(Error::FailedPrecondition)?;
            return Ok(Self {
                id,
                socket: PathBuf::new(),
                state: Mutex::new(State::Sandbox { folder, cgroup }),
                stop_signal: Arc::new(AtomicI32::new(0)),
                exit: WaitableCell::new(),
            });
        }
        let placement = annotations::placement(&annotations, &id)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let socket_limit =
            node.check_grants(&pod.namespace, &placement).map_err(Error::InvalidArgument)?;
        let mut place = socket_in_pod_folder(&annotations, &pod, &placement.socket_name, node)?;
        let socket = place.folder.path().join(&place.name);
        let prepared = match prepare(&id, cfg, &spec, &placement, &socket) {
            Ok((config, mut options, wasm_file)) => {
                options.socket_limit = socket_limit;
                // Under Kubernetes the sandbox holds the Pod's cgroup for
                // every container; elsewhere the container is the Pod.
                if !pod.kubernetes {
                    match cpu_cgroup::join(&spec, &id, false) {
                        Ok(cgroup) => place.cgroup = cgroup,
                        Err(e) => {
                            place.release();
                            return Err(Error::FailedPrecondition(e));
                        }
                    }
                }
                Prepared { config, options, wasm_file, place }
            }
            Err(e) => {
                place.release();
                return Err(e);
            }
        };
        log::info!(
            "container {id}: component {}, socket {}, CID {}",
            prepared.config.components[0].name,
            socket.display(),
            placement.cid
        );
        Ok(Self {
            id,
            socket,
            state: Mutex::new(State::Created(Box::new(prepared))),
            stop_signal: Arc::new(AtomicI32::new(0)),
            exit: WaitableCell::new(),
        })
    }

    async fn start(&self) -> Result<u32, Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let prepared = match std::mem::replace(&mut *state, State::Gone) {
            State::Created(prepared) => prepared,
            State::Sandbox { folder, cgroup } => {
                *state = State::Sandbox { folder, cgroup };
                return Ok(std::process::id());
            }
            other => {
                *state = other;
                return Err(Error::FailedPrecondition(format!(
                    "container {} was started, killed or deleted already",
                    self.id
                )));
            }
        };
        let Prepared { config, options, wasm_file, place } = *prepared;
        let shim = match Shim::start_with(config, options) {
            Ok(shim) => shim,
            Err(e) => {
                place.release();
                return Err(Error::Others(format!("starting the component: {e:#}")));
            }
        };
        // The component is compiled (or loaded from the cache) now.
        drop(wasm_file);
        let stopper = shim.stopper();
        if let Err(e) = place.folder.share_sockets(&place.name, &place.node.sockets) {
            stopper.cut();
            let _ = shim.wait();
            place.release();
            return Err(Error::Others(e));
        }
        let exit = self.exit.clone();
        let stop_signal = self.stop_signal.clone();
        let id = self.id.clone();
        std::thread::Builder::new()
            .name("pier-wait".into())
            .spawn(move || {
                let code = match shim.wait() {
                    Ok(codes) => {
                        let own = codes.first().map_or(0, |(_, code)| *code);
                        match stop_signal.load(Ordering::Acquire) {
                            0 => own as u32,
                            signal => 128 + signal as u32,
                        }
                    }
                    Err(e) => {
                        log::error!("container {id}: {e:#}");
                        LOST_EXIT_CODE
                    }
                };
                log::info!("container {id}: exited with {code}");
                // Already set when SIGKILL did not wait for the component.
                let _ = exit.set((code, Utc::now()));
            })
            .map_err(|e| Error::Others(format!("starting the waiting thread: {e}")))?;
        *state = State::Running { stopper, place: Box::new(place) };
        Ok(std::process::id())
    }

    async fn kill(&self, signal: u32) -> Result<(), Error> {
        if self.exit.wait().now_or_never().is_some() {
            return Err(Error::NotFound(format!(
                "container {}: process already finished",
                self.id
            )));
        }
        if signal == 0 || IGNORED_SIGNALS.contains(&signal) {
            return Ok(());
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let signal_number = i32::try_from(signal)
            .map_err(|_| Error::InvalidArgument(format!("{signal} is not a signal")))?;
        let _ = self.stop_signal.compare_exchange(
            0,
            signal_number,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        log::info!("container {}: signal {signal}", self.id);
        match &*state {
            State::Created(_) => {
                if let State::Created(prepared) = std::mem::replace(&mut *state, State::Gone) {
                    prepared.place.release();
                }
                let _ = self.exit.set((128 + signal, Utc::now()));
            }
            State::Sandbox { .. } => {
                let code = if signal == SIGKILL { KILLED_EXIT_CODE } else { 0 };
                let _ = self.exit.set((code, Utc::now()));
            }
            State::Running { stopper, .. } => {
                stopper.stop();
                if signal == SIGKILL {
                    stopper.cut();
                    let _ = self.exit.set((KILLED_EXIT_CODE, Utc::now()));
                }
            }
            State::Gone => {}
        }
        Ok(())
    }

    async fn delete(&self) -> Result<(), Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, State::Gone) {
            State::Running { stopper, place } => {
                // Closes host connections and removes the socket files.
                stopper.cut();
                place.release();
            }
            State::Created(prepared) => prepared.place.release(),
            State::Sandbox { folder, cgroup } => {
                if let Some(cgroup) = cgroup {
                    cgroup.leave();
                }
                if let Some(folder) = folder {
                    folder.remove_if_empty();
                }
            }
            State::Gone => {}
        }
        Ok(())
    }

    async fn wait(&self) -> (u32, DateTime<Utc>) {
        *self.exit.wait().await
    }
}

/// The container's memory limit (`linux.resources.memory.limit`, what a
/// Pod's `resources.limits.memory` becomes), as the component's linear
/// memory limit: the component runs in the shim's process, outside the
/// cgroup that would enforce it for a process. None, or -1 (the OCI
/// spec's "unlimited"), leaves it unlimited.
fn memory_limit(spec: &Spec) -> Option<u64> {
    let limit = spec.linux().as_ref()?.resources().as_ref()?.memory().as_ref()?.limit()?;
    u64::try_from(limit).ok()
}

/// The container's socket: its Pod's folder opened (made if this is the
/// Pod's first container outside Kubernetes), the name checked free and
/// short enough. Every refusal names the socket annotation, whose name
/// (or default) is the part a Pod chose.
fn socket_in_pod_folder(
    annotations: &std::collections::HashMap<String, String>,
    pod: &PodName,
    name: &str,
    node: NodeConfig,
) -> Result<NodePlace, Error> {
    let refuse = |why: String| {
        let setting = match annotations.get(annotations::SOCKET) {
            Some(value) => format!("{value:?}"),
            None => format!("{:?} (the default)", annotations::DEFAULT_SOCKET),
        };
        Error::InvalidArgument(format!("annotation {}={setting}: {why}", annotations::SOCKET))
    };
    let folder = PodFolder::open(&node.sockets, &pod.namespace, &pod.name).map_err(refuse)?;
    let place = NodePlace {
        folder,
        name: name.to_owned(),
        node,
        owns_folder: !pod.kubernetes,
        cgroup: None,
    };
    let path = place.folder.path().join(name);
    let checked = annotations::check_socket_path(&path)
        .map_err(|e| Error::InvalidArgument(e.to_string()))
        .and_then(|()| place.folder.check_free(name).map_err(refuse));
    if let Err(e) = checked {
        place.release();
        return Err(e);
    }
    Ok(place)
}

/// Reads and checks everything a start needs: the shim's configuration,
/// its options, and the component's file.
fn prepare(
    id: &str,
    cfg: &InstanceConfig,
    spec: &Spec,
    placement: &annotations::Placement,
    socket: &Path,
) -> Result<(ShimConfig, ShimOptions, OwnedFd), Error> {
    let process = spec
        .process()
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the runtime spec has no process".into()))?;
    let args = process.args().as_deref().unwrap_or_default();
    let Some(entry) = args.first() else {
        return Err(Error::InvalidArgument(
            "the container has no entrypoint: the image's Entrypoint (or the arguments after \
             the image) must name the component's .wasm file"
                .into(),
        ));
    };
    let root = spec
        .root()
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the runtime spec has no root".into()))?
        .path();
    let root = if root.is_absolute() { root.clone() } else { cfg.bundle.join(root) };
    // A relative entrypoint is found from the process's working directory.
    let inside = Path::new(process.cwd()).join(entry);
    let wasm = open_in_root(&root, &inside).map_err(|e| {
        Error::InvalidArgument(format!("the component {entry} in the container's image: {e}"))
    })?;
    check_component(&wasm, entry)?;

    let name = Path::new(entry)
        .file_stem()
        .map_or_else(|| id.to_owned(), |s| s.to_string_lossy().into_owned());
    let env = process
        .env()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let stdio = ComponentStdio {
        stdin: cfg.open_stdin().ok().map(Arc::new),
        stdout: cfg.open_stdout().ok().map(Arc::new),
        stderr: cfg.open_stderr().ok().map(Arc::new),
    };
    let component = ComponentSpec {
        name,
        wasm: PathBuf::from(format!("/proc/self/fd/{}", wasm.as_raw_fd())),
        args: args[1..].to_vec(),
        env,
        grants: placement.grants.clone(),
        dirs: preopens(spec, &root, placement.image_files),
        stdio,
        memory_limit: memory_limit(spec),
    };
    let config =
        ShimConfig { cid: placement.cid, uds: socket.to_path_buf(), components: vec![component] };
    let options = ShimOptions {
        compile_cache: compile_cache::default_dir()
            .or_else(|| Some(PathBuf::from(SYSTEM_COMPILE_CACHE))),
        grant_names: GrantNames { listen: annotations::LISTEN, connect: annotations::CONNECT },
        ..ShimOptions::default()
    };
    Ok((config, options, wasm))
}

/// The folders the component gets: the container's bind mounts of
/// folders (a Pod's volumes: hostPath, emptyDir, configMap, secret, which
/// the kubelet hands containerd as host folders), each at its path in the
/// container and read-only where the mount is, and the image's own files
/// at `/`, read-only, when `pier.dev/image-files` asks. A mount of a
/// single file (a configMap key with `subPath`, the CRI's `/etc/hosts`)
/// cannot be a WASI preopen, which is a folder, and the system mounts
/// under `/dev`, `/proc` and `/sys` are of no use to a component: both are
/// left out, with a line in the log.
fn preopens(spec: &Spec, root: &Path, image_files: bool) -> Vec<Preopen> {
    let mut dirs = Vec::new();
    if image_files {
        dirs.push(Preopen { host: root.to_path_buf(), guest: "/".into(), read_only: true });
    }
    for mount in spec.mounts().as_deref().unwrap_or_default() {
        let options = mount.options().as_deref().unwrap_or_default();
        let is_bind = mount.typ().as_deref() == Some("bind")
            || options.iter().any(|o| o == "bind" || o == "rbind");
        let destination = mount.destination();
        let Some(source) = mount.source().as_ref().filter(|_| is_bind) else { continue };
        if ["/dev", "/proc", "/sys"].iter().any(|system| destination.starts_with(system)) {
            continue;
        }
        if !source.is_dir() {
            log::info!(
                "the mount at {} is not a folder ({}): a component gets folders only",
                destination.display(),
                source.display()
            );
            continue;
        }
        dirs.push(Preopen {
            host: source.clone(),
            guest: destination.to_string_lossy().into_owned(),
            read_only: options.iter().any(|o| o == "ro"),
        });
    }
    dirs
}

/// Opens `path` as if `root` were `/`: `..` and symlinks, absolute ones
/// included, cannot leave it (`openat2` with `RESOLVE_IN_ROOT`). The
/// shim runs as root on the node; the image is someone else's.
fn open_in_root(root: &Path, path: &Path) -> io::Result<OwnedFd> {
    let root = File::open(root)?;
    open_at(&root, path, libc::O_RDONLY, libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS)
}

/// A component starts with `\0asm` and the component layer's version; a
/// core module (wasm32-wasip1) has version 1 instead.
fn check_component(wasm: &OwnedFd, entry: &str) -> Result<(), Error> {
    const COMPONENT: [u8; 8] = *b"\0asm\x0d\x00\x01\x00";
    const CORE_MODULE: [u8; 8] = *b"\0asm\x01\x00\x00\x00";
    let file = File::from(wasm.try_clone()?);
    let mut head = [0u8; 8];
    let read = file.read_at(&mut head, 0)?;
    match head {
        COMPONENT if read == 8 => Ok(()),
        CORE_MODULE if read == 8 => Err(Error::InvalidArgument(format!(
            "{entry} is a core WebAssembly module; pier runs components (wasm32-wasip2)"
        ))),
        _ => Err(Error::InvalidArgument(format!("{entry} is not a WebAssembly component"))),
    }
}
