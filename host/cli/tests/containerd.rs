//! pier components under a real containerd, through
//! `containerd-shim-pier-v1` (`host/containerd-shim`).
//!
//! Each test starts its own containerd (Debian's, installed when missing)
//! with a temporary root, state and socket and the runtime registered in
//! its config, imports the component images `cargo xtask oci-image`
//! builds, and drives containers with `ctr` as a user would. Nothing is
//! skipped: a containerd or a build dependency that cannot be installed
//! fails the test with the command to run by hand.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

use common::scenarios::{self, Target};
use pier_testkit::containerd::Containerd;

const PORT: u32 = 1234;
const MIB: usize = 1 << 20;
const ECHO: &str = "docker.io/pier/echo:latest";
const HELLO: &str = "docker.io/pier/hello:latest";
const PROBE: &str = "docker.io/pier/probe:latest";
/// `hello` built for WASI 0.3 (pier-rt's `wasi-0-3` feature).
const HELLO_WASI_0_3: &str = "docker.io/pier/hello-wasi-0-3:latest";
/// How long a stopping signal may take to end a component: it traps at
/// its next call or wakes from its socket wait, then its connections get
/// at most a second to close.
const GRACE: Duration = Duration::from_secs(5);

/// The shim, built once per test process.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        pier_testkit::containerd::build_shim(pier_testkit::Output::OnFailure)
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// The image archives of echo, hello (both worlds) and probe, written
/// once per test process.
fn images() -> &'static [PathBuf] {
    static IMAGES: OnceLock<(tempfile::TempDir, Vec<PathBuf>)> = OnceLock::new();
    let (_, archives) = IMAGES.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let archives = [
            ("echo", ECHO),
            ("hello", HELLO),
            ("probe", PROBE),
            ("hello-wasi-0-3", HELLO_WASI_0_3),
        ]
        .iter()
        .map(|(app, reference)| {
            let out = dir.path().join(format!("{app}.tar"));
            pier_testkit::oci_image::write_image(&common::wasm(app), app, reference, &[], &out)
                .unwrap_or_else(|e| panic!("{e}"));
            out
        })
        .collect();
        (dir, archives)
    });
    archives
}

/// The shim crate's own tests: the annotations' parsing, and the
/// Kubernetes path (`host/containerd-shim/tests/cri.rs`: a Pod with the
/// `pier` runtime class through containerd's CRI plugin). The crate is
/// outside the workspace, so `cargo test --workspace` would not run them
/// otherwise.
#[test]
fn the_shim_crates_own_tests_pass() {
    shim();
    pier_testkit::containerd::test_shim(pier_testkit::Output::OnFailure)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A node: our own containerd with the images imported; the shim's node
/// config puts the Pods' socket folders under `sockets`.
struct Node {
    containerd: Containerd,
    /// The socket root's folder for containerd's `default` namespace.
    sockets: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start() -> Self {
        Self::with_policy("")
    }

    /// A node whose shim config adds `policy` (`[policy...]` tables).
    fn with_policy(policy: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let containerd =
            Containerd::start_with_node_config(&dir.path().join("containerd"), shim(), policy)
                .unwrap_or_else(|e| panic!("{e}"));
        for archive in images() {
            containerd.import("default", archive).unwrap_or_else(|e| panic!("{e}"));
        }
        let sockets = containerd.socket_root().join("default");
        Self { containerd, sockets, _dir: dir }
    }

    /// The hybrid socket container `id` gets by default: outside
    /// Kubernetes each container is a Pod of its own, so its folder is
    /// `<root>/default/<id>/`, and the socket is named after it.
    fn socket(&self, id: &str) -> PathBuf {
        self.sockets.join(id).join(format!("{id}.sock"))
    }

    /// Starts echo as container `id`, allowed to listen on its port.
    fn start_echo(&self, id: &str) -> Container<'_> {
        let socket = self.socket(id);
        let out = self
            .containerd
            .run(id, ECHO, &[("pier.dev/listen", "1234")], &["/echo.wasm", "--port", "1234"], true)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "ctr run -d {id}: {}\n{}", out.status, self.log_of(&out));
        Container { node: self, id: id.to_owned(), socket }
    }

    fn log_of(&self, out: &std::process::Output) -> String {
        format!(
            "stdout: {}\nstderr: {}\ncontainerd's log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.containerd.log()
        )
    }
}

