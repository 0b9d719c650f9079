//! Addresses are plain data shared by every backend, so they live outside
//! `backend` and apps can build them without touching a socket.

use std::fmt;

/// Bind to any local CID (`VMADDR_CID_ANY`).
pub const VMADDR_CID_ANY: u32 = 0xffff_ffff;
/// The hypervisor's reserved CID (`VMADDR_CID_HYPERVISOR`).
pub const VMADDR_CID_HYPERVISOR: u32 = 0;
/// Loopback to this side of the transport (`VMADDR_CID_LOCAL`).
pub const VMADDR_CID_LOCAL: u32 = 1;
/// The host (`VMADDR_CID_HOST`).
pub const VMADDR_CID_HOST: u32 = 2;
/// Bind to any free port; the stack picks one above 1023
/// (`VMADDR_PORT_ANY`).
pub const VMADDR_PORT_ANY: u32 = 0xffff_ffff;

/// A vsock socket address: a context ID (which machine) and a port.
///
/// The counterpart of `struct sockaddr_vm` and of std's `SocketAddr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsockAddr {
    /// Context identifier; see the `VMADDR_CID_*` constants.
    pub cid: u32,
    /// Port number; ports up to 1023 are privileged.
    pub port: u32,
}

impl VsockAddr {
    /// An address from its two parts.
    pub const fn new(cid: u32, port: u32) -> Self {
        Self { cid, port }
    }

    /// `VMADDR_CID_ANY:port`: the usual address to listen on.
    pub const fn any(port: u32) -> Self {
        Self::new(VMADDR_CID_ANY, port)
    }

    /// `VMADDR_CID_HOST:port`: the usual address to dial from a guest.
    pub const fn host(port: u32) -> Self {
        Self::new(VMADDR_CID_HOST, port)
    }
}

/// Prints `cid:port`, the form Linux tools (socat's `VSOCK-CONNECT:cid:port`)
/// use.
impl fmt::Display for VsockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.cid, self.port)
    }
}
