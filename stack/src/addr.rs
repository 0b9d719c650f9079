//! Socket addresses: a context id (CID) and a port, as in `sockaddr_vm`.
//!
//! The wire carries CIDs as 64-bit fields whose top half must be zero; the
//! socket API keeps them 32-bit like Linux does, so an out-of-range CID is
//! caught once, at the edge, and never reaches a socket.

use core::fmt;

/// Any CID: used when binding to mean "whatever this stack's CID is".
pub const VMADDR_CID_ANY: u32 = u32::MAX;
/// The hypervisor.
pub const VMADDR_CID_HYPERVISOR: u32 = 0;
/// The local loopback CID: traffic to it never leaves the stack.
pub const VMADDR_CID_LOCAL: u32 = 1;
/// The host.
pub const VMADDR_CID_HOST: u32 = 2;
/// Any port: binding to it picks an ephemeral port.
pub const VMADDR_PORT_ANY: u32 = u32::MAX;
/// Ports at or below this are privileged; ephemeral ports start above it.
pub const LAST_RESERVED_PORT: u32 = 1023;

/// A vsock socket address, `struct sockaddr_vm`: a context id (the
/// machine) and a port on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsockAddr {
    /// The context id: which machine (2 is the host; each guest has its own,
    /// 3 or above).
    pub cid: u32,
    /// The port on that machine.
    pub port: u32,
}

impl VsockAddr {
    /// The address `cid:port`.
    pub const fn new(cid: u32, port: u32) -> Self {
        Self { cid, port }
    }

    /// Binding to this picks the local CID and an ephemeral port.
    pub const fn any() -> Self {
        Self::new(VMADDR_CID_ANY, VMADDR_PORT_ANY)
    }
}

impl fmt::Display for VsockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.cid, self.port)
    }
}