/// A running container, seen as a scenario target.
struct Container<'a> {
    node: &'a Node,
    id: String,
    socket: PathBuf,
}

impl Target for Container<'_> {
    fn uds(&self) -> &Path {
        &self.socket
    }
    fn stderr(&self) -> String {
        self.node.containerd.log()
    }
}

impl Container<'_> {
    fn kill(&self, signal: &str) {
        self.node
            .containerd
            .ctr_ok(&["task", "kill", "--signal", signal, &self.id])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits for the task to stop, deletes it and returns its exit code.
    fn stopped_exit_code(&self) -> i32 {
        let containerd = &self.node.containerd;
        containerd
            .wait_stopped(&self.id, GRACE)
            .unwrap_or_else(|e| panic!("{e}\ncontainerd's log:\n{}", containerd.log()));
        containerd.delete(&self.id).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The socket files and the folder the shim made for them.
    fn socket_files(&self) -> Vec<PathBuf> {
        let folder = self.socket.parent().unwrap();
        match std::fs::read_dir(folder) {
            Ok(entries) => {
                let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
                files.push(folder.to_path_buf());
                files
            }
            Err(_) => Vec::new(),
        }
    }
}

/// Echo under containerd: a host program echoes 16 MiB through the socket
/// the annotation names; `ctr task kill` (SIGTERM) ends it within the
/// grace period with 128 + 15, and deleting the task removes its socket
/// files and the folder the shim made for them.
#[test]
fn echo_serves_and_stops_under_containerd() {
    let node = Node::start();
    let echo = node.start_echo("echo-1");
    scenarios::echo_serves_concurrent_clients(&echo, PORT, 1, |_| 16 * MIB);
    // Two more at once, so the component is really serving, not just
    // answering one connection.
    scenarios::echo_serves_concurrent_clients(&echo, PORT, 2, |i| (i as usize + 1) * MIB);
    let files = echo.socket_files();
    assert!(files.contains(&echo.socket), "the socket is in its Pod's folder: {files:?}");
    // Whoever may enter the folder (owner and group, by the default mode)
    // may connect: `connect` needs write permission on the socket.
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(echo.socket.parent().unwrap()), 0o750);
    assert_eq!(mode(&echo.socket), 0o660);

    echo.kill("SIGTERM");
    assert_eq!(echo.stopped_exit_code(), 128 + 15, "log:\n{}", node.containerd.log());
    assert_eq!(echo.socket_files(), Vec::<PathBuf>::new(), "delete removes the sockets");
}

/// SIGKILL does not wait for the component: 137 at once, and the
/// endpoint's connections are cut.
#[test]
fn sigkill_ends_the_container_at_once() {
    let node = Node::start();
    let echo = node.start_echo("echo-kill");
    let mut conn = common::connect(&echo.socket, PORT);
    echo.kill("SIGKILL");
    assert_eq!(echo.stopped_exit_code(), 137);
    let mut rest = Vec::new();
    use std::io::Read as _;
    let _ = conn.read_to_end(&mut rest);
    assert!(rest.is_empty(), "a killed echo sends nothing more");
    assert_eq!(echo.socket_files(), Vec::<PathBuf>::new(), "delete removes the sockets");
}

