//! Addresses: pier-stack's [`VsockAddr`] and `VMADDR_*` constants,
//! re-exported, so that an app, the shim and the bare-metal stack share one
//! type with one meaning, which two copies could not keep. Addresses are
//! plain data, so they live outside `platform` and apps can build them
//! without touching a socket.
//!
//! What pier-rt adds is [`VsockAddrExt`]: the constructors apps reach for,
//! as an extension trait because the type is pier-stack's. Printing
//! (`cid:port`, as socat writes it) comes with the type.

pub use pier_stack::{
    VMADDR_CID_ANY, VMADDR_CID_HOST, VMADDR_CID_HYPERVISOR, VMADDR_CID_LOCAL, VMADDR_PORT_ANY,
    VsockAddr,
};

/// The addresses apps name most, as constructors on [`VsockAddr`]
/// (`VsockAddr::any_cid(port)`, `VsockAddr::host(port)`): a listener and a
/// client each need one, and spelling out the CID constant every time
/// hides which of the two it is.
///
/// `VsockAddr::any()` (no port) is pier-stack's own: `VMADDR_CID_ANY` and
/// `VMADDR_PORT_ANY`, a free port on this side.
pub trait VsockAddrExt {
    /// `VMADDR_CID_ANY:port`: the usual address to listen on, reached
    /// however a peer addresses this side.
    fn any_cid(port: u32) -> Self;

    /// `VMADDR_CID_HOST:port`: the usual address to dial from a guest.
    fn host(port: u32) -> Self;
}

impl VsockAddrExt for VsockAddr {
    fn any_cid(port: u32) -> Self {
        Self::new(VMADDR_CID_ANY, port)
    }

    fn host(port: u32) -> Self {
        Self::new(VMADDR_CID_HOST, port)
    }
}
