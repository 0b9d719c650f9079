//! Programs from outside Rust that some tests and tasks need: `tshark`
//! (to decode pier's packet captures), QEMU and `vhost-device-vsock` (the
//! cross-check against the world's own vsock backend), `socat` (a stand-in
//! hybrid vsock backend for pier-client's tests), containerd (the shim's
//! tests) and what building the shim needs (`protoc`, libseccomp).
//!
//! The README's test command must work as a machine's first command, so
//! a test that needs one of these asks [`ensure`] for it, which installs
//! what is missing the way the project documents (Debian's apt as root or
//! through `sudo -n`; `cargo install --locked` for Rust tools, built into
//! a cache outside the clone), one installer at a time across processes
//! (`flock`). When it cannot, the error names the exact command to run by
//! hand: a test never skips because a tool is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How a tool is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Debian package.
    Apt(&'static str),
    /// A crate on crates.io, `name@version`, installed with `cargo install
    /// --locked`.
    Cargo(&'static str),
}

/// One program a test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The command's name.
    pub command: &'static str,
    /// Where it comes from.
    pub source: Source,
}

/// tshark, Wireshark's command-line decoder.
pub const TSHARK: Tool = Tool { command: "tshark", source: Source::Apt("tshark") };
/// QEMU for x86-64 (Debian 12's is 7.2, with `vhost-user-vsock-device`).
pub const QEMU: Tool =
    Tool { command: "qemu-system-x86_64", source: Source::Apt("qemu-system-x86") };
/// perf, for the benchmarks' system-call counts (`perf stat`).
pub const PERF: Tool = Tool { command: "perf", source: Source::Apt("linux-perf") };
/// socat: pier-client's tests build a stand-in hybrid vsock backend from
/// it, to show the client assumes nothing of pier beyond the protocol.
pub const SOCAT: Tool = Tool { command: "socat", source: Source::Apt("socat") };
/// containerd (Debian 12's is 1.6), with `ctr`, for the containerd shim's
/// tests.
pub const CONTAINERD: Tool = Tool { command: "containerd", source: Source::Apt("containerd") };
/// The protobuf compiler: building runwasi's containerd client needs it.
pub const PROTOC: Tool = Tool { command: "protoc", source: Source::Apt("protobuf-compiler") };
/// rust-vmm's vhost-user vsock backend, at the release whose behaviour the
/// tests and docs describe (`docs/vhost-user.md`): a newer one may differ.
pub const VHOST_DEVICE_VSOCK: Tool =
    Tool { command: "vhost-device-vsock", source: Source::Cargo("vhost-device-vsock@0.3.0") };

impl Tool {
    /// The command to install it by hand.
    pub fn install_command(&self) -> String {
        match self.source {
            Source::Apt(package) => format!("sudo apt-get install -y {package}"),
            Source::Cargo(krate) => format!("cargo install --locked {krate}"),
        }
    }
}

/// The path of `tool`, installing it first when it is missing. Prints one
/// line when it installs.
pub fn ensure(tool: Tool) -> Result<PathBuf, String> {
    let install = || match tool.source {
        Source::Apt(package) => install_apt(package),
        Source::Cargo(krate) => install_cargo(krate),
    };
    install_unless_present(tool.command, &tool.install_command(), install, || find(tool.command))
}

/// Makes sure the C library `library` can be linked: `pkg-config` knows
/// it, or Debian's `package` (with pkg-config itself) is installed.
pub fn ensure_pkg_config_library(library: &str, package: &str) -> Result<(), String> {
    let known = || {
        Command::new("pkg-config")
            .args(["--exists", library])
            .status()
            .is_ok_and(|s| s.success())
            .then_some(())
    };
    let packages = format!("pkg-config {package}");
    let by_hand = format!("sudo apt-get install -y {packages}");
    install_unless_present(library, &by_hand, || install_apt(&packages), known)
}

/// `present()`, or else `install` and `present()` again; the errors name
/// `what` and the command `by_hand` that installs it.
fn install_unless_present<T>(
    what: &str,
    by_hand: &str,
    install: impl FnOnce() -> Result<(), String>,
    present: impl Fn() -> Option<T>,
) -> Result<T, String> {
    if let Some(found) = present() {
        return Ok(found);
    }
    eprintln!("pier: installing {what} ({by_hand})");
    match (install(), present()) {
        (Ok(()), Some(found)) => Ok(found),
        (Ok(()), None) => Err(format!(
            "{what} is still missing after installing it; install it by hand:\n    {by_hand}"
        )),
        (Err(why), _) => Err(format!(
            "{what} is missing and installing it failed ({why}).\nInstall it by hand, then run \
             the command again:\n    {by_hand}"
        )),
    }
}

/// `command` on PATH, or in cargo's bin folder (where `cargo install`
/// puts it even when that folder is not on PATH).
fn find(command: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.push(cargo_bin());
    dirs.into_iter().map(|d| d.join(command)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn cargo_bin() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home).join("bin"),
        None => home().join(".cargo/bin"),
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// Runs `argv` under `flock` on one lock file, so that parallel tests
/// install one at a time (and apt's own lock is never contended).
fn locked(argv: &[&str]) -> Command {
    let lock = std::env::temp_dir().join("pier-tool-install.lock");
    let mut cmd = Command::new("flock");
    cmd.arg(lock).args(argv);
    cmd
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Refreshes apt's package lists (as root, or through `sudo -n`), for
/// `apt-get download` on a machine whose lists are missing or stale.
pub(crate) fn apt_update() -> Result<(), String> {
    let script = "apt-get update -qq";
    let argv: Vec<&str> =
        if is_root() { vec!["sh", "-c", script] } else { vec!["sudo", "-n", "sh", "-c", script] };
    run(locked(&argv)).map_err(|why| {
        format!(
            "apt-get update failed ({why}); run it by hand (sudo apt-get update), then the \
             command again"
        )
    })
}

fn install_apt(package: &str) -> Result<(), String> {
    let script = format!(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}"
    );
    let argv: Vec<&str> =
        if is_root() { vec!["sh", "-c", &script] } else { vec!["sudo", "-n", "sh", "-c", &script] };
    run(locked(&argv))
}

fn install_cargo(krate: &str) -> Result<(), String> {
    let mut cmd = locked(&["cargo", "install", "--locked", krate]);
    // Built outside the clone, so it survives a fresh checkout, and never
    // in the workspace's own target folder (whose lock the calling cargo
    // may hold).
    cmd.env("CARGO_TARGET_DIR", home().join(".cache/pier/tools-target"));
    cmd.current_dir(std::env::temp_dir());
    run(cmd)
}

fn run(mut cmd: Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("could not run {cmd:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    Err(format!("{}: {}", out.status, tail.into_iter().rev().collect::<Vec<_>>().join(" / ")))
}
