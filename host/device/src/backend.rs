//! The device model's one seam to the host: what happens to the guest's
//! traffic beyond the host stack.
//!
//! The host endpoint ([`crate::endpoint`]) terminates every guest
//! connection in a [`pier_stack::Stack`] at CID 2. Something on the host
//! must then carry those connections somewhere: the Unix-socket bridge in
//! production, a test's echo loop, nothing at all. That something is a
//! [`HostBackend`]. It plays both roles of Firecracker's `VsockBackend`:
//!
//! - **a channel** for packets that bypass the host stack's buffers:
//!   guest datagrams it takes whole, guest stream bytes it takes before
//!   they are buffered (written straight to a Unix socket), and host
//!   datagrams it hands over for the guest, which reach the receive queue
//!   through the same writer as the stack's packets;
//! - **an event listener**: its own file descriptors, registered in the
//!   device loop's poller, its own deadline, and a call after each batch
//!   of guest packets to move data on the host stack's sockets.
//!
//! Every method has a default that does nothing, so a backend implements
//! only the roles it plays.

use pier_stack::wire::RawHeader;
use pier_stack::{Instant, SocketHandle, Stack, TxSink};

use crate::bridge::BridgeStats;
use crate::cid::GuestCid;

/// What the host side does with the guest's traffic; see the
/// [module documentation](self).
pub trait HostBackend {
    /// One of the backend's event sources (registered in the device
    /// loop's poller when it was built) is ready.
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        let _ = (stack, event, now);
    }

    /// The host stack took guest packets or fired timers: move data,
    /// accept, finish handshakes.
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        let _ = (stack, now);
    }

    /// The backend's earliest deadline, for the device loop's sleep.
    fn poll_at(&self) -> Option<Instant> {
        None
    }

    /// A guest datagram. `true` if the backend took it; otherwise the host
    /// stack's datagram sockets get it.
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        let _ = (header, payload);
        false
    }

    /// Guest stream bytes for host socket `socket`, offered before the host
    /// stack buffers them (see [`pier_stack::DirectReceive`]); returns how
    /// many the backend took. Takes none by default.
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: &[u8]) -> usize {
        let _ = (socket, data);
        0
    }

    /// Offers host datagrams for the guest to `sink`, which stands for the
    /// guest's receive queue; a datagram `sink` refuses (the queue is full)
    /// stays with the backend for the next call.
    fn host_datagrams(&mut self, sink: &mut dyn TxSink) {
        let _ = sink;
    }

    /// A guest packet addressed to a CID other than the host's: a sibling
    /// VM's, when the backend serves several (vhost-user). `true` if the
    /// backend took it; otherwise the host stack drops it as not its own.
    fn guest_packet_elsewhere(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        let _ = (header, payload);
        false
    }

    /// Offers packets from elsewhere (sibling VMs, or the RSTs that answer
    /// packets for CIDs nobody serves) to `sink`, the guest's receive
    /// queue, whatever their socket type; a packet `sink` refuses stays
    /// with the backend for the next call. `max_payload` is the largest
    /// payload the guest's receive buffers are known to take: data larger
    /// than that must go in pieces (a Linux guest posts 4 KiB buffers,
    /// while its sibling sends packets of up to 64 KiB).
    fn packets_from_elsewhere(&mut self, sink: &mut dyn TxSink, max_payload: usize) {
        let _ = (sink, max_payload);
    }

    /// The guest's CID changed (the host gave it a new one, as after a
    /// snapshot is restored elsewhere): whatever the backend addresses to
    /// the guest goes to `cid` from now on.
    fn guest_cid_changed(&mut self, cid: GuestCid) {
        let _ = cid;
    }

    /// The Unix-socket bridge's counters, for a backend that is one (or
    /// wraps one), so that `pier run --stats` can show them.
    fn bridge_stats(&self) -> Option<BridgeStats> {
        None
    }
}

/// No backend: the host stack alone (tests that work on its sockets
/// directly).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoBackend;

impl HostBackend for NoBackend {}
