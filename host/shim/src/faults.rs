//! Faults a test sets off in a running shim, to check that components and
//! host programs live through what a real guest's vsock can suffer: its
//! driver restarting (a guest that unbinds and binds its driver again) and
//! the device's TRANSPORT_RESET (what a VM gets once its snapshot is
//! restored). Nothing in normal running calls these; `pier run` exposes
//! them only through a hidden testing option.

use std::sync::Arc;

use anyhow::{Context, Result};

use crate::net::GuestEndpoint;

/// One fault [`FaultInjector::inject`] can set off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The guest's driver resets the device and a new driver sets it up
    /// under the same stack: every connection fails with connection-reset
    /// on both sides, listeners and datagram sockets stay.
    DriverRestart,
    /// The device sends the driver a TRANSPORT_RESET on the same CID: the
    /// same end for connections, with the driver kept.
    TransportReset,
}

/// Sets off [`Fault`]s in a running shim, from any thread.
#[derive(Clone)]
pub struct FaultInjector {
    pub(crate) net: Arc<GuestEndpoint>,
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjector").finish_non_exhaustive()
    }
}

impl FaultInjector {
    pub fn inject(&self, fault: Fault) -> Result<()> {
        match fault {
            Fault::DriverRestart => self.net.restart_driver().context("restarting the driver"),
            Fault::TransportReset => {
                self.net.reset_transport().context("asking the device for a TRANSPORT_RESET")
            }
        }
    }
}
