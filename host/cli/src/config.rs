//! The config file of `pier run --config FILE`: several components on one
//! vsock endpoint.
//!
//! ```toml
//! cid = 3                        # optional, default 3 (alias: guest_cid)
//! uds = "/run/pier/app.vsock"    # optional, default $XDG_RUNTIME_DIR/pier-<cid>.vsock (alias: uds_path)
//! wasi_tcp = false               # optional: loopback wasi:sockets TCP for every component
//!
//! [[component]]
//! name = "echo"                  # optional, default: the file name without .wasm
//! wasm = "echo.wasm"             # relative paths start at the config file's folder
//! args = ["--port", "1234"]      # optional
//! listen = ["1234"]              # optional: ports (or "*") it may bind and listen on
//! dirs = ["data::/data"]         # optional: host directories, HOST or HOST::GUEST
//! env = { RUST_LOG = "debug" }   # optional: environment variables
//! max_memory = "64M"             # optional: its linear memory's limit (bytes, K, M or G)
//!
//! [[component]]
//! wasm = "send-file.wasm"
//! args = ["--cid", "1", "--port", "1234"]
//! connect = ["1:1234"]           # optional: "CID:PORT" (either may be "*"), or "*"
//! ```
//!
//! Why a file format at all: several components share one CID only inside
//! one shim process, and a command line with per-component grants would be
//! unreadable. Unknown keys are errors, so a typo never silently drops a
//! grant.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use pier_shim::{ComponentSpec, ComponentStdio, ConnectGrant, Grants, PortGrant};
use serde::Deserialize;

