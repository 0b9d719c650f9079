//! Capabilities: which vsock ports a component may bind and listen on, and
//! which `(cid, port)` pairs it may dial or send datagrams to.
//!
//! Everything is denied unless granted. The host writes grants as short
//! strings, the same on the command line and in config files:
//!
//! | grant | kind | allows |
//! |---|---|---|
//! | `1234` | listen | binding and listening on port 1234 (even a privileged one) |
//! | `*` | listen | every port above 1023 |
//! | `2:5000` | connect | connecting (or sending datagrams) to CID 2, port 5000 |
//! | `*:80` | connect | port 80 on any CID |
//! | `3:*` | connect | any port on CID 3 |
//! | `*` | connect | anything |
//!
//! Why privileged ports need an explicit grant: the WIT promises that a
//! port at or below 1023 is only bound "with the right to", as Linux asks
//! for `CAP_NET_BIND_SERVICE`; a wildcard is too easy to hand out for that.
//!
//! CIDs are matched as the component wrote them, after one normalisation
//! the stack also makes: a datagram to `VMADDR_CID_ANY` goes to this side's
//! own CID. `1:1234` (the local CID) and `3:1234` (the shim's own CID) are
//! different grants even though both reach the same socket, so a host can
//! tell which one a component is meant to use.
//!
//! A component's calls are checked through [`ComponentGrants`], which
//! knows whose grants they are: every denial is logged at `warn`, naming
//! the component, the operation and the address, and counted for
//! `pier run --stats`. A component sees only `access-denied`; the log tells
//! the person running it which grant is missing.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pier_stack::VsockAddr;

use crate::network::ErrorCode;

/// The highest privileged port.
const LAST_PRIVILEGED_PORT: u32 = 1023;
/// `VMADDR_PORT_ANY` and `VMADDR_CID_ANY`: never a real port or CID.
const ANY: u32 = u32::MAX;

/// A listen grant: one port, or every unprivileged port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortGrant {
    /// `*`: every port above 1023.
    Any,
    /// One port, privileged or not.
    Port(u32),
}

impl PortGrant {
    fn allows(self, port: u32) -> bool {
        match self {
            Self::Any => port > LAST_PRIVILEGED_PORT && port != ANY,
            Self::Port(p) => p == port,
        }
    }

    /// Whether everything `other` grants, this grants too: how a node's
    /// policy bounds the grants a deployment asks for.
    pub fn covers(self, other: Self) -> bool {
        match other {
            Self::Any => self == Self::Any,
            Self::Port(port) => self.allows(port),
        }
    }
}

/// A connect grant: a CID and a port, each of which may be `*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectGrant {
    /// `None` is `*`: any CID.
    pub cid: Option<u32>,
    /// `None` is `*`: any port.
    pub port: Option<u32>,
}

impl ConnectGrant {
    /// `*`: every destination.
    pub const ANY: Self = Self { cid: None, port: None };

    fn allows(self, addr: VsockAddr) -> bool {
        self.cid.is_none_or(|c| c == addr.cid) && self.port.is_none_or(|p| p == addr.port)
    }

    /// Whether every destination `other` grants, this grants too (a `*`
    /// is covered only by a `*`).
    pub fn covers(self, other: Self) -> bool {
        let part = |mine: Option<u32>, theirs: Option<u32>| mine.is_none() || mine == theirs;
        part(self.cid, other.cid) && part(self.port, other.port)
    }
}

/// What one component may do. The default grants nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Ports it may bind and listen on (stream, seqpacket and datagram).
    pub listen: Vec<PortGrant>,
    /// Destinations it may connect to or send datagrams to.
    pub connect: Vec<ConnectGrant>,
}

impl Grants {
    /// Grants nothing: every bind to a port, listen and connect is denied.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether the component may bind or listen on `port`.
    pub fn may_listen(&self, port: u32) -> bool {
        self.listen.iter().any(|g| g.allows(port))
    }

    /// Whether the component may connect or send to `addr`.
    pub fn may_connect(&self, addr: VsockAddr) -> bool {
        self.connect.iter().any(|g| g.allows(addr))
    }
}

/// What the person running a component writes to grant it something, so
/// that a denial's log line names the exact setting that is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantNames {
    /// The listen grant's name: `--listen` for `pier run`.
    pub listen: &'static str,
    /// The connect grant's name: `--connect` for `pier run`.
    pub connect: &'static str,
}

