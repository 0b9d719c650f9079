//! Placement and grants from the container's OCI annotations.
//!
//! Whoever deploys a component decides what it may do, not the image it
//! comes in: an image's own config (its environment, its labels) is
//! written by the component's author, so grants come only from the OCI
//! runtime spec's annotations, which `ctr run --annotation` sets and
//! Kubernetes passes on from a Pod's annotations (containerd's
//! `pod_annotations` setting for the runtime). Everything is denied unless
//! granted, as under `pier run`.
//!
//! | annotation | default | meaning |
//! |---|---|---|
//! | `pier.dev/listen` | nothing | ports the component may bind and listen on: `1234`, `*` (every port above 1023), a list separated by commas or spaces |
//! | `pier.dev/connect` | nothing | destinations it may connect or send to: `2:5000`, `*:80`, `3:*`, `*`, a list |
//! | `pier.dev/cid` | 3 | the CID the component's endpoint has |
//! | `pier.dev/socket` | `/run/pier/{namespace}/{id}.sock` | the hybrid vsock socket on the node; listeners for connections from the component are `<socket>_<port>` beside it |
//!
//! The socket path may use `{id}` (the container's id) and `{namespace}`
//! (its containerd namespace), and under Kubernetes `{pod}`,
//! `{pod-namespace}` and `{container}`, so one Deployment's replicas each
//! get their own socket. A value that does not parse, an unknown
//! `pier.dev/` key (a typo would otherwise grant nothing, silently) or a
//! socket path that is relative or too long fails the container's create,
//! naming the annotation and the reason.

use std::collections::HashMap;
use std::fmt;
use std::path::{Component, PathBuf};

use pier_hybrid::paths::MAX_SUFFIX_LEN;
use pier_shim::{ConnectGrant, DEFAULT_CID, Grants, GuestCid, PortGrant};

/// Every annotation pier reads starts with this.
pub const PREFIX: &str = "pier.dev/";
/// Ports the component may listen on.
pub const LISTEN: &str = "pier.dev/listen";
/// Destinations the component may connect to.
pub const CONNECT: &str = "pier.dev/connect";
/// The endpoint's CID.
pub const CID: &str = "pier.dev/cid";
/// The hybrid vsock socket's path on the node.
pub const SOCKET: &str = "pier.dev/socket";
const KNOWN: [&str; 4] = [LISTEN, CONNECT, CID, SOCKET];

/// Where the socket goes when no annotation says.
pub const DEFAULT_SOCKET: &str = "/run/pier/{namespace}/{id}.sock";

/// The longest socket path accepted. A Unix socket address holds 107
/// bytes and a NUL, and the bridge's other names add a suffix of up to
/// [`MAX_SUFFIX_LEN`] bytes (`_dgram_<port>`); a longer base would pass
/// here and fail when the bridge binds.
pub const MAX_SOCKET_PATH: usize = 107 - MAX_SUFFIX_LEN;

/// Kubernetes' CRI annotations the socket path's variables come from.
const CRI_POD: &str = "io.kubernetes.cri.sandbox-name";
const CRI_POD_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const CRI_CONTAINER: &str = "io.kubernetes.cri.container-name";

/// Where a component runs on its node and what it may do there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub cid: u32,
    pub socket: PathBuf,
    pub grants: Grants,
}

/// An annotation that cannot be used; its message names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnotationError(String);

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnnotationError {}

fn invalid(key: &str, value: &str, why: impl fmt::Display) -> AnnotationError {
    AnnotationError(format!("annotation {key}={value:?}: {why}"))
}

/// Reads the placement of container `id` in containerd namespace
/// `namespace` from its annotations.
pub fn placement(
    annotations: &HashMap<String, String>,
    namespace: &str,
    id: &str,
) -> Result<Placement, AnnotationError> {
    let mut unknown: Vec<&str> = annotations
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with(PREFIX) && !KNOWN.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(AnnotationError(format!(
            "unknown annotation {} (pier reads {})",
            unknown.join(", "),
            KNOWN.join(", ")
        )));
    }
    let get = |key: &str| annotations.get(key).map(String::as_str);
    let listen = list::<PortGrant>(LISTEN, get(LISTEN))?;
    let connect = list::<ConnectGrant>(CONNECT, get(CONNECT))?;
    let cid = match get(CID) {
        None => DEFAULT_CID,
        Some(value) => parse_cid(value).map_err(|why| invalid(CID, value, why))?,
    };
    let template = get(SOCKET).unwrap_or(DEFAULT_SOCKET);
    let socket = socket_path(template, |name| match name {
        "id" => Some(id),
        "namespace" => Some(namespace),
        "pod" => get(CRI_POD),
        "pod-namespace" => get(CRI_POD_NAMESPACE),
        "container" => get(CRI_CONTAINER),
        _ => None,
    })
    .map_err(|why| invalid(SOCKET, template, why))?;
    Ok(Placement { cid, socket, grants: Grants { listen, connect } })
}

/// A list of grants separated by commas, spaces or both; an absent or
/// empty value grants nothing.
fn list<T: std::str::FromStr>(key: &str, value: Option<&str>) -> Result<Vec<T>, AnnotationError>
where
    T::Err: fmt::Display,
{
    let Some(value) = value else { return Ok(Vec::new()) };
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
        .map(|item| item.parse().map_err(|e| invalid(key, value, e)))
        .collect()
}

