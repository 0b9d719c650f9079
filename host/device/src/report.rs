//! The host side's counters as text: what `pier run --stats` and `pier
//! boot --stats` (and SIGUSR1) print for the device, its host stack and
//! the bridge. Totals first, then only the drop, reset and refusal
//! reasons that happened (a reason that never happened is noise). The
//! helpers are public so that reports of other layers (the shim's guest
//! side) read the same way.

use std::fmt;

use crate::device_loop::DeviceStats;
use crate::endpoint::EndpointStats;
use crate::host_side::BridgeStats;

/// Writes `label: name n, name n` with the non-zero counters only, or
/// nothing when all are zero.
pub fn nonzero(f: &mut fmt::Formatter<'_>, label: &str, counters: &[(&str, u64)]) -> fmt::Result {
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
pub fn indented(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    for line in text.lines() {
        writeln!(f, "  {line}")?;
    }
    Ok(())
}

fn endpoint(f: &mut fmt::Formatter<'_>, e: &EndpointStats) -> fmt::Result {
    writeln!(
        f,
        "  packets: to guest {} ({} read in place), from guest {}",
        e.to_guest, e.to_guest_in_place, e.from_guest
    )?;
    if e.from_guest_bytes_unstaged > 0 {
        // `pier boot`'s only: other buses lend or copy payloads as bytes.
        writeln!(
            f,
            "  stream bytes from guest sent from guest memory: {}",
            e.from_guest_bytes_unstaged
        )?;
    }
    if e.to_elsewhere > 0 {
        writeln!(f, "  packets from the guest to other CIDs: {}", e.to_elsewhere)?;
    }
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
    nonzero(f, "unix sockets", &[("send-buffer-grown", b.send_buffers_grown)])?;
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
            ("denied", b.denied),
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

impl fmt::Display for DeviceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device")?;
        endpoint(f, &self.endpoint)?;
        writeln!(f, "host stack (CID 2)")?;
        indented(f, &self.host_stack.to_string())?;
        if let Some(b) = &self.bridge {
            writeln!(f, "bridge")?;
            bridge(f, b)?;
        }
        Ok(())
    }
}
