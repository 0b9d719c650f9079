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
//! | `pier.dev/socket-limit` | the node's (1024 unless its config says) | how many sockets the component may hold at once; it can lower the node's limit, not raise it |
//! | `pier.dev/image-files` | none | `read-only`: the image's own files are the component's `/`, read-only (the container's mounts are its folders either way) |
//! | `pier.dev/socket` | `{container}.sock` | the hybrid vsock socket's file name in the Pod's folder on the node, `<root>/<namespace>/<pod>/` ([`crate::pod_folder`]); listeners for connections from the component are `<socket>_<port>` beside it |
//!
//! The socket's name may use `{container}` (the container's name under
//! Kubernetes, its id elsewhere), `{id}` (the container's id), and under
//! Kubernetes `{pod}` and `{pod-namespace}`. It is a file name and
//! nothing more: no `/`, so no annotation can name a path outside its own
//! Pod's folder. The folder is named by containerd, not by the Pod: under
//! Kubernetes the Pod's namespace and name (the kubelet's, from the CRI),
//! elsewhere the containerd namespace and the container's id. What the
//! grants may ask for is bounded by the node's policy
//! ([`crate::node_config`]). A value that does not parse, an unknown
//! `pier.dev/` key (a typo would otherwise grant nothing, silently) or a
//! socket name that is not a file name fails the container's create,
//! naming the annotation and the reason.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

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
/// The hybrid vsock socket's file name in the Pod's folder.
pub const SOCKET: &str = "pier.dev/socket";
/// How many sockets the component may hold at once.
pub const SOCKET_LIMIT: &str = "pier.dev/socket-limit";
/// Whether the image's own files are the component's `/`.
pub const IMAGE_FILES: &str = "pier.dev/image-files";
const KNOWN: [&str; 6] = [LISTEN, CONNECT, CID, SOCKET, SOCKET_LIMIT, IMAGE_FILES];

/// The socket's name when no annotation says: one per container of a Pod.
pub const DEFAULT_SOCKET: &str = "{container}.sock";

/// The longest socket path accepted. A Unix socket address holds 107
/// bytes and a NUL, and the bridge's other names add a suffix of up to
/// [`MAX_SUFFIX_LEN`] bytes (`_dgram_<port>`); a longer base would pass
/// here and fail when the bridge binds.
pub const MAX_SOCKET_PATH: usize = 107 - MAX_SUFFIX_LEN;

/// Kubernetes' CRI annotations the Pod's folder and the socket name's
/// variables come from. containerd's CRI plugin sets them from the
/// kubelet's sandbox and container config, after (and over) the Pod's own
/// annotations.
const CRI_POD: &str = "io.kubernetes.cri.sandbox-name";
const CRI_POD_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const CRI_CONTAINER: &str = "io.kubernetes.cri.container-name";

/// Where a component runs on its node and what it may do there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub cid: u32,
    /// The socket's file name in its Pod's folder.
    pub socket_name: String,
    pub grants: Grants,
    /// A lower socket limit than the node's, if the annotation asks.
    pub socket_limit: Option<usize>,
    /// The image's files are the component's `/`, read-only.
    pub image_files: bool,
}

/// The Pod a container belongs to, as its folder names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodName {
    /// The Kubernetes namespace, or containerd's outside Kubernetes.
    pub namespace: String,
    /// The Pod's name, or the container's id outside Kubernetes, where
    /// every container is a Pod of its own.
    pub name: String,
    /// Named by Kubernetes: the Pod's sandbox container owns the folder,
    /// made before and deleted after every other container of the Pod.
    pub kubernetes: bool,
}

impl PodName {
    /// The Pod of container `id` in containerd namespace `namespace`.
    pub fn of(annotations: &HashMap<String, String>, namespace: &str, id: &str) -> Self {
        match (annotations.get(CRI_POD_NAMESPACE), annotations.get(CRI_POD)) {
            (Some(namespace), Some(pod)) => {
                Self { namespace: namespace.clone(), name: pod.clone(), kubernetes: true }
            }
            _ => Self { namespace: namespace.to_owned(), name: id.to_owned(), kubernetes: false },
        }
    }

