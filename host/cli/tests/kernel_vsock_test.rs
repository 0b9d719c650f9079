//! Linux's own vsock test suite (`tools/testing/vsock/vsock_test`, built
//! from Debian's source of the guest kernel's exact version) between two
//! Debian guests, CIDs 3 and 4, siblings on one vhost-user backend: one
//! guest runs `--mode=server`, the other `--mode=client`, then the roles
//! swap. Each case runs in a `vsock_test` process of its own on its own
//! vsock ports (`pier_testkit::kernel_vsock_test` builds the guests and
//! says how), so a failing case is reported by name and the others still
//! run.
//!
//! The test prints a table of every case in both directions and fails
//! naming the cases that failed. [`INAPPLICABLE`] lists the cases that
//! cannot apply to a vhost-user device, with why: they still run and are
//! reported, but do not fail the test. [`GUEST_RACES`] lists failures
//! that are races inside the guests, by the words the tool prints: such
//! a case alone runs again on fresh guests, and must pass there.
//!
//! pier's runs are part of the suite, with two kernels: the newest Debian
//! offers this machine and the host release's own. The same runs against
//! rust-vmm's vhost-device-vsock are `#[ignore]`d, since 0.3.0 fails some
//! cases (docs/linux-behaviours.md has the tables): `cargo test --release
//! -p pier-cli --test kernel_vsock_test -- --ignored --nocapture`
//! (docs/testing.md).
//!
//! The guests boot under TCG (see `pier_testkit::linux_vm`); QEMU, GCC and
//! the Debian packages are installed or downloaded when missing, and a
//! missing piece fails the test, naming what to do.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use pier_testkit::kernel_vsock_test::{
    self as kvt, CASE_MARKER, DONE, GuestRole, Kernel, KernelTestGuest, RUNNING,
};
use pier_testkit::linux_vm::{Backend, BackendProcess, GuestSlot, LinuxVm, LinuxVmConfig};

/// Cases that cannot apply to a vhost-user device: `(case name, why)`.
/// Every case of Linux 7.3's and 6.1's suites applies, so the list is
/// empty; a case added here is still run and reported.
const INAPPLICABLE: &[(&str, &str)] = &[];

/// Failures that are races inside the guests, not in the device:
/// `(case name, what the failing side printed, why)`. A case that fails
/// with exactly that output is run once more on fresh guests, and the
/// test fails only if it fails again; any other failure fails at once.
const GUEST_RACES: &[(&str, &str, &str)] = &[(
    "SOCK_STREAM double bind connect",
    "bind: Address already in use",
    "the client closes its socket and binds the same port again as soon as the server's \
     \"LISTENING\" arrives over TCP; the port is free only once the server's RST has come back \
     and the client guest's vsock rx worker has taken it, and the guest may run its TCP receive \
     first",
)];

/// How long a guest may take to boot: seconds on an idle machine, but
/// TCG on a 2-core host that is also compiling takes many times that.
const BOOT: Duration = Duration::from_secs(240);
/// How long both guests may take to run every case in both roles: about
/// 75 s for Linux 7.3's 41 cases on an idle 2-core machine, several times
/// that on a busy one.
const RUN: Duration = Duration::from_secs(20 * 60);

/// One run at a time: two runs at once would put four TCG guests on the
/// machine's cores, and every case's timeouts with them.
static ONE_RUN: Mutex<()> = Mutex::new(());

/// Which guests serve and which connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Direction {
    /// CID 3 runs the server, CID 4 the client.
    ServerOn3,
    /// CID 4 runs the server, CID 3 the client.
    ServerOn4,
}

/// One case in one direction: both sides' exit status and output.
#[derive(Debug, Default, Clone)]
struct Outcome {
    server: Option<(i32, String)>,
    client: Option<(i32, String)>,
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!((&self.server, &self.client), (Some((0, _)), Some((0, _))))
    }

    fn word(&self) -> &'static str {
        match (&self.server, &self.client) {
            _ if self.passed() => "pass",
            (None, _) | (_, None) => "not run",
            _ => "FAIL",
        }
    }
}

