//! Booting real images in KVM: the hello app built for bare metal through
//! pier-testkit (as `cargo xtask image` builds it), and the errors
//! for images and hosts that cannot work.
//!
//! Tests that need KVM fail, naming `/dev/kvm`, where it is missing or not
//! permitted: they never skip.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pier_vmm::{CrashKind, DeviceSpec, Error, Exit, GuestCid, Image, PreparedVm, Vm, VmConfig};

/// The hello image, built once per test process.
fn hello_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let target = pier_testkit::cache_dir("guest-image-target");
        pier_testkit::build_guest_image("hello", &target, pier_testkit::Output::OnFailure)
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A serial sink the test can read afterwards.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).replace("\r\n", "\n")
    }
}

/// Boots `image` with the given arguments on a thread, and fails the test
/// if the guest neither exits nor crashes within 30 s (a hang is a bug in
/// itself; the VM is stopped first). Returns the result and the console
/// text.
fn boot(image: &Path, boot_args: &[&str], app_args: &[&str]) -> (Result<u32, Error>, String) {
    boot_with(image, boot_args, app_args, None)
}

fn boot_with(
    image: &Path,
    boot_args: &[&str],
    app_args: &[&str],
    vsock: Option<DeviceSpec>,
) -> (Result<u32, Error>, String) {
    let console = Capture::default();
    let config = VmConfig {
        boot_args: boot_args.iter().map(|s| s.to_string()).collect(),
        app_args: app_args.iter().map(|s| s.to_string()).collect(),
        serial: Box::new(console.clone()),
        vsock,
        ..VmConfig::default()
    };
    let mut vm = match Vm::new(image, config) {
        Ok(vm) => vm,
        Err(e @ Error::KvmOpen { .. }) => panic!("{e}"),
        Err(e) => return (Err(e), console.text()),
    };
    let stop = vm.stop_handle();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = vm.run();
        // Dropped before the result goes back, so the device (and its
        // socket files) is gone when the test looks.
        drop(vm);
        let _ = tx.send(result);
    });
    let result = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(result) => result,
        Err(_) => {
            stop.stop();
            panic!("the guest hung; console so far:\n{}", console.text())
        }
    };
    let result = result.map(|exit| match exit {
        Exit::Code(code) => code,
        Exit::Stopped => panic!("stopped, but nobody asked"),
    });
    (result, console.text())
}

#[test]
fn hello_boots_runs_in_ring_3_and_exits_with_its_code() {
    let (result, console) = boot(hello_image(), &[], &["one", "two", "exit", "42"]);
    let code = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(code, 42, "console:\n{console}");
    assert!(console.contains("hello from pier-rt\n"), "console:\n{console}");
    assert!(console.contains("privilege level: 3\n"), "console:\n{console}");
    assert!(console.contains("arg: one\narg: two\n"), "console:\n{console}");
}

#[test]
fn the_guest_finds_the_vsock_device_and_the_bridge_cleans_up() {
    let dir = tempdir();
    let uds = dir.join("vm.vsock");
    let setup = DeviceSpec::new(GuestCid::DEFAULT, &uds);
    let (result, console) = boot_with(hello_image(), &[], &["devices"], Some(setup));
    let code = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(code, 0, "console:\n{console}");
    assert!(
        console.contains("virtio-mmio at 0xd0000000 irq 5: version 2, device 19\n"),
        "console:\n{console}"
    );
    assert!(!uds.exists(), "the bridge left {} behind", uds.display());

    // Without a device the slot is still named, but nothing answers there.
    let (result, console) = boot(hello_image(), &[], &["devices"]);
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}")), 0);
    assert!(!console.contains("virtio-mmio at"), "console:\n{console}");
}

#[test]
fn the_app_has_a_heap_and_running_out_is_a_panic() {
    let (result, console) = boot(hello_image(), &[], &["alloc", "16"]);
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}")), 0, "{console}");
    // 16 MiB of the bytes 0, 1, ..., 255, 0, 1, ...
    let sum = (16u64 << 20) / 256 * (255 * 256 / 2);
    assert!(console.contains(&format!("allocated 16 MiB, sum {sum}\n")), "console:\n{console}");

    // The default VM has 128 MiB.
    let (result, console) = boot(hello_image(), &[], &["alloc", "200"]);
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}")), 101, "{console}");
    assert!(console.contains("memory allocation of 209715200 bytes failed"), "console:\n{console}");
}

/// A VM of hello spinning forever, and its console.
fn spinning_guest() -> (Vm, Capture) {
    let console = Capture::default();
    let config = VmConfig {
        app_args: vec!["spin".into()],
        serial: Box::new(console.clone()),
        ..VmConfig::default()
    };
    (Vm::new(hello_image(), config).unwrap_or_else(|e| panic!("{e}")), console)
}

