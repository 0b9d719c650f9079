//! Fuzz target: the containerd shim's reading of a container's OCI
//! annotations (`host/containerd-shim/src/annotations.rs`, compiled here
//! from its own source: the shim's crate brings containerd's client, which
//! needs protoc and libseccomp to build). Whoever writes a Pod's
//! annotations is not trusted by the node.
//!
//! Input layout: the container id up to the first newline, then one
//! annotation per line. Each line's first character picks its key by its
//! code: one of pier's, one of the CRI's the shim reads, `pier.dev/` and
//! the rest of the line up to `=`, or the raw text up to `=`; the value is
//! what follows.
//!
//! Invariants, besides never panicking:
//! - an accepted placement's socket name is one file name (not empty, no
//!   `/` or NUL, not `.` or `..`), whatever the variables held;
//! - it is accepted only if every `pier.dev/` key is one pier reads;
//! - its CID is one the device takes, its socket limit above 0, and the
//!   image's files are the component's `/` exactly when the annotation
//!   says `read-only`;
//! - every grant prints as text that parses back to the same grant;
//! - a Pod name that passes its check is two file names, and a socket
//!   path passes its check exactly when it is short enough to bind;
//! - a refusal names the annotation.
#![no_main]

use std::collections::HashMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pier_shim::{ConnectGrant, GuestCid, PortGrant};

#[allow(dead_code)]
#[path = "../../host/containerd-shim/src/annotations.rs"]
mod annotations;

use annotations::{
    CID, CONNECT, IMAGE_FILES, LISTEN, MAX_SOCKET_PATH, PREFIX, PodName, SOCKET, SOCKET_LIMIT,
};

/// Keys an input line's first byte picks from.
const KEYS: [&str; 9] = [
    LISTEN,
    CONNECT,
    CID,
    SOCKET,
    SOCKET_LIMIT,
    IMAGE_FILES,
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.container-name",
];

const KNOWN: [&str; 6] = [LISTEN, CONNECT, CID, SOCKET, SOCKET_LIMIT, IMAGE_FILES];

fn is_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\0']) && name != "." && name != ".."
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let id = lines.next().unwrap_or_default();
    let mut map = HashMap::new();
    for line in lines {
        let mut chars = line.chars();
        let Some(pick) = chars.next() else { continue };
        let rest = chars.as_str();
        let (key, value) = match pick as usize % (KEYS.len() + 2) {
            i if i < KEYS.len() => (KEYS[i].to_owned(), rest),
            i => {
                let (name, value) = rest.split_once('=').unwrap_or((rest, ""));
                let key = if i == KEYS.len() { format!("{PREFIX}{name}") } else { name.to_owned() };
                (key, value)
            }
        };
        map.insert(key, value.to_owned());
    }

    let pod = PodName::of(&map, "k8s.io", id);
    if pod.check().is_ok() {
        assert!(is_file_name(&pod.namespace) && is_file_name(&pod.name), "{pod:?}");
    }
    match annotations::placement(&map, id) {
        Ok(p) => {
            assert!(is_file_name(&p.socket_name), "{:?}", p.socket_name);
            assert!(
                map.keys().filter(|k| k.starts_with(PREFIX)).all(|k| KNOWN.contains(&k.as_str()))
            );
            assert!(GuestCid::new(p.cid).is_ok(), "CID {}", p.cid);
            assert!(p.socket_limit.is_none_or(|n| n > 0));
            assert_eq!(p.image_files, map.get(IMAGE_FILES).is_some_and(|v| v == "read-only"));
            for grant in &p.grants.listen {
                assert_eq!(grant.to_string().parse::<PortGrant>().as_ref(), Ok(grant));
            }
            for grant in &p.grants.connect {
                assert_eq!(grant.to_string().parse::<ConnectGrant>().as_ref(), Ok(grant));
            }
            let path = Path::new("/run/pier/pods")
                .join(&pod.namespace)
                .join(&pod.name)
                .join(&p.socket_name);
            let fits = path.as_os_str().len() <= MAX_SOCKET_PATH;
            assert_eq!(annotations::check_socket_path(&path).is_ok(), fits, "{path:?}");
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("annotation"), "{message}");
        }
    }
});