/// Each guest's console into `(role, case id) -> (exit status, output)`:
/// a case's output is the console text since the previous marker.
fn parse_console(console: &str) -> BTreeMap<(String, u32), (i32, String)> {
    let mut results = BTreeMap::new();
    let mut output = String::new();
    for line in console.lines() {
        let Some(rest) = line.strip_prefix(CASE_MARKER) else {
            output.push_str(line);
            output.push('\n');
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if let [role, id, rc] = words[..]
            && let (Ok(id), Some(Ok(rc))) = (id.parse(), rc.strip_prefix("rc=").map(str::parse))
        {
            results.insert((role.to_owned(), id), (rc, std::mem::take(&mut output)));
        }
    }
    results
}

/// Whether something on this host listens on TCP `127.0.0.1:port`
/// (`/proc/net/tcp`), without connecting to it: QEMU's `-netdev socket`
/// listener would take a probe's connection for its peer.
fn listening(port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|table| {
        table.lines().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
        })
    })
}

/// A TCP port on 127.0.0.1 that nothing uses right now.
fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    probe.local_addr().expect("a bound address").port()
}

/// Everything one run found.
struct Report {
    backend: &'static str,
    guest: KernelTestGuest,
    cases: Vec<(u32, String)>,
    outcomes: BTreeMap<(u32, Direction), Outcome>,
    took: Duration,
    /// Cases whose outcomes are from a second run on fresh guests, after
    /// a known race inside the guests failed them in the first.
    rerun: Vec<u32>,
}

impl Report {
    fn table(&self) -> String {
        let mut text = format!(
            "vsock_test of Linux {} ({}) through {}, {:.0} s:\n\
             {:>3}  {:<58} {:<10} {:<10}\n",
            self.guest.guest.kernel_release,
            self.guest.debian_version,
            self.backend,
            self.took.as_secs_f64(),
            "id",
            "case",
            "server 3",
            "server 4",
        );
        for (id, name) in &self.cases {
            let word = |d| self.outcomes.get(&(*id, d)).map_or("not run", Outcome::word);
            let _ = writeln!(
                text,
                "{id:>3}  {name:<58} {:<10} {:<10}{}",
                word(Direction::ServerOn3),
                word(Direction::ServerOn4),
                inapplicable(name).map(|why| format!(" (inapplicable: {why})")).unwrap_or_default()
                    + if self.rerun.contains(id) {
                        " (run again: a race in the guests)"
                    } else {
                        ""
                    }
            );
        }
        text
    }

    /// The failing cases that are not inapplicable, each with both sides'
    /// output.
    fn failures(&self) -> Vec<String> {
        self.failures_where(|_, _| true)
    }

    /// The failing cases that are neither inapplicable nor a known race
    /// inside the guests ([`GUEST_RACES`]).
    fn failures_beyond_guest_races(&self) -> Vec<String> {
        self.failures_where(|name, outcome| guest_race(name, outcome).is_none())
    }

    /// The cases that failed with a known race inside the guests, in
    /// either direction, each with the race's explanation.
    fn guest_races(&self) -> Vec<(u32, &'static str)> {
        self.cases
            .iter()
            .filter_map(|(id, name)| {
                [Direction::ServerOn3, Direction::ServerOn4]
                    .into_iter()
                    .find_map(|d| guest_race(name, self.outcomes.get(&(*id, d))?))
                    .map(|why| (*id, why))
            })
            .collect()
    }

    fn failures_where(&self, counts: impl Fn(&str, &Outcome) -> bool) -> Vec<String> {
        let mut failures = Vec::new();
        for (id, name) in &self.cases {
            for direction in [Direction::ServerOn3, Direction::ServerOn4] {
                let outcome = self.outcomes.get(&(*id, direction)).cloned().unwrap_or_default();
                if outcome.passed() || inapplicable(name).is_some() || !counts(name, &outcome) {
                    continue;
                }
                let side = |s: &Option<(i32, String)>| match s {
                    Some((rc, out)) => format!("exit status {rc}:\n{}", out.trim_end()),
                    None => "did not run".to_owned(),
                };
                failures.push(format!(
                    "case {id} ({name}), {direction:?}:\n  server: {}\n  client: {}",
                    side(&outcome.server),
                    side(&outcome.client)
                ));
            }
        }
        failures
    }
}

fn inapplicable(name: &str) -> Option<&'static str> {
    INAPPLICABLE.iter().find(|(case, _)| *case == name).map(|(_, why)| *why)
}

