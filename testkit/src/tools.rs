//! Programs from outside Rust that some tests and tasks need: `tshark`
//! (to decode pier's packet captures), `chromium` (to load the ring
//! trace's page), QEMU and `vhost-device-vsock` (the
//! cross-check against the world's own vsock backend), `socat` (a stand-in
//! hybrid vsock backend for pier-client's tests), containerd (the shim's
//! tests), what building the shim needs (`protoc`, libseccomp) and what
//! building the kernel's own `vsock_test` needs (GCC, glibc's static
//! libraries, xz).
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

/// A Debian package at the version the suite was written against.
///
/// `version` is an apt version pattern, exact or ending in `*`. Debian 12's
/// point and security releases keep a package's upstream version and the
/// archive keeps only the newest revision, so each pattern names the
/// upstream version and takes whichever Debian revision is current: a
/// fresh machine can still install it, and never gets another release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deb {
    pub name: &'static str,
    pub version: &'static str,
}

impl Deb {
    /// `name=version`, as `apt-get install` takes it.
    fn spec(&self) -> String {
        format!("{}={}", self.name, self.version)
    }

    /// Whether dpkg has the package installed at a matching version.
    fn installed(&self) -> bool {
        Command::new("dpkg-query").args(["-W", "-f=${Version}", self.name]).output().is_ok_and(
            |out| {
                out.status.success()
                    && version_matches(self.version, String::from_utf8_lossy(&out.stdout).trim())
            },
        )
    }
}

/// Whether `version` is what `pattern` (exact, or a prefix ending in `*`)
/// names.
fn version_matches(pattern: &str, version: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => version.starts_with(prefix),
        None => version == pattern,
    }
}

/// How a tool is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Debian package.
    Apt(Deb),
    /// A crate on crates.io at one release, installed with `cargo install
    /// --locked name@version`; the program's `--version` names it.
    Cargo { name: &'static str, version: &'static str },
}

/// One program a test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The command's name.
    pub command: &'static str,
    /// Where it comes from.
    pub source: Source,
}

/// tshark, Wireshark's command-line decoder (Debian 12's 4.0, whose vsock
/// dissector the capture tests read).
pub const TSHARK: Tool =
    Tool { command: "tshark", source: Source::Apt(Deb { name: "tshark", version: "4.0.*" }) };
/// chromium, headless, for the test that loads `pier trace --html`'s page
/// in a real browser. Debian 12 ships chromium's current upstream release
/// through its security archive and keeps only that one, so unlike the
/// others this pin must move when Debian moves it.
pub const CHROMIUM: Tool =
    Tool { command: "chromium", source: Source::Apt(Deb { name: "chromium", version: "156.*" }) };
/// QEMU for x86-64 (Debian 12's is 7.2, with `vhost-user-vsock-device`).
pub const QEMU: Tool = Tool {
    command: "qemu-system-x86_64",
    source: Source::Apt(Deb { name: "qemu-system-x86", version: "1:7.2+*" }),
};
/// perf, for the benchmarks' system-call counts (`perf stat`): Debian 12's
/// kernel series.
pub const PERF: Tool =
    Tool { command: "perf", source: Source::Apt(Deb { name: "linux-perf", version: "6.1.*" }) };
/// socat: pier-client's tests build a stand-in hybrid vsock backend from
/// it, to show the client assumes nothing of pier beyond the protocol.
pub const SOCAT: Tool =
    Tool { command: "socat", source: Source::Apt(Deb { name: "socat", version: "1.7.4.*" }) };
/// containerd (Debian 12's is 1.6), with `ctr`, for the containerd shim's
/// tests.
pub const CONTAINERD: Tool = Tool {
    command: "containerd",
    source: Source::Apt(Deb { name: "containerd", version: "1.6.*" }),
};
/// The protobuf compiler: building runwasi's containerd client needs it.
pub const PROTOC: Tool = Tool {
    command: "protoc",
    source: Source::Apt(Deb { name: "protobuf-compiler", version: "3.21.*" }),
};
/// rust-vmm's vhost-user vsock backend, at the release whose behaviour the
/// tests and docs describe (`docs/vhost-user.md`): a newer one may differ.
pub const VHOST_DEVICE_VSOCK: Tool = Tool {
    command: "vhost-device-vsock",
    source: Source::Cargo { name: "vhost-device-vsock", version: "0.3.0" },
};

/// xz, to decompress the kernel modules newer Debian kernels ship as
/// `.ko.xz` and the kernel source tarball (Debian 12's 5.4).
pub const XZ: Tool =
    Tool { command: "xz", source: Source::Apt(Deb { name: "xz-utils", version: "5.4.*" }) };
/// The C compiler (Debian 12's GCC 12) that builds the kernel's own
/// `vsock_test` from Debian's kernel source.
pub const GCC: Tool =
    Tool { command: "gcc", source: Source::Apt(Deb { name: "gcc", version: "4:12.*" }) };
