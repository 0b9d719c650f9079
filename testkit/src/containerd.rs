//! containerd for pier's shim: building `containerd-shim-pier-v1`, and a
//! private containerd for the tests and benchmarks that run it.
//!
//! The shim crate (`host/containerd-shim`) is its own workspace: runwasi's
//! crates need `protoc` and libseccomp's headers to build, which the main
//! workspace must not, since the README's test command builds it on a
//! fresh machine. [`build_shim`] installs both (Debian's
//! `protobuf-compiler`, `libseccomp-dev`) when they are missing, through
//! [`crate::tools`], and builds the shim into a cache folder of its own.
//!
//! [`Containerd`] is Debian's containerd (installed the same way when
//! missing) started with a temporary root, state and socket, never the
//! machine's own: the shim on its `PATH`, the runtime registered in its
//! config as `docs/kubernetes.md` shows it, its log kept for failures.
//! Dropping it kills what it started (shims included) and unmounts what
//! they left mounted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output as ProcessOutput, Stdio};
use std::time::{Duration, Instant};

use crate::tools::{self, CONTAINERD, PROTOC};
use crate::{Output, cache_dir, cargo, repo_root, run};

/// The runtime name containerd maps to `containerd-shim-pier-v1`.
pub const RUNTIME: &str = "io.containerd.pier.v1";
/// The shim binary's name.
pub const SHIM_BINARY: &str = "containerd-shim-pier-v1";
/// The platform of pier's component images (`crate::oci_image`).
pub const PLATFORM: &str = "wasip2/wasm";

/// Builds the shim (release) and returns the binary's path.
///
/// Its tests are built too: their dev-dependencies turn on more of
/// tokio's features, and a build without them would be compiled again
/// (wasmtime-wasi, pier-shim and the shim) by the first `cargo test`.
pub fn build_shim(output: Output) -> Result<PathBuf, String> {
    run(&mut shim_cargo("build", &["--all-targets"])?, "building containerd-shim-pier-v1", output)?;
    Ok(shim_target().join("release").join(SHIM_BINARY))
}

/// Runs the shim crate's own unit tests (it is outside the workspace, so
/// `cargo test --workspace` does not).
pub fn test_shim(output: Output) -> Result<(), String> {
    run(&mut shim_cargo("test", &[])?, "testing the shim crate", output)
}

/// Lints the shim crate as CI lints the workspace: clippy with warnings
/// denied, and rustfmt's check.
pub fn lint_shim(output: Output) -> Result<(), String> {
    run(
        &mut shim_cargo("clippy", &["--all-targets", "--", "-D", "warnings"])?,
        "clippy on the shim crate",
        output,
    )?;
    let manifest = repo_root().join("host/containerd-shim/Cargo.toml");
    let mut fmt = cargo();
    fmt.args(["fmt", "--check", "--manifest-path"]).arg(manifest);
    run(&mut fmt, "rustfmt's check of the shim crate", output)
}

/// `cargo SUBCOMMAND --release --locked` on the shim crate, in its own
/// target folder, its build dependencies installed first.
fn shim_cargo(subcommand: &str, extra: &[&str]) -> Result<Command, String> {
    tools::ensure(PROTOC)?;
    tools::ensure_pkg_config_library("libseccomp", tools::LIBSECCOMP_DEV)?;
    let manifest = repo_root().join("host/containerd-shim/Cargo.toml");
    let mut cmd = cargo();
    cmd.args([subcommand, "--release", "--locked", "--manifest-path"])
        .arg(&manifest)
        .args(extra)
        .env("CARGO_TARGET_DIR", shim_target());
    Ok(cmd)
}

/// Not the workspace's target folder, which a `cargo test` running the
/// shim's tests keeps locked.
fn shim_target() -> PathBuf {
    cache_dir("containerd-shim-target")
}