/// What the kubelet does to stop a Pod: SIGTERM, then SIGKILL when the
/// grace period is over. A component asleep in WASI does not wake for
/// SIGTERM (only vsock waits and running code are reached); the SIGKILL
/// ends it at once with 137, and delete removes its sockets.
#[test]
fn sigterm_then_sigkill_ends_a_component_asleep_in_wasi() {
    let node = Node::start();
    let id = "asleep";
    let socket = node.socket(id);
    let annotations = [("pier.dev/listen", "7001")];
    let out = node
        .containerd
        .run(id, PROBE, &annotations, &["/probe.wasm", "sleep", "7001"], true)
        .unwrap();
    assert!(out.status.success(), "{}", node.log_of(&out));
    let asleep = Container { node: &node, id: id.to_owned(), socket };
    // Its listener is bound before it sleeps: a connect is answered.
    drop(common::connect(&asleep.socket, 7001));
    asleep.kill("SIGTERM");
    thread::sleep(Duration::from_millis(1500));
    let task = node.containerd.task(id).unwrap();
    assert_eq!(task.map(|(status, _)| status).as_deref(), Some("RUNNING"), "asleep past SIGTERM");
    asleep.kill("SIGKILL");
    assert_eq!(asleep.stopped_exit_code(), 137);
    assert_eq!(asleep.socket_files(), Vec::<PathBuf>::new(), "delete removes the sockets");
}

/// The component's stdout and stderr are containerd's (ctr prints what
/// the pipes carry), its environment is the container's, and its exit
/// code is the task's: 0, 1, 3, 42 as it asked, 134 for a trap (the
/// signals' 143 and 137 are the tests above).
#[test]
fn stdio_environment_and_exit_codes_reach_containerd() {
    let node = Node::start();
    let args = ["/hello.wasm", "pier", "env", "GREETING", "exit", "1"];
    let mut cmd = node.containerd.ctr();
    cmd.args([
        "run",
        "--rm",
        "--runtime",
        pier_testkit::containerd::RUNTIME,
        "--env",
        "GREETING=hi",
    ])
    .args([HELLO, "hello-1"])
    .args(args);
    let out = cmd.output().expect("running ctr");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", node.log_of(&out));
    for line in ["hello from pier-rt", "arg: pier", "env GREETING=hi"] {
        assert!(stdout.contains(line), "stdout lacks {line:?}:\n{}", node.log_of(&out));
    }

    let out = node.containerd.run("hello-2", HELLO, &[], &["/hello.wasm", "panic"], false).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(134), "a trap is 128 + SIGABRT: {}", node.log_of(&out));
    assert!(stderr.contains("hello was asked to panic"), "{}", node.log_of(&out));

    // Every code the component asks for, not only 0 and 1, by exit or
    // returned from main.
    for (how, code) in [("exit", 0), ("exit", 3), ("exit", 42), ("return", 1), ("return", 42)] {
        let id = format!("hello-{how}-{code}");
        let args = ["/hello.wasm", how, &code.to_string()];
        let out = node.containerd.run(&id, HELLO, &[], &args, false).unwrap();
        assert_eq!(out.status.code(), Some(code), "{how} {code}: {}", node.log_of(&out));
    }
}

/// A WASI 0.3 component's exit code is the task's too: its `run@0.3.0`
/// returns only ok or err, so 3 and 42 leave through `exit-with-code`.
#[test]
fn a_wasi_0_3_components_exit_codes_reach_containerd() {
    let node = Node::start();
    for (how, code) in [("exit", 0), ("exit", 1), ("exit", 3), ("exit", 42), ("return", 42)] {
        let id = format!("h03-{how}-{code}");
        let args = ["/hello-wasi-0-3.wasm", how, &code.to_string()];
        let out = node.containerd.run(&id, HELLO_WASI_0_3, &[], &args, false).unwrap();
        assert_eq!(out.status.code(), Some(code), "{how} {code}: {}", node.log_of(&out));
    }
}

