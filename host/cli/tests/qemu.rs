//! The cross-check against the world's own vsock stack: pier's images
//! booted by QEMU's microvm, the vsock device served over vhost-user by
//! rust-vmm's vhost-device-vsock or by `pier vhost-user`, host programs on
//! the backend's Firecracker-style hybrid socket (`pier_testkit::qemu`, which
//! installs QEMU and vhost-device-vsock first when the machine lacks them;
//! a failed install fails the test, naming the command).
//!
//! Bulk data is checked one way at a time (host to guest into `probe
//! hash`, guest to host from `probe blurt`), not through an echo:
//! vhost-device-vsock 0.3.0 handles a host socket that is readable and
//! writable at once as readable only, and stops flushing what the guest
//! sent; with the guest waiting for credit, both sides then wait for
//! ever (`docs/benchmarks.md`, the QEMU cross-check). The echo through
//! pier's own device is `unikernel.rs`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::scenarios::{self, Target};
use common::{data, image};
use pier_client::HybridStream;
use pier_testkit::linux_vm::{Backend, BackendProcess, GuestSlot, collect_output};
use pier_testkit::pattern::WordChecksum;
use pier_testkit::qemu::{Console, QemuConfig, QemuVm};

const MIB: usize = 1 << 20;

/// One guest at a time: six QEMU processes and their backends at once
/// on a 2-core host starve each other into timeouts.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A QEMU guest whose console is collected for the test to read.
struct Guest {
    vm: QemuVm,
    console: Arc<Mutex<String>>,
    uds: PathBuf,
    _dir: tempfile::TempDir,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Guest {
    fn boot(app: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::boot_in(dir, app, args)
    }

    fn boot_in(dir: tempfile::TempDir, app: &str, args: &[&str]) -> Self {
        Self::boot_with(dir, app, args, |_| {})
    }

    fn boot_with(
        dir: tempfile::TempDir,
        app: &str,
        args: &[&str],
        configure: impl FnOnce(&mut QemuConfig),
    ) -> Self {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let uds = dir.path().join("vm.vsock");
        let mut config = QemuConfig::new(image(app), &uds);
        config.app_args = args.iter().map(|a| a.to_string()).collect();
        config.console = Console::Piped;
        configure(&mut config);
        let mut vm = QemuVm::start(&config).unwrap_or_else(|e| panic!("{e}"));
        // vhost-device-vsock 0.3.0 can stop serving the hybrid socket for
        // good when CONNECTs arrive before the guest's driver has set up
        // the queues (about 40 ms after start), so the tests let the guest
        // come up first.
        thread::sleep(Duration::from_millis(300));
        let console = collect_output(vm.console().expect("piped console"), false);
        Self { vm, console, uds, _dir: dir, _turn: turn }
    }

    /// A guest whose vsock device `pier vhost-user` serves.
    fn boot_on_pier(app: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::boot_with(dir, app, args, |c| c.backend = Some(pier_backend()))
    }

    /// The console so far (the serial port's `\r\n` as `\n`).
    fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    fn exit_code(&mut self) -> i32 {
        let code = self.vm.wait(Duration::from_secs(30));
        // Let the console reader catch the last lines.
        thread::sleep(Duration::from_millis(100));
        code.unwrap_or_else(|e| panic!("{e}\nconsole:\n{}", self.console()))
    }
}

impl Target for Guest {
    fn uds(&self) -> &Path {
        &self.uds
    }
    fn stderr(&self) -> String {
        format!("guest console:\n{}\nbackend:\n{}", self.console(), self.vm.backend_stderr())
    }
}

/// `pier vhost-user`, this build's.
fn pier_backend() -> Backend {
    Backend::Pier(PathBuf::from(env!("CARGO_BIN_EXE_pier")))
}

/// A hybrid-socket connection to the guest's `port`, retrying while the
/// guest is still starting.
fn connect(uds: &Path, port: u32) -> UnixStream {
    // The backend closes at once a CONNECT the guest cannot take yet, and
    // may do so before the line is even written; one that arrives before
    // the guest's driver is up may never be answered. So each attempt
    // waits a second at most, then tries again.
    let attempt = || HybridStream::connect_timeout(uds, port, Duration::from_secs(1));
    let conn = pier_client::retry(Duration::from_secs(30), attempt)
        .unwrap_or_else(|e| panic!("port {port} behind {} never answered: {e}", uds.display()));
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.into_inner()
}

#[test]
fn exit_codes_and_panics_come_through_qemu() {
    let mut guest = Guest::boot("hello", &["hi", "exit", "3"]);
    assert_eq!(guest.exit_code(), 3, "console:\n{}", guest.console());
    assert!(guest.console().contains("arg: hi\n"), "console:\n{}", guest.console());
    // QEMU's own words on the command line are not the app's arguments.
    assert!(!guest.console().contains("virtio_mmio"), "console:\n{}", guest.console());
    drop(guest);
    let mut guest = Guest::boot("hello", &["panic"]);
    assert_eq!(guest.exit_code(), 101, "console:\n{}", guest.console());
    assert!(guest.console().contains("hello was asked to panic"), "{}", guest.console());
}

/// 64 MiB from the host into the guest through vhost-device-vsock,
/// checked with the checksum the guest computes.
#[test]
fn sixty_four_mib_host_to_guest_arrive_intact() {
    let guest = Guest::boot("probe", &["hash", "7100"]);
    let mut conn = connect(&guest.uds, 7100);
    let total = 64 * MIB;
    conn.write_all(&(total as u64).to_le_bytes()).unwrap();
    let mut sent = WordChecksum::new();
    for i in 0..total / MIB {
        let chunk = data(i as u64 + 1, MIB);
        sent.update(&chunk);
        conn.write_all(&chunk).unwrap();
    }
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, format!("{total} {:016x}\n", sent.value()), "console:\n{}", guest.console());
}

