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
//! - `cargo xtask apps`: build the guest components and print where they are.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const WASM_TARGET: &str = "wasm32-wasip2";
const ECHO_PORT: &str = "1234";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("run") => run(&rest),
        Some("apps") => build_apps().map(|dir| {
            println!("guest components are in {}", dir.display());
        }),
        _ => {
            eprintln!("usage: cargo xtask run [pier run options] | cargo xtask apps");
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

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repo").to_path_buf()
}

/// Where cargo puts host builds: `$CARGO_TARGET_DIR`, or `target/` in the repo.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn check(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
}

/// Installs the Wasm target through rustup if it is not there yet.
fn ensure_wasm_target() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("rustup is needed to add the {WASM_TARGET} target: {e}"))?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == WASM_TARGET) {
        return Ok(());
    }
    eprintln!("xtask: installing the {WASM_TARGET} target");
    check(
        Command::new("rustup").args(["target", "add", WASM_TARGET]).current_dir(repo_root()),
        "rustup target add",
    )
}

/// Builds the guest components; returns the folder holding the `.wasm` files.
fn build_apps() -> Result<PathBuf, String> {
    ensure_wasm_target()?;
    let guest_target = target_dir().join("guest");
    eprintln!("xtask: building the guest components ({WASM_TARGET})");
    check(
        cargo()
            .args(["build", "--release", "--target", WASM_TARGET, "--manifest-path"])
            .arg(repo_root().join("guest-apps/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &guest_target)
            .current_dir(repo_root()),
        "building the guest components",
    )?;
    Ok(guest_target.join(WASM_TARGET).join("release"))
}

fn run(extra: &[String]) -> Result<(), String> {
    let apps = build_apps()?;
    eprintln!("xtask: building the pier CLI");
    check(
        cargo().args(["build", "--release", "--package", "pier-cli"]).current_dir(repo_root()),
        "building the pier CLI",
    )?;
    let pier = target_dir().join("release/pier");
    let echo = apps.join("echo.wasm");
    eprintln!("xtask: starting the echo service: pier run {} --listen {ECHO_PORT}", echo.display());
    let mut cmd = Command::new(&pier);
    cmd.arg("run")
        .arg(&echo)
        .args(["--listen", ECHO_PORT])
        .args(extra)
        .args(["--", "--port", ECHO_PORT]);
    let status = cmd.status().map_err(|e| format!("running {}: {e}", pier.display()))?;
    match status.code() {
        Some(0) => Ok(()),
        // pier stopped on Ctrl-C or SIGTERM (it says so itself).
        Some(130 | 143) => std::process::exit(status.code().unwrap_or(1)),
        _ => Err(format!("pier exited with {status}")),
    }
}