/// The container's memory limit (`ctr run --memory-limit`, a Pod's
/// `resources.limits.memory`) bounds the component: past it, exit 137 and
/// the reason on the container's stderr.
#[test]
fn a_container_that_grows_past_its_memory_limit_ends_with_137() {
    let node = Node::start();
    let mut cmd = node.containerd.ctr();
    cmd.args(["run", "--rm", "--runtime", pier_testkit::containerd::RUNTIME])
        .args(["--memory-limit", &(16u64 << 20).to_string()])
        .args([PROBE, "probe-oom", "/probe.wasm", "grow", "32"]);
    let out = cmd.output().expect("running ctr");
    assert_eq!(out.status.code(), Some(137), "{}", node.log_of(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("out of memory"), "{}", node.log_of(&out));
}

/// Deny by default: echo without `pier.dev/listen` gets access-denied on
/// its bind, says so on its stderr and exits 1; the shim's log names the
/// annotation that would have allowed it.
#[test]
fn a_container_without_a_grant_cannot_listen() {
    let node = Node::start();
    let socket = node.socket("nogrant");
    let out = node
        .containerd
        .run("nogrant", ECHO, &[], &["/echo.wasm", "--port", "1234"], false)
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", node.log_of(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("echo: vsock: access-denied"), "{}", node.log_of(&out));
    assert!(
        node.containerd.log().contains("bind on port 1234 denied: no pier.dev/listen grant"),
        "{}",
        node.log_of(&out)
    );
    assert!(!socket.exists(), "the socket is gone with the container");
}

impl Node {
    /// Runs echo as `id` with `annotations`, which must fail its create
    /// with `message` on ctr's stderr; returns that stderr.
    fn refused(&self, id: &str, annotations: &[(&str, &str)], message: &str) -> String {
        let out = self.containerd.run(id, ECHO, annotations, &[], true).unwrap();
        assert!(!out.status.success(), "{annotations:?} started: {}", self.log_of(&out));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(message), "{annotations:?}: wanted {message:?} in:\n{stderr}");
        // ctr leaves the container record of a failed create behind.
        let _ = self.containerd.ctr_ok(&["container", "rm", id]);
        stderr
    }

    /// Everything below the socket root.
    fn socket_root_entries(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                into.push(entry.path());
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), into);
                }
            }
        }
        let mut entries = Vec::new();
        walk(&self.containerd.socket_root(), &mut entries);
        entries
    }
}

/// Annotations that cannot work fail the container's create, naming the
/// annotation and the reason, and leave no socket or folder behind.
#[test]
fn bad_annotations_fail_the_start_with_a_clear_message() {
    let node = Node::start();
    let cases = [
        ("pier.dev/listen", "http", "annotation pier.dev/listen=\"http\""),
        ("pier.dev/connect", "2", "annotation pier.dev/connect=\"2\""),
        ("pier.dev/cid", "2", "CID 2 is reserved"),
        ("pier.dev/lisen", "1234", "unknown annotation pier.dev/lisen"),
    ];
    for (i, (key, value, message)) in cases.into_iter().enumerate() {
        node.refused(&format!("bad-{i}"), &[(key, value)], message);
    }
    let left: Vec<PathBuf> =
        node.socket_root_entries().into_iter().filter(|p| p != &node.sockets).collect();
    assert_eq!(left, Vec::<PathBuf>::new(), "no socket or Pod folder was left");
}

/// A socket annotation names a file in its own Pod's folder and nothing
/// else: an absolute path outside the root, `..`, another namespace's
/// folder are each refused, naming the annotation, and nothing is made
/// outside the Pod's folder.
#[test]
fn a_socket_annotation_cannot_name_a_path_outside_its_pods_folder() {
    let node = Node::start();
    let outside = node._dir.path().join("outside");
    let outside_socket = outside.join("x.sock");
    let another_namespace = "../../kube-system/coredns/coredns.sock";
    for (i, value) in
        [outside_socket.to_str().unwrap(), "../x.sock", another_namespace].into_iter().enumerate()
    {
        node.refused(
            &format!("escape-{i}"),
            &[("pier.dev/listen", "1234"), ("pier.dev/socket", value)],
            &format!("annotation pier.dev/socket={value:?}: the socket must be a file name"),
        );
    }
    assert!(!outside.exists(), "nothing was made outside the socket root");
    let root = node.containerd.socket_root();
    assert!(!root.join("kube-system").exists(), "nor in another namespace's place");
    assert!(!node.sockets.join("x.sock").exists());
}

