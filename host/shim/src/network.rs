//! The `vsock:sockets/network` interface: the error codes, addresses and
//! `network` resource every other interface uses, and the error type
//! every binding returns.
//!
//! It is generated on its own, apart from the rest of the package
//! (`bindings`), because everything below the bindings speaks its types:
//! grant checks answer `access-denied`, the socket lifecycle returns error
//! codes. The rest of the package maps its resources to the socket types
//! built on those modules, and takes this interface from here.

use std::fmt;

use wasmtime::component::ResourceTableError;

pub use self::vsock::sockets::network::{ErrorCode, VsockAddress};

wasmtime::component::bindgen!({
    path: "../../wit",
    inline: "
        package pier:shim;

        /// Never linked: a function that fails with `error-code` is what
        /// makes bindgen give the type its `name`, `message`, `Display`
        /// and `Error`, as the whole package's bindings would.
        interface error-code-as-error {
            use vsock:sockets/network@0.1.0.{error-code};

            fails: func() -> result<_, error-code>;
        }

        world network-types {
            import vsock:sockets/network@0.1.0;
            import error-code-as-error;
        }
    ",
    world: "pier:shim/network-types",
    imports: { default: trappable },
    with: {
        "wasi": wasmtime_wasi::p2::bindings::sync,
        "vsock:sockets/network.network": crate::network::Network,
    },
    trappable_error_type: {
        "vsock:sockets/network.error-code" => VsockError,
    },
    require_store_data_send: true,
});

/// The `network` resource: the component's vsock capability. It carries
/// nothing itself; the grants live in the component's vsock context, and
/// a `borrow<network>` argument only proves the component was handed one.
#[derive(Debug)]
pub struct Network;

/// What a binding that returns `result<_, error-code>` fails with: either
/// an error code for the component, or a trap that ends it (a bad resource
/// handle, a broken permit rule).
///
/// It is our own type, not `wasmtime_wasi::TrappableError<ErrorCode>`,
/// because the orphan rule would not let us convert resource-table errors
/// into that one.
#[derive(Debug)]
pub enum VsockError {
    /// Returned to the component as `error-code`.
    Code(ErrorCode),
    /// Ends the component.
    Trap(wasmtime::Error),
}

impl VsockError {
    pub(crate) fn trap(msg: &str) -> Self {
        Self::Trap(wasmtime::format_err!("{msg}"))
    }
}

impl From<ErrorCode> for VsockError {
    fn from(code: ErrorCode) -> Self {
        Self::Code(code)
    }
}

impl From<ResourceTableError> for VsockError {
    fn from(e: ResourceTableError) -> Self {
        Self::Trap(e.into())
    }
}

impl From<wasmtime::Error> for VsockError {
    fn from(e: wasmtime::Error) -> Self {
        Self::Trap(e)
    }
}

impl fmt::Display for VsockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "vsock: {}", c.name()),
            Self::Trap(e) => write!(f, "trap: {e}"),
        }
    }
}

impl std::error::Error for VsockError {}

/// The error a vsock `input-stream` or `output-stream` carries in
/// `stream-error.last-operation-failed`; `network-error-code` finds it
/// again by downcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFailure(pub ErrorCode);

impl fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vsock: {}", self.0.name())
    }
}

impl std::error::Error for StreamFailure {}

impl From<VsockAddress> for pier_stack::VsockAddr {
    fn from(a: VsockAddress) -> Self {
        pier_stack::VsockAddr::new(a.cid, a.port)
    }
}

impl From<pier_stack::VsockAddr> for VsockAddress {
    fn from(a: pier_stack::VsockAddr) -> Self {
        VsockAddress { cid: a.cid, port: a.port }
    }
}
