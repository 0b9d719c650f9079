//! Where this checkout is, where its builds go, and how its commands run.
//!
//! Every path is found at run time, never baked in at compile time: two
//! checkouts that share a build cache may share this crate's compiled code,
//! and each must still build and test its own files.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::pattern::Fnv;

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
///
/// The checkout's name is the FNV-1a hash of its path: std's hasher is
/// not stable across releases, and the name must be.
pub fn cache_dir(name: &str) -> PathBuf {
    match std::env::var_os("HOME") {
        Some(home) => {
            let checkout = Fnv::of(repo_root().as_os_str().as_encoded_bytes());
            PathBuf::from(home).join(".cache/pier").join(format!("{name}-{checkout:016x}"))
        }
        None => target_dir().join(name),
    }
}

/// `cargo`, the same one that runs us when there is one.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(repo_root());
    cmd
}

/// Whether a build shows cargo's progress (a user waiting) or keeps it
/// for the error (a test, whose output would drown the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Show,
    OnFailure,
}

/// Runs a command to the end, its output shown or kept as `output` says;
/// on failure, the error names `what` (and holds the output it kept).
pub fn run(cmd: &mut Command, what: &str, output: Output) -> Result<(), String> {
    match output {
        Output::Show => run_visibly(cmd, what),
        Output::OnFailure => run_quietly(cmd, what),
    }
}

/// Runs a command with its output on the terminal.
pub fn run_visibly(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
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