/// A symlink planted where a namespace's folder goes is not followed: the
/// create fails naming the annotation, and nothing is made where the link
/// points.
#[test]
fn a_symlink_planted_in_the_socket_root_is_refused() {
    let node = Node::start();
    let elsewhere = node._dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::create_dir_all(node.containerd.socket_root()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &node.sockets).unwrap();
    let stderr = node.refused(
        "planted",
        &[("pier.dev/listen", "1234")],
        "annotation pier.dev/socket=\"{container}.sock\" (the default):",
    );
    assert!(stderr.contains("is a symlink or not a folder"), "{stderr}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing made through the link");
}

/// A socket another Pod left behind (its shim died before cleaning up)
/// is neither taken over nor removed: the create fails naming the
/// annotation, and the file stays for the node's operator.
#[test]
fn a_stale_socket_left_by_another_pod_is_refused_and_kept() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::start();
    let folder = node.sockets.join("reused");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o750)).unwrap();
    let stale = folder.join("reused.sock");
    // Bound, then closed: a socket file nobody answers on.
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    node.refused(
        "reused",
        &[("pier.dev/listen", "1234")],
        &format!("{} exists already", stale.display()),
    );
    assert!(stale.exists(), "the other Pod's socket is left where it was");
}

/// The node's policy bounds what a Pod's annotations may grant: within
/// it a container runs; asking for more fails the create, naming both the
/// annotation and the policy entry.
#[test]
fn the_node_policy_bounds_what_annotations_may_grant() {
    let node = Node::with_policy(
        "[policy.namespaces.default]\nlisten = [\"1234\"]\nconnect = [\"2:5000\"]\ncid = [3]\n",
    );
    let within = [("pier.dev/listen", "1234"), ("pier.dev/connect", "2:5000")];
    let out = node
        .containerd
        .run("within", ECHO, &within, &["/echo.wasm", "--port", "1234"], true)
        .unwrap();
    assert!(out.status.success(), "{}", node.log_of(&out));
    let echo = Container { node: &node, id: "within".into(), socket: node.socket("within") };
    scenarios::echo_serves_concurrent_clients(&echo, PORT, 1, |_| MIB);
    echo.kill("SIGKILL");
    echo.stopped_exit_code();
    let entry = "[policy.namespaces.default]";
    for (i, (key, value, asked, bound)) in [
        ("pier.dev/listen", "*", "\"*\"", "listen = [\"1234\"]"),
        ("pier.dev/listen", "80", "\"80\"", "listen = [\"1234\"]"),
        ("pier.dev/connect", "2:*", "\"2:*\"", "connect = [\"2:5000\"]"),
        ("pier.dev/cid", "4", "CID 4", "cid = [\"3\"]"),
    ]
    .into_iter()
    .enumerate()
    {
        let stderr = node.refused(
            &format!("beyond-{i}"),
            &[(key, value)],
            &format!("annotation {key} asks for {asked}, which the node's pier config"),
        );
        assert!(stderr.contains(&format!("{entry} {bound}")), "{key}={value}: {stderr}");
    }
}

/// Fifty echo containers on one node at once, each served through its own
/// socket, then all stopped and deleted. (Their memory and start time are
/// measured by `cargo bench --bench containerd`.)
#[test]
fn fifty_echo_containers_on_one_node() {
    const CONTAINERS: usize = 50;
    let node = Node::start();
    let echoes: Vec<Container<'_>> =
        (0..CONTAINERS).map(|i| node.start_echo(&format!("echo-{i:02}"))).collect();
    thread::scope(|scope| {
        for echo in &echoes {
            scope.spawn(move || {
                scenarios::echo_serves_concurrent_clients(echo, PORT, 1, |_| 256 << 10)
            });
        }
    });
    for echo in &echoes {
        echo.kill("SIGTERM");
    }
    for echo in &echoes {
        assert_eq!(echo.stopped_exit_code(), 143, "{}", echo.id);
        assert_eq!(echo.socket_files(), Vec::<PathBuf>::new(), "{}", echo.id);
    }
}

