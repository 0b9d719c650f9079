//! Builds for pier's targets other than the host, shared by `cargo xtask`,
//! the tests and the benchmarks.
//!
//! pier builds for four targets: the host, `wasm32-wasip2` (the guest
//! components in `guest-apps/`), `x86_64-unknown-none` (the `no_std`
//! crates, and the boot images) and `x86_64-unknown-linux-musl` (the
//! program inside the Linux test guest, [`crate::linux_guest`]).
//! `rust-toolchain.toml` lists the extra targets, but rustup adds them only
//! when it installs the toolchain itself: a machine that already had the
//! pinned toolchain, or one with rustup's auto-install turned off, has none
//! of them. So every build of a non-host target goes through
//! [`ensure_target`] first, and a user's first command works whichever one
//! it is (`cargo xtask run` or `cargo test`).
//!
//! There is one copy of this logic: `cargo xtask` builds with it for users,
//! and the tests and benchmarks with it as a dev-dependency, so what the
//! suite builds is exactly what a user builds.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace::{Output, cargo, repo_root, run};

/// The target the guest components build for.
pub const WASM_TARGET: &str = "wasm32-wasip2";
/// The bare-metal target: the `no_std` crates and the boot images.
pub const BARE_METAL_TARGET: &str = "x86_64-unknown-none";

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

/// The apps also built for WASI 0.3 (pier-rt's `wasi-0-3` feature, so on
/// `vsock:sockets@0.2.0`), from the same sources. Each lands beside its
/// 0.1.0 build as `{app}-wasi-0-3.wasm`.
pub const WASI_0_3_APPS: [&str; 6] =
    ["echo", "msg-echo", "echo-async", "hello", "probe", "bench-echo"];

/// Builds `guest-apps/` for `wasm32-wasip2` (release) into `target_dir`,
/// then [`WASI_0_3_APPS`] again for WASI 0.3, and returns the folder
/// holding the `.wasm` files.
pub fn build_guest_components(target_dir: &Path, output: Output) -> Result<PathBuf, String> {
    ensure_target(WASM_TARGET)?;
    let manifest = repo_root().join("guest-apps/Cargo.toml");
    run(
        cargo()
            .args(["build", "--release", "--target", WASM_TARGET, "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", target_dir),
        "building the guest components",
        output,
    )?;
    let out = target_dir.join(WASM_TARGET).join("release");
    // A target folder of its own: the feature changes pier-rt, and
    // sharing one would rebuild each variant over the other.
    let wasi_0_3_dir = target_dir.join("wasi-0-3");
    let mut build = cargo();
    build
        .args(["build", "--release", "--target", WASM_TARGET, "--features", "pier-rt/wasi-0-3"])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &wasi_0_3_dir);
    for app in WASI_0_3_APPS {
        build.args(["--package", app]);
    }
    run(&mut build, "building the guest components for WASI 0.3", output)?;
    for app in WASI_0_3_APPS {
        let built = wasi_0_3_dir.join(WASM_TARGET).join("release").join(format!("{app}.wasm"));
        let named = out.join(format!("{app}-wasi-0-3.wasm"));
        std::fs::copy(&built, &named)
            .map_err(|e| format!("copying {} to {}: {e}", built.display(), named.display()))?;
    }
    Ok(out)
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

/// The guest components for `wasm32-wasip2`, built once per process into
/// the guest cache every test binary shares (`$PIER_GUEST_TARGET` names
/// another folder): the folder with the `.wasm` files. A build that fails
/// panics with its output, as a test wants.
pub fn built_guest_components() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = match std::env::var_os("PIER_GUEST_TARGET") {
            Some(dir) => PathBuf::from(dir),
            None => crate::cache_dir("guest-target"),
        };
        build_guest_components(&target, Output::OnFailure).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// One guest component, by crate name, from [`built_guest_components`].
pub fn guest_component(name: &str) -> PathBuf {
    let path = built_guest_components().join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}
