//! The module-cycle check (`cargo xtask module-cycles`): on small crates
//! written for each case, it finds the cycles a reader would and no others;
//! on the repository itself, it reads every crate and finds none.

use std::path::{Path, PathBuf};

use xtask::module_cycles::{Report, scan};

/// A folder of packages under the system's temporary folder, removed when
/// the test ends.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let dir =
            std::env::temp_dir().join(format!("pier-module-cycles-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the fixture folder");
        Fixture { dir }
    }

    /// Writes the package `package` with `files` (paths relative to it).
    fn package(&self, package: &str, files: &[(&str, &str)]) -> &Fixture {
        let root = self.dir.join(package);
        write(&root.join("Cargo.toml"), &format!("[package]\nname = \"{package}\"\n"));
        for (path, text) in files {
            write(&root.join(path), text);
        }
        self
    }

    fn scan(&self) -> Report {
        scan(&self.dir).expect("scanning the fixture")
    }

    /// Each cycle as its files, from its least.
    fn cycles(&self) -> Vec<Vec<String>> {
        let report = self.scan();
        report.cycles.iter().map(|c| c.files().into_iter().map(str::to_owned).collect()).collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent folder")).expect("creating a folder");
    std::fs::write(path, text).expect("writing a fixture file");
}

fn files(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn finds_two_modules_that_import_each_other() {
    let fixture = Fixture::new("two");
    fixture.package(
        "two",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
            ("src/b.rs", "pub struct B;\npub fn make() -> crate::a::A {\n    todo!()\n}\n"),
        ],
    );
    let report = fixture.scan();
    assert_eq!(report.cycles.len(), 1, "{report}");
    let cycle = &report.cycles[0];
    assert_eq!((cycle.package.as_str(), cycle.root.as_str()), ("two", "src/lib.rs"));
    assert_eq!(cycle.files(), ["src/a.rs", "src/b.rs"]);
    assert_eq!(cycle.hops[0].names, ["use crate::b::B (line 1)"]);
    assert_eq!(cycle.hops[1].names, ["crate::a::A (line 2)"]);
    let printed = report.to_string();
    assert!(printed.contains("cycle: src/a.rs -> src/b.rs -> src/a.rs"), "{printed}");
}

#[test]
fn finds_a_three_cycle_through_super() {
    let fixture = Fixture::new("three");
    fixture.package(
        "three",
        &[
            ("src/lib.rs", "mod net;\n"),
            ("src/net/mod.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/net/a.rs", "use super::b::B;\npub struct A;\nfn f(_: B) {}\n"),
            ("src/net/b.rs", "pub struct B;\nfn g() {\n    super::c::h();\n}\n"),
            ("src/net/c.rs", "pub fn h() {\n    let _ = super::a::A;\n}\n"),
        ],
    );
    assert_eq!(fixture.cycles(), [files(&["src/net/a.rs", "src/net/b.rs", "src/net/c.rs"])]);
}

/// `crate::B` names the module defining `B`, not the root that re-exports
/// it: the cycle is between the two children, and the root is not in it.
#[test]
fn finds_a_cycle_through_root_re_exports_between_the_defining_modules() {
    let fixture = Fixture::new("reexport");
    fixture.package(
        "reexport",
        &[
            ("src/lib.rs", "mod a;\nmod b;\npub use a::A;\npub use b::*;\n"),
            ("src/a.rs", "use crate::B;\npub struct A(B);\n"),
            ("src/b.rs", "pub struct B;\nimpl B {\n    fn a(&self) -> crate::A { todo!() }\n}\n"),
        ],
    );
    assert_eq!(fixture.cycles(), [files(&["src/a.rs", "src/b.rs"])]);
}

/// A parent that declares its children, re-exports them, and whose
/// children use each other's items through those re-exports, depends on
/// nothing: each child's imports go to the module defining the item.
#[test]
fn a_parent_that_declares_and_re_exports_its_children_is_in_no_cycle() {
    let fixture = Fixture::new("parent");
    fixture.package(
        "parent",
        &[
            ("src/lib.rs", "pub mod socket;\npub use socket::{Options, Socket};\n"),
            (
                "src/socket/mod.rs",
                "mod conn;\nmod options;\npub use self::conn::Socket;\npub use options::*;\n",
            ),
            (
                "src/socket/conn.rs",
                "use crate::Options;\nuse super::Options as Same;\n\
                 pub struct Socket(Options, Same);\n",
            ),
            ("src/socket/options.rs", "pub struct Options;\n"),
        ],
    );
    let report = fixture.scan();
    assert!(report.cycles.is_empty(), "{report}");
    // The edges that remain: conn.rs to options.rs, by both of its imports.
    assert_eq!(report.edges, 1, "{report}");
}

/// Comments, doc comments and string literals name things without using
/// them; only code is an edge.
#[test]
fn comments_and_strings_are_not_edges() {
    let fixture = Fixture::new("clean");
    fixture.package(
        "clean",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
            (
                "src/b.rs",
                "//! Made into a [`crate::a::A`] by `crate::a`.\n\
                 /* crate::a::A /* nested */ crate::a::A */\n\
                 /// See [`A`](crate::a::A).\n\
                 pub struct B;\n\
                 const S: &str = \"crate::a::A\";\n\
                 const R: &str = r#\"super::a::A \"# ;\n\
                 const C: char = '\"';\n\
                 fn f<'a>(x: &'a str) -> &'a str { x }\n\
                 // crate::a::A\n",
            ),
        ],
    );
    let report = fixture.scan();
    assert!(report.cycles.is_empty(), "{report}");
    assert_eq!(report.edges, 1, "{report}");
    assert_eq!((report.roots.len(), report.files), (1, 3), "{report}");
}

