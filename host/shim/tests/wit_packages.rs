//! The contract between the two `vsock:sockets` packages in `wit/`.
//!
//! `vsock:sockets@0.2.0` (WASI 0.3's async shape) promises three things
//! that a WIT parser alone does not check: every item carries
//! `@since(version = 0.2.0)`, every error code keeps the name and the
//! errno it has in 0.1.0 (less the three that only 0.1.0's two-phase
//! calls could return), and stream sockets wait by `async func` and move
//! bytes as `stream<u8>`. These tests parse both packages with the
//! `wit-parser` that matches the pinned wasmtime and hold the WIT to those
//! promises, so an edit that breaks one fails here rather than in a
//! component built against it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use wit_parser::{
    FunctionKind, Handle, InterfaceId, PackageId, Resolve, Stability, Type, TypeDefKind, TypeId,
};

fn wit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit")
}

/// Parses the package in `dir`, with the vendored `wasi:io` and
/// `wasi:clocks` of `wit/deps` for 0.1.0 (0.2.0 needs none).
fn parse(dir: &Path) -> (Resolve, PackageId) {
    let mut resolve = Resolve::default();
    let (package, _) = resolve
        .push_dir_with_deps(dir, wit_dir().join("deps"))
        .unwrap_or_else(|e| panic!("{} does not parse: {e:?}", dir.display()));
    (resolve, package)
}

fn interface(resolve: &Resolve, package: PackageId, name: &str) -> InterfaceId {
    *resolve.packages[package]
        .interfaces
        .get(name)
        .unwrap_or_else(|| panic!("package has no interface {name}"))
}

fn named_type(resolve: &Resolve, iface: InterfaceId, name: &str) -> TypeId {
    *resolve.interfaces[iface].types.get(name).unwrap_or_else(|| panic!("no type {name}"))
}

/// The cases of an enum with the errno names (`EINVAL`, ...) that their
/// docs give in parentheses.
fn error_codes(resolve: &Resolve, iface: InterfaceId) -> Vec<(String, BTreeSet<String>)> {
    let TypeDefKind::Enum(e) = &resolve.types[named_type(resolve, iface, "error-code")].kind else {
        panic!("error-code is not an enum");
    };
    e.cases
        .iter()
        .map(|case| (case.name.clone(), errnos(case.docs.contents.as_deref().unwrap_or(""))))
        .collect()
}

fn errnos(docs: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for group in docs.split('(').skip(1).filter_map(|s| s.split(')').next()) {
        for word in group.split(|c: char| !c.is_ascii_alphanumeric()) {
            if word.len() > 2
                && word.starts_with('E')
                && word.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            {
                found.insert(word.to_string());
            }
        }
    }
    found
}

fn since_0_2_0(what: &str, stability: &Stability, missing: &mut Vec<String>) {
    match stability {
        Stability::Stable { since, .. } if since.to_string() == "0.2.0" => {}
        other => missing.push(format!("{what}: {other:?}")),
    }
}

#[test]
fn every_item_of_vsock_sockets_0_2_0_is_marked_since_0_2_0() {
    let (resolve, package) = parse(&wit_dir().join("v0.2.0"));
    let pkg = &resolve.packages[package];
    assert_eq!(pkg.name.to_string(), "vsock:sockets@0.2.0");
    let mut missing = Vec::new();
    for (name, &iface) in &pkg.interfaces {
        let iface = &resolve.interfaces[iface];
        since_0_2_0(&format!("interface {name}"), &iface.stability, &mut missing);
        for (ty_name, &ty) in &iface.types {
            since_0_2_0(
                &format!("type {name}.{ty_name}"),
                &resolve.types[ty].stability,
                &mut missing,
            );
        }
        for (f_name, f) in &iface.functions {
            since_0_2_0(&format!("function {name}.{f_name}"), &f.stability, &mut missing);
        }
    }
    for (name, &world) in &pkg.worlds {
        since_0_2_0(&format!("world {name}"), &resolve.worlds[world].stability, &mut missing);
    }
    assert!(missing.is_empty(), "items without @since(version = 0.2.0):\n{}", missing.join("\n"));
    // The walk above saw something: the three socket resources and their
    // methods are in `types`.
    let types = &resolve.interfaces[interface(&resolve, package, "types")];
    for resource in ["stream-socket", "seqpacket-socket", "datagram-socket"] {
        assert!(types.types.contains_key(resource), "types has no {resource}");
    }
    assert!(types.functions.len() > 20, "types has only {} functions", types.functions.len());
}