/// Shown after `pier run --help`.
pub const HELP: &str = "\
CONFIG FILE (--config FILE), TOML:

  cid = 3                        # optional, default 3 (alias: guest_cid)
  uds = \"/run/pier/app.vsock\"    # optional (alias: uds_path)
  wasi_tcp = false               # optional

  [[component]]                  # one table per component
  name = \"echo\"                  # optional, default: the file stem
  wasm = \"echo.wasm\"             # relative to the config file's folder
  args = [\"--port\", \"1234\"]      # optional
  listen = [\"1234\"]              # optional: PORT or \"*\"
  connect = [\"1:1234\"]           # optional: CID:PORT (each may be \"*\") or \"*\"
  dirs = [\"data::/data\"]         # optional: host directories, HOST or HOST::GUEST
  env = { NAME = \"value\" }       # optional: environment variables
  max_memory = \"64M\"             # optional: linear memory limit; past it, exit 137

Components run side by side on one CID and reach each other over CID 1 or
that CID. The exit code is the first non-zero component exit code.

Grants deny by default: binding or listening on a port, or connecting to an
address, that was not granted fails with access-denied. \"*\" as a listen
grant covers ports above 1023 only; a privileged port must be named.";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `guest_cid` is Firecracker's name for it.
    #[serde(alias = "guest_cid")]
    pub cid: Option<u32>,
    /// `uds_path` is Firecracker's name for it.
    #[serde(alias = "uds_path")]
    pub uds: Option<PathBuf>,
    #[serde(default)]
    pub wasi_tcp: bool,
    #[serde(default, rename = "component")]
    component: Vec<ComponentEntry>,
    #[serde(skip)]
    dir: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComponentEntry {
    name: Option<String>,
    wasm: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    listen: Vec<String>,
    #[serde(default)]
    connect: Vec<String>,
    /// Host directories, `HOST` or `HOST::GUEST`; relative hosts are
    /// resolved against the config file's folder.
    #[serde(default)]
    dirs: Vec<String>,
    /// Environment variables, as a table of NAME = "VALUE".
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// The most linear memory it may hold, as `--max-memory` takes it.
    max_memory: Option<String>,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("in {}", path.display()))
    }

    pub(crate) fn parse(text: &str, dir: &Path) -> Result<Self> {
        let mut file: ConfigFile = toml::from_str(text)?;
        file.dir = dir.to_owned();
        if let Some(uds) = &file.uds {
            file.uds = Some(file.dir.join(uds));
        }
        Ok(file)
    }

    /// The components, with paths resolved and grants parsed.
    pub fn components(&self) -> Result<Vec<ComponentSpec>> {
        if self.component.is_empty() {
            bail!("no [[component]] tables");
        }
        self.component
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let wasm = self.dir.join(&c.wasm);
                let name = c.name.clone().unwrap_or_else(|| {
                    wasm.file_stem()
                        .map_or(format!("component-{i}"), |s| s.to_string_lossy().into_owned())
                });
                let listen = c
                    .listen
                    .iter()
                    .map(|g| g.parse::<PortGrant>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("component {name}: listen"))?;
                let connect = c
                    .connect
                    .iter()
                    .map(|g| g.parse::<ConnectGrant>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("component {name}: connect"))?;
                let dirs = c
                    .dirs
                    .iter()
                    .map(|d| {
                        d.parse::<pier_shim::Preopen>().map(|mut p| {
                            p.host = self.dir.join(&p.host);
                            p
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map_err(anyhow::Error::msg)
                    .with_context(|| format!("component {name}: dirs"))?;
                let memory_limit = c
                    .max_memory
                    .as_deref()
                    .map(|m| crate::size::parse_size("max_memory", m))
                    .transpose()
                    .with_context(|| format!("component {name}: max_memory"))?;
                Ok(ComponentSpec {
                    name,
                    wasm,
                    args: c.args.clone(),
                    env: c.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    grants: Grants { listen, connect },
                    dirs,
                    stdio: ComponentStdio::default(),
                    memory_limit,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let text = r#"
            cid = 7
            uds = "vm.vsock"
            [[component]]
            name = "echo"
            wasm = "echo.wasm"
            args = ["--port", "1234"]
            listen = ["1234"]
            [[component]]
            wasm = "apps/send-file.wasm"
            connect = ["1:1234", "*:80", "*"]
        "#;
        let file = ConfigFile::parse(text, Path::new("/etc/pier")).unwrap();
        assert_eq!(file.cid, Some(7));
        assert_eq!(file.uds.as_deref(), Some(Path::new("/etc/pier/vm.vsock")));
        let c = file.components().unwrap();
        assert_eq!(c[0].name, "echo");
        assert_eq!(c[0].wasm, Path::new("/etc/pier/echo.wasm"));
        assert_eq!(c[0].grants.listen, vec![PortGrant::Port(1234)]);
        assert_eq!(c[1].name, "send-file");
        assert_eq!(c[1].grants.connect.len(), 3);
    }

    /// Firecracker's key names work, and the help lists every key a
    /// component table accepts.
    #[test]
    fn firecracker_names_and_env_and_the_help_lists_every_key() {
        let text = r#"
            guest_cid = 9
            uds_path = "/run/vm.vsock"
            [[component]]
            wasm = "echo.wasm"
            env = { GREETING = "hi", MODE = "fast" }
        "#;
        let file = ConfigFile::parse(text, Path::new("/etc/pier")).unwrap();
        assert_eq!(file.cid, Some(9));
        assert_eq!(file.uds.as_deref(), Some(Path::new("/run/vm.vsock")));
        let c = file.components().unwrap();
        assert_eq!(
            c[0].env,
            vec![("GREETING".to_owned(), "hi".to_owned()), ("MODE".to_owned(), "fast".to_owned())]
        );
        for key in
            ["name", "wasm", "args", "listen", "connect", "dirs", "env", "cid", "uds", "wasi_tcp"]
        {
            assert!(HELP.contains(&format!("  {key} = ")), "the help lists {key}");
        }
    }

    #[test]
    fn rejects_typos_and_bad_grants() {
        let typo = "[[component]]\nwasm = \"a.wasm\"\nlisten_on = [\"1\"]\n";
        assert!(ConfigFile::parse(typo, Path::new(".")).is_err());
        let bad = "[[component]]\nwasm = \"a.wasm\"\nconnect = [\"2-5000\"]\n";
        let err = ConfigFile::parse(bad, Path::new(".")).unwrap().components().unwrap_err();
        assert!(format!("{err:#}").contains("2-5000"), "{err:#}");
        assert!(ConfigFile::parse("", Path::new(".")).unwrap().components().is_err());
    }
}