/// A file's own test module is part of it: its `use super::*` ties the
/// file to itself (no edge), but what it imports from elsewhere is the
/// file's import.
#[test]
fn a_macro_body_names_items_for_where_it_expands_not_for_its_file() {
    let fixture = Fixture::new("macros");
    fixture.package(
        "macros",
        &[
            ("src/lib.rs", "#[macro_use]\nmod macros;\nmod report;\n"),
            (
                "src/macros.rs",
                "#[macro_export]\nmacro_rules! say {\n    ($x:expr) => { $crate::report::say($x) };\n}\n",
            ),
            ("src/report.rs", "pub fn say(x: u32) {}\npub fn twice() { crate::say!(2); }\n"),
        ],
    );
    let report = fixture.scan();
    assert!(report.cycles.is_empty(), "{report}");
}

#[test]
fn a_test_module_counts_as_its_file() {
    let fixture = Fixture::new("tests");
    let a = "pub fn helper() {}\n\
             #[cfg(test)]\n\
             mod tests {\n    use super::*;\n    #[test]\n    fn t() { helper(); }\n}\n";
    fixture.package(
        "own",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", a),
            ("src/b.rs", "use crate::a::helper;\n"),
        ],
    );
    let a_importing_b = format!(
        "{a}#[cfg(test)]\nmod more_tests {{\n    use crate::b::thing;\n    fn t() {{ thing(); }}\n}}\n"
    );
    fixture.package(
        "imports",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", &a_importing_b),
            ("src/b.rs", "use crate::a::helper;\npub fn thing() {}\n"),
        ],
    );
    let report = fixture.scan();
    let cycles: Vec<(&str, Vec<&str>)> =
        report.cycles.iter().map(|c| (c.package.as_str(), c.files())).collect();
    assert_eq!(cycles, [("imports", vec!["src/a.rs", "src/b.rs"])], "{report}");
}

/// A glob import ties the importing module to the module defining each
/// name it uses, whichever `cfg` alternative brings it in, and to no
/// module it uses nothing of.
#[test]
fn a_glob_import_ties_to_each_module_defining_a_name_it_uses() {
    let fixture = Fixture::new("glob");
    fixture.package(
        "glob",
        &[
            ("src/lib.rs", "mod backend;\nmod poll;\nmod unused;\npub struct Readiness;\n"),
            (
                "src/backend/mod.rs",
                "#[cfg(unix)]\nmod unix;\n#[cfg(unix)]\npub use unix::*;\n\
                 #[cfg(not(unix))]\nmod other;\n#[cfg(not(unix))]\npub use other::*;\n",
            ),
            ("src/backend/unix.rs", "use crate::poll::Poller;\npub struct Socket(Poller);\n"),
            ("src/backend/other.rs", "use crate::poll::Poller;\npub struct Socket(Poller);\n"),
            ("src/unused.rs", "pub struct Unused;\n"),
            (
                "src/poll.rs",
                "use crate::backend::*;\nuse crate::unused::*;\n\
                 pub struct Poller;\nfn f(_: Socket) {}\n",
            ),
        ],
    );
    assert_eq!(
        fixture.cycles(),
        [
            files(&["src/backend/other.rs", "src/poll.rs"]),
            files(&["src/backend/unix.rs", "src/poll.rs"])
        ]
    );
}

/// A `#[path]` module is the file it names, even outside the package
/// (one source compiled into two crates); it is named from the package.
#[test]
fn a_path_attribute_leads_to_the_file_it_names() {
    let fixture = Fixture::new("path");
    fixture.package(
        "app",
        &[
            (
                "src/main.rs",
                "#[path = \"../../common/data.rs\"]\nmod data;\nmod io;\nfn main() {}\n",
            ),
            ("src/io.rs", "pub fn log() {}\npub fn fill() {\n    crate::data::make();\n}\n"),
        ],
    );
    write(&fixture.dir.join("common/data.rs"), "pub fn make() {\n    crate::io::log();\n}\n");
    let report = fixture.scan();
    assert!(report.missing.is_empty() && report.unreached.is_empty(), "{report}");
    assert_eq!(
        report.cycles.iter().map(|c| c.files()).collect::<Vec<_>>(),
        [["../common/data.rs", "src/io.rs"]],
        "{report}"
    );
}

/// Every crate the repository has is read, through every `mod`
/// declaration: a source file no crate root reaches would mean the scan
/// missed a declaration (or the file is dead).
#[test]
fn the_scan_reads_every_crate_and_every_source_file() {
    let report = scan(&pier_testkit::repo_root()).expect("scanning the repository");
    for root in [
        "stack/src/lib.rs",
        "driver/src/lib.rs",
        "host/device/src/lib.rs",
        "host/cli/src/main.rs",
        "xtask/src/lib.rs",
        "xtask/src/main.rs",
        "guest-apps/rt/src/lib.rs",
        "guest-apps/echo/src/main.rs",
        "guest-linux/vsock-test/src/main.rs",
        "host/containerd-shim/src/lib.rs",
        "fuzz/src/lib.rs",
    ] {
        assert!(report.roots.iter().any(|r| r == root), "{root} not scanned:\n{report}");
    }
    assert!(report.unreached.is_empty(), "{report}");
    assert!(report.missing.is_empty(), "{report}");
}

/// No module of any crate imports one that imports it back: a change that
/// adds such a pair fails here (and `cargo xtask module-cycles` names the
/// imports that tie it).
#[test]
fn repository_has_no_module_import_cycles() {
    let report = scan(&pier_testkit::repo_root()).expect("scanning the repository");
    assert!(report.cycles.is_empty(), "module import cycles:\n{report}");
}
