//! `cargo xtask fuzz`: the fuzz targets in `fuzz/` built with libFuzzer's
//! instrumentation on the stable toolchain, and each one fuzzed for a
//! budget (`docs/fuzzing.md`).

use std::path::{Path, PathBuf};
use std::process::Command;

use pier_testkit::{Output, cache_dir, cargo, repo_root, run, target_dir};

/// The fuzz targets in `fuzz/fuzz_targets/`, in the order `cargo xtask
/// fuzz` runs them (see `docs/fuzzing.md`).
pub const FUZZ_TARGETS: &[&str] = &[
    "wire_decode",
    "connect_line",
    "bridge_framing",
    "virtqueue",
    "stack_sequence",
    "client_reply",
    "config_file",
    "containerd_annotations",
    "vhost_user_vrings",
];

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
