//! The seed corpus in `fuzz/corpus/` is what `cargo xtask fuzz-seeds`
//! writes: a change to the seed generator (or to a target's input layout
//! with it) must come with the regenerated files.

#[test]
fn committed_seeds_match_the_generator() {
    let root = pier_testkit::repo_root();
    for (target, name, bytes) in xtask::seeds::seeds() {
        let file = root.join("fuzz/corpus").join(target).join(name);
        let on_disk = std::fs::read(&file)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask fuzz-seeds`", file.display()));
        assert_eq!(on_disk, bytes, "{} is stale; run `cargo xtask fuzz-seeds`", file.display());
    }
}

/// `fuzz/` is a workspace of its own with its own lockfile, which a new
/// dependency of pier-stack or pier-device makes stale; CI builds the
/// fuzz targets with `--locked`, so a stale lockfile fails there, after
/// the tests. This finds it in the test command instead.
#[test]
fn the_fuzz_lockfile_is_current() {
    let manifest = pier_testkit::repo_root().join("fuzz/Cargo.toml");
    let out = pier_testkit::cargo()
        .args(["metadata", "--locked", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "fuzz/Cargo.lock is stale; run `cargo update --workspace` in fuzz/:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