/// The CID rule is the device's own ([`GuestCid`]), so the message is
/// the one `pier run --cid` gives.
fn parse_cid(value: &str) -> Result<u32, String> {
    value.trim().parse::<GuestCid>().map(GuestCid::get).map_err(|e| e.to_string())
}

/// Fills in `{name}` variables and checks the result can be a socket
/// that nothing outside its folder decides: absolute, no `..`, short
/// enough for a Unix socket address.
fn socket_path<'a>(
    template: &str,
    vars: impl Fn(&str) -> Option<&'a str>,
) -> Result<PathBuf, String> {
    let mut path = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        path.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or("a '{' without its '}'")?;
        let name = &after[..close];
        let value = vars(name).ok_or_else(|| match name {
            "pod" | "pod-namespace" | "container" => {
                format!("{{{name}}} is known only under Kubernetes")
            }
            _ => format!(
                "unknown variable {{{name}}} (there are {{id}}, {{namespace}}, {{pod}}, \
                 {{pod-namespace}} and {{container}})"
            ),
        })?;
        if value.is_empty() || value.contains(['/', '\0']) || value == ".." || value == "." {
            return Err(format!("{{{name}}} is {value:?}, which cannot be part of a path"));
        }
        path.push_str(value);
        rest = &after[close + 1..];
    }
    path.push_str(rest);
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err("the socket path must be absolute".into());
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err("the socket path must not contain '..'".into());
    }
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(format!(
            "{} is {} bytes long; a socket path can be at most {MAX_SOCKET_PATH} (a Unix socket \
             address holds 107, and the other sockets add up to {MAX_SUFFIX_LEN} bytes)",
            path.display(),
            path.as_os_str().len()
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn place(pairs: &[(&str, &str)]) -> Result<Placement, AnnotationError> {
        placement(&annotations(pairs), "default", "web-1")
    }

    #[test]
    fn nothing_is_granted_by_default() {
        let p = place(&[("org.example/other", "x")]).unwrap();
        assert_eq!(p.grants, Grants::none());
        assert_eq!(p.cid, DEFAULT_CID);
        assert_eq!(p.socket, PathBuf::from("/run/pier/default/web-1.sock"));
    }

    #[test]
    fn lists_take_commas_and_spaces() {
        let p = place(&[(LISTEN, "1234, 80 *"), (CONNECT, "2:5000,*:80"), (CID, "7")]).unwrap();
        assert_eq!(p.grants.listen, [PortGrant::Port(1234), PortGrant::Port(80), PortGrant::Any]);
        assert_eq!(
            p.grants.connect,
            [
                ConnectGrant { cid: Some(2), port: Some(5000) },
                ConnectGrant { cid: None, port: Some(80) }
            ]
        );
        assert_eq!(p.cid, 7);
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let e = place(&[(LISTEN, "1234,http")]).unwrap_err().to_string();
        assert!(e.starts_with("annotation pier.dev/listen=\"1234,http\": \"http\""), "{e}");
        let e = place(&[(CID, "2")]).unwrap_err().to_string();
        assert!(e.contains("pier.dev/cid") && e.contains("reserved"), "{e}");
        let e = place(&[(CID, "three")]).unwrap_err().to_string();
        assert!(e.contains("not a CID"), "{e}");
        let e = place(&[(CONNECT, "2")]).unwrap_err().to_string();
        assert!(e.starts_with("annotation pier.dev/connect="), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = place(&[("pier.dev/lsten", "1234")]).unwrap_err().to_string();
        assert!(e.contains("unknown annotation pier.dev/lsten"), "{e}");
        assert!(e.contains(LISTEN), "{e}");
    }

    #[test]
    fn socket_paths_fill_in_variables() {
        let p = place(&[(SOCKET, "/srv/{namespace}/{id}")]).unwrap();
        assert_eq!(p.socket, PathBuf::from("/srv/default/web-1"));
        let p = place(&[
            (SOCKET, "/run/pier/{pod-namespace}/{pod}-{container}.sock"),
            (CRI_POD, "web-7f9c"),
            (CRI_POD_NAMESPACE, "shop"),
            (CRI_CONTAINER, "echo"),
        ])
        .unwrap();
        assert_eq!(p.socket, PathBuf::from("/run/pier/shop/web-7f9c-echo.sock"));
    }

    #[test]
    fn socket_paths_that_cannot_work_are_refused() {
        for (template, why) in [
            ("run/pier.sock", "absolute"),
            ("/run/../etc/x", ".."),
            ("/run/{pod}.sock", "only under Kubernetes"),
            ("/run/{pid}.sock", "unknown variable {pid}"),
            ("/run/{id.sock", "without its '}'"),
        ] {
            let e = place(&[(SOCKET, template)]).unwrap_err().to_string();
            assert!(e.contains(why), "{template}: {e}");
        }
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH));
        let e = place(&[(SOCKET, &long)]).unwrap_err().to_string();
        assert!(e.contains(&format!("at most {MAX_SOCKET_PATH}")), "{e}");
        assert_eq!(MAX_SOCKET_PATH, 90, "107 bytes less `_dgram_4294967295`");
        let at_limit = format!("/{}", "a".repeat(MAX_SOCKET_PATH - 1));
        assert!(place(&[(SOCKET, &at_limit)]).is_ok());
    }

    #[test]
    fn variables_cannot_climb_out_of_the_folder() {
        let bad = annotations(&[(SOCKET, "/run/{pod}.sock"), (CRI_POD, "../etc")]);
        let e = placement(&bad, "k8s.io", "x").unwrap_err().to_string();
        assert!(e.contains("cannot be part of a path"), "{e}");
    }
}
