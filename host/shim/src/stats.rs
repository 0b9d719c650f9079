//! What `pier run --stats` (and SIGUSR1) prints: every counter of the
//! chain, gathered from the threads that own them, as one report.
//!
//! Each layer counts what it alone sees: the components' grants and
//! quotas here, the guest stack and driver under the guest's lock, the
//! device's endpoint, host stack and bridge on the device thread, the
//! capture on its writer. [`Monitor::stats`] collects a copy of each;
//! nothing is counted twice and nothing is added to a hot path to make the
//! report possible.
//!
//! The report is for people: totals first, then only the drop, reset and
//! refusal reasons that happened (a reason that never happened is noise).

use std::fmt;
use std::sync::Arc;

use pier_device::report::{indented, nonzero};
use pier_device::{CaptureHandle, CaptureReport, DeviceStats, GuestStats};

use crate::grants::ComponentGrants;
use crate::net::{GuestEndpoint, Quota};

/// Reads every counter of a running (or finished) shim, from any thread.
#[derive(Clone)]
pub struct Monitor {
    pub(crate) net: Arc<GuestEndpoint>,
    pub(crate) components: Arc<[ComponentCounters]>,
    pub(crate) capture: Option<CaptureHandle>,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

/// Where one component's counters live.
pub(crate) struct ComponentCounters {
    pub(crate) name: String,
    pub(crate) grants: Arc<ComponentGrants>,
    pub(crate) quota: Arc<Quota>,
}

/// One component's use of its capabilities.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComponentStats {
    pub name: String,
    /// Sockets it holds now.
    pub sockets_open: usize,
    /// Sockets it created or accepted since it started.
    pub sockets_opened: u64,
    /// Sockets refused because it held its limit.
    pub socket_limit_refusals: u64,
    /// Binds, listens, connects and sends its grants did not allow.
    pub grant_denials: u64,
}

/// Every counter of a shim at one moment.
#[derive(Clone, Debug, Default)]
pub struct ShimStats {
    /// The host side; `None` if the device thread did not answer.
    pub device: Option<DeviceStats>,
    /// The guest side: the components' stack and its driver.
    pub guest: GuestStats,
    pub components: Vec<ComponentStats>,
    /// The packet capture, when `--pcap` is on.
    pub capture: Option<CaptureReport>,
}

impl Monitor {
    /// Copies every counter now.
    pub fn stats(&self) -> ShimStats {
        let components = self
            .components
            .iter()
            .map(|c| ComponentStats {
                name: c.name.clone(),
                sockets_open: c.quota.in_use(),
                sockets_opened: c.quota.leased(),
                socket_limit_refusals: c.quota.refused(),
                grant_denials: c.grants.denials(),
            })
            .collect();
        ShimStats {
            device: self.net.device_stats(),
            guest: self.net.guest_stats(),
            components,
            capture: self.capture.as_ref().map(CaptureHandle::report),
        }
    }

    /// Ends the packet capture, if there is one: what is queued is
    /// written and the file closed. Returns its final counters.
    pub fn finish_capture(&self) -> Option<CaptureReport> {
        self.capture.as_ref().map(CaptureHandle::finish)
    }
}

impl fmt::Display for ShimStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.device {
            Some(device) => write!(f, "{device}")?,
            None => writeln!(f, "device: did not answer")?,
        }
        writeln!(f, "guest stack")?;
        indented(f, &self.guest.stack.to_string())?;
        let d = &self.guest.driver;
        writeln!(f, "driver")?;
        writeln!(
            f,
            "  rx buffers used {}, tx packets {}, tx queue full {}, notifications {}, transport resets {}",
            d.rx_buffers_used, d.tx_packets, d.tx_full, d.notifications, d.transport_resets
        )?;
        nonzero(
            f,
            "dropped",
            &[
                ("rx-malformed", d.rx_malformed),
                ("unknown-event", d.unknown_events),
                ("device-error", d.device_errors),
            ],
        )?;
        for c in &self.components {
            writeln!(f, "component {}", c.name)?;
            writeln!(
                f,
                "  sockets: open {}, opened {}, refused at the limit {}; grant denials {}",
                c.sockets_open, c.sockets_opened, c.socket_limit_refusals, c.grant_denials
            )?;
        }
        if let Some(capture) = &self.capture {
            writeln!(f, "capture")?;
            writeln!(f, "  {capture}")?;
        }
        Ok(())
    }
}