/// A Kubernetes Pod's sandbox, which the CRI starts through the Pod's
/// runtime before its containers, runs no component: it holds its place
/// until it is stopped, then exits 0 as `pause` does.
#[test]
fn a_pod_sandbox_holds_its_place_until_stopped() {
    let node = Node::start();
    let id = "sandbox";
    let annotations = [("io.kubernetes.cri.container-type", "sandbox")];
    let out = node.containerd.run(id, ECHO, &annotations, &[], true).unwrap();
    assert!(out.status.success(), "{}", node.log_of(&out));
    thread::sleep(Duration::from_millis(300));
    let task = node.containerd.task(id).unwrap();
    assert_eq!(task.map(|(status, _)| status).as_deref(), Some("RUNNING"));
    let sandbox = Container { node: &node, id: id.to_owned(), socket: node.socket(id) };
    sandbox.kill("SIGTERM");
    assert_eq!(sandbox.stopped_exit_code(), 0);
}

/// The CPU quota and period of a cgroup folder, as v1 or v2 writes them.
fn cpu_quota_and_period(cgroup: &Path) -> (String, String) {
    let read = |name: &str| std::fs::read_to_string(cgroup.join(name)).map(|s| s.trim().to_owned());
    if let (Ok(quota), Ok(period)) = (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")) {
        return (quota, period);
    }
    let max = read("cpu.max").unwrap_or_else(|e| panic!("{}: {e}", cgroup.display()));
    let (quota, period) = max.split_once(' ').unwrap();
    (quota.to_owned(), period.to_owned())
}

/// A container's CPU limit (`ctr run --cpus`, a Pod's
/// `resources.limits.cpu`) holds the component: the shim, whose threads
/// run it, is in the container's cgroup with that quota, and leaves it
/// (and removes it) when the container is deleted.
#[test]
fn a_containers_cpu_limit_holds_its_shim() {
    let node = Node::start();
    let id = "cpu-half";
    let out = node
        .containerd
        .run_with(
            id,
            ECHO,
            &[("pier.dev/listen", "1234")],
            &["--cpus", "0.5"],
            &["/echo.wasm", "--port", "1234"],
            true,
        )
        .unwrap();
    assert!(out.status.success(), "{}", node.log_of(&out));
    let (_, shim_pid) = node.containerd.task(id).unwrap().expect("the task is listed");
    let cgroup = pier_testkit::containerd::cpu_cgroup_of(shim_pid);
    assert!(cgroup.ends_with(format!("default/{id}")), "ctr's cgroup path: {}", cgroup.display());
    assert_eq!(cpu_quota_and_period(&cgroup), ("50000".into(), "100000".into()));
    let echo = Container { node: &node, id: id.to_owned(), socket: node.socket(id) };
    scenarios::echo_serves_concurrent_clients(&echo, PORT, 1, |_| MIB);
    echo.kill("SIGTERM");
    assert_eq!(echo.stopped_exit_code(), 143);
    assert!(!cgroup.exists(), "delete removes the container's cgroup");
}