/// Why `outcome`, a failure of case `name`, is a known race inside the
/// guests, if it is one: a side failed printing the race's words (the
/// other side then fails too, with its peer gone).
fn guest_race(name: &str, outcome: &Outcome) -> Option<&'static str> {
    if outcome.passed() {
        return None;
    }
    let (_, words, why) = GUEST_RACES.iter().find(|(case, _, _)| *case == name)?;
    let printed = |side: &Option<(i32, String)>| {
        side.as_ref().is_some_and(|(rc, out)| *rc != 0 && out.contains(words))
    };
    (printed(&outcome.server) || printed(&outcome.client)).then_some(*why)
}

/// Boots the two guests for `kernel` on `backend`, waits for both to run
/// every case (or only the ids in `only`) in both roles, and collects the
/// outcomes.
fn run_suite(backend: &Backend, kernel: Kernel, only: &[u32]) -> Report {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let guest = kvt::build(kernel, pier_testkit::Output::OnFailure).unwrap_or_else(|e| {
        panic!("building the {} kernel's vsock_test guest: {e}", kernel.name())
    });
    let mut cases = guest.cases().unwrap_or_else(|e| panic!("{e}"));
    let count = u32::try_from(cases.len()).expect("fewer than 2^32 cases");
    if !only.is_empty() {
        cases.retain(|(id, _)| only.contains(id));
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let slots = [GuestSlot::in_dir(dir.path(), 3), GuestSlot::in_dir(dir.path(), 4)];
    let process = BackendProcess::start(backend, &slots).unwrap_or_else(|e| panic!("{e}"));
    let link = free_port();
    let roles = [
        GuestRole {
            ip: "fe80::a",
            peer_ip: "fe80::b",
            peer_cid: 4,
            server_first: true,
            cases: count,
            only: only.to_vec(),
        },
        GuestRole {
            ip: "fe80::b",
            peer_ip: "fe80::a",
            peer_cid: 3,
            server_first: false,
            cases: count,
            only: only.to_vec(),
        },
    ];
    let mut vms: Vec<LinuxVm> = Vec::new();
    for ((slot, role), end) in slots.iter().zip(&roles).zip(["listen", "connect"]) {
        let mut config = LinuxVmConfig::new(&guest.guest, &slot.vhost_socket);
        config.append.push(' ');
        config.append.push_str(&role.kernel_args());
        config.extra_args = vec![
            "-netdev".into(),
            format!("socket,id=n0,{end}=127.0.0.1:{link}"),
            "-device".into(),
            format!("virtio-net-device,netdev=n0,mac=52:54:00:00:00:{:02x}", slot.cid),
        ];
        vms.push(LinuxVm::start(&config).unwrap_or_else(|e| panic!("{e}")));
        if end == "listen" {
            // The connecting QEMU gives up at once if nothing listens yet.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !listening(link) {
                assert!(
                    Instant::now() < deadline,
                    "QEMU did not listen on 127.0.0.1:{link} for its private link within 60 s; \
                     its stderr:\n{}",
                    vms[0].qemu_stderr()
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut waited = Vec::new();
    for (vm, slot) in vms.iter_mut().zip(&slots) {
        let booted = vm.wait_for(RUNNING, BOOT);
        waited.push(booted.map_err(|e| format!("guest {} did not boot: {e}", slot.cid)));
    }
    let running = Instant::now();
    for (vm, slot) in vms.iter_mut().zip(&slots) {
        let budget = RUN.saturating_sub(running.elapsed());
        waited.push(vm.wait_for(DONE, budget).map_err(|e| format!("guest {}: {e}", slot.cid)));
    }
    let took = started.elapsed();
    if let Some(Err(e)) = waited.iter().find(|w| w.is_err()) {
        panic!("{e}\nbackend: {}\nbackend stderr:\n{}", process.command_line(), process.stderr());
    }
    let consoles: Vec<_> = vms.iter().map(|vm| parse_console(&vm.console())).collect();
    let mut outcomes = BTreeMap::new();
    for (id, _) in &cases {
        for (direction, server, client) in
            [(Direction::ServerOn3, 0, 1), (Direction::ServerOn4, 1, 0)]
        {
            outcomes.insert(
                (*id, direction),
                Outcome {
                    server: consoles[server].get(&("server".to_owned(), *id)).cloned(),
                    client: consoles[client].get(&("client".to_owned(), *id)).cloned(),
                },
            );
        }
    }
    Report { backend: backend.name(), guest, cases, outcomes, took, rerun: Vec::new() }
}

/// Runs the whole suite and checks it; a case that failed only by a
/// known race inside the guests ([`GUEST_RACES`]) is run once more, on
/// fresh guests, and must pass then.
fn run_and_check(backend: &Backend, kernel: Kernel) {
    let report = run_suite(backend, kernel, &[]);
    let races = report.guest_races();
    if races.is_empty() || !report.failures_beyond_guest_races().is_empty() {
        return check(&report, kernel);
    }
    let raced: Vec<u32> = races.iter().map(|(id, _)| *id).collect();
    let whys: Vec<String> = races.iter().map(|(id, why)| format!("case {id}: {why}")).collect();
    eprintln!(
        "{}\ncases {raced:?} failed by a known race inside the guests ({}); running them again \
         on fresh guests:\n{}",
        report.table(),
        whys.join("; "),
        report.failures().join("\n\n")
    );
    let rerun = run_suite(backend, kernel, &raced);
    let mut merged = report;
    merged.outcomes.extend(rerun.outcomes);
    merged.took += rerun.took;
    merged.rerun = raced;
    check(&merged, kernel);
}

/// Prints the table (and keeps it under the target folder, for the docs)
/// and fails naming every failing case.
fn check(report: &Report, kernel: Kernel) {
    let table = report.table();
    eprintln!("{table}");
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "kernel-vsock-test-{}-{}.txt",
        report.backend.replace(' ', "-"),
        kernel.name()
    ));
    let _ = std::fs::write(&file, &table);
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} of vsock_test's cases failed through {}:\n{}\n\n{table}",
        failures.len(),
        report.backend,
        failures.join("\n\n")
    );
}