/// Waits until the spinning guest says it is in its loop.
fn wait_for_the_spin(console: &Capture) {
    let started = std::time::Instant::now();
    while !console.text().contains("spinning") {
        assert!(started.elapsed() < Duration::from_secs(10), "console:\n{}", console.text());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_spinning_guest_is_stopped_from_another_thread() {
    let (mut vm, console) = spinning_guest();
    let stop = vm.stop_handle();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(vm.run());
    });
    wait_for_the_spin(&console);
    let asked = std::time::Instant::now();
    stop.stop();
    let result = rx.recv_timeout(Duration::from_secs(5)).expect("run returned after stop");
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}")), Exit::Stopped);
    assert!(asked.elapsed() < Duration::from_secs(1), "stopping took {:?}", asked.elapsed());
}

#[test]
fn a_prebooted_guest_finds_its_device_before_the_host_side_exists() {
    let dir = tempdir();
    let uds = dir.join("vm.vsock");
    let spec = DeviceSpec::new(GuestCid::DEFAULT, &uds);
    let console = Capture::default();
    let config = VmConfig {
        app_args: vec!["devices".into()],
        serial: Box::new(console.clone()),
        vsock: Some(spec.clone()),
        ..VmConfig::default()
    };
    let prepared =
        PreparedVm::new(config.mem_size, Path::new("/dev/kvm")).unwrap_or_else(|e| panic!("{e}"));
    let image = Image::read(hello_image()).unwrap();
    let mut vm = prepared.preboot(&image, config).unwrap_or_else(|e| panic!("{e}"));
    let ran = vm.run_until_paused();
    let text = console.text();
    assert_eq!(ran.unwrap_or_else(|e| panic!("{e}\n{text}")), Some(Exit::Code(0)), "{text}");
    assert!(text.contains("virtio-mmio at 0xd0000000 irq 5: version 2, device 19\n"), "{text}");
    assert!(!uds.exists(), "{} bound before the device started", uds.display());

    let other = DeviceSpec::new(GuestCid::new(7).unwrap(), &uds);
    let refused = vm.start_device(&other).expect_err("a device shown as CID 3 started as 7");
    assert!(refused.to_string().contains("CID 7"), "{refused}");
    assert!(!uds.exists());
    vm.start_device(&spec).unwrap_or_else(|e| panic!("{e}"));
    assert!(uds.exists(), "the device's start did not bind {}", uds.display());
    drop(vm);
    assert!(!uds.exists(), "the bridge left {} behind", uds.display());
}

#[test]
fn a_paused_guest_runs_on_until_it_is_stopped() {
    let (mut vm, console) = spinning_guest();
    let pause = vm.pause_handle();
    let stop = vm.stop_handle();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(vm.run_until_paused().map_err(|e| e.to_string()));
        // On the same thread, as a pool's worker runs it on.
        let _ = tx.send(vm.run().map(Some).map_err(|e| e.to_string()));
    });
    wait_for_the_spin(&console);
    pause.pause();
    let paused = rx.recv_timeout(Duration::from_secs(5)).expect("the run returned on pause");
    assert_eq!(paused, Ok(None), "a pause is not an end");
    stop.stop();
    let stopped = rx.recv_timeout(Duration::from_secs(5)).expect("the run returned on stop");
    assert_eq!(stopped, Ok(Some(Exit::Stopped)));
}

#[test]
fn the_guest_clock_runs_at_the_rate_the_vmm_passed() {
    let started = std::time::Instant::now();
    let (result, console) = boot(hello_image(), &[], &["wait", "300"]);
    let wall = started.elapsed();
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}")), 0, "{console}");
    assert!(console.contains("waited 300 ms\n"), "console:\n{console}");
    // The guest's 300 ms must be about 300 ms of the host's; booting adds
    // a little.
    assert!(wall >= Duration::from_millis(290), "the guest waited only {wall:?}");
    assert!(wall < Duration::from_millis(1500), "the guest waited {wall:?}");
}

#[test]
fn a_cpu_exception_is_reported_by_the_guest_with_a_signal_like_code() {
    let (result, console) = boot(hello_image(), &[], &["fault"]);
    let code = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    // A page fault, reported as a shell reports SIGSEGV.
    assert_eq!(code, 139, "console:\n{console}");
    assert!(
        console.contains("pier-rt: CPU exception 14 (page fault (#PF)) in ring 3 at rip="),
        "console:\n{console}"
    );
    assert!(console.contains("cr2=0xfffffffffffffff0"), "console:\n{console}");
}

#[test]
fn a_guest_panic_prints_its_message_and_exits_101() {
    let (result, console) = boot(hello_image(), &[], &["panic"]);
    let code = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(code, 101, "console:\n{console}");
    assert!(console.contains("hello was asked to panic"), "console:\n{console}");
    assert!(console.contains("panicked at "), "console:\n{console}");
}

