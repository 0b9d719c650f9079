//! The seed corpus in `fuzz/corpus/` is what `cargo xtask fuzz-seeds`
//! writes: a change to the seed generator (or to a target's input layout
//! with it) must come with the regenerated files.

#[test]
fn committed_seeds_match_the_generator() {
    let root = xtask::repo_root();
    for (target, name, bytes) in xtask::seeds::seeds() {
        let file = root.join("fuzz/corpus").join(target).join(name);
        let on_disk = std::fs::read(&file)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask fuzz-seeds`", file.display()));
        assert_eq!(on_disk, bytes, "{} is stale; run `cargo xtask fuzz-seeds`", file.display());
    }
}