/// glibc's headers and static libraries, which `gcc -static` links.
pub const LIBC6_DEV: Deb = Deb { name: "libc6-dev", version: "2.36-*" };

/// pkg-config, which finds the C libraries the containerd shim links.
pub const PKG_CONFIG: Deb = Deb { name: "pkg-config", version: "1.8.*" };
/// libseccomp's headers and pkg-config file (Debian 12's 2.5).
pub const LIBSECCOMP_DEV: Deb = Deb { name: "libseccomp-dev", version: "2.5.*" };

impl Tool {
    /// The command to install it by hand.
    pub fn install_command(&self) -> String {
        match self.source {
            Source::Apt(deb) => format!("sudo apt-get install -y '{}'", deb.spec()),
            Source::Cargo { name, version } => format!("cargo install --locked {name}@{version}"),
        }
    }

    /// The command at its pinned version: for a Debian package, the one on
    /// PATH once dpkg has the package at that version; for a crate, the
    /// first on PATH or in cargo's bin folder whose `--version` names it.
    fn find_pinned(&self) -> Option<PathBuf> {
        match self.source {
            Source::Apt(deb) => deb.installed().then(|| find(self.command)).flatten(),
            Source::Cargo { version, .. } => {
                candidates(self.command).find(|path| reports_version(path, version))
            }
        }
    }
}

/// The path of `tool` at its pinned version, installing that version first
/// when it is missing (or another one is installed). Prints one line when
/// it installs.
pub fn ensure(tool: Tool) -> Result<PathBuf, String> {
    let install = || match tool.source {
        Source::Apt(deb) => install_apt(&[deb]),
        Source::Cargo { name, version } => install_cargo(&format!("{name}@{version}")),
    };
    install_unless_present(tool.command, &tool.install_command(), install, || tool.find_pinned())
}

/// Makes sure Debian's `package` is installed at its pinned version.
pub fn ensure_deb(package: Deb) -> Result<(), String> {
    let by_hand = format!("sudo apt-get install -y '{}'", package.spec());
    install_unless_present(
        package.name,
        &by_hand,
        || install_apt(&[package]),
        || package.installed().then_some(()),
    )
}

/// Makes sure the C library `library` can be linked: `pkg-config` knows
/// it, or else Debian's `package` (with pkg-config itself) is installed at
/// its pinned version.
pub fn ensure_pkg_config_library(library: &str, package: Deb) -> Result<(), String> {
    let known = || {
        Command::new("pkg-config")
            .args(["--exists", library])
            .status()
            .is_ok_and(|s| s.success())
            .then_some(())
    };
    let by_hand = format!("sudo apt-get install -y '{}' '{}'", PKG_CONFIG.spec(), package.spec());
    install_unless_present(library, &by_hand, || install_apt(&[PKG_CONFIG, package]), known)
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
    candidates(command).next()
}

/// Every executable `command` on PATH, then in cargo's bin folder.
fn candidates(command: &str) -> impl Iterator<Item = PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.push(cargo_bin());
    let command = command.to_owned();
    dirs.into_iter().map(move |d| d.join(&command)).filter(|p| is_executable(p))
}

/// Whether `path --version` names `version` as a word of its first line
/// (`vhost-device-vsock 0.3.0`).
fn reports_version(path: &Path, version: &str) -> bool {
    Command::new(path).arg("--version").output().is_ok_and(|out| {
        let text = String::from_utf8_lossy(&out.stdout);
        out.status.success()
            && text.lines().next().is_some_and(|line| line.split_whitespace().any(|w| w == version))
    })
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

/// Installs `debs` at their pinned versions (downgrading one installed at
/// a newer version, so the suite runs what it was written against).
fn install_apt(debs: &[Deb]) -> Result<(), String> {
    let specs: Vec<String> = debs.iter().map(|d| format!("'{}'", d.spec())).collect();
    let script = format!(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
         --allow-downgrades {}",
        specs.join(" ")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_takes_any_debian_revision_of_its_upstream_version_only() {
        let qemu = "1:7.2+*";
        assert!(version_matches(qemu, "1:7.2+dfsg-7+deb12u18+b3"));
        assert!(!version_matches(qemu, "1:8.2.2+ds-0ubuntu1"));
        assert!(!version_matches(qemu, "1:7.20+dfsg-1"));
        assert!(version_matches("1.7.4.4-2", "1.7.4.4-2"));
        assert!(!version_matches("1.7.4.4-2", "1.7.4.4-3"));
    }

    #[test]
    fn every_tool_names_its_version_in_its_install_command() {
        for tool in [TSHARK, CHROMIUM, QEMU, PERF, SOCAT, CONTAINERD, PROTOC, VHOST_DEVICE_VSOCK] {
            let command = tool.install_command();
            let version = match tool.source {
                Source::Apt(deb) => deb.version,
                Source::Cargo { version, .. } => version,
            };
            assert!(command.contains(version), "{}: {command}", tool.command);
        }
    }
}