    /// Whether both names can be one folder each: Kubernetes' and
    /// containerd's naming rules already keep them so; this says so to
    /// the shim, which must not trust that.
    pub fn check(&self) -> Result<(), String> {
        for (what, name) in [("namespace", &self.namespace), ("Pod", &self.name)] {
            if !is_file_name(name) {
                return Err(format!("the {what} name {name:?} cannot be a folder's name"));
            }
        }
        Ok(())
    }
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

/// Reads the placement of container `id` from its annotations.
pub fn placement(
    annotations: &HashMap<String, String>,
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
    let socket_limit =
        match get(SOCKET_LIMIT) {
            None => None,
            Some(value) => {
                Some(value.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    invalid(SOCKET_LIMIT, value, "not a number of sockets above 0")
                })?)
            }
        };
    let image_files = match get(IMAGE_FILES) {
        None => false,
        Some("read-only") => true,
        Some(value) => {
            return Err(invalid(
                IMAGE_FILES,
                value,
                "the one value is read-only (or leave it out)",
            ));
        }
    };
    let template = get(SOCKET).unwrap_or(DEFAULT_SOCKET);
    let socket_name = socket_name(template, |name| match name {
        "id" => Some(id),
        "container" => Some(get(CRI_CONTAINER).unwrap_or(id)),
        "pod" => get(CRI_POD),
        "pod-namespace" => get(CRI_POD_NAMESPACE),
        _ => None,
    })
    .map_err(|why| invalid(SOCKET, template, why))?;
    Ok(Placement {
        cid,
        socket_name,
        grants: Grants { listen, connect },
        socket_limit,
        image_files,
    })
}

/// Why a socket at `path` could not be bound, if it could not: the
/// annotation is named, since the name it chose is part of the length.
pub fn check_socket_path(path: &Path) -> Result<(), AnnotationError> {
    let length = path.as_os_str().len();
    if length <= MAX_SOCKET_PATH {
        return Ok(());
    }
    Err(AnnotationError(format!(
        "annotation {SOCKET}: the socket {} is {length} bytes long; a socket path can be at most \
         {MAX_SOCKET_PATH} (a Unix socket address holds 107, and the other sockets add up to \
         {MAX_SUFFIX_LEN} bytes): choose a shorter name, or the operator a shorter socket root",
        path.display()
    )))
}

/// A name that is one entry of a folder: not empty, no `/` or NUL, and
/// not `.` or `..`.
fn is_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\0']) && name != "." && name != ".."
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