/// 64 MiB from the guest to a host listener at `<uds>_5000`, the
/// connection the guest opens itself; every byte in order, then EOF.
///
/// vhost-device-vsock 0.3.0 now and then never serves a boot (the
/// guest's CONNECT goes unanswered and its driver gives up: "probe:
/// connection timed out"), so a guest that ends, or takes
/// [`GUEST_CONNECT_WAIT`], without connecting is reported on stderr with
/// its console and booted once more; a second such boot fails the test.
/// What the test checks, the bytes of a connection that was made, is
/// never retried.
#[test]
fn sixty_four_mib_guest_to_host_arrive_intact() {
    let total = 64 * MIB;
    let (mut guest, mut conn) = (1..=2)
        .find_map(|boot| {
            let dir = tempfile::tempdir().unwrap();
            let listen = pier_hybrid::listener_path(dir.path().join("vm.vsock"), 5000);
            let listener = UnixListener::bind(listen).unwrap();
            let args = ["blurt", "2", "5000", &total.to_string()];
            let mut guest = Guest::boot_in(dir, "probe", &args);
            let conn = accept_from_guest(&listener, &mut guest, boot)?;
            Some((guest, conn))
        })
        .expect("in two boots the guest never connected (consoles above)");
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    loop {
        let n = conn.read(&mut buf).unwrap_or_else(|e| panic!("after {got} bytes: {e}"));
        if n == 0 {
            break;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, ((got + k) % 251) as u8, "byte {}", got + k);
        }
        got += n;
    }
    assert_eq!(got, total, "console:\n{}", guest.console());
    assert_eq!(guest.exit_code(), 0, "console:\n{}", guest.console());
}

/// How long a guest may take to connect to the host: its boot on a busy
/// 2-core host, then its driver's own wait for the backend's answer.
const GUEST_CONNECT_WAIT: Duration = Duration::from_secs(60);