impl GrantNames {
    /// `pier run`'s options (the config file's keys carry the same names).
    pub const PIER_RUN: Self = Self { listen: "--listen", connect: "--connect" };
}

impl Default for GrantNames {
    fn default() -> Self {
        Self::PIER_RUN
    }
}

/// One component's grants, checked in its name.
#[derive(Debug)]
pub(crate) struct ComponentGrants {
    component: Arc<str>,
    grants: Grants,
    names: GrantNames,
    denials: AtomicU64,
}

impl ComponentGrants {
    pub(crate) fn new(component: &str, grants: Grants, names: GrantNames) -> Arc<Self> {
        Arc::new(Self { component: component.into(), grants, names, denials: AtomicU64::new(0) })
    }

    /// Calls denied so far.
    pub(crate) fn denials(&self) -> u64 {
        self.denials.load(Ordering::Relaxed)
    }

    /// Allows `operation` (bind, listen) on local `port`, or logs and
    /// counts the denial.
    pub(crate) fn check_listen(&self, operation: &str, port: u32) -> Result<(), ErrorCode> {
        if self.grants.may_listen(port) {
            return Ok(());
        }
        self.denials.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            component = %self.component,
            operation,
            port,
            "{}: {operation} on port {port} denied: no {} grant covers it",
            self.component,
            self.names.listen
        );
        Err(ErrorCode::AccessDenied)
    }

    /// Allows `operation` (connect, send) to `addr`, or logs and counts
    /// the denial.
    pub(crate) fn check_connect(&self, operation: &str, addr: VsockAddr) -> Result<(), ErrorCode> {
        if self.grants.may_connect(addr) {
            return Ok(());
        }
        self.denials.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            component = %self.component,
            operation,
            cid = addr.cid,
            port = addr.port,
            "{}: {operation} to {}:{} denied: no {} grant covers it",
            self.component,
            addr.cid,
            addr.port,
            self.names.connect
        );
        Err(ErrorCode::AccessDenied)
    }

    /// Whether the component may listen on `port`, without a denial: for
    /// deciding which datagrams it receives.
    pub(crate) fn may_listen(&self, port: u32) -> bool {
        self.grants.may_listen(port)
    }

    /// Whether the component may reach `addr`, without a denial: for
    /// deciding which datagrams it receives.
    pub(crate) fn may_connect(&self, addr: VsockAddr) -> bool {
        self.grants.may_connect(addr)
    }
}

/// Why a grant string was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantError(String);

impl fmt::Display for GrantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GrantError {}

fn number(text: &str, what: &str, whole: &str) -> Result<u32, GrantError> {
    let bad = || GrantError(format!("{whole:?}: {what} must be a number below 4294967295 or *"));
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u32>() {
        Ok(n) if n != ANY => Ok(n),
        _ => Err(bad()),
    }
}

fn wildcard(text: &str, what: &str, whole: &str) -> Result<Option<u32>, GrantError> {
    if text == "*" { Ok(None) } else { number(text, what, whole).map(Some) }
}

impl FromStr for PortGrant {
    type Err = GrantError;

    /// `1234` or `*`.
    fn from_str(s: &str) -> Result<Self, GrantError> {
        let s = s.trim();
        Ok(match wildcard(s, "the port", s)? {
            None => Self::Any,
            Some(p) => Self::Port(p),
        })
    }
}

impl FromStr for ConnectGrant {
    type Err = GrantError;

    /// `CID:PORT` (each may be `*`), or `*` alone.
    fn from_str(s: &str) -> Result<Self, GrantError> {
        let s = s.trim();
        if s == "*" {
            return Ok(Self::ANY);
        }
        let (cid, port) = s
            .split_once(':')
            .ok_or_else(|| GrantError(format!("{s:?}: expected CID:PORT or *")))?;
        Ok(Self { cid: wildcard(cid, "the CID", s)?, port: wildcard(port, "the port", s)? })
    }
}

impl fmt::Display for PortGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Port(p) => write!(f, "{p}"),
        }
    }
}

impl fmt::Display for ConnectGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |v: Option<u32>| v.map_or_else(|| "*".to_owned(), |n| n.to_string());
        if *self == Self::ANY {
            return f.write_str("*");
        }
        write!(f, "{}:{}", part(self.cid), part(self.port))
    }
}
