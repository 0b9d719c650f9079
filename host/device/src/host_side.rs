//! The device model's seam to the host, the *host side*: what happens to
//! the guest's traffic beyond the host stack, split by role.
//!
//! The host endpoint ([`crate::endpoint`]) terminates every guest
//! connection in a [`pier_stack::Stack`] at CID 2. Something on the host
//! must then carry those connections somewhere: the Unix-socket bridge in
//! production, a test's echo loop, nothing at all. That something plays up
//! to three roles, each a trait of its own, so that a host side implements
//! only what it does and a wrapper never forwards what it does not touch:
//!
//! - [`Relay`], **the relay**: it moves data on the host stack's
//!   sockets after each batch of guest packets, takes guest stream bytes
//!   before the stack buffers them (written straight to a Unix socket),
//!   reads host stream bytes into the receive buffers the device lends it
//!   ([`RxLender`]), takes guest datagrams whole, and hands over host
//!   datagrams for the guest, which reach the receive queue through the
//!   same writer as the stack's packets;
//! - [`EventSource`], **the event source**: its own file descriptors,
//!   registered in the device loop's poller, and its own deadline;
//! - [`Siblings`], **a sibling router** (vhost-user only): packets for
//!   CIDs other than the host's, and packets from those CIDs.
//!
//! [`HostSide`] is the three together, as the device loop takes them;
//! every method has a default that does nothing. [`WithSiblings`] composes
//! a relay with a router, so a process that serves several guests
//! (`pier-vhost-user`) adds routing without wrapping the bridge.
//!
//! The bridge's counters ([`BridgeStats`]) are defined here, where the
//! seam hands them to the device loop's report, so the report never needs
//! the bridge itself.

use pier_stack::wire::RawHeader;
use pier_stack::{Instant, Payload, SocketHandle, Stack, TxSink};

use crate::cid::GuestCid;
use crate::queues::RxPayload;

/// Where the guest's connections and datagrams go on the host; see the
/// [module documentation](self).
pub trait Relay {
    /// The host stack took guest packets or fired timers: move data,
    /// accept, finish handshakes.
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        let _ = (stack, now);
    }

    /// A guest datagram. `true` if the host side took it; otherwise the
    /// host stack's datagram sockets get it.
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        let _ = (header, payload);
        false
    }

    /// Guest stream bytes for host socket `socket`, offered before the host
    /// stack buffers them (see [`pier_stack::DirectReceive`]); returns how
    /// many the host side took. Takes none by default.
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: Payload<'_>) -> usize {
        let _ = (socket, data);
        0
    }

    /// The device lends the guest's receive buffers: host → guest stream
    /// bytes the relay left in their source for one (see [`RxLender`]) may
    /// be read into them now. Called after the host stack's own packets
    /// went out, each time the device writes the receive queue.
    fn lend_rx(&mut self, stack: &mut Stack, rx: &mut dyn RxLender, now: Instant) {
        let _ = (stack, rx, now);
    }

    /// Offers host datagrams for the guest to `sink`, which stands for the
    /// guest's receive queue; a datagram `sink` refuses (the queue is full)
    /// stays with the host side for the next call.
    fn host_datagrams(&mut self, sink: &mut dyn TxSink) {
        let _ = sink;
    }

    /// The guest's CID changed (the host gave it a new one, as after a
    /// snapshot is restored elsewhere): whatever the host side addresses
    /// to the guest goes to `cid` from now on.
    fn guest_cid_changed(&mut self, cid: GuestCid) {
        let _ = cid;
    }

    /// The Unix-socket bridge's counters, for a host side that is one, so
    /// that `--stats` can show them.
    fn bridge_stats(&self) -> Option<BridgeStats> {
        None
    }

    /// Guest bytes the host stack holds for host programs that can still
    /// read them. The device handed the guest its buffers back for them,
    /// so the guest counts them as sent: a device loop told to stop
    /// delivers them first ([`DeviceThread::stop`](crate::DeviceThread::stop)).
    fn undelivered_guest_bytes(&self, stack: &Stack) -> usize {
        let _ = stack;
        0
    }
}

