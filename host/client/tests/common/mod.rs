//! The stand-in backend the client's tests talk to: socat listening at
//! the hybrid socket paths and running a shell script per connection
//! (the script's stdin and stdout are the connection), plus test data.
//! Every socat runs in its own process group, killed with its forked
//! children when the test's last handle on the backend goes.

#![allow(dead_code)]

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Test data by seed and length.
pub use pier_testkit::pattern::data;

/// A stand-in for a hybrid vsock stream backend that serves every port:
/// take the line, answer `OK`, echo.
pub const ECHO: &str = "read line; echo OK 1073741824; exec cat";

/// socat's path, installed when missing; a test fails (naming the
/// command to run by hand) when it cannot be.
pub fn socat() -> PathBuf {
    pier_testkit::tools::ensure(pier_testkit::tools::SOCAT).unwrap_or_else(|e| panic!("{e}"))
}

/// One stand-in backend: a temporary folder with `<uds>` and friends,
/// and the socat processes serving them.
#[derive(Clone)]
pub struct Backend(Arc<Inner>);

struct Inner {
    dir: tempfile::TempDir,
    uds: PathBuf,
    children: Mutex<Vec<Child>>,
    scripts: AtomicUsize,
}

impl Default for Backend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("vm.vsock");
        Self(Arc::new(Inner {
            dir,
            uds,
            children: Mutex::new(Vec::new()),
            scripts: AtomicUsize::new(0),
        }))
    }

    /// The stream socket's path, from which the others derive.
    pub fn uds(&self) -> &Path {
        &self.0.uds
    }

    /// A socat command in a process group of its own.
    pub fn command(&self) -> Command {
        let mut command = Command::new(socat());
        command.process_group(0).stderr(Stdio::null());
        command
    }

    /// Serves `<uds>` with `script` per connection.
    pub fn stream(&self, script: &str) {
        self.serve(self.uds(), "", script);
    }

    /// Serves `<uds>_seqpacket` (`SOCK_SEQPACKET`) with `script` per
    /// connection: each message read is written to the script, each
    /// write of the script is sent as one message.
    pub fn seqpacket(&self, script: &str) {
        self.serve(&pier_client::seqpacket_path(self.uds()), ",socktype=5", script);
    }

    /// Binds `<uds>_dgram` and sends each datagram back to its sender,
    /// unchanged (so the ports header comes back as it went).
    pub fn datagram_echo(&self) {
        let path = pier_client::datagram_path(self.uds());
        let mut command = self.command();
        // socat moves 8 KiB at a time unless told otherwise, which would
        // cut larger datagrams.
        command.args(["-b", "131072"]);
        command.arg(format!("UNIX-RECVFROM:{},fork", path.display())).arg("EXEC:cat");
        self.spawn(command, &path, Ready::Bound);
    }

    fn serve(&self, path: &Path, options: &str, script: &str) {
        let n = self.0.scripts.fetch_add(1, Ordering::Relaxed);
        let file = self.0.dir.path().join(format!("script-{n}.sh"));
        let mut f = std::fs::File::create(&file).expect("script");
        writeln!(f, "#!/bin/sh\n{script}").expect("script");
        drop(f);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut command = self.command();
        command
            .arg(format!("UNIX-LISTEN:{},fork{options}", path.display()))
            .arg(format!("EXEC:{}", file.display()));
        self.spawn(command, path, Ready::Listening);
    }

    /// Starts `command` and waits until `path` is ready: bound (a
    /// datagram socket), or listening (the file appears at `bind`, a
    /// moment before `listen`, and a connect in between is refused).
    fn spawn(&self, mut command: Command, path: &Path, ready: Ready) {
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect("socat");
        self.0.children.lock().unwrap().push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let is_ready = || match ready {
            Ready::Bound => path.exists(),
            Ready::Listening => is_listening(path),
        };
        while !is_ready() {
            assert!(Instant::now() < deadline, "socat never listened on {}", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// When a stand-in socket can be used.
#[derive(Clone, Copy)]
enum Ready {
    Bound,
    Listening,
}

/// Whether a Unix socket listens at `path`, read from `/proc/net/unix`
/// (whose flags column has `__SO_ACCEPTCON`, 0x10000, for a listener)
/// rather than by connecting, which socat would serve as a client.
fn is_listening(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let path = path.to_string_lossy();
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() >= 8 && fields[7] == path && fields[3] == "00010000"
    })
}

impl Drop for Inner {
    fn drop(&mut self) {
        for child in self.children.get_mut().unwrap().iter_mut() {
            // The whole group: socat and the scripts it forked.
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}
