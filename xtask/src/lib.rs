//! Building pier's non-host pieces, shared by `cargo xtask`, the tests and
//! the benchmarks.
//!
//! pier builds for four targets: the host, `wasm32-wasip2` (the guest
//! components in `guest-apps/`), `x86_64-unknown-none` (the `no_std`
//! crates, and the boot images) and `x86_64-unknown-linux-musl` (the
//! program inside the Linux test guest, [`linux_guest`]). `rust-toolchain.toml` lists the extra
//! targets, but rustup adds them only when it installs the toolchain
//! itself: a machine that already had the pinned toolchain, or one with
//! rustup's auto-install turned off, has none of them. So every build of a
//! non-host target goes through [`ensure_target`] first, and a user's first
//! command works whichever one it is (`cargo xtask run` or `cargo test`).
//!
//! There is one copy of this logic. `xtask` (the binary) uses it for users;
//! the tests and benchmarks use it as a dev-dependency, so what the suite
//! builds is exactly what a user builds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod bench;
pub mod containerd;
pub mod linux_guest;
pub mod linux_vm;
pub mod module_cycles;
pub mod oci_image;
pub mod qemu;
pub mod seeds;
pub mod tools;

/// The target the guest components build for.
pub const WASM_TARGET: &str = "wasm32-wasip2";
/// The bare-metal target: the `no_std` crates and the boot images.
pub const BARE_METAL_TARGET: &str = "x86_64-unknown-none";

/// The repository root: the nearest folder holding `guest-apps/`, above
/// the package cargo is running or testing.
///
/// Found at run time (cargo sets `CARGO_MANIFEST_DIR` for what it runs)
/// rather than baked in when this crate was compiled: two checkouts that
/// share a build cache may share this crate's compiled code too, and a
/// test in one must still build the guest apps of its own.
pub fn repo_root() -> PathBuf {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR"));
    let start = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    start
        .iter()
        .flat_map(|dir| dir.ancestors())
        .chain(compiled_in.ancestors())
        .find(|dir| dir.join("guest-apps/Cargo.toml").is_file())
        .unwrap_or(compiled_in)
        .to_path_buf()
}

/// Where cargo puts host builds: `$CARGO_TARGET_DIR`, or `target/` in the repo.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// A cache folder shared by every test process and every run of this
/// checkout: `$HOME/.cache/pier/<name>-<checkout>` (or `target/<name>` in
/// the repo without a `HOME`). Tests build into their own folders rather
/// than the workspace's target folder, which the `cargo test` running them
/// keeps locked. Each checkout has its own, because cargo copies a built
/// artifact to its final name only when it rebuilds it: two checkouts in
/// one folder would find each other's `.wasm` files there.
pub fn cache_dir(name: &str) -> PathBuf {
    match std::env::var_os("HOME") {
        Some(home) => {
            let checkout = fnv1a(repo_root().as_os_str().as_encoded_bytes());
            PathBuf::from(home).join(".cache/pier").join(format!("{name}-{checkout:016x}"))
        }
        None => target_dir().join(name),
    }
}

/// FNV-1a: a stable name for a checkout's path (std's hasher is not
/// stable across releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `s` as a JSON string. xtask writes its few small JSON documents (the
/// benchmark records, the OCI image's metadata) by hand: key order and
/// spacing then stay fixed, with no serialisation library to build.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `cargo`, the same one that runs us when there is one.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(repo_root());
    cmd
}

/// The toolchain `rust-toolchain.toml` pins, for the commands we print.
fn pinned_toolchain() -> String {
    std::env::var("RUSTUP_TOOLCHAIN").ok().filter(|t| !t.is_empty()).unwrap_or_else(|| {
        std::fs::read_to_string(repo_root().join("rust-toolchain.toml"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let value = line.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
                    Some(value.trim().trim_matches('"').to_owned())
                })
            })
            .unwrap_or_else(|| "stable".into())
    })
}