/// The guest's receive queue, lent to the relay so that host → guest
/// stream bytes go from their source (a Unix socket) straight into a
/// receive buffer: the relay reads them with [`RxPayload::read_with`], and
/// [`Stack::send_in_place`](pier_stack::Stack::send_in_place) counts them
/// and makes their header. Without it they pass through the host stack's
/// send buffer, one copy more on the device thread.
pub trait RxLender {
    /// Whether buffers are lent now. Not while packets are captured (the
    /// capture records payloads from the host's own memory), nor after a
    /// buffer too small for data turned up in this round (the host stack
    /// learns the buffers' size), nor to a driver whose buffers are too
    /// small to be worth a read call each
    /// ([`MIN_LENT_PAYLOAD`](crate::endpoint::MIN_LENT_PAYLOAD)): then the
    /// relay sends through the host stack.
    fn lends(&self) -> bool;

    /// Takes the next receive buffer and calls `fill` with its payload
    /// area; the header `fill` returns goes in front of the bytes it wrote,
    /// and the buffer to the guest. `fill` returning `None` leaves the
    /// buffer for the next packet. Returns `false`, without calling `fill`,
    /// when there is no buffer to lend (the driver's next one brings
    /// another [`Relay::lend_rx`]) or lending stopped.
    fn fill(&mut self, fill: &mut dyn FnMut(&mut RxPayload<'_>) -> Option<RawHeader>) -> bool;
}

/// Sources of work of the host side's own, beside the queues.
pub trait EventSource {
    /// One of the host side's sources (registered in the device loop's poller
    /// when it was built) is ready. Events of other sources arrive too and
    /// are ignored by their token.
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        let _ = (stack, event, now);
    }

    /// The host side's earliest deadline, for the device loop's sleep.
    fn poll_at(&self) -> Option<Instant> {
        None
    }

    /// Every event of one poll's batch has been passed to
    /// [`Self::handle_event`]. Only the thread that polled may say so: a
    /// round run on another thread meanwhile (an inline kick) cannot know
    /// which events that poll has already collected, so a socket it closed
    /// must keep its token out of use until the poller is done with them.
    fn events_handled(&mut self) {}
}

/// Packets between the guest and sibling VMs, for a host side that serves
/// several guests (vhost-user).
pub trait Siblings {
    /// A guest packet addressed to a CID other than the host's. `true` if
    /// the router took it; otherwise the host stack drops it as not its own.
    fn guest_packet_elsewhere(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        let _ = (header, payload);
        false
    }

    /// Offers packets from elsewhere (sibling VMs, or the RSTs that answer
    /// packets for CIDs nobody serves) to `sink`, the guest's receive
    /// queue, whatever their socket type; a packet `sink` refuses stays
    /// with the router for the next call. `max_payload` is the largest
    /// payload the guest's receive buffers are known to take: data larger
    /// than that must go in pieces (a Linux guest posts 4 KiB buffers,
    /// while its sibling sends packets of up to 64 KiB).
    fn packets_from_elsewhere(&mut self, sink: &mut dyn TxSink, max_payload: usize) {
        let _ = (sink, max_payload);
    }
}

/// Everything the device loop asks of the host: the three roles together.
pub trait HostSide: Relay + EventSource + Siblings {}

impl<T: Relay + EventSource + Siblings> HostSide for T {}

/// No host side: the host stack alone (tests that work on its sockets
/// directly).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHostSide;

impl Relay for NoHostSide {}
impl EventSource for NoHostSide {}
impl Siblings for NoHostSide {}

/// A relay and a sibling router as one host side: relay calls go to
/// `host`, routing calls to `router`, and both are event sources.
#[derive(Debug)]
pub struct WithSiblings<H, R> {
    /// The host side (the bridge).
    pub host: H,
    /// The router to sibling VMs.
    pub router: R,
}

impl<H: Relay, R> Relay for WithSiblings<H, R> {
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        self.host.service(stack, now);
    }
    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        self.host.guest_datagram(header, payload)
    }
    fn guest_stream_bytes(&mut self, socket: SocketHandle, data: Payload<'_>) -> usize {
        self.host.guest_stream_bytes(socket, data)
    }
    fn lend_rx(&mut self, stack: &mut Stack, rx: &mut dyn RxLender, now: Instant) {
        self.host.lend_rx(stack, rx, now);
    }
    fn host_datagrams(&mut self, sink: &mut dyn TxSink) {
        self.host.host_datagrams(sink);
    }
    fn guest_cid_changed(&mut self, cid: GuestCid) {
        self.host.guest_cid_changed(cid);
    }
    fn bridge_stats(&self) -> Option<BridgeStats> {
        self.host.bridge_stats()
    }
    fn undelivered_guest_bytes(&self, stack: &Stack) -> usize {
        self.host.undelivered_guest_bytes(stack)
    }
}

