//! `pier pool` and `pier boot --pool`: boots in VMs prepared ahead of
//! time behave as plain `pier boot` does (echo over the hybrid socket, the
//! guest's exit code, signals), the pool replaces what it hands out, and
//! it refuses other users and reports what goes wrong.
//!
//! These need `/dev/kvm`: where it is missing or not permitted the pool
//! fails to start, naming it, and so do they; they never skip.

mod common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{PierRun, connect, image, pier};

/// A `pier pool` child, stopped when dropped.
struct Pool {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
}

impl Pool {
    /// Starts a pool of `size` VMs and waits until it says it is ready.
    fn start(size: u32) -> Self {
        Self::start_with(size, &[])
    }

    /// Starts a pool of `size` VMs that preboot `app` with `args`.
    fn preboot(size: u32, app: &str, args: &[&str]) -> Self {
        let mut options = vec![OsString::from("--preboot"), image(app).into_os_string()];
        if !args.is_empty() {
            options.push("--".into());
            options.extend(args.iter().map(OsString::from));
        }
        Self::start_with(size, &options)
    }

    fn start_with(size: u32, options: &[OsString]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("pool.sock");
        let mut child = pier()
            .arg("pool")
            .arg("--socket")
            .arg(&socket)
            .arg("--size")
            .arg(size.to_string())
            .args(options)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG")
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = stderr.read_line(&mut line).unwrap();
            seen.push_str(&line);
            assert!(n > 0, "pier pool ended before it was ready:\n{seen}");
            if line.contains("VMs ready at") {
                break;
            }
        }
        // Keep reading its log, so the pool never blocks on a full pipe.
        let log = Arc::new(Mutex::new(seen));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                let mut log = lines.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Self { child, socket, dir, log }
    }

    /// `pier boot --pool` of `app` with `args`, its socket at `uds`.
    fn boot(&self, app: &str, uds: &Path, args: &[&str]) -> PierRun {
        let mut command = pier();
        command
            .arg("boot")
            .arg("--pool")
            .arg(&self.socket)
            .arg(image(app))
            .arg("--uds")
            .arg(uds)
            .arg("--")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        PierRun::spawn_command(&mut command, uds)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn echo_once(uds: &Path, text: &[u8]) -> Vec<u8> {
    let mut conn = connect(uds, 1234);
    conn.write_all(text).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    back
}

#[test]
fn boots_through_the_pool_echo_and_replaced_vms_for_later_boots() {
    let pool = Pool::start(1);
    // Three boots from a pool of one: the second and third need the
    // replacements of the VMs the earlier ones took.
    for round in 0..3 {
        let uds = pool.dir.path().join(format!("echo-{round}.vsock"));
        let mut run = pool.boot("echo", &uds, &[]);
        let text = format!("round {round} through the pool\n");
        assert_eq!(echo_once(&uds, text.as_bytes()), text.as_bytes(), "stderr:\n{}", run.stderr());
        common::signal(&run, "TERM");
        assert_eq!(run.wait(Duration::from_secs(10)), 128 + 15, "stderr:\n{}", run.stderr());
        assert!(run.stderr().contains("stopped the VM (signal 15)"), "{}", run.stderr());
        assert!(!uds.exists(), "{} left behind", uds.display());
    }
}

#[test]
fn the_guests_exit_code_and_console_reach_the_client() {
    let pool = Pool::start(2);
    for code in ["3", "0"] {
        let uds = pool.dir.path().join(format!("hello-{code}.vsock"));
        let mut run = pool.boot("hello", &uds, &["hi", "exit", code]);
        let console =
            String::from_utf8_lossy(&run.read_stdout(None, Duration::from_secs(30))).into_owned();
        assert_eq!(run.wait(Duration::from_secs(10)).to_string(), code, "{}", run.stderr());
        assert!(console.contains("hello from pier-rt"), "console:\n{console}");
        assert!(console.contains("arg: hi"), "console:\n{console}");
        assert!(run.stderr().contains(&format!("hybrid vsock socket {}", uds.display())));
    }
}

#[test]
fn a_prebooted_pool_serves_its_guest_and_replaces_it_for_later_boots() {
    let pool = Pool::preboot(1, "echo", &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pool.log.lock().unwrap().contains("has booted") {
        let log = pool.log.lock().unwrap().clone();
        assert!(Instant::now() < deadline, "the pool does not say what it prebooted:\n{log}");
        std::thread::sleep(Duration::from_millis(10));
    }
    for round in 0..3 {
        let uds = pool.dir.path().join(format!("echo-{round}.vsock"));
        let mut run = pool.boot("echo", &uds, &[]);
        let text = format!("round {round} through a prebooted guest\n");
        assert_eq!(echo_once(&uds, text.as_bytes()), text.as_bytes(), "stderr:\n{}", run.stderr());
        common::signal(&run, "TERM");
        assert_eq!(run.wait(Duration::from_secs(10)), 128 + 15, "stderr:\n{}", run.stderr());
        assert!(!uds.exists(), "{} left behind", uds.display());
    }
}

#[test]
fn a_prebooted_guests_console_and_exit_code_reach_the_boot_that_asks_later() {
    let pool = Pool::preboot(1, "hello", &["hi", "exit", "3"]);
    // Long enough for the guest to have printed and exited in its worker
    // before anyone asks for it.
    std::thread::sleep(Duration::from_millis(500));
    let uds = pool.dir.path().join("hello.vsock");
    let mut run = pool.boot("hello", &uds, &["hi", "exit", "3"]);
    let console =
        String::from_utf8_lossy(&run.read_stdout(None, Duration::from_secs(30))).into_owned();
    assert_eq!(run.wait(Duration::from_secs(10)), 3, "{}", run.stderr());
    assert!(console.contains("hello from pier-rt"), "console:\n{console}");
    assert!(console.contains("arg: hi"), "console:\n{console}");
}

#[test]
fn a_prebooted_pool_refuses_another_boot_and_keeps_its_guest() {
    let pool = Pool::preboot(1, "echo", &[]);
    let uds = pool.dir.path().join("other.vsock");
    for (app, args) in [("hello", &[][..]), ("echo", &["extra"][..])] {
        // A boot wrongly taken would serve on: the bounded wait fails it.
        let mut run = pool.boot(app, &uds, args);
        assert_eq!(run.wait(Duration::from_secs(30)), 1, "{}", run.stderr());
        let stderr = run.stderr();
        assert!(stderr.contains("booted") && stderr.contains("ahead of time"), "{stderr}");
        let asked = if app == "hello" { "the image" } else { "the arguments [\"extra\"]" };
        assert!(stderr.contains(asked), "{stderr}");
    }
    // The refusals left the worker's guest where it was.
    let uds = pool.dir.path().join("echo.vsock");
    let mut run = pool.boot("echo", &uds, &[]);
    assert_eq!(echo_once(&uds, b"still here\n"), b"still here\n", "{}", run.stderr());
    common::signal(&run, "TERM");
    assert_eq!(run.wait(Duration::from_secs(10)), 128 + 15, "{}", run.stderr());
}

#[test]
fn a_bad_image_is_a_clear_error_and_the_pool_serves_on() {
    let pool = Pool::start(1);
    let text = pool.dir.path().join("notes.txt");
    std::fs::write(&text, "not a kernel\n").unwrap();
    let out = pier().arg("boot").arg("--pool").arg(&pool.socket).arg(&text).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not an ELF file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let uds = pool.dir.path().join("after.vsock");
    let mut run = pool.boot("hello", &uds, &["exit", "4"]);
    assert_eq!(run.wait(Duration::from_secs(30)), 4, "{}", run.stderr());
}

#[test]
fn a_missing_or_dead_pool_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pool.sock");
    let out = pier().arg("boot").arg("--pool").arg(&socket).arg(image("hello")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("no pool at {}", socket.display())), "{stderr}");

    // A socket file nobody listens on: what a killed pool leaves.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let out = pier().arg("boot").arg("--pool").arg(&socket).arg(image("hello")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is gone"), "{stderr}");
}