/// Each component's sockets count against its container's limit: the
/// node's policy sets it, an annotation may lower it, and asking for more
/// fails the create naming both.
#[test]
fn a_containers_socket_limit_comes_from_the_node_and_only_lowers() {
    let node = Node::with_policy("[policy.default]\nsocket_limit = 32\n");
    let opened = |id: &str, annotations: &[(&str, &str)]| {
        let out = node
            .containerd
            .run(id, PROBE, annotations, &["/probe.wasm", "sockets"], false)
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = opened("sockets-node", &[]);
    assert!(stderr.contains("opened 32 sockets, then: vsock: new-socket-limit"), "{stderr}");
    let stderr = opened("sockets-lower", &[("pier.dev/socket-limit", "16")]);
    assert!(stderr.contains("opened 16 sockets, then: vsock: new-socket-limit"), "{stderr}");
    let stderr = node.refused(
        "sockets-higher",
        &[("pier.dev/socket-limit", "64")],
        "annotation pier.dev/socket-limit asks for 64 sockets",
    );
    assert!(stderr.contains("[policy.default] socket_limit = 32"), "{stderr}");
}

/// A container's folder mounts (a Pod's configMap and emptyDir volumes
/// reach containerd as bind mounts of host folders) are the component's
/// preopened folders at their container paths, read-only where the mount
/// is; the image's own files are its `/`, read-only, only when
/// `pier.dev/image-files` asks.
#[test]
fn a_component_reads_its_config_mount_and_writes_its_data_mount() {
    let node = Node::start();
    let config = node._dir.path().join("config");
    let data = node._dir.path().join("data");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(config.join("app.toml"), "answer = 42\n").unwrap();
    let config_mount = format!("type=bind,src={},dst=/config,options=rbind:ro", config.display());
    let data_mount = format!("type=bind,src={},dst=/data,options=rbind:rw", data.display());
    let copy = |id: &str, annotations: &[(&str, &str)], from: &str, to: &str| {
        let options = ["--mount", &config_mount, "--mount", &data_mount];
        let args = ["/probe.wasm", "copy-file", from, to];
        node.containerd.run_with(id, PROBE, annotations, &options, &args, false).unwrap()
    };

    let out = copy("files-1", &[], "/config/app.toml", "/data/app.toml");
    assert_eq!(out.status.code(), Some(0), "{}", node.log_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("copied 12 bytes"));
    assert_eq!(std::fs::read_to_string(data.join("app.toml")).unwrap(), "answer = 42\n");

    let out = copy("files-2", &[], "/config/app.toml", "/config/changed.toml");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a read-only mount is not written: {}",
        node.log_of(&out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("/config/changed.toml"));
    assert!(!config.join("changed.toml").exists());

    let out = copy("files-3", &[], "/probe.wasm", "/data/probe.wasm");
    assert_eq!(out.status.code(), Some(1), "no image files unless asked: {}", node.log_of(&out));
    let image_files = [("pier.dev/image-files", "read-only")];
    let out = copy("files-4", &image_files, "/probe.wasm", "/data/probe.wasm");
    assert_eq!(out.status.code(), Some(0), "{}", node.log_of(&out));
    assert_eq!(
        std::fs::read(data.join("probe.wasm")).unwrap(),
        std::fs::read(common::wasm("probe")).unwrap()
    );
    let out = copy("files-5", &image_files, "/config/app.toml", "/probe-copy.toml");
    assert_eq!(out.status.code(), Some(1), "the image is read-only: {}", node.log_of(&out));
}

/// An image pulled from a registry runs, as a node fetches one: `ctr
/// pull` with no platform (the host's, which is also what the kubelet's
/// pulls ask for) and with each wasm platform the image lists finds it,
/// the blobs come from the registry (nothing is imported first), and
/// `ctr run` of the pulled reference runs hello with its arguments.
#[test]
fn an_image_pulled_from_a_registry_runs_under_containerd() {
    let component = std::fs::read(common::wasm("hello")).expect("hello's component");
    let layout = pier_testkit::oci_image::image_layout(&component, "hello", "pier/hello:v1", &[])
        .unwrap_or_else(|e| panic!("{e}"));
    let manifest = format!("/manifests/{}", layout.manifest_digest);
    let registry = pier_testkit::registry::Registry::serve(vec![("pier/hello".into(), layout)])
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let containerd =
        Containerd::start(&dir.path().join("containerd"), shim()).unwrap_or_else(|e| panic!("{e}"));
    let reference = registry.reference("pier/hello", "v1");

    containerd.pull("default", &reference, &[]).unwrap_or_else(|e| panic!("{e}"));
    let requests = registry.requests();
    assert!(
        requests.iter().any(|r| r.starts_with("GET ") && r.contains(&manifest)),
        "the manifest came from the registry: {requests:?}"
    );
    for platform in [pier_testkit::oci_image::PLATFORM, "wasi/wasm"] {
        containerd
            .pull("default", &reference, &["--platform", platform])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    let args = ["/hello.wasm", "registry", "exit", "3"];
    let out = containerd.run("pulled-hello", &reference, &[], &args, false).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = || format!("stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{}\n{}", log(), containerd.log());
    assert!(stdout.contains("arg: registry"), "{}", log());
}
