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

use pier_device::bridge::BridgeStats;
use pier_device::{CaptureHandle, CaptureReport, DeviceStats, EndpointStats, GuestStats};

use crate::grants::ComponentGrants;
use crate::net::{Endpoint, Quota};

/// Reads every counter of a running (or finished) shim, from any thread.
#[derive(Clone)]
pub struct Monitor {
    pub(crate) net: Arc<Endpoint>,
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

/// Writes `label: name n, name n` with the non-zero counters only, or
/// nothing when all are zero.
fn nonzero(f: &mut fmt::Formatter<'_>, label: &str, counters: &[(&str, u64)]) -> fmt::Result {
    let mut first = true;
    for (name, n) in counters.iter().filter(|(_, n)| *n > 0) {
        let sep = if first { format!("  {label}: ") } else { ", ".to_owned() };
        write!(f, "{sep}{name} {n}")?;
        first = false;
    }
    if !first {
        writeln!(f)?;
    }
    Ok(())
}

/// A stack's own report, indented under its heading.
fn indented(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    for line in text.lines() {
        writeln!(f, "  {line}")?;
    }
    Ok(())
}

fn endpoint(f: &mut fmt::Formatter<'_>, e: &EndpointStats) -> fmt::Result {
    writeln!(f, "  packets: to guest {}, from guest {}", e.to_guest, e.from_guest)?;
    writeln!(
        f,
        "  datagrams from guest {}, rx queue full {} rounds, rx buffer shrinks {}, driver resets {}",
        e.datagrams_from_guest, e.rx_full, e.rx_buffer_shrinks, e.driver_resets
    )?;
    nonzero(
        f,
        "dropped",
        &[
            ("spoofed-source", e.spoofed_source),
            ("bad-chain", e.bad_chains),
            ("datagram-not-negotiated", e.datagrams_not_negotiated),
            ("datagram-too-large", e.datagrams_too_large),
        ],
    )
}

fn bridge(f: &mut fmt::Formatter<'_>, b: &BridgeStats) -> fmt::Result {
    writeln!(
        f,
        "  connections: from host {}, from guest {}, established {}, active {}, closed {}",
        b.host_connections, b.guest_connections, b.established, b.active, b.closed
    )?;
    writeln!(
        f,
        "  bytes: to guest {}, from guest {}; messages: to guest {}, from guest {}",
        b.bytes_to_guest, b.bytes_from_guest, b.messages_to_guest, b.messages_from_guest
    )?;
    writeln!(
        f,
        "  datagrams: to guest {}, from guest {}; stalls: guest credit {}, unix socket full {}",
        b.datagrams_to_guest, b.datagrams_from_guest, b.credit_stalls, b.unix_stalls
    )?;
    nonzero(
        f,
        "refused or closed",
        &[
            ("connection-limit", b.connection_limit),
            ("accept-error", b.accept_errors),
            ("malformed-line", b.malformed_lines),
            ("line-timeout", b.line_timeouts),
            ("line-eviction", b.line_evictions),
            ("guest-refused", b.guest_refused),
            ("guest-timeout", b.guest_timeouts),
            ("abandoned", b.abandoned),
            ("host-refused", b.host_refused),
            ("wrong-peer", b.wrong_peer),
            ("unix-error", b.unix_errors),
            ("stack-error", b.stack_errors),
            ("message-too-large", b.messages_too_large),
            ("bad-frame", b.bad_frames),
        ],
    )?;
    nonzero(
        f,
        "datagrams dropped",
        &[
            ("no-receiver", b.datagrams_no_receiver),
            ("receiver-full", b.datagrams_receiver_full),
            ("malformed", b.datagrams_malformed),
            ("too-large", b.datagrams_too_large),
            ("rejected", b.datagrams_rejected),
            ("failed", b.datagrams_failed),
        ],
    )
}

impl fmt::Display for ShimStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.device {
            Some(device) => {
                writeln!(f, "device")?;
                endpoint(f, &device.endpoint)?;
                writeln!(f, "host stack (CID 2)")?;
                indented(f, &device.host_stack.to_string())?;
                if let Some(b) = &device.bridge {
                    writeln!(f, "bridge")?;
                    bridge(f, b)?;
                }
            }
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
