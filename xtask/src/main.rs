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
//! - `cargo xtask image NAME`: build the bootable image of the app NAME
//!   (`x86_64-unknown-none`) and print where it is.

use std::process::{Command, ExitCode};

use xtask::{Output, build_guest_components, cargo, run_visibly, target_dir};

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
        Some("image") => match rest.as_slice() {
            [name] => build_image(name).map(|image| println!("{}", image.display())),
            _ => Err("usage: cargo xtask image NAME (an app in guest-apps/)".to_owned()),
        },
        _ => {
            eprintln!(
                "usage: cargo xtask run [pier run options] | cargo xtask apps | \
                 cargo xtask image NAME"
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
    eprintln!("xtask: building the guest components ({})", xtask::WASM_TARGET);
    build_guest_components(&target_dir().join("guest"), Output::Show)
}

/// Builds the bootable image of the app `name` into `target/guest-image`;
/// returns the image's path.
fn build_image(name: &str) -> Result<std::path::PathBuf, String> {
    eprintln!("xtask: building the {name} image ({})", xtask::BARE_METAL_TARGET);
    xtask::build_guest_image(name, &target_dir().join("guest-image"), Output::Show)
}

fn run(extra: &[String]) -> Result<(), String> {
    let apps = build_apps()?;
    eprintln!("xtask: building the pier CLI");
    run_visibly(
        cargo().args(["build", "--release", "--package", "pier-cli"]),
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