/// Whether the compiler in use has the standard library for `target`.
///
/// Asks the compiler itself (its sysroot) rather than rustup, so the answer
/// is right for any installation, rustup or not.
fn target_installed(target: &str) -> Result<bool, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("running {} --print sysroot: {e}", rustc.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --print sysroot failed ({}): {}",
            rustc.to_string_lossy(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Ok(sysroot.join("lib/rustlib").join(target).join("lib").is_dir())
}

/// Makes sure the compiler can build for `target`, installing it through
/// rustup when it is missing. Prints one line when it installs.
///
/// When it cannot (no rustup, no network), the error says exactly which
/// command to run by hand.
pub fn ensure_target(target: &str) -> Result<(), String> {
    if target_installed(target)? {
        return Ok(());
    }
    let toolchain = pinned_toolchain();
    let by_hand = format!("rustup target add {target} --toolchain {toolchain}");
    eprintln!("pier: installing the {target} target ({by_hand})");
    let out = Command::new("rustup")
        .args(["target", "add", target, "--toolchain", &toolchain])
        .current_dir(repo_root())
        .output();
    let failure = match out {
        Ok(out) if out.status.success() => {
            if target_installed(target)? {
                return Ok(());
            }
            "rustup reported success, but the compiler still has no standard library for it"
                .to_owned()
        }
        Ok(out) => format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => format!("rustup could not be run: {e}"),
    };
    Err(format!(
        "the {target} target is not installed and installing it failed ({failure}).\n\
         Install it by hand, then run the command again:\n    {by_hand}\n\
         (without rustup, install your toolchain's standard library for {target})"
    ))
}

/// Runs a command to the end; on failure, the error holds its output.
fn run_quietly(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Runs a command with its output on the terminal.
pub fn run_visibly(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
}

/// Whether a build shows cargo's progress (a user waiting) or keeps it
/// for the error (a test, whose output would drown the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Show,
    OnFailure,
}

fn run(cmd: &mut Command, what: &str, output: Output) -> Result<(), String> {
    match output {
        Output::Show => run_visibly(cmd, what),
        Output::OnFailure => run_quietly(cmd, what),
    }
}

/// Builds `guest-apps/` for `wasm32-wasip2` (release) into `target_dir`
/// and returns the folder holding the `.wasm` files.
pub fn build_guest_components(target_dir: &Path, output: Output) -> Result<PathBuf, String> {
    ensure_target(WASM_TARGET)?;
    run(
        cargo()
            .args(["build", "--release", "--target", WASM_TARGET, "--manifest-path"])
            .arg(repo_root().join("guest-apps/Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir),
        "building the guest components",
        output,
    )?;
    Ok(target_dir.join(WASM_TARGET).join("release"))
}

/// Builds workspace packages for the bare-metal target into `target_dir`:
/// the proof that they need nothing but `core` and `alloc`.
pub fn build_bare_metal(
    packages: &[&str],
    target_dir: &Path,
    output: Output,
) -> Result<(), String> {
    ensure_target(BARE_METAL_TARGET)?;
    let mut cmd = cargo();
    cmd.args(["build", "--target", BARE_METAL_TARGET]).env("CARGO_TARGET_DIR", target_dir);
    for package in packages {
        cmd.args(["--package", package]);
    }
    run(&mut cmd, "building for the bare-metal target", output)
}

/// Builds the bare-metal image of the guest app `app` (a package in
/// `guest-apps/`, release profile) into `target_dir` and returns the
/// image's path: an ELF64 with a PVH note, bootable by pier-vmm and QEMU.
///
/// Cargo runs in `guest-apps/`, so that `guest-apps/.cargo/config.toml`
/// supplies the image's linker script and relocation model. `RUSTFLAGS`
/// from the environment would replace those flags, not add to them, so it
/// is removed for this build.
pub fn build_guest_image(app: &str, target_dir: &Path, output: Output) -> Result<PathBuf, String> {
    ensure_target(BARE_METAL_TARGET)?;
    run(
        cargo()
            .current_dir(repo_root().join("guest-apps"))
            .args(["build", "--release", "--target", BARE_METAL_TARGET, "--package", app])
            .env("CARGO_TARGET_DIR", target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
        &format!("building the {app} image"),
        output,
    )?;
    Ok(target_dir.join(BARE_METAL_TARGET).join("release").join(app))
}

/// The fuzz targets in `fuzz/fuzz_targets/`, in the order `cargo xtask
/// fuzz` runs them (see `docs/fuzzing.md`).
pub const FUZZ_TARGETS: &[&str] =
    &["wire_decode", "connect_line", "bridge_framing", "virtqueue", "stack_sequence"];

/// What `cargo-fuzz` passes to rustc, minus the nightly-only `-Zsanitizer`:
/// SanitizerCoverage instrumentation (edge counters, the PC table, and
/// comparison tracing so libFuzzer can learn magic values), all of it
/// plain LLVM options that stable rustc accepts. libFuzzer itself comes
/// from the `libfuzzer-sys` crate, compiled with the system's C++ compiler.
const FUZZ_RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg=fuzzing",
];

/// The host's target triple, from the compiler in use.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("running {} -vV: {e}", rustc.to_string_lossy()))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| "rustc -vV names no host triple".to_owned())
}

/// Builds the fuzz targets (all of them: one cargo run, and the shared
/// crates are compiled once) and returns the folder holding the binaries.
///
/// The build is explicit about the host target so that `RUSTFLAGS` reach
/// only the targets, not build scripts, and lives in its own folder under
/// the target directory, so instrumented code never mixes with normal
/// builds.
pub fn build_fuzz_targets(output: Output) -> Result<PathBuf, String> {
    let triple = host_triple()?;
    let dir = target_dir().join("fuzz");
    run(
        cargo()
            .args(["build", "--release", "--locked", "--bins", "--target", &triple])
            .arg("--manifest-path")
            .arg(repo_root().join("fuzz/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &dir)
            .env("RUSTFLAGS", FUZZ_RUSTFLAGS.join(" "))
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
        "building the fuzz targets",
        output,
    )?;
    Ok(dir.join(triple).join("release"))
}

/// How long one fuzz target runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuzzBudget {
    /// Wall-clock seconds.
    Seconds(u64),
    /// Executions (libFuzzer's `-runs`).
    Runs(u64),
}

impl std::fmt::Display for FuzzBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Seconds(n) => write!(f, "{n} s"),
            Self::Runs(n) => write!(f, "{n} runs"),
        }
    }
}