#[test]
fn the_0_2_0_error_codes_are_those_of_0_1_0_with_the_same_errnos_less_the_two_phase_ones() {
    let (old, old_pkg) = parse(&wit_dir());
    let (new, new_pkg) = parse(&wit_dir().join("v0.2.0"));
    assert_eq!(old.packages[old_pkg].name.to_string(), "vsock:sockets@0.1.0");
    let old_codes = error_codes(&old, interface(&old, old_pkg, "network"));
    let new_codes = error_codes(&new, interface(&new, new_pkg, "types"));

    // An async call waits where a 0.1.0 call said would-block, and there
    // is no start/finish pair to get out of step.
    let two_phase_only = ["concurrency-conflict", "not-in-progress", "would-block"];
    let expected: Vec<_> =
        old_codes.iter().filter(|(name, _)| !two_phase_only.contains(&name.as_str())).collect();
    let expected_names: Vec<_> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let new_names: Vec<_> = new_codes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(new_names, expected_names, "0.2.0's error codes differ from 0.1.0's");

    for ((name, old_errnos), (_, new_errnos)) in expected.iter().zip(&new_codes) {
        assert_eq!(new_errnos, old_errnos, "error-code {name} names other errnos in 0.2.0");
    }
    // The comparison is not vacuous: most codes name their errno.
    let with_errno = new_codes.iter().filter(|(_, e)| !e.is_empty()).count();
    assert!(with_errno >= 14, "only {with_errno} error codes name an errno");
}

#[test]
fn a_0_2_0_stream_socket_connects_by_async_func_and_moves_bytes_as_streams() {
    let (resolve, package) = parse(&wit_dir().join("v0.2.0"));
    let types = &resolve.interfaces[interface(&resolve, package, "types")];
    let func = |name: &str| {
        types.functions.get(name).unwrap_or_else(|| panic!("types has no function {name}"))
    };
    let kind = |ty: &Type| match ty {
        Type::Id(id) => &resolve.types[*id].kind,
        other => panic!("{other:?} is not a compound type"),
    };
    let ok_of = |ty: &Type| match kind(ty) {
        TypeDefKind::Result(r) => r.ok,
        other => panic!("{other:?} is not a result"),
    };
    let is_stream_of = |ty: &Type, item: &dyn Fn(&Type) -> bool| matches!(kind(ty), TypeDefKind::Stream(Some(t)) if item(t));
    let is_future_of_result = |ty: &Type| matches!(kind(ty), TypeDefKind::Future(Some(t)) if matches!(kind(t), TypeDefKind::Result(_)));
    let stream_socket =
        named_type(&resolve, interface(&resolve, package, "types"), "stream-socket");
    // An owned handle to the resource, as a listener hands each
    // connection over.
    let is_stream_socket =
        |t: &Type| matches!(kind(t), TypeDefKind::Handle(Handle::Own(id)) if *id == stream_socket);

    let connect = func("[method]stream-socket.connect");
    assert!(matches!(connect.kind, FunctionKind::AsyncMethod(_)), "connect is {:?}", connect.kind);

    let listen = func("[method]stream-socket.listen");
    let accepted = ok_of(listen.result.as_ref().expect("listen returns"))
        .expect("listen's result carries a value");
    assert!(
        is_stream_of(&accepted, &is_stream_socket),
        "listen does not return stream<stream-socket>"
    );

    let send = func("[method]stream-socket.send");
    let data = &send.params.last().expect("send takes data").ty;
    assert!(is_stream_of(data, &|t| *t == Type::U8), "send does not take a stream<u8>");
    assert!(
        is_future_of_result(send.result.as_ref().expect("send returns")),
        "send returns no future"
    );

    let receive = func("[method]stream-socket.receive");
    let TypeDefKind::Tuple(parts) = kind(receive.result.as_ref().expect("receive returns")) else {
        panic!("receive does not return a tuple");
    };
    assert_eq!(parts.types.len(), 2);
    assert!(is_stream_of(&parts.types[0], &|t| *t == Type::U8), "receive gives no stream<u8>");
    assert!(is_future_of_result(&parts.types[1]), "receive gives no future of how the peer ended");
}
