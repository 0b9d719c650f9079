//! The habits pier users bring from wasmtime: arguments after the
//! component are the component's, `--env` sets its environment (and
//! nothing else leaks in), and a component compiled once is not compiled
//! again (the compile cache).

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Output;

use common::{pier, wasm};

fn run_hello(cache: &Path, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    pier()
        .arg("run")
        .arg("--uds")
        .arg(dir.path().join("vm.vsock"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env("PIER_TEST_HOST_ONLY", "leak")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn what_follows_the_component_is_its_own_and_env_is_explicit() {
    let cache = tempfile::tempdir().unwrap();
    let hello = wasm("hello");
    let hello = hello.to_str().unwrap();
    let out = run_hello(
        cache.path(),
        &["--env", "GREETING=hi", hello, "greet", "env", "GREETING", "env", "PIER_TEST_HOST_ONLY"],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("arg: greet\n"), "{text}");
    assert!(text.contains("env GREETING=hi\n"), "{text}");
    assert!(
        text.contains("env PIER_TEST_HOST_ONLY unset\n"),
        "the host's environment stays out: {text}"
    );
    // `--env NAME` passes the host's value on, as wasmtime's does.
    let out = run_hello(
        cache.path(),
        &["--env", "PIER_TEST_HOST_ONLY", hello, "env", "PIER_TEST_HOST_ONLY"],
    );
    assert!(stdout(&out).contains("env PIER_TEST_HOST_ONLY=leak\n"), "{out:?}");
    // The `--` form still works, with pier's options after the component.
    let out = run_hello(cache.path(), &[hello, "--socket-limit", "8", "--", "--port", "1234"]);
    let text = stdout(&out);
    assert!(text.contains("arg: --port\n") && text.contains("arg: 1234\n"), "{text}");
}

#[test]
fn a_component_is_compiled_once_and_kept() {
    let cache = tempfile::tempdir().unwrap();
    let kept = cache.path().join("pier/components");
    // An entry is its code (`.cwasm`) and its record (`.sum`).
    let entries = || -> Vec<_> {
        std::fs::read_dir(&kept)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let hello = wasm("hello");
    let hello = hello.to_str().unwrap();
    let out = run_hello(cache.path(), &["--no-compile-cache", hello]);
    assert!(out.status.success(), "{out:?}");
    assert!(entries().is_empty(), "--no-compile-cache keeps nothing");
    let out = run_hello(cache.path(), &[hello]);
    assert!(out.status.success(), "{out:?}");
    let first = entries();
    assert_eq!(first.len(), 1, "one compiled component: {first:?}");
    // An entry is written to a new file and renamed into place, so a
    // rewrite shows as another inode (its time changes on every use: the
    // cache's bound removes the least recently used entries first).
    let written = std::fs::metadata(&first[0]).unwrap().ino();
    let out = run_hello(cache.path(), &[hello, "again"]);
    assert!(stdout(&out).contains("arg: again\n"), "the kept code runs: {out:?}");
    assert_eq!(entries(), first, "the second run adds nothing");
    assert_eq!(std::fs::metadata(&first[0]).unwrap().ino(), written, "nor rewrites it");
    // A damaged entry costs a compile, never the run.
    std::fs::write(&first[0], b"not machine code").unwrap();
    let out = run_hello(cache.path(), &[hello, "repaired"]);
    assert!(stdout(&out).contains("arg: repaired\n"), "{out:?}");
    assert!(std::fs::read(&first[0]).unwrap().len() > 1000, "the entry was written again");
}

/// `--max-memory` as a container's memory limit: past it the component
/// ends with 137 and says why; under it the same allocation runs.
#[test]
fn max_memory_ends_a_component_that_grows_past_it_with_137() {
    let cache = tempfile::tempdir().unwrap();
    let probe = wasm("probe");
    let probe = probe.to_str().unwrap();
    let out = run_hello(cache.path(), &["--max-memory", "16M", probe, "grow", "32"]);
    assert_eq!(out.status.code(), Some(137), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("out of memory") && said.contains("limit of 16777216 bytes"), "{said}");
    let out = run_hello(cache.path(), &["--max-memory", "64M", probe, "grow", "32"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("grew 32 MiB"), "{out:?}");
    let out = run_hello(cache.path(), &["--max-memory", "lots", probe, "grow", "1"]);
    assert_eq!(out.status.code(), Some(2), "a bad size is a usage error: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-memory"), "{out:?}");
}

/// The exit code a component asks for is `pier run`'s own, whole: WASI's
/// `exit-with-code`, not only the ok or err of `exit`, whether the app
/// calls `pier_rt::process::exit` or returns an `ExitCode` from `main`;
/// a trap is 134.
#[test]
fn a_components_exit_code_is_pier_runs() {
    exit_codes_are_pier_runs("hello");
}

/// The same for a WASI 0.3 component (`hello` built with pier-rt's
/// `wasi-0-3` feature), whose `run@0.3.0` returns only ok or err too.
#[test]
fn a_wasi_0_3_components_exit_code_is_pier_runs() {
    exit_codes_are_pier_runs("hello-wasi-0-3");
}

fn exit_codes_are_pier_runs(app: &str) {
    let cache = tempfile::tempdir().unwrap();
    let hello = wasm(app);
    let hello = hello.to_str().unwrap();
    for how in ["exit", "return"] {
        for code in [0, 1, 3, 42] {
            let out = run_hello(cache.path(), &[hello, how, &code.to_string()]);
            assert_eq!(out.status.code(), Some(code), "{how} {code}: {out:?}");
        }
    }
    let out = run_hello(cache.path(), &[hello, "panic"]);
    assert_eq!(out.status.code(), Some(134), "a trap is 128 + SIGABRT: {out:?}");
}

/// A component that imports an interface pier does not serve (here
/// `vsock:sockets/types@0.3.0`, a version that does not exist) fails at
/// start, before the socket is bound, with an error that names
/// the import and the packages pier does serve, not a trap when it first
/// calls the import.
#[test]
fn a_component_importing_an_unserved_package_fails_at_start_naming_it() {
    use wasm_encoder::{
        Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection,
        ComponentValType, InstanceType,
    };

    let dir = tempfile::tempdir().unwrap();
    let mut instance = InstanceType::new();
    instance.ty().function().params([] as [(&str, ComponentValType); 0]).result(None);
    instance.export("connect", ComponentTypeRef::Func(0));
    let mut types = ComponentTypeSection::new();
    types.instance(&instance);
    let mut imports = ComponentImportSection::new();
    imports.import("vsock:sockets/types@0.3.0", ComponentTypeRef::Instance(0));
    let mut component = Component::new();
    component.section(&types).section(&imports);
    let wasm = dir.path().join("unserved.wasm");
    std::fs::write(&wasm, component.finish()).unwrap();

    let uds = dir.path().join("vm.vsock");
    let out = pier().arg("run").arg("--uds").arg(&uds).arg(&wasm).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("vsock:sockets/types@0.3.0"), "the error names the import: {said}");
    assert!(said.contains("unserved.wasm"), "the error names the component: {said}");
    assert!(said.contains("vsock:sockets@0.2.0"), "the error says what pier serves: {said}");
    assert!(!uds.exists(), "nothing was bound for a component that cannot run");
}
