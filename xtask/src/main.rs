//! `cargo xtask`: the tasks that need more than one cargo invocation.
//!
//! pier has two kinds of build output: host binaries (the `pier` CLI) and
//! WebAssembly components (the apps in `guest-apps/`, their own workspace,
//! built for `wasm32-wasip2`). A new user should not have to know that, so
//! `cargo xtask run` installs the Wasm target if it is missing, builds both,
//! and starts the echo service on the embedded in-process device.
//!
//! - `cargo xtask run [PIER RUN OPTIONS]`: build, then `pier run echo.wasm
//!   --listen 1234 -- --port 1234` (extra options go to `pier run`).
//! - `cargo xtask qemu [IMAGE] [--vhost-device-vsock | --pier-vhost-user]
//!   [--port N] [-- APP ARGS]`: the cross-check: boot IMAGE (a path, or an
//!   app's name; echo by default) under QEMU's microvm with rust-vmm's
//!   vhost-device-vsock serving its vsock device (both installed first
//!   when missing), wait until the guest listens on port N (1234), print
//!   how to connect, and run until the guest exits or Ctrl-C.
//! - `cargo xtask apps`: build the guest components and print where they are.
//! - `cargo xtask image NAME`: build the bootable image of the app NAME
//!   (`x86_64-unknown-none`) and print where it is.
//! - `cargo xtask oci-image [APP] [--out FILE] [--reference REF] [-- ARGS]`:
//!   build the guest components and pack APP's (echo by default) into an
//!   OCI image archive for containerd and pier's shim (`target/oci/APP.tar`,
//!   named `docker.io/pier/APP:latest`; ARGS become the image's command; see
//!   `pier_testkit::oci_image`), then print how to import and run it with `ctr`.
//! - `cargo xtask boot [PIER BOOT OPTIONS]`: build, then boot the echo
//!   image as a unikernel in pier's own hypervisor (`pier boot echo --
//!   --port 1234`; extra options go to `pier boot`). Needs `/dev/kvm`.
//! - `cargo xtask fuzz [TARGET] [--seconds N | --runs N]`: build the fuzz
//!   targets (`fuzz/`, on the stable toolchain) and fuzz each one, or only
//!   TARGET, for N seconds (30 by default) or N executions; a crash fails
//!   the command (`docs/fuzzing.md`).
//! - `cargo xtask fuzz-seeds`: rewrite the seed corpus in `fuzz/corpus/`.
//! - `cargo xtask bench [--quick] [--bench NAME]... [--from FILE]`: run
//!   every benchmark (`cargo bench --workspace`; `--quick`, a few minutes;
//!   `--bench` picks targets), then rewrite the measured tables in
//!   `docs/benchmarks.md` and the plots in `docs/plots/` (`--from`
//!   redraws them from an earlier run's `target/bench/results.jsonl`
//!   without running anything). The `bench` module says how.
//! - `cargo xtask linux-guest`: build the Linux test guest (Debian's
//!   kernel and an initramfs with `guest-linux/vsock-test`; see
//!   `pier_testkit::linux_guest`) and print the paths of the kernel and the
//!   initramfs.
//! - `cargo xtask linux [--vhost-device-vsock] [--cid N]`: build the guest,
//!   start `pier vhost-user` (or rust-vmm's vhost-device-vsock) and boot
//!   the guest under QEMU (TCG) against it, console on stderr; print how
//!   to reach the guest's ports, and run until the guest powers off or
//!   Ctrl-C.
//! - `cargo xtask containerd-shim`: build `containerd-shim-pier-v1`
//!   (installing `protoc` and libseccomp's headers first when missing)
//!   and print where it is (`docs/kubernetes.md`); `--lint` runs clippy
//!   and rustfmt's check on it instead (it is outside the workspace).
//! - `cargo xtask module-cycles [DIR]`: find every module that imports one
//!   that imports it back, in every crate of the repository (or of the
//!   checkout at DIR; the rules are in `xtask::module_cycles`); print each
//!   cycle with the names that tie it, and fail when there is one.

use std::process::{Command, ExitCode};

use pier_testkit::{Output, build_guest_components, cargo, run_visibly, target_dir};
use xtask::fuzz::{FUZZ_TARGETS, FuzzBudget, build_fuzz_targets, fuzz_target};