/// The connection `guest` makes to `listener`, or `None`, with why and
/// the guest's console on stderr, if the guest ends or takes
/// [`GUEST_CONNECT_WAIT`] without connecting.
fn accept_from_guest(listener: &UnixListener, guest: &mut Guest, boot: u32) -> Option<UnixStream> {
    let ended = || guest.vm.qemu().try_wait().is_ok_and(|status| status.is_some());
    match pier_testkit::qemu::accept_from_guest(listener, GUEST_CONNECT_WAIT, ended) {
        Ok(conn) => Some(conn),
        Err(e) => {
            // Let the console reader catch the last lines.
            thread::sleep(Duration::from_millis(100));
            eprintln!("boot {boot}: {e}\n{}", guest.stderr());
            None
        }
    }
}

/// A CONNECT to a port nobody listens on in the guest is refused at once.
#[test]
fn a_connect_to_a_dead_port_is_refused_within_500_ms() {
    let guest = Guest::boot("echo", &[]);
    drop(connect(&guest.uds, 1234));
    let asked = Instant::now();
    let answer = HybridStream::connect_timeout(&guest.uds, 4321, Duration::from_secs(5));
    let took = asked.elapsed();
    assert!(answer.is_err(), "a dead port answered OK");
    assert!(took < Duration::from_millis(500), "the refusal took {took:?}");
}

/// The socket types the device does not offer fail at once with
/// `Unsupported`: vhost-device-vsock offers no datagrams (and QEMU 7.2
/// would not pass them on) and 0.3.0 no seqpacket.
#[test]
fn socket_types_the_device_lacks_are_unsupported() {
    let mut guest = Guest::boot("probe", &["dgram-send", "2", "5000"]);
    assert_eq!(guest.exit_code(), 1, "console:\n{}", guest.console());
    assert!(
        guest.console().contains("probe: socket type not supported by the transport"),
        "console:\n{}",
        guest.console()
    );
    drop(guest);
    let mut guest = Guest::boot("probe", &["blurt-messages", "2", "5000", "10", "1"]);
    assert_eq!(guest.exit_code(), 1, "console:\n{}", guest.console());
    assert!(
        guest.console().contains("probe: socket type not supported by the transport"),
        "console:\n{}",
        guest.console()
    );
}

/// A host program's half-close: vhost-device-vsock forwards it as a full
/// shutdown (both flags), so the guest can no longer send after it; what
/// the echo had not sent back yet when it arrived is lost to the backend,
/// not to pier (`docs/vhost-user.md`). So the host half-closes only once
/// every byte has come back: then the guest must read the end, close in
/// order, and the host get EOF right after the whole echo, never a hang,
/// an error, or the guest reporting a failure.
#[test]
fn a_host_half_close_ends_cleanly_though_the_backend_shuts_both_ways() {
    let guest = Guest::boot("echo", &[]);
    let mut conn = connect(&guest.uds, 1234);
    // Small enough for the Unix socket to take at once: a larger write
    // races the echo coming back, which the backend does not survive
    // (see the module documentation).
    let sent = data(5, 32 * 1024);
    conn.write_all(&sent).unwrap();
    let mut back = vec![0; sent.len()];
    conn.read_exact(&mut back).expect("the whole echo before the half-close");
    assert!(back == sent, "the echo differs from what was sent");
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).expect("EOF, not a hang or an error");
    assert!(rest.is_empty(), "{} bytes after the whole echo", rest.len());
    assert!(
        !guest.console().contains("echo: connection"),
        "the guest reported a failure:\n{}",
        guest.console()
    );
}