/// What one fuzzing run did.
#[derive(Clone, Debug, PartialEq)]
pub struct FuzzReport {
    /// Inputs executed.
    pub runs: u64,
    /// Executions per second, as libFuzzer measured them.
    pub execs_per_sec: u64,
    /// Wall-clock seconds the run took.
    pub seconds: f64,
    /// Inputs in the working corpus afterwards.
    pub corpus: usize,
}

/// Fuzzes one target with libFuzzer.
///
/// The seeds in `fuzz/corpus/<target>/` are read but never written: new
/// inputs go to a working corpus in the per-checkout cache, which later
/// runs start from, and a crashing input is saved beside it. A crash, a
/// timeout or an out-of-memory input is an error that names that file and
/// the command that replays it; the fuzzer's log (saved beside the corpus)
/// is printed on failure only, so a passing run stays one line.
pub fn fuzz_target(bins: &Path, target: &str, budget: FuzzBudget) -> Result<FuzzReport, String> {
    if !FUZZ_TARGETS.contains(&target) {
        return Err(format!("no fuzz target {target:?}; the targets: {}", FUZZ_TARGETS.join(", ")));
    }
    let work = cache_dir("fuzz");
    let corpus = work.join("corpus").join(target);
    let artifacts = work.join("artifacts");
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let seeds = repo_root().join("fuzz/corpus").join(target);
    let log = work.join(format!("{target}.log"));
    let log_file =
        std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let limit = match budget {
        FuzzBudget::Seconds(s) => format!("-max_total_time={s}"),
        FuzzBudget::Runs(n) => format!("-runs={n}"),
    };
    let bin = bins.join(target);
    let mut cmd = Command::new(&bin);
    cmd.arg(&limit)
        .arg("-print_final_stats=1")
        // An input that runs for a second is a hang; one that needs a
        // gigabyte breaks the memory bound the targets check.
        .arg("-timeout=10")
        .arg("-rss_limit_mb=1024")
        .arg(format!("-artifact_prefix={}/{target}-", artifacts.display()))
        .arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.current_dir(&work).stdout(log_file.try_clone().map_err(|e| e.to_string())?);
    cmd.stderr(log_file);
    let started = std::time::Instant::now();
    let status = cmd.status().map_err(|e| format!("running {}: {e}", bin.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        let crash = text
            .lines()
            .find_map(|l| l.split("Test unit written to ").nth(1))
            .map(str::trim)
            .unwrap_or("(no input saved)");
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "fuzz target {target} failed ({status}).\n{}\n\
             The input: {crash}\nReplay it: {} {crash}\nFull log: {}",
            tail.join("\n"),
            bin.display(),
            log.display()
        ));
    }
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0)
    };
    let corpus_len = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
    Ok(FuzzReport {
        runs: stat("stat::number_of_executed_units"),
        execs_per_sec: stat("stat::average_exec_per_sec"),
        seconds,
        corpus: corpus_len,
    })
}