/// The runtime's entry in containerd 1.6's config (version 2): what
/// Kubernetes' `RuntimeClass` handler `pier` names, with the `pier.dev/`
/// Pod annotations passed on to the shim. `ctr` finds the shim by its
/// runtime name alone.
pub const RUNTIME_CONFIG: &str = r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.pier]
  runtime_type = "io.containerd.pier.v1"
  pod_annotations = ["pier.dev/*"]
"#;

/// The Pod sandbox image of our containerd's CRI plugin.
pub const SANDBOX_IMAGE: &str = "docker.io/pier/echo:latest";

/// The environment variable that names the shim's node config (the shim
/// reads `/etc/pier/containerd-shim.toml` without it); containerd passes
/// its environment on to the shims it starts.
pub const NODE_CONFIG_VARIABLE: &str = "PIER_CONTAINERD_SHIM_CONFIG";

/// A containerd of our own in a temporary folder.
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    address: PathBuf,
    child: Child,
}

impl Containerd {
    /// Starts containerd in `dir` (made if missing) with `shim` on its
    /// `PATH`, and waits until it answers. The shim's node config puts the
    /// Pods' socket folders under [`Self::socket_root`], with the default
    /// grant policy.
    pub fn start(dir: &Path, shim: &Path) -> Result<Self, String> {
        Self::start_with_node_config(dir, shim, "")
    }

