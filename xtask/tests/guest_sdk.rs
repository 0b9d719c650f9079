//! pier-rt, the app SDK, lives in the guest-apps workspace, which builds
//! for WASI and bare metal and so is not part of this workspace's
//! `cargo test`. Its own suite (the socket facades, the poller and the
//! async executor over an in-memory loopback backend) runs on the host,
//! so this test runs it: a facade that breaks fails the README's test
//! command, not only a build for another target.

#[test]
fn pier_rt_facade_suite_passes_on_the_host() {
    let target = pier_testkit::cache_dir("guest-sdk-tests");
    let manifest = pier_testkit::repo_root().join("guest-apps/Cargo.toml");
    let mut cargo = pier_testkit::cargo();
    cargo
        .args(["test", "--quiet", "-p", "pier-rt", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target);
    if let Err(e) = pier_testkit::run_visibly(&mut cargo, "pier-rt's own tests") {
        panic!("{e}");
    }
}
