//! What every end-to-end test needs: the guest components (built once per
//! test process, from this very checkout), a `pier run` child that is
//! killed when the test ends, and host-side clients for the hybrid vsock
//! socket.
//!
//! The guest build is the one `cargo xtask` runs (`pier_testkit::targets`:
//! it installs the Wasm target when it is missing), into a shared cache
//! (`$HOME/.cache/pier/guest-target-<checkout>`, or `$PIER_GUEST_TARGET`), so it is a
//! no-op when nothing changed. A failed build fails the test with cargo's
//! output: these tests never skip.

#![allow(dead_code)]

pub mod scenarios;
pub mod stats;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pier_client::HybridStream;

/// Test data by seed and length, and its hash: the same as the Linux test
/// guest's.
pub use pier_testkit::pattern::{Fnv, data};

/// The guest components, built once per process (installing the target
/// first if the toolchain lacks it, as `cargo xtask run` does).
// Not every test binary uses both.
#[allow(unused_imports)]
pub use pier_testkit::{built_guest_components as guest_dir, guest_component as wasm};

pub fn pier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pier"))
}

/// The unikernel image of one guest app, built for x86_64-unknown-none
/// once per process (as `cargo xtask image NAME` builds it, adding the
/// target when it is missing).
pub fn image(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let path = pier_testkit::build_guest_image(
        name,
        &pier_testkit::cache_dir("guest-image-target"),
        pier_testkit::Output::OnFailure,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    built.push((name.to_owned(), path.clone()));
    path
}

/// A `pier run` or `pier boot` child process; killed when dropped.
pub struct PierRun {
    pub child: Child,
    stderr: Arc<Mutex<String>>,
    pub uds: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl PierRun {
    /// `pier run <args>` with `--uds` in a fresh temporary folder.
    pub fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("vm.vsock");
        let mut run = Self::start_in(&uds, args, Stdio::null(), Stdio::null());
        run._dir = Some(dir);
        run
    }

    /// `pier run <args>` with `--uds` in a fresh temporary folder and
    /// `env` added to its environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("vm.vsock");
        let mut run = Self::run_with_env(&uds, args, Stdio::null(), Stdio::null(), env);
        run._dir = Some(dir);
        run
    }

    /// `pier run --uds <uds> <args>` with the given stdin and stdout.
    pub fn start_in(uds: &Path, args: &[&str], stdin: Stdio, stdout: Stdio) -> Self {
        Self::run_with_env(uds, args, stdin, stdout, &[])
    }

    fn run_with_env(
        uds: &Path,
        args: &[&str],
        stdin: Stdio,
        stdout: Stdio,
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = pier();
        command.arg("run").arg("--uds").arg(uds).args(args).envs(env.iter().copied());
        Self::spawn(command.stdin(stdin).stdout(stdout), uds)
    }

    /// `pier boot <image> -- <app_args>` with `--uds` in a fresh temporary
    /// folder; the guest's console is piped to [`Self::read_stdout`].
    pub fn boot(image: &Path, app_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut run = Self::boot_in(&dir.path().join("vm.vsock"), image, app_args);
        run._dir = Some(dir);
        run
    }

    /// `pier boot <image> --uds <uds> -- <app_args>`, the console piped.
    pub fn boot_in(uds: &Path, image: &Path, app_args: &[&str]) -> Self {
        Self::boot_with(&[], uds, image, app_args)
    }

    /// [`Self::boot_in`] with `pier boot`'s own `options` (`--stats`).
    pub fn boot_with(options: &[&str], uds: &Path, image: &Path, app_args: &[&str]) -> Self {
        let mut command = pier();
        command
            .arg("boot")
            .args(options)
            .arg(image)
            .arg("--uds")
            .arg(uds)
            .arg("--")
            .args(app_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        Self::spawn(&mut command, uds)
    }

    /// Starts a `pier` command the caller built (`--uds <uds>` among its
    /// arguments).
    pub fn spawn_command(command: &mut Command, uds: &Path) -> Self {
        Self::spawn(command, uds)
    }

    /// Starts a `pier boot` command the caller built (`--uds <uds>` among
    /// its arguments) with the guest's console read into [`Self::stderr`]
    /// too, both on one pipe so that their lines keep the order pier wrote
    /// them in: for tests that follow what the guest app logs as it goes.
    pub fn spawn_with_console(command: &mut Command, uds: &Path) -> Self {
        let (pipe, writer) = std::io::pipe().expect("a pipe for pier's output");
        command.stdout(writer.try_clone().expect("the pipe's write end")).stderr(writer);
        let child = Self::launch(command);
        // The command keeps the write ends it was given; without them the
        // child is the pipe's only writer.
        command.stdout(Stdio::null()).stderr(Stdio::null());
        Self::reading(child, pipe, uds)
    }

    /// Starts `command` with its stderr read into [`Self::stderr`].
    fn spawn(command: &mut Command, uds: &Path) -> Self {
        let mut child = Self::launch(command.stderr(Stdio::piped()));
        let pipe = child.stderr.take().expect("stderr");
        Self::reading(child, pipe, uds)
    }

    /// Starts `command` with pier's default log filter (a `RUST_LOG` of
    /// the test's own environment would change what the tests read on
    /// stderr, so it is removed unless the test set one itself).
    fn launch(command: &mut Command) -> Child {
        if !command.get_envs().any(|(k, v)| k == "RUST_LOG" && v.is_some()) {
            command.env_remove("RUST_LOG");
        }
        command.spawn().expect("spawning pier")
    }

    /// The running `child`, whose output `pipe` is read line by line into
    /// [`Self::stderr`].
    fn reading(child: Child, pipe: impl Read + Send + 'static, uds: &Path) -> Self {
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let stderr = stderr.clone();
            thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    let mut s = stderr.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        Self { child, stderr, uds: uds.to_owned(), _dir: None }
    }

    /// Reads the child's stdout: `len` bytes, or to the end when `None`.
    /// Fails the test (with pier's stderr) if that takes over `timeout`.
    pub fn read_stdout(&mut self, len: Option<usize>, timeout: Duration) -> Vec<u8> {
        let mut stdout = self.child.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let result = match len {
                Some(len) => {
                    let mut out = vec![0u8; len];
                    stdout.read_exact(&mut out).map(|()| out)
                }
                None => {
                    let mut out = Vec::new();
                    stdout.read_to_end(&mut out).map(|_| out)
                }
            };
            let _ = tx.send(result);
        });
        match rx.recv_timeout(timeout) {
            Ok(Ok(out)) => out,
            other => panic!("reading pier's stdout: {other:?}; stderr:\n{}", self.stderr()),
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The connection the guest opens to a host listener, taken with
    /// `accept` on that listener made non-blocking first
    /// ([`pier_testkit::qemu::accept_within`]). Fails the test, with
    /// pier's stderr, once pier has exited or `limit` has passed without
    /// one: a blocking accept would hang the whole test run on a guest
    /// that never connects.
    pub fn accept_from_guest<T>(
        &mut self,
        limit: Duration,
        accept: impl FnMut() -> std::io::Result<T>,
    ) -> T {
        let child = &mut self.child;
        let pier_exited = || child.try_wait().expect("try_wait").is_some();
        pier_testkit::qemu::accept_within(accept, limit, pier_exited)
            .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", self.stderr()))
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Let the stderr reader catch up with the last lines.
                thread::sleep(Duration::from_millis(50));
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "pier did not exit within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PierRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stream's worth of guest bytes that a host program which reads
/// nothing cannot all take into its Unix socket, while what is left over
/// is small enough for the guest's credit: so a guest that writes it and
/// exits never waits for the program, and some of it stays in pier.
///
/// The bridge's end of a socket whose program has not read keeps the
/// kernel's default send buffer (`net.core.wmem_default`; it grows only
/// once the program reads). The last write may pass that limit by part
/// of one socket buffer (about 6 KiB on this project's hosts); 32 KiB
/// more is past it. Much more is not: the unikernel's exit waits for its
/// queued bytes, and what the guest may have in flight is bounded by its
/// own buffer as well as the host stack's.
pub fn more_than_an_unread_stream_socket_holds() -> usize {
    let wmem_default: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_default")
        .expect("net.core.wmem_default")
        .trim()
        .parse()
        .expect("net.core.wmem_default is a number");
    wmem_default + (32 << 10)
}

/// Connects to a guest port through `<uds>`, retrying while the shim or
/// the component is still starting (refusals close the socket before OK).
pub fn connect(uds: &Path, port: u32) -> UnixStream {
    connect_with_host_port(uds, port).0
}

/// `pier run` of the echo component on port 1234, with `options`.
pub fn run_echo(options: &[&str]) -> PierRun {
    let echo = wasm("echo");
    let mut args = vec![echo.to_str().unwrap(), "--listen", "1234"];
    args.extend_from_slice(options);
    PierRun::start(&args)
}

/// Connects to `port` behind `uds`, sends `line`, half-closes (SHUT_WR)
/// and reads the echo to its end; returns the connection's host-side
/// port. The exchange the capture and ring trace tests record.
pub fn echo_with_half_close(uds: &Path, port: u32, line: &[u8]) -> u32 {
    use std::io::Write;
    let (mut s, host_port) = connect_with_host_port(uds, port);
    s.write_all(line).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut echoed = Vec::new();
    s.read_to_end(&mut echoed).unwrap();
    assert_eq!(echoed, line);
    host_port
}

/// [`connect`], also returning the host-side port of the connection
/// (the `OK <port>` answer), which names it in captures.
pub fn connect_with_host_port(uds: &Path, port: u32) -> (UnixStream, u32) {
    let attempt = || HybridStream::connect_timeout(uds, port, Duration::from_secs(10));
    let conn = pier_client::retry(Duration::from_secs(20), attempt)
        .unwrap_or_else(|e| panic!("port {port} behind {} never answered: {e}", uds.display()));
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let host_port = conn.local_port();
    (conn.into_inner(), host_port)
}

/// Sends `pier` the signal `name` (TERM, INT, USR1, ...).
pub fn signal(run: &PierRun, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(run.pid().to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{name} failed");
}

/// Waits until pier's stderr contains `needle`.
pub fn wait_for_stderr(run: &PierRun, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run.stderr().contains(needle) {
        assert!(Instant::now() < deadline, "never saw {needle:?}; stderr:\n{}", run.stderr());
        thread::sleep(Duration::from_millis(20));
    }
}

/// CPU time (user + system) a process has used, from /proc.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/pid/stat");
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ (_SC_CLK_TCK) is 100 on every Linux architecture pier runs on.
    Duration::from_millis(ticks * 10)
}

/// Resident memory of a process, in bytes.
pub fn rss(pid: u32) -> usize {
    status_kib(pid, "VmRSS:") * 1024
}

/// Resident anonymous memory of a process, in bytes: the heap, stacks and
/// guest memory, without the pages of its executable and libraries, which
/// the first run of a code path (a trap's unwinding, say) brings in and
/// which are not memory the process holds for anything.
pub fn anonymous_rss(pid: u32) -> usize {
    status_kib(pid, "RssAnon:") * 1024
}

fn status_kib(pid: u32, field: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/pid/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