fn pier() -> Backend {
    Backend::Pier(PathBuf::from(env!("CARGO_BIN_EXE_pier")))
}

#[test]
fn newest_kernel_vsock_test_passes_every_case_in_both_roles_through_pier_vhost_user() {
    run_and_check(&pier(), Kernel::Newest);
}

#[test]
fn host_release_kernel_vsock_test_passes_every_case_in_both_roles_through_pier_vhost_user() {
    run_and_check(&pier(), Kernel::HostRelease);
}

#[test]
#[ignore = "the reference backend, for docs/linux-behaviours.md's table: see docs/testing.md"]
fn newest_kernel_vsock_test_through_vhost_device_vsock() {
    run_and_check(&Backend::VhostDeviceVsock, Kernel::Newest);
}

#[test]
#[ignore = "the reference backend, for docs/linux-behaviours.md's table: see docs/testing.md"]
fn host_release_kernel_vsock_test_through_vhost_device_vsock() {
    run_and_check(&Backend::VhostDeviceVsock, Kernel::HostRelease);
}

#[test]
fn only_the_double_bind_port_race_is_taken_for_a_guest_race() {
    let failed = |out: &str| Some((1, out.to_owned()));
    let raced = Outcome {
        server: failed("accept: timeout\n"),
        client: failed("21 - SOCK_STREAM double bind connect...bind: Address already in use\n"),
    };
    assert!(guest_race("SOCK_STREAM double bind connect", &raced).is_some());
    assert!(guest_race("SOCK_STREAM bind only", &raced).is_none(), "another case's failure");
    let other = Outcome {
        server: Some((0, String::new())),
        client: failed("21 - SOCK_STREAM double bind connect...connect: Connection reset\n"),
    };
    assert!(guest_race("SOCK_STREAM double bind connect", &other).is_none(), "other words");
    let passed = Outcome { server: Some((0, String::new())), client: Some((0, String::new())) };
    assert!(guest_race("SOCK_STREAM double bind connect", &passed).is_none());
}

#[test]
fn a_console_splits_into_cases_with_their_exit_status_and_output() {
    let console = "boot noise\n0 - SOCK_STREAM connection reset...ok\n\
                   vsock_test-case: server 0 rc=0\n\
                   1 - SOCK_STREAM bind only...recv: Connection reset\n\
                   vsock_test-case: server 1 rc=1\n";
    let cases = parse_console(console);
    assert_eq!(cases.len(), 2);
    let (rc, out) = &cases[&("server".to_owned(), 0)];
    assert_eq!((*rc, out.as_str()), (0, "boot noise\n0 - SOCK_STREAM connection reset...ok\n"));
    let (rc, out) = &cases[&("server".to_owned(), 1)];
    assert_eq!((*rc, out.as_str()), (1, "1 - SOCK_STREAM bind only...recv: Connection reset\n"));
}