#[test]
fn a_triple_fault_is_reported_with_the_registers() {
    let (result, console) = boot(hello_image(), &["pier.test=triple-fault"], &[]);
    let crash = match result {
        Err(Error::Crash(crash)) => crash,
        other => panic!("expected a crash, got {other:?}\nconsole:\n{console}"),
    };
    let message = crash.to_string();
    eprintln!("reported: {message}");
    assert_eq!(crash.kind, CrashKind::Shutdown, "{message}");
    let regs = crash.regs.unwrap_or_else(|| panic!("no registers: {message}"));
    // The app faults on purpose in ring 3; the exception handler, told to
    // for this test, escalates in ring 0.
    assert_eq!(regs.cs & 3, 0, "{message}");
    assert_ne!(regs.rip, 0, "{message}");
    assert!(message.contains("rip=0x"), "{message}");
    assert!(!console.contains("hello from pier-rt"), "the app ran:\n{console}");
}

#[test]
fn a_missing_kvm_device_is_named() {
    let config = VmConfig {
        kvm_path: PathBuf::from("/nonexistent/kvm"),
        serial: Box::new(std::io::sink()),
        ..VmConfig::default()
    };
    let err = pier_vmm::boot(hello_image(), config).unwrap_err();
    assert!(matches!(err, Error::KvmOpen { .. }), "{err}");
    assert!(err.to_string().contains("KVM is not available"), "{err}");
    assert!(err.to_string().contains("/nonexistent/kvm"), "{err}");
}

#[test]
fn a_file_that_is_not_elf_is_refused() {
    let dir = tempdir();
    let path = dir.join("not-an-image");
    std::fs::write(&path, b"#!/bin/sh\necho hello\n").unwrap();
    let err = pier_vmm::boot(&path, quiet()).unwrap_err();
    assert!(matches!(err, Error::NotElf { .. }), "{err}");
    assert!(err.to_string().contains("not an ELF file"), "{err}");
}

#[test]
fn an_elf_without_a_pvh_note_is_refused() {
    let dir = tempdir();
    let path = dir.join("no-note");
    std::fs::write(&path, elf_without_notes()).unwrap();
    let err = pier_vmm::boot(&path, quiet()).unwrap_err();
    assert!(matches!(err, Error::NoPvhNote { .. }), "{err}");
    assert!(err.to_string().contains("PVH"), "{err}");
}

#[test]
fn an_image_bigger_than_memory_is_refused() {
    let dir = tempdir();
    let path = dir.join("big");
    std::fs::write(&path, elf(0x10_0000, 4 << 20, true)).unwrap();
    let err = pier_vmm::boot(&path, VmConfig { mem_size: 2 << 20, ..quiet() }).unwrap_err();
    match &err {
        Error::ImageTooBig { image_end, mem_size, .. } => {
            assert_eq!((*image_end, *mem_size), (0x50_0000, 2 << 20))
        }
        other => panic!("expected ImageTooBig, got {other}"),
    }
    assert!(err.to_string().contains("more memory"), "{err}");
}

#[test]
fn a_memory_size_out_of_range_is_refused() {
    for mem_size in [1 << 20, (64 << 20) + 1, 4 << 30] {
        let err = pier_vmm::boot(hello_image(), VmConfig { mem_size, ..quiet() }).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{mem_size}: {err}");
    }
}

fn quiet() -> VmConfig {
    VmConfig { serial: Box::new(std::io::sink()), ..VmConfig::default() }
}

fn tempdir() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("pier-vmm-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A minimal ELF64 x86-64 executable: one loadable segment at `paddr`
/// of `memsz` bytes (no file contents), and a PVH note if `pvh`.
fn elf(paddr: u64, memsz: u64, pvh: bool) -> Vec<u8> {
    let phnum: u16 = if pvh { 2 } else { 1 };
    let notes_at = 64 + 56 * usize::from(phnum);
    let mut elf = vec![0u8; notes_at];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    elf[6] = 1; // EV_CURRENT
    elf[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[24..32].copy_from_slice(&paddr.to_le_bytes()); // e_entry
    elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    elf[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    elf[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    elf[56..58].copy_from_slice(&phnum.to_le_bytes());
    let load = &mut elf[64..120];
    load[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    load[4..8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    load[16..24].copy_from_slice(&paddr.to_le_bytes()); // p_vaddr
    load[24..32].copy_from_slice(&paddr.to_le_bytes()); // p_paddr
    load[40..48].copy_from_slice(&memsz.to_le_bytes()); // p_memsz
    if pvh {
        let mut note = Vec::new();
        for word in [4u32, 8, 18] {
            note.extend_from_slice(&word.to_le_bytes());
        }
        note.extend_from_slice(b"Xen\0");
        note.extend_from_slice(&paddr.to_le_bytes());
        let ph = &mut elf[120..176];
        ph[0..4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
        ph[8..16].copy_from_slice(&(notes_at as u64).to_le_bytes()); // p_offset
        ph[32..40].copy_from_slice(&(note.len() as u64).to_le_bytes()); // p_filesz
        elf.extend_from_slice(&note);
    }
    elf
}

fn elf_without_notes() -> Vec<u8> {
    elf(0x10_0000, 0x1000, false)
}