    /// [`Self::start`], with `policy` (TOML: `[policy...]` tables) added to
    /// the shim's node config.
    pub fn start_with_node_config(dir: &Path, shim: &Path, policy: &str) -> Result<Self, String> {
        let containerd = tools::ensure(CONTAINERD)?;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).map_err(|e| format!("making {}: {e}", bin.display()))?;
        let link = bin.join(SHIM_BINARY);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(shim, &link)
            .map_err(|e| format!("linking the shim into {}: {e}", bin.display()))?;
        let address = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(&config, config_text(dir, &address))
            .map_err(|e| format!("writing {}: {e}", config.display()))?;
        let node_config = dir.join("pier-node.toml");
        let sockets = format!("[sockets]\nroot = {:?}\n\n", socket_root(dir).display().to_string());
        std::fs::write(&node_config, sockets + policy)
            .map_err(|e| format!("writing {}: {e}", node_config.display()))?;
        let log = std::fs::File::create(dir.join("containerd.log"))
            .map_err(|e| format!("creating containerd's log: {e}"))?;
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![bin];
        paths.extend(std::env::split_paths(&path));
        let child = Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .env("PATH", std::env::join_paths(paths).map_err(|e| e.to_string())?)
            .env(NODE_CONFIG_VARIABLE, &node_config)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting containerd: {e}"))?;
        let mut containerd = Self { dir: dir.to_path_buf(), address, child };
        containerd.wait_until_up()?;
        containerd.check_cri_plugin()?;
        Ok(containerd)
    }

    fn wait_until_up(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("containerd exited ({status}):\n{}", self.log()));
            }
            if self.address.exists()
                && self.ctr().arg("version").output().is_ok_and(|o| o.status.success())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("containerd did not answer within 20 s:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The CRI plugin (Kubernetes' way in) loaded with the runtime entry:
    /// a config it rejects only shows as a warning in the log.
    fn check_cri_plugin(&self) -> Result<(), String> {
        let out = self.ctr_ok(&["plugins", "ls"])?;
        let listing = String::from_utf8_lossy(&out.stdout);
        let loaded = listing.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"cri") && fields.last() == Some(&"ok")
        });
        if loaded {
            return Ok(());
        }
        Err(format!("containerd's CRI plugin did not load:\n{listing}\n{}", self.log()))
    }

    /// Where the shim makes each Pod's socket folder: `<root>/<namespace>/<pod>/`.
    pub fn socket_root(&self) -> PathBuf {
        socket_root(&self.dir)
    }

    /// `ctr` talking to this containerd.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&self.address);
        cmd
    }

    /// Runs `ctr ARGS` to the end; an error holds its output.
    pub fn ctr_ok(&self, args: &[&str]) -> Result<ProcessOutput, String> {
        let out = self.ctr().args(args).output().map_err(|e| format!("running ctr: {e}"))?;
        if out.status.success() {
            return Ok(out);
        }
        Err(format!(
            "ctr {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Imports an image archive (`crate::oci_image`) into containerd's
    /// `namespace`: `default` is `ctr`'s, `k8s.io` the kubelet's.
    pub fn import(&self, namespace: &str, archive: &Path) -> Result<(), String> {
        let archive = archive.to_str().ok_or("the archive's path is not UTF-8")?;
        self.ctr_ok(&["-n", namespace, "image", "import", "--platform", PLATFORM, archive])
            .map(drop)
    }

    /// Lets the CRI plugin pull from the registry at `host`
    /// (`127.0.0.1:PORT`) over plain HTTP, as a node's
    /// `/etc/containerd/certs.d/<host>/hosts.toml` would; `ctr` is told
    /// per pull ([`Self::pull`]).
    pub fn trust_plain_http(&self, host: &str) -> Result<(), String> {
        let dir = hosts_dir(&self.dir).join(host);
        std::fs::create_dir_all(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        let text = format!(
            "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n"
        );
        std::fs::write(dir.join("hosts.toml"), text)
            .map_err(|e| format!("writing {}'s hosts.toml: {e}", dir.display()))
    }

    /// `ctr image pull --plain-http` of `reference` into `namespace`, with
    /// `options` (`--platform P`, ...): what a user does to fetch an image
    /// from a registry on loopback.
    pub fn pull(&self, namespace: &str, reference: &str, options: &[&str]) -> Result<(), String> {
        let mut args = vec!["-n", namespace, "image", "pull", "--plain-http"];
        args.extend_from_slice(options);
        args.push(reference);
        self.ctr_ok(&args).map(drop)
    }

    /// `ctr run` of `image` as container `id` with the pier runtime and
    /// `annotations`; `args` (after the image and id) replace the image's
    /// entrypoint and arguments when given. `detach` returns once the task
    /// started (`-d`); otherwise this waits for the task to end, removes
    /// the container (`--rm`) and returns ctr's output, whose exit status
    /// is the task's exit code and whose stdout and stderr are the
    /// component's.
    pub fn run(
        &self,
        id: &str,
        image: &str,
        annotations: &[(&str, &str)],
        args: &[&str],
        detach: bool,
    ) -> Result<ProcessOutput, String> {
        self.run_with(id, image, annotations, &[], args, detach)
    }

    /// [`Self::run`] with more `ctr run` options (`--memory-limit N`, ...).
    pub fn run_with(
        &self,
        id: &str,
        image: &str,
        annotations: &[(&str, &str)],
        options: &[&str],
        args: &[&str],
        detach: bool,
    ) -> Result<ProcessOutput, String> {
        let mut cmd = self.ctr();
        cmd.args(["run", "--runtime", RUNTIME, if detach { "-d" } else { "--rm" }]);
        cmd.args(options);
        for (key, value) in annotations {
            cmd.arg("--annotation").arg(format!("{key}={value}"));
        }
        cmd.arg(image).arg(id).args(args);
        cmd.stdin(Stdio::null()).output().map_err(|e| format!("running ctr run: {e}"))
    }

    /// The task's status (`RUNNING`, `STOPPED`, ...) and process id, as
    /// `ctr task ls` shows them; `None` when there is no such task.
    pub fn task(&self, id: &str) -> Result<Option<(String, u32)>, String> {
        let out = self.ctr_ok(&["task", "ls"])?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().skip(1).find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == id).then_some(())?;
            let pid = fields.next()?.parse().ok()?;
            Some((fields.next()?.to_owned(), pid))
        }))
    }

    /// Waits until task `id` has stopped; returns how long that took.
    pub fn wait_stopped(&self, id: &str, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            match self.task(id)? {
                Some((status, _)) if status == "STOPPED" => return Ok(start.elapsed()),
                None => return Err(format!("there is no task {id}")),
                Some(_) if start.elapsed() > timeout => {
                    return Err(format!("task {id} still runs after {timeout:?}"));
                }
                Some(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Deletes the stopped task `id` and its container; returns the task's
    /// exit code (`ctr task delete` reports a non-zero one as a warning).
    pub fn delete(&self, id: &str) -> Result<i32, String> {
        let out = self.ctr_ok(&["task", "delete", id])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let marker = "non-zero exit code ";
        let code = match stderr.find(marker) {
            Some(at) => {
                let digits: String =
                    stderr[at + marker.len()..].chars().take_while(char::is_ascii_digit).collect();
                digits.parse().map_err(|_| format!("unreadable exit code in {stderr:?}"))?
            }
            None => 0,
        };
        self.ctr_ok(&["container", "rm", id])?;
        Ok(code)
    }

    /// containerd's log so far, the shims' lines included.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// containerd's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The folder it runs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_shims_of(&self.address);
        unmount_under(&self.dir);
    }
}

fn socket_root(dir: &Path) -> PathBuf {
    dir.join("sockets")
}

/// The CRI plugin's registry hosts folder (`config_path`).
fn hosts_dir(dir: &Path) -> PathBuf {
    dir.join("hosts")
}

/// A version-2 config: everything of ours under `dir`, the runtime
/// registered as a node's config would have it. runc's entry stays
/// beside pier's, as on a node: the CRI plugin refuses a runtimes table
/// without its default runtime, `runc`. Pod sandboxes run no process under
/// pier, so the sandbox image is echo's (imported, never pulled). The CRI
/// plugin finds how to reach a registry in `hosts/<host>/hosts.toml`
/// ([`Containerd::trust_plain_http`]), read at every pull.
fn config_text(dir: &Path, address: &Path) -> String {
    let quoted = |p: &Path| format!("{:?}", p.display().to_string());
    format!(
        "version = 2\nroot = {root}\nstate = {state}\n\n[grpc]\n  address = {grpc}\n\n\
         [ttrpc]\n  address = {ttrpc}\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = {SANDBOX_IMAGE:?}\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = {hosts}\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  \
         runtime_type = \"io.containerd.runc.v2\"\n\n{RUNTIME_CONFIG}",
        root = quoted(&dir.join("root")),
        state = quoted(&dir.join("state")),
        grpc = quoted(address),
        ttrpc = quoted(&address.with_extension("sock.ttrpc")),
        hosts = quoted(&hosts_dir(dir)),
    )
}

/// Shims outlive a killed containerd on purpose (containerd reconnects
/// to them); ours must not outlive the test. A shim's command line names
/// its containerd's address.
fn kill_shims_of(address: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    let needle = address.as_os_str().as_encoded_bytes();
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let is_ours = cmdline.split(|&b| b == 0).any(|arg| arg == needle)
            && cmdline.windows(SHIM_BINARY.len()).any(|w| w == SHIM_BINARY.as_bytes());
        if is_ours {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Unmounts every mount below `dir`, deepest first (container root
/// filesystems a failed test left behind).
fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(point).status();
    }
}

/// The cpu controller's folder of process `pid`'s cgroup, for cgroup v1
/// (a hierarchy of its own) and v2 (the unified one).
pub fn cpu_cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) =
            (fields.next(), fields.next().unwrap(), fields.next().unwrap());
        if controllers.split(',').any(|c| c == "cpu") {
            return PathBuf::from("/sys/fs/cgroup/cpu").join(path.trim_start_matches('/'));
        }
        if controllers.is_empty() && Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            return PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        }
    }
    panic!("no cpu cgroup in /proc/{pid}/cgroup:\n{text}");
}