/// Fills in `{name}` variables and checks the result is a file name:
/// the socket lives in its Pod's folder and nowhere else.
fn socket_name<'a>(
    template: &str,
    vars: impl Fn(&str) -> Option<&'a str>,
) -> Result<String, String> {
    let mut name = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        name.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or("a '{' without its '}'")?;
        let variable = &after[..close];
        let value = vars(variable).ok_or_else(|| match variable {
            "pod" | "pod-namespace" => format!("{{{variable}}} is known only under Kubernetes"),
            _ => format!(
                "unknown variable {{{variable}}} (there are {{container}}, {{id}}, {{pod}} and \
                 {{pod-namespace}})"
            ),
        })?;
        if !is_file_name(value) {
            return Err(format!(
                "{{{variable}}} is {value:?}, which cannot be part of a file name"
            ));
        }
        name.push_str(value);
        rest = &after[close + 1..];
    }
    name.push_str(rest);
    if !is_file_name(&name) {
        return Err(format!(
            "the socket must be a file name in the Pod's own folder, not a path ({name:?} has a \
             '/', or is empty, '.' or '..'); the node's operator chooses where Pod folders are"
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn place(pairs: &[(&str, &str)]) -> Result<Placement, AnnotationError> {
        placement(&annotations(pairs), "web-1")
    }

    #[test]
    fn nothing_is_granted_by_default() {
        let p = place(&[("org.example/other", "x")]).unwrap();
        assert_eq!(p.grants, Grants::none());
        assert_eq!(p.cid, DEFAULT_CID);
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
        for bad in ["0", "-1", "many"] {
            let e = place(&[(SOCKET_LIMIT, bad)]).unwrap_err().to_string();
            assert!(e.starts_with("annotation pier.dev/socket-limit="), "{e}");
        }
        assert_eq!(place(&[(SOCKET_LIMIT, "16")]).unwrap().socket_limit, Some(16));
        let e = place(&[(IMAGE_FILES, "yes")]).unwrap_err().to_string();
        assert!(e.starts_with("annotation pier.dev/image-files=\"yes\""), "{e}");
        assert!(place(&[(IMAGE_FILES, "read-only")]).unwrap().image_files);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = place(&[("pier.dev/lsten", "1234")]).unwrap_err().to_string();
        assert!(e.contains("unknown annotation pier.dev/lsten"), "{e}");
        assert!(e.contains(LISTEN), "{e}");
    }

    #[test]
    fn socket_names_fill_in_variables() {
        assert_eq!(place(&[]).unwrap().socket_name, "web-1.sock", "the default is per container");
        let p = place(&[(SOCKET, "{id}-vsock")]).unwrap();
        assert_eq!(p.socket_name, "web-1-vsock");
        let p = place(&[
            (SOCKET, "{pod}-{container}.sock"),
            (CRI_POD, "web-7f9c"),
            (CRI_POD_NAMESPACE, "shop"),
            (CRI_CONTAINER, "echo"),
        ])
        .unwrap();
        assert_eq!(p.socket_name, "web-7f9c-echo.sock");
    }

    #[test]
    fn socket_names_that_are_paths_are_refused() {
        for (template, why) in [
            ("/run/pier/other.sock", "must be a file name in the Pod's own folder"),
            ("../other-pod/x.sock", "must be a file name"),
            ("..", "must be a file name"),
            ("sub/x.sock", "must be a file name"),
            ("{pod}.sock", "only under Kubernetes"),
            ("{pid}.sock", "unknown variable {pid}"),
            ("{id.sock", "without its '}'"),
        ] {
            let e = place(&[(SOCKET, template)]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("annotation pier.dev/socket={template:?}")), "{e}");
            assert!(e.contains(why), "{template}: {e}");
        }
    }

    #[test]
    fn variables_cannot_climb_out_of_the_folder() {
        let bad = annotations(&[(SOCKET, "{container}.sock"), (CRI_CONTAINER, "../etc")]);
        let e = placement(&bad, "x").unwrap_err().to_string();
        assert!(e.contains("cannot be part of a file name"), "{e}");
    }

    #[test]
    fn long_socket_paths_are_refused_naming_the_annotation() {
        assert_eq!(MAX_SOCKET_PATH, 90, "107 bytes less `_dgram_4294967295`");
        let at_limit = format!("/{}", "a".repeat(MAX_SOCKET_PATH - 1));
        assert!(check_socket_path(Path::new(&at_limit)).is_ok());
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH));
        let e = check_socket_path(Path::new(&long)).unwrap_err().to_string();
        assert!(e.starts_with("annotation pier.dev/socket") && e.contains("at most 90"), "{e}");
    }

    #[test]
    fn the_pod_comes_from_the_cri_or_is_the_container() {
        let k8s = annotations(&[(CRI_POD, "web-0"), (CRI_POD_NAMESPACE, "shop")]);
        assert_eq!(
            PodName::of(&k8s, "k8s.io", "abc"),
            PodName { namespace: "shop".into(), name: "web-0".into(), kubernetes: true }
        );
        assert_eq!(
            PodName::of(&annotations(&[]), "default", "abc"),
            PodName { namespace: "default".into(), name: "abc".into(), kubernetes: false }
        );
        let bad = PodName { namespace: "..".into(), name: "x".into(), kubernetes: false };
        assert!(bad.check().unwrap_err().contains("namespace name"));
    }
}