#[test]
fn a_pool_that_cannot_preboot_its_image_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pool.sock");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a kernel\n").unwrap();
    let mut pool = pier()
        .arg("pool")
        .arg("--socket")
        .arg(&socket)
        .arg("--size")
        .arg("1")
        .arg("--preboot")
        .arg(&text)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A pool that wrongly started would serve on: the bounded wait fails it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = pool.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = pool.kill();
            panic!("pier pool is still running 30 s after its preboot failed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    pool.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not an ELF file"), "{stderr}");
    assert!(!stderr.contains("VMs ready"), "{stderr}");
    assert!(!socket.exists(), "the pool left {} behind", socket.display());
}

#[test]
fn a_worker_that_dies_mid_boot_is_a_clear_error() {
    let pool = Pool::start(1);
    let uds = pool.dir.path().join("spin.vsock");
    let mut run = pool.boot("hello", &uds, &["spin"]);
    let console = run.read_stdout(Some(8), Duration::from_secs(30));
    assert!(!console.is_empty());
    // The worker is the process whose stdout is the client's console:
    // the pool's child that is neither idle nor the pool.
    let worker = workers_of(pool.child.id())
        .into_iter()
        .find(|pid| fd_target(*pid, 1) == fd_target(run.pid(), 1))
        .expect("the worker running the boot");
    assert_eq!(
        std::process::Command::new("kill")
            .arg("-9")
            .arg(worker.to_string())
            .status()
            .unwrap()
            .code(),
        Some(0)
    );
    assert_eq!(run.wait(Duration::from_secs(10)), 1, "{}", run.stderr());
    assert!(run.stderr().contains("ended without an exit code"), "{}", run.stderr());
}

