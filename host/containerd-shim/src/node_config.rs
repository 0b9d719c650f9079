//! The node's own configuration: where sockets live and the most a Pod
//! may be granted, written by the node's operator, not by a Pod's author.
//!
//! A Pod's annotations say what its component asks for; this file bounds
//! what any Pod of a namespace can get, so that the right to create Pods
//! is not the right to every vsock port and CID on the node. It is read
//! from [`DEFAULT_PATH`] (or the file [`PATH_VARIABLE`] names in the
//! shim's environment, which containerd passes on) at every container
//! create, so an edit applies to the next container without restarting
//! anything. A missing default file means the defaults below; a file that
//! exists but does not parse, names an unknown key, or that someone other
//! than the shim's user could have written fails the create, naming the
//! file: a config that does not say what the operator meant must not be
//! half applied.
//!
//! ```toml
//! [sockets]
//! root = "/run/pier"   # every Pod's folder is <root>/<namespace>/<pod>/
//! group = "pier"       # the folders' and sockets' group: a name or a number
//! mode = 0o750         # the Pod folders' mode; sockets get rw where it has x
//!
//! [policy.default]     # every namespace not listed below
//! listen = ["*"]       # ports a Pod may be granted to listen on
//! connect = []         # destinations it may be granted to connect to
//! cid = ["*"]          # CIDs pier.dev/cid may choose
//! socket_limit = 1024  # sockets a component may hold; pier.dev/socket-limit may lower it
//!
//! [policy.namespaces.shop]
//! listen = ["80", "*"]
//! connect = ["2:5000"] # keys left out take [policy.default]'s value
//! ```

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use pier_shim::{ConnectGrant, DEFAULT_SOCKET_LIMIT, GuestCid, PortGrant};
use serde::Deserialize;

use crate::annotations::{self, Placement};

/// Where the operator's file is when the environment names none.
pub const DEFAULT_PATH: &str = "/etc/pier/containerd-shim.toml";
/// The environment variable that names another file (containerd's own
/// environment reaches the shim it starts).
pub const PATH_VARIABLE: &str = "PIER_CONTAINERD_SHIM_CONFIG";
/// The node-wide socket root when the file names none.
pub const DEFAULT_SOCKET_ROOT: &str = "/run/pier";
/// Owner and group may enter a Pod's folder, others may not.
pub const DEFAULT_FOLDER_MODE: u32 = 0o750;

/// The node's configuration, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// The file it came from, for messages; None for the built-in defaults.
    pub source: Option<PathBuf>,
    pub sockets: SocketSettings,
    policy: Policy,
}

/// Where Pods' sockets live, and who may reach them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketSettings {
    pub root: PathBuf,
    /// The group of every Pod folder and socket; None keeps the shim's.
    pub group: Option<u32>,
    pub folder_mode: u32,
}

impl SocketSettings {
    /// A socket is connectable by whoever may enter its folder: `connect`
    /// needs write permission on the socket file, and nobody else can get
    /// to it.
    pub fn socket_mode(&self) -> u32 {
        let mut mode = 0o600;
        if self.folder_mode & 0o010 != 0 {
            mode |= 0o060;
        }
        if self.folder_mode & 0o001 != 0 {
            mode |= 0o006;
        }
        mode
    }
}

/// What Pods of each namespace may be granted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Policy {
    default: Bounds,
    namespaces: BTreeMap<String, Bounds>,
}

/// The most one namespace's Pods may be granted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Bounds {
    listen: Vec<PortGrant>,
    connect: Vec<ConnectGrant>,
    /// None is every CID.
    cids: Option<Vec<u32>>,
    /// The most sockets one component may hold at once.
    socket_limit: usize,
}