/// With QEMU told not to name its devices on the command line, the guest
/// finds the vsock device by scanning microvm's virtio-mmio window, and
/// serves on it.
#[test]
fn the_device_is_found_by_scanning_when_qemu_names_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut guest =
        Guest::boot_with(dir, "hello", &["devices", "exit", "0"], |c| c.name_devices = false);
    assert_eq!(guest.exit_code(), 0, "console:\n{}", guest.console());
    assert!(
        guest.console().contains("virtio-mmio at 0xfeb00e00 irq 12: version 2, device 19"),
        "console:\n{}",
        guest.console()
    );
    drop(guest);
    let dir = tempfile::tempdir().unwrap();
    let guest = Guest::boot_with(dir, "probe", &["hash", "7100"], |c| c.name_devices = false);
    let mut conn = connect(&guest.uds, 7100);
    conn.write_all(&3u64.to_le_bytes()).unwrap();
    conn.write_all(b"abc").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert_eq!(
        answer,
        format!("3 {:016x}\n", WordChecksum::of(b"abc")),
        "console:\n{}",
        guest.console()
    );
}

/// The same image under QEMU with `pier vhost-user` as the backend: 64 MiB
/// through the echo both ways at once, then a half-close that must bring
/// back every byte and then EOF (vhost-device-vsock 0.3.0 can do neither:
/// see the module documentation).
#[test]
fn pier_vhost_user_echoes_64_mib_with_half_close() {
    let guest = Guest::boot_on_pier("echo", &[]);
    drop(connect(&guest.uds, 1234));
    scenarios::echo_64_mib_with_half_close(&guest, 1234);
    assert!(
        guest.stderr().contains("features negotiated"),
        "pier logs what QEMU negotiated:\n{}",
        guest.stderr()
    );
}

/// QEMU passes the SEQPACKET bit on when the backend offers it, so under
/// `pier vhost-user` the guest has seqpacket sockets: boundaries and
/// end-of-record marks survive, as under `pier boot`.
#[test]
fn pier_vhost_user_carries_seqpacket() {
    let guest = Guest::boot_on_pier("msg-echo", &[]);
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&guest, 1235);
}

/// QEMU 7.2 never passes the DGRAM bit to a vhost-user vsock guest, even
/// from a backend that offers it: the guest's datagram sockets fail with
/// `Unsupported`, and pier logs that datagrams were not negotiated.
#[test]
fn under_qemu_datagrams_stay_off_even_on_pier() {
    let mut guest = Guest::boot_on_pier("probe", &["dgram-send", "2", "5000"]);
    assert_eq!(guest.exit_code(), 1, "{}", guest.stderr());
    assert!(
        guest.console().contains("probe: socket type not supported by the transport"),
        "{}",
        guest.stderr()
    );
    assert!(guest.stderr().contains("datagram=false"), "{}", guest.stderr());
}

/// One `pier vhost-user` outlives the QEMUs it serves: when one goes away
/// (here killed, as a crashed or stopped VM), the host program's
/// connection to its guest ends instead of hanging, and the next QEMU on
/// the same socket is served at once. (QEMU 7.2's vhost-user-vsock cannot
/// reconnect to a restarted backend; `docs/vhost-user.md`.)
#[test]
fn pier_vhost_user_serves_the_next_qemu_after_one_leaves() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let slot = GuestSlot {
        cid: 3,
        vhost_socket: pier_testkit::qemu::vhost_socket(&uds),
        uds: uds.clone(),
    };
    let backend = BackendProcess::start(&pier_backend(), &[slot]).unwrap_or_else(|e| panic!("{e}"));
    let backend_log = || backend.stderr();
    for round in 1..=2 {
        let mut config = QemuConfig::new(image("echo"), &uds);
        config.backend = None;
        config.console = Console::Piped;
        let vm = QemuVm::start(&config).unwrap_or_else(|e| panic!("{e}"));
        let mut conn = connect(&uds, 1234);
        let sent = data(round, 100_000);
        conn.write_all(&sent).unwrap();
        let mut back = vec![0u8; sent.len()];
        conn.read_exact(&mut back)
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", backend_log()));
        assert!(back == sent, "round {round}: the echo is what was sent");
        drop(vm);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = [0u8; 16];
        match conn.read(&mut rest) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!(
                "round {round}: the connection outlived its VM: {other:?}\n{}",
                backend_log()
            ),
        }
    }
    let log = backend_log();
    assert_eq!(log.matches("frontend connected").count(), 2, "{log}");
}
