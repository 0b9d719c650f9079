//! Puts the bare-metal image's linker script where the linker finds it.
//!
//! A library's build script cannot add linker arguments to the binaries
//! that use it, but its link search path does reach them. So the script is
//! copied to OUT_DIR as `pier-rt.ld`, OUT_DIR goes on the search path, and
//! the app's build names it (`-C link-arg=-Tpier-rt.ld`, set in
//! `guest-apps/.cargo/config.toml`).

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=src/platform/bare/link.ld");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::copy("src/platform/bare/link.ld", out.join("pier-rt.ld"))
        .expect("copying the linker script to OUT_DIR");
    println!("cargo::rustc-link-search={}", out.display());
}