impl Bounds {
    /// Any port above 1023 on the container's own CID, whatever it is, and
    /// no outgoing connects: a service that serves the node, and reaches
    /// nothing it was not given.
    fn builtin() -> Self {
        Self {
            listen: vec![PortGrant::Any],
            connect: Vec::new(),
            cids: None,
            socket_limit: DEFAULT_SOCKET_LIMIT,
        }
    }

    fn covers_listen(&self, asked: PortGrant) -> bool {
        self.listen.iter().any(|bound| bound.covers(asked))
    }

    fn covers_connect(&self, asked: ConnectGrant) -> bool {
        self.connect.iter().any(|bound| bound.covers(asked))
    }

    fn covers_cid(&self, cid: u32) -> bool {
        self.cids.as_ref().is_none_or(|cids| cids.contains(&cid))
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            source: None,
            sockets: SocketSettings {
                root: PathBuf::from(DEFAULT_SOCKET_ROOT),
                group: None,
                folder_mode: DEFAULT_FOLDER_MODE,
            },
            policy: Policy { default: Bounds::builtin(), namespaces: BTreeMap::new() },
        }
    }
}

/// A config that cannot be used; the message names the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl NodeConfig {
    /// Reads the operator's file: the one the environment names, or
    /// [`DEFAULT_PATH`] if it exists, or else the defaults.
    pub fn load() -> Result<Self, ConfigError> {
        match std::env::var_os(PATH_VARIABLE) {
            Some(path) => Self::load_file(Path::new(&path), true),
            None => Self::load_file(Path::new(DEFAULT_PATH), false),
        }
    }

    /// Reads `path`; a missing file is the defaults unless `required`.
    pub fn load_file(path: &Path, required: bool) -> Result<Self, ConfigError> {
        let fail =
            |why: String| ConfigError(format!("the node's pier config {}: {why}", path.display()));
        let mut file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Self::default());
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        let meta = file.metadata().map_err(|e| fail(e.to_string()))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid || meta.mode() & 0o022 != 0 {
            return Err(fail(format!(
                "it belongs to uid {} with mode {:o}; pier reads it only when it belongs to the \
                 shim's user (uid {euid}) and no group or other user can write it",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| fail(e.to_string()))?;
        let mut config = Self::parse(&text).map_err(fail)?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parses and checks the file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let defaults = Self::default();
        let sockets = match file.sockets {
            None => defaults.sockets,
            Some(s) => {
                let root = s.root.map_or(defaults.sockets.root, PathBuf::from);
                if !root.is_absolute() {
                    return Err(format!("[sockets] root = {:?} must be absolute", root.display()));
                }
                let folder_mode = s.mode.unwrap_or(DEFAULT_FOLDER_MODE);
                if folder_mode & !0o777 != 0 || folder_mode & 0o700 != 0o700 {
                    return Err(format!(
                        "[sockets] mode = 0o{folder_mode:o} must be permission bits that give the \
                         owner rwx (0o700 to 0o777)"
                    ));
                }
                if folder_mode & 0o002 != 0 {
                    return Err(format!(
                        "[sockets] mode = 0o{folder_mode:o} lets every local user write in a Pod's \
                         folder and plant names in it"
                    ));
                }
                let group = s.group.map(GroupName::resolve).transpose()?;
                SocketSettings { root, group, folder_mode }
            }
        };
        let policy = match file.policy {
            None => defaults.policy,
            Some(p) => {
                let default = Bounds::from_entry(p.default.unwrap_or_default(), &Bounds::builtin())
                    .map_err(|e| format!("[policy.default] {e}"))?;
                let mut namespaces = BTreeMap::new();
                for (name, entry) in p.namespaces {
                    let bounds = Bounds::from_entry(entry, &default)
                        .map_err(|e| format!("[policy.namespaces.{name}] {e}"))?;
                    namespaces.insert(name, bounds);
                }
                Policy { default, namespaces }
            }
        };
        Ok(Self { source: None, sockets, policy })
    }

    /// Checks that the node lets Pods of `namespace` have what
    /// `placement` asks for; the refusal names the annotation and the
    /// policy entry that bounds it.
    /// Returns the socket limit the component gets: the annotation's, or
    /// the policy's.
    pub fn check_grants(&self, namespace: &str, placement: &Placement) -> Result<usize, String> {
        let (bounds, entry) = match self.policy.namespaces.get(namespace) {
            Some(bounds) => (bounds, format!("[policy.namespaces.{namespace}]")),
            None => (&self.policy.default, "[policy.default]".to_owned()),
        };
        let source = match &self.source {
            Some(path) => format!("the node's pier config {}", path.display()),
            None => "the node's built-in policy (no config file)".to_owned(),
        };
        let refuse = |annotation: &str, asked: String, key: &str, bound: String| {
            format!(
                "annotation {annotation} asks for {asked}, which {source} does not allow for \
                 namespace {namespace:?}: {entry} {key} = {bound}"
            )
        };
        for &asked in &placement.grants.listen {
            if !bounds.covers_listen(asked) {
                return Err(refuse(
                    annotations::LISTEN,
                    format!("{:?}", asked.to_string()),
                    "listen",
                    list_text(bounds.listen.iter().map(PortGrant::to_string)),
                ));
            }
        }
        for &asked in &placement.grants.connect {
            if !bounds.covers_connect(asked) {
                return Err(refuse(
                    annotations::CONNECT,
                    format!("{:?}", asked.to_string()),
                    "connect",
                    list_text(bounds.connect.iter().map(ConnectGrant::to_string)),
                ));
            }
        }
        if !bounds.covers_cid(placement.cid) {
            let allowed = match &bounds.cids {
                Some(cids) => list_text(cids.iter().map(u32::to_string)),
                None => "[\"*\"]".to_owned(),
            };
            return Err(refuse(annotations::CID, format!("CID {}", placement.cid), "cid", allowed));
        }
        match placement.socket_limit {
            Some(asked) if asked > bounds.socket_limit => Err(refuse(
                annotations::SOCKET_LIMIT,
                format!("{asked} sockets"),
                "socket_limit",
                bounds.socket_limit.to_string(),
            )),
            Some(asked) => Ok(asked),
            None => Ok(bounds.socket_limit),
        }
    }
}

fn list_text(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.map(|item| format!("{item:?}")).collect();
    format!("[{}]", items.join(", "))
}

impl Bounds {
    /// An entry's keys, each missing one taken from `fallback`.
    fn from_entry(entry: PolicyEntry, fallback: &Self) -> Result<Self, String> {
        let listen = match entry.listen {
            None => fallback.listen.clone(),
            Some(items) => parse_items(&items).map_err(|e| format!("listen: {e}"))?,
        };
        let connect = match entry.connect {
            None => fallback.connect.clone(),
            Some(items) => parse_items(&items).map_err(|e| format!("connect: {e}"))?,
        };
        let socket_limit = match entry.socket_limit {
            None => fallback.socket_limit,
            Some(0) => return Err("socket_limit = 0 would let no component open a socket".into()),
            Some(n) => n,
        };
        let cids = match entry.cid {
            None => fallback.cids.clone(),
            Some(items) => {
                let mut cids = Vec::new();
                for item in items {
                    match item {
                        CidItem::Text(text) if text == "*" => {
                            return Ok(Self { listen, connect, cids: None, socket_limit });
                        }
                        CidItem::Text(text) => cids.push(parse_cid(&text)?),
                        CidItem::Number(cid) => cids.push(parse_cid(&cid.to_string())?),
                    }
                }
                Some(cids)
            }
        };
        Ok(Self { listen, connect, cids, socket_limit })
    }
}

fn parse_cid(text: &str) -> Result<u32, String> {
    text.parse::<GuestCid>().map(GuestCid::get).map_err(|e| format!("cid: {e}"))
}

fn parse_items<T: std::str::FromStr>(items: &[String]) -> Result<Vec<T>, String>
where
    T::Err: fmt::Display,
{
    items.iter().map(|item| item.parse().map_err(|e| format!("{e}"))).collect()
}

/// A group as the operator writes it.
#[derive(Deserialize)]
#[serde(untagged)]
enum GroupName {
    Number(u32),
    Name(String),
}

impl GroupName {
    fn resolve(self) -> Result<u32, String> {
        match self {
            Self::Number(gid) => Ok(gid),
            Self::Name(name) => group_id(&name)
                .ok_or_else(|| format!("[sockets] group = {name:?}: no such group on this node")),
        }
    }
}

/// The id of group `name`, from the node's group database.
fn group_id(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and the buffer's length
    // is the one passed; the result points into `group` and `buffer`.
    let rc = unsafe {
        libc::getgrnam_r(name.as_ptr(), &mut group, buffer.as_mut_ptr(), buffer.len(), &mut found)
    };
    (rc == 0 && !found.is_null()).then_some(group.gr_gid)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    sockets: Option<SocketsEntry>,
    policy: Option<PolicyFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SocketsEntry {
    root: Option<String>,
    group: Option<GroupName>,
    mode: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    default: Option<PolicyEntry>,
    #[serde(default)]
    namespaces: BTreeMap<String, PolicyEntry>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyEntry {
    listen: Option<Vec<String>>,
    connect: Option<Vec<String>>,
    cid: Option<Vec<CidItem>>,
    socket_limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CidItem {
    Number(u32),
    Text(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use pier_shim::Grants;

    fn placement(listen: &[PortGrant], connect: &[ConnectGrant], cid: u32) -> Placement {
        Placement {
            cid,
            socket_name: "x.sock".into(),
            grants: Grants { listen: listen.to_vec(), connect: connect.to_vec() },
            socket_limit: None,
            image_files: false,
        }
    }

    #[test]
    fn the_builtin_policy_allows_unprivileged_listens_and_no_connects() {
        let config = NodeConfig::default();
        assert!(config.check_grants("any", &placement(&[PortGrant::Any], &[], 3)).is_ok());
        assert!(config.check_grants("any", &placement(&[PortGrant::Port(8080)], &[], 9)).is_ok());
        let e = config.check_grants("any", &placement(&[PortGrant::Port(80)], &[], 3)).unwrap_err();
        assert!(e.contains("annotation pier.dev/listen asks for \"80\""), "{e}");
        assert!(e.contains("built-in policy") && e.contains("[policy.default] listen"), "{e}");
        let e = config
            .check_grants(
                "any",
                &placement(&[], &[ConnectGrant { cid: Some(2), port: Some(5000) }], 3),
            )
            .unwrap_err();
        assert!(e.contains("annotation pier.dev/connect asks for \"2:5000\""), "{e}");
        assert!(e.contains("connect = []"), "{e}");
    }

    #[test]
    fn a_namespace_entry_bounds_its_pods_and_inherits_the_default() {
        let config = NodeConfig::parse(
            r#"
            [policy.default]
            listen = ["8080"]
            cid = [3]
            [policy.namespaces.shop]
            listen = ["80", "*"]
            connect = ["2:5000", "*:53"]
            "#,
        )
        .unwrap();
        let shop = |p: &Placement| config.check_grants("shop", p);
        assert!(shop(&placement(&[PortGrant::Port(80), PortGrant::Any], &[], 3)).is_ok());
        let dns = ConnectGrant { cid: Some(7), port: Some(53) };
        assert!(
            shop(&placement(&[], &[dns, ConnectGrant { cid: Some(2), port: Some(5000) }], 3))
                .is_ok()
        );
        // `2:*` asks for more than `2:5000` gives.
        let e = shop(&placement(&[], &[ConnectGrant { cid: Some(2), port: None }], 3)).unwrap_err();
        assert!(
            e.contains("asks for \"2:*\"") && e.contains("[policy.namespaces.shop] connect"),
            "{e}"
        );
        // The CID list came from the default entry.
        let e = shop(&placement(&[], &[], 4)).unwrap_err();
        assert!(
            e.contains("annotation pier.dev/cid asks for CID 4") && e.contains("cid = [\"3\"]"),
            "{e}"
        );
        // Other namespaces get the default entry: `*` is more than 8080.
        let e = config.check_grants("web", &placement(&[PortGrant::Any], &[], 3)).unwrap_err();
        assert!(
            e.contains("namespace \"web\"") && e.contains("[policy.default] listen = [\"8080\"]"),
            "{e}"
        );
    }

    #[test]
    fn a_socket_limit_may_be_lowered_but_not_raised() {
        let config = NodeConfig::parse("[policy.default]\nsocket_limit = 64\n").unwrap();
        let mut asking = placement(&[], &[], 3);
        assert_eq!(config.check_grants("any", &asking), Ok(64), "the policy's by default");
        asking.socket_limit = Some(16);
        assert_eq!(config.check_grants("any", &asking), Ok(16));
        asking.socket_limit = Some(65);
        let e = config.check_grants("any", &asking).unwrap_err();
        assert!(e.contains("annotation pier.dev/socket-limit asks for 65 sockets"), "{e}");
        assert!(e.contains("[policy.default] socket_limit = 64"), "{e}");
        assert_eq!(
            NodeConfig::default().check_grants("any", &placement(&[], &[], 3)),
            Ok(DEFAULT_SOCKET_LIMIT)
        );
        assert!(NodeConfig::parse("[policy.default]\nsocket_limit = 0\n").is_err());
    }

    #[test]
    fn socket_settings_parse_and_bad_ones_are_refused() {
        let config =
            NodeConfig::parse("[sockets]\nroot = \"/srv/pier\"\ngroup = 0\nmode = 0o755\n")
                .unwrap();
        assert_eq!(config.sockets.root, PathBuf::from("/srv/pier"));
        assert_eq!(config.sockets.group, Some(0));
        assert_eq!(config.sockets.socket_mode(), 0o666);
        assert_eq!(NodeConfig::default().sockets.socket_mode(), 0o660);
        assert_eq!(
            NodeConfig::parse("[sockets]\ngroup = \"root\"\n").unwrap().sockets.group,
            Some(0)
        );
        for (text, why) in [
            ("[sockets]\nroot = \"run/pier\"\n", "must be absolute"),
            ("[sockets]\nmode = 0o777\n", "every local user write"),
            ("[sockets]\nmode = 0o050\n", "give the owner rwx"),
            ("[sockets]\ngroup = \"no-such-group-here\"\n", "no such group"),
            ("[sockets]\nrot = \"/run\"\n", "unknown field `rot`"),
            ("[policy.default]\nlisten = [\"http\"]\n", "[policy.default] listen"),
            ("[policy.namespaces.a]\ncid = [2]\n", "[policy.namespaces.a] cid"),
        ] {
            let e = NodeConfig::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_config_file_others_could_write_is_not_loaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim.toml");
        std::fs::write(&path, "[sockets]\nroot = \"/srv/pier\"\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let config = NodeConfig::load_file(&path, true).unwrap();
        assert_eq!(config.sockets.root, PathBuf::from("/srv/pier"));
        assert_eq!(config.source.as_deref(), Some(path.as_path()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = NodeConfig::load_file(&path, true).unwrap_err().to_string();
        assert!(e.contains("no group or other user can write it"), "{e}");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(NodeConfig::load_file(&link, true).is_err(), "a symlink is not followed");
        let missing = dir.path().join("missing.toml");
        assert_eq!(NodeConfig::load_file(&missing, false).unwrap(), NodeConfig::default());
        assert!(NodeConfig::load_file(&missing, true).is_err());
    }
}
