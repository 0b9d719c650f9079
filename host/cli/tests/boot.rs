//! `pier boot`: the hello app's unikernel image booted by the CLI, on KVM
//! (where `/dev/kvm` is missing or not permitted these fail, naming it).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn hello_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        pier_testkit::build_guest_image(
            "hello",
            &pier_testkit::cache_dir("guest-image-target"),
            pier_testkit::Output::OnFailure,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn pier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pier"))
}

/// Boots hello with `args` on a socket in a folder of its own and waits
/// for it to exit.
fn boot_hello_to_exit(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    pier()
        .arg("boot")
        .arg(hello_image())
        .arg("--uds")
        .arg(dir.path().join("vm.vsock"))
        .arg("--")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_guest_console_is_stdout_and_its_exit_code_is_piers() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let out = pier()
        .arg("boot")
        .arg(hello_image())
        .arg("--uds")
        .arg(&uds)
        .args(["--", "hi", "exit", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("hello from pier-rt"), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("arg: hi"), "stdout:\n{stdout}");
    assert!(stderr.contains(&format!("hybrid vsock socket {}", uds.display())), "{stderr}");
    assert!(!uds.exists(), "{} left behind", uds.display());
}

/// The boot turns the YMM state on where the CPU has AVX, so the guest's
/// stack can copy with the vector loop and chooses as a host process on
/// the same CPU does (pier-vmm gives the guest the host's CPUID). Without
/// that step the guest could not run the loop and would take `memcpy`
/// (a string move on the bare-metal target) on every CPU.
#[test]
fn the_guest_can_copy_with_the_vector_loop_and_chooses_as_the_host_does() {
    let out = boot_hello_to_exit(&["copy"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let host_vector = pier_stack::copy::vector_copy_available();
    let yes_no = if host_vector { "yes" } else { "no" };
    assert!(stdout.contains(&format!("vector copy: {yes_no}\r\n")), "stdout:\n{stdout}");
    let strategy = pier_stack::copy::copy_strategy();
    assert!(stdout.contains(&format!("copy strategy: {strategy:?}\r\n")), "stdout:\n{stdout}");
}

/// An `ExitCode` returned from the app's `main` leaves the VM as the code
/// `pier_rt::process::exit` would give.
#[test]
fn a_code_the_apps_main_returns_is_pier_boots_exit_code() {
    let out = boot_hello_to_exit(&["return", "42"]);
    assert_eq!(out.status.code(), Some(42), "{out:?}");
}

#[test]
fn sigterm_stops_the_vm_and_removes_the_socket_files() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let mut child = pier()
        .arg("boot")
        .arg(hello_image())
        .arg("--uds")
        .arg(&uds)
        .args(["--", "spin"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("spinning") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "pier ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(uds.exists(), "no socket at {} while the VM runs", uds.display());
    let asked = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc_kill(child.id() as i32, 15) }, 0);
    let status = child.wait().unwrap();
    assert!(asked.elapsed() < Duration::from_secs(2), "took {:?}", asked.elapsed());
    assert_eq!(status.code(), Some(128 + 15));
    assert!(!uds.exists(), "{} left behind", uds.display());
}

#[test]
fn bad_images_and_sizes_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a kernel\n").unwrap();
    let out = pier().arg("boot").arg(&text).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not an ELF file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = pier().arg("boot").arg(hello_image()).args(["--mem", "lots"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--mem \"lots\""), "{stderr}");
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}