/// The children of `parent`, from /proc.
fn workers_of(parent: u32) -> Vec<u32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default();
    let mut pids: Vec<u32> = children.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    // Threads other than the main one spawn the workers.
    for task in std::fs::read_dir(format!("/proc/{parent}/task")).unwrap().flatten() {
        let path = task.path().join("children");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        pids.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn fd_target(pid: u32, fd: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// Another user reaches the socket (its folder and file opened to all,
/// as a careless setup might) and is refused by the peer check, with a
/// message, and the refusal is in the pool's log. The test runs as root:
/// the child drops to `nobody` before it connects.
#[test]
fn another_users_boot_is_refused() {
    let pool = Pool::start(1);
    std::fs::set_permissions(pool.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&pool.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let reply = connect_as_nobody(&pool.socket);
    assert!(reply.starts_with("error the pool refused a boot from uid 65534"), "{reply:?}");
    assert!(reply.contains("only its owner, uid 0"), "{reply:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pool.log.lock().unwrap().contains("refused a boot from uid 65534") {
        assert!(Instant::now() < deadline, "not in the pool's log:\n{}", pool.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }

    // The worker that refused still serves its owner.
    let uds = pool.dir.path().join("owner.vsock");
    let mut run = pool.boot("hello", &uds, &["exit", "6"]);
    assert_eq!(run.wait(Duration::from_secs(30)), 6, "{}", run.stderr());
}

/// Forks a child that becomes uid and gid 65534 (`nobody`), connects to
/// `socket`, and writes what the pool answered to its stdout; returns that.
/// The child never execs: it uses only system calls between fork and its
/// exit, as a forked child of a threaded process must.
fn connect_as_nobody(socket: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;

    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 0, "this test drops to nobody, so it must run as root");
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = socket.as_os_str().as_bytes();
    assert!(path.len() < addr.sun_path.len());
    for (dst, src) in addr.sun_path.iter_mut().zip(path) {
        *dst = *src as libc::c_char;
    }
    let mut command = std::process::Command::new("/bin/true");
    command.stdout(Stdio::piped());
    // SAFETY: the hook runs in the forked child and calls only
    // async-signal-safe system calls, then _exit()s.
    unsafe {
        command.pre_exec(move || {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if fd < 0 || libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                libc::_exit(11);
            }
            let mut buf = [0u8; 512];
            let mut have = 0;
            loop {
                let n = libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have);
                if n <= 0 {
                    break;
                }
                have += n as usize;
            }
            libc::write(1, buf.as_ptr().cast(), have);
            libc::_exit(0)
        })
    };
    let started = Instant::now();
    let out = command.output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(0), "the child could not drop to nobody or connect");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