const ECHO_PORT: &str = "1234";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("run") => run(&rest),
        Some("boot") => boot(&rest),
        Some("qemu") => qemu(&rest),
        Some("apps") => build_apps().map(|dir| {
            println!("guest components are in {}", dir.display());
        }),
        Some("image") => match rest.as_slice() {
            [name] => build_image(name).map(|image| println!("{}", image.display())),
            _ => Err("usage: cargo xtask image NAME (an app in guest-apps/)".to_owned()),
        },
        Some("oci-image") => oci_image(&rest),
        Some("fuzz") => fuzz(&rest),
        Some("module-cycles") => module_cycles(&rest),
        Some("bench") => xtask::bench::Options::parse(&rest).and_then(|o| xtask::bench::run(&o)),
        Some("linux-guest") => pier_testkit::linux_guest::build(Output::Show).map(|guest| {
            println!("kernel {}", guest.kernel.display());
            println!("initrd {}", guest.initrd.display());
        }),
        Some("linux") => linux(&rest),
        Some("containerd-shim") => match rest.as_slice() {
            [] => pier_testkit::containerd::build_shim(Output::Show)
                .map(|shim| println!("{}", shim.display())),
            [lint] if lint == "--lint" => pier_testkit::containerd::lint_shim(Output::Show),
            _ => Err("usage: cargo xtask containerd-shim [--lint]".to_owned()),
        },
        Some("fuzz-seeds") => xtask::seeds::write_seeds(&pier_testkit::repo_root()).map(|n| {
            println!("wrote {n} seeds under fuzz/corpus/");
        }),
        _ => {
            eprintln!(
                "usage: cargo xtask run [pier run options] | cargo xtask boot [pier boot options]\n       \
                 cargo xtask qemu [IMAGE] [--vhost-device-vsock | --pier-vhost-user] [--port N] [-- ARGS]\n       \
                 cargo xtask apps | cargo xtask image NAME\n       \
                 cargo xtask oci-image [APP] [--out FILE] [--reference REF] [-- ARGS]\n       \
                 cargo xtask fuzz [TARGET] [--seconds N | --runs N] | cargo xtask fuzz-seeds\n       \
                 cargo xtask bench [--quick] [--bench NAME]... [--from FILE]\n       \
                 cargo xtask linux-guest | cargo xtask linux [--vhost-device-vsock] [--cid N]\n       \
                 cargo xtask containerd-shim [--lint] | cargo xtask module-cycles [DIR]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the guest components into `target/guest`; returns the folder
/// holding the `.wasm` files.
fn build_apps() -> Result<std::path::PathBuf, String> {
    eprintln!("xtask: building the guest components ({})", pier_testkit::WASM_TARGET);
    build_guest_components(&target_dir().join("guest"), Output::Show)
}

/// Builds the bootable image of the app `name` into `target/guest-image`;
/// returns the image's path.
fn build_image(name: &str) -> Result<std::path::PathBuf, String> {
    eprintln!("xtask: building the {name} image ({})", pier_testkit::BARE_METAL_TARGET);
    pier_testkit::build_guest_image(name, &target_dir().join("guest-image"), Output::Show)
}

/// Packs the guest component APP into an OCI image archive that
/// containerd imports without a registry, and says how to import it.
fn oci_image(args: &[String]) -> Result<(), String> {
    let (options, app_args) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let mut app = None;
    let mut out = None;
    let mut reference = None;
    let mut options = options.iter();
    while let Some(option) = options.next() {
        match option.as_str() {
            "--out" => out = Some(options.next().ok_or("--out needs a file")?.into()),
            "--reference" => reference = Some(options.next().ok_or("--reference needs a name")?),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other if app.is_none() => app = Some(other),
            other => return Err(format!("one app at a time ({other}?)")),
        }
    }
    let app = app.unwrap_or("echo");
    let out: std::path::PathBuf =
        out.unwrap_or_else(|| target_dir().join("oci").join(format!("{app}.tar")));
    let reference = reference.cloned().unwrap_or_else(|| format!("docker.io/pier/{app}:latest"));
    let wasm = build_apps()?.join(format!("{app}.wasm"));
    if !wasm.is_file() {
        return Err(format!("no component {} (is {app} an app in guest-apps/?)", wasm.display()));
    }
    let image = pier_testkit::oci_image::write_image(&wasm, app, &reference, app_args, &out)?;
    println!("{}", out.display());
    println!("{} ({}, {} bytes)", image.reference, image.index_digest, image.archive_size);
    println!("import with: {}", pier_testkit::oci_image::import_command(&out));
    println!("run with:    {}", pier_testkit::oci_image::run_command(&image.reference, app));
    Ok(())
}

/// Builds the pier CLI; returns its path.
fn build_pier() -> Result<std::path::PathBuf, String> {
    eprintln!("xtask: building the pier CLI");
    run_visibly(
        cargo().args(["build", "--release", "--package", "pier-cli"]),
        "building the pier CLI",
    )?;
    Ok(target_dir().join("release/pier"))
}

fn run(extra: &[String]) -> Result<(), String> {
    let apps = build_apps()?;
    let pier = build_pier()?;
    let echo = apps.join("echo.wasm");
    eprintln!("xtask: starting the echo service: pier run {} --listen {ECHO_PORT}", echo.display());
    let mut cmd = Command::new(&pier);
    cmd.arg("run")
        .arg(&echo)
        .args(["--listen", ECHO_PORT])
        .args(extra)
        .args(["--", "--port", ECHO_PORT]);
    serve(cmd, &pier)
}

fn boot(extra: &[String]) -> Result<(), String> {
    let image = build_image("echo")?;
    let pier = build_pier()?;
    eprintln!("xtask: booting the echo unikernel: pier boot {}", image.display());
    let mut cmd = Command::new(&pier);
    cmd.arg("boot").arg(&image).args(extra).args(["--", "--port", ECHO_PORT]);
    serve(cmd, &pier)
}

fn qemu(args: &[String]) -> Result<(), String> {
    let (options, app_args) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], args[i + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let mut image = None;
    let mut port: u32 = ECHO_PORT.parse().expect("a port number");
    let mut backend = pier_testkit::linux_vm::Backend::VhostDeviceVsock;
    let mut options = options.iter();
    while let Some(option) = options.next() {
        match option.as_str() {
            "--vhost-device-vsock" => backend = pier_testkit::linux_vm::Backend::VhostDeviceVsock,
            "--pier-vhost-user" => backend = pier_testkit::linux_vm::Backend::Pier(build_pier()?),
            "--port" => {
                let value = options.next().ok_or("--port needs a number")?;
                port = value.parse().map_err(|_| format!("--port {value}: not a number"))?;
            }
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other => image = Some(other.to_owned()),
        }
    }
    let image = match image {
        Some(path) if std::path::Path::new(&path).is_file() => std::path::PathBuf::from(path),
        Some(app) => build_image(&app)?,
        None => build_image("echo")?,
    };
    let uds = std::env::temp_dir().join(format!("pier-qemu-{}.vsock", std::process::id()));
    let mut config = pier_testkit::qemu::QemuConfig::new(&image, &uds);
    config.app_args = app_args;
    eprintln!("xtask: booting {} under QEMU with {}", image.display(), backend.name());
    config.backend = Some(backend);
    let mut vm = pier_testkit::qemu::QemuVm::start(&config)?;
    let started = std::time::Instant::now();
    loop {
        if pier_testkit::qemu::connects(&uds, port) {
            eprintln!(
                "xtask: the guest listens on port {port} ({:.0} ms after start); connect with: \
                 pier connect {} {port}",
                started.elapsed().as_secs_f64() * 1e3,
                uds.display()
            );
            break;
        }
        if vm.qemu().try_wait().map_err(|e| e.to_string())?.is_some()
            || started.elapsed() > std::time::Duration::from_secs(30)
        {
            eprintln!("xtask: the guest never listened on port {port}");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let code = vm.wait(std::time::Duration::MAX)?;
    eprintln!("xtask: the guest exited with {code}");
    if code == 0 { Ok(()) } else { std::process::exit(code) }
}

/// Boots the Linux test guest under QEMU against a vhost-user backend and
/// runs until it powers off (or Ctrl-C, which takes QEMU and the backend
/// down with this process).
fn linux(args: &[String]) -> Result<(), String> {
    use pier_testkit::linux_guest::{READY, ports};
    use pier_testkit::linux_vm::{Backend, BackendProcess, GuestSlot, LinuxVm, LinuxVmConfig};
    let mut reference = false;
    let mut cid: u32 = 3;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--vhost-device-vsock" => reference = true,
            "--cid" => {
                let value = args.next().ok_or("--cid needs a number")?;
                cid = value.parse().map_err(|_| format!("--cid {value}: not a number"))?;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    eprintln!("xtask: building the Linux test guest");
    let guest = pier_testkit::linux_guest::build(Output::Show)?;
    let (backend, pier) = if reference {
        (Backend::VhostDeviceVsock, None)
    } else {
        let pier = build_pier()?;
        (Backend::Pier(pier.clone()), Some(pier))
    };
    let dir = std::env::temp_dir().join(format!("pier-linux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let slot = GuestSlot::in_dir(&dir, cid);
    let backend = BackendProcess::start(&backend, std::slice::from_ref(&slot))?;
    eprintln!("xtask: backend: {}", backend.command_line());
    let mut config = LinuxVmConfig::new(&guest, &slot.vhost_socket);
    config.echo_console = true;
    let mut vm = LinuxVm::start(&config)?;
    let took = vm.wait_for(READY, std::time::Duration::from_secs(60))?;
    let connect = match &pier {
        Some(pier) => format!("{} connect {}", pier.display(), slot.uds.display()),
        None => format!("pier connect {}", slot.uds.display()),
    };
    eprintln!(
        "xtask: the guest (CID {cid}) is ready {:.1} s after start.\n\
         xtask: stream echo:  {connect} {}\n\
         xtask: control port: {connect} {} (then `ping`; guest-linux/vsock-test lists the commands)",
        took.as_secs_f64(),
        ports::STREAM_ECHO,
        ports::CONTROL,
    );
    let status = vm.wait(std::time::Duration::MAX);
    drop(backend);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("xtask: QEMU exited ({})", status.map_or("?".to_owned(), |s| s.to_string()));
    Ok(())
}

/// Runs a `pier` service in the foreground until it ends, and ends with
/// its exit code.
///
/// A Ctrl-C in the terminal reaches both processes (they share the
/// terminal's process group). xtask must not die of it first: pier takes
/// a moment to stop its components and remove its sockets, and the shell
/// prompt would come back while it still prints. So xtask ignores SIGINT
/// once pier runs, waits, and passes pier's exit code on (130 after a
/// Ctrl-C, as pier reports it).
fn serve(mut cmd: Command, pier: &std::path::Path) -> Result<(), String> {
    let mut child = cmd.spawn().map_err(|e| format!("running {}: {e}", pier.display()))?;
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory
    // effects; pier, already started, keeps its own handlers.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    let status = child.wait().map_err(|e| format!("waiting for {}: {e}", pier.display()))?;
    match status.code() {
        Some(0) => Ok(()),
        // pier stopped on Ctrl-C or a signal, and said so itself.
        Some(code) => std::process::exit(code),
        None => Err(format!("pier ended with {status}")),
    }
}

/// Finds the module import cycles of the repository, or of the checkout
/// at the path given.
fn module_cycles(args: &[String]) -> Result<(), String> {
    let root = match args {
        [] => pier_testkit::repo_root(),
        [dir] => std::path::PathBuf::from(dir),
        _ => return Err("usage: cargo xtask module-cycles [DIR]".to_owned()),
    };
    let started = std::time::Instant::now();
    let report = xtask::module_cycles::scan(&root)?;
    println!("{report} ({:.0} ms)", started.elapsed().as_secs_f64() * 1e3);
    match report.cycles.len() {
        0 => Ok(()),
        n => Err(format!("{n} module import cycles; break each at one of the names listed")),
    }
}

/// Seconds each target runs when no budget is given: long enough to find
/// what a change broke in the parsers, short enough for every CI run.
const DEFAULT_FUZZ_SECONDS: u64 = 30;

fn fuzz(args: &[String]) -> Result<(), String> {
    let mut targets: Vec<&str> = Vec::new();
    let mut budget = FuzzBudget::Seconds(DEFAULT_FUZZ_SECONDS);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> Result<u64, String> {
            let value = args.next().ok_or_else(|| format!("{flag} needs a number"))?;
            value.parse().map_err(|_| format!("{flag} {value}: not a number"))
        };
        match arg.as_str() {
            "--seconds" => budget = FuzzBudget::Seconds(number("--seconds")?),
            "--runs" => budget = FuzzBudget::Runs(number("--runs")?),
            name if FUZZ_TARGETS.contains(&name) => targets.push(name),
            other => {
                return Err(format!(
                    "unknown fuzz target or option {other:?}; the targets: {}",
                    FUZZ_TARGETS.join(", ")
                ));
            }
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.to_vec();
    }
    eprintln!("xtask: building the fuzz targets");
    let bins = build_fuzz_targets(Output::Show)?;
    for target in targets {
        eprintln!("xtask: fuzzing {target} ({budget})");
        let r = fuzz_target(&bins, target, budget)?;
        println!(
            "fuzz {target}: {} runs in {:.0} s ({} exec/s), corpus {}, no crash",
            r.runs, r.seconds, r.execs_per_sec, r.corpus
        );
    }
    Ok(())
}