impl<H: EventSource, R: EventSource> EventSource for WithSiblings<H, R> {
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        self.host.handle_event(stack, event, now);
        self.router.handle_event(stack, event, now);
    }
    fn poll_at(&self) -> Option<Instant> {
        [self.host.poll_at(), self.router.poll_at()].into_iter().flatten().min()
    }
    fn events_handled(&mut self) {
        self.host.events_handled();
        self.router.events_handled();
    }
}

impl<H, R: Siblings> Siblings for WithSiblings<H, R> {
    fn guest_packet_elsewhere(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        self.router.guest_packet_elsewhere(header, payload)
    }
    fn packets_from_elsewhere(&mut self, sink: &mut dyn TxSink, max_payload: usize) {
        self.router.packets_from_elsewhere(sink, max_payload);
    }
}

/// Counters for everything the bridge did, refused, dropped or timed out.
/// All are totals since the bridge was created, except `active`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// Connections accepted on `<uds>` and `<uds>_seqpacket`.
    pub host_connections: u64,
    /// Guest connections bridged to a host listener at `<uds>_<port>`.
    pub guest_connections: u64,
    /// Connections that reached the relay, both directions.
    pub established: u64,
    /// Connections open now.
    pub active: usize,
    /// Connections ended, for any reason.
    pub closed: u64,
    /// Connections refused because `max_connections` were open, or (for
    /// the guest's) the guest had `max_guest_connections` open.
    pub connection_limit: u64,
    /// Failed `accept` calls on the Unix listeners (for example EMFILE).
    pub accept_errors: u64,
    /// CONNECT lines that were not one (bad text, too long, EOF first).
    pub malformed_lines: u64,
    /// Host programs that did not finish their CONNECT line in time.
    pub line_timeouts: u64,
    /// Host connections still without a CONNECT line, closed to make
    /// room for a new one (see [`BridgeConfig::max_pending_lines`](crate::bridge::BridgeConfig::max_pending_lines)).
    pub line_evictions: u64,
    /// Host → guest connects the guest refused (RST: nothing listening).
    pub guest_refused: u64,
    /// Host → guest connects the guest never answered.
    pub guest_timeouts: u64,
    /// Host programs that hung up before the guest answered.
    pub abandoned: u64,
    /// Guest → host connects with no host listener at `<uds>_<port>` (or
    /// one of the other socket type, or with a full backlog): refused, RST.
    pub host_refused: u64,
    /// Catch-all connections from a CID other than the guest's: refused.
    pub wrong_peer: u64,
    /// Connections the port policy denied, either way ([`PortPolicy`](crate::bridge::PortPolicy)).
    pub denied: u64,
    /// Relays ended by a Unix socket error (ECONNRESET and the like).
    pub unix_errors: u64,
    /// Relays ended by a host-stack error (reset, protocol violation).
    pub stack_errors: u64,
    /// Seqpacket messages too large for the other side: connection closed.
    pub messages_too_large: u64,
    /// Unix seqpacket messages with unknown flag bits: connection closed.
    pub bad_frames: u64,
    /// Times host → guest data waited for the guest's credit.
    pub credit_stalls: u64,
    /// Times guest → host data waited for a full Unix socket.
    pub unix_stalls: u64,
    /// Stream sockets whose send buffer grew to
    /// [`BridgeConfig::stream_send_buffer`](crate::bridge::BridgeConfig::stream_send_buffer)
    /// once their host program had drained them.
    pub send_buffers_grown: u64,
    pub bytes_to_guest: u64,
    pub bytes_from_guest: u64,
    pub messages_to_guest: u64,
    pub messages_from_guest: u64,
    /// Datagrams handed to the device for the guest.
    pub datagrams_to_guest: u64,
    /// Guest datagrams delivered to a host receiver.
    pub datagrams_from_guest: u64,
    /// Guest datagrams with no receiver at `<uds>_dgram_<port>`: dropped.
    pub datagrams_no_receiver: u64,
    /// Guest datagrams whose receiver's queue was full: dropped.
    pub datagrams_receiver_full: u64,
    /// Host datagrams shorter than the 8-byte header, or to port
    /// `VMADDR_PORT_ANY`: dropped.
    pub datagrams_malformed: u64,
    /// Datagrams over the size limit, either way: dropped.
    pub datagrams_too_large: u64,
    /// Guest datagrams not from the guest's CID, not to CID 2, or not RW: dropped.
    pub datagrams_rejected: u64,
    /// Datagrams lost to any other socket error.
    pub datagrams_failed: u64,
}
