//! Sibling routing: guests served by one `pier vhost-user` reach each other
//! by CID, with no host program in between.
//!
//! Each guest's device terminates the connections to the host (CID 2) in
//! its host stack. A packet for any other CID is not the host's: the
//! endpoint hands it to the device's sibling router
//! ([`Siblings::guest_packet_elsewhere`]), here the guest's [`SiblingPort`],
//! which gives it to the [`Router`]. The router puts it in the inbox of the device serving that CID, if the two
//! guests share a group, and has that device's loop write it into its
//! guest's receive queue ([`Siblings::packets_from_elsewhere`]): by a round
//! of that device run right away on the sending device's thread when its
//! own loop sleeps ([`InlineKick::try_deliver`]), by a note for one more
//! round when it is awake, and through the inbox's eventfd only when
//! another thread is running its round. A packet between siblings so
//! wakes one thread (the sender's loop, on the sender's kick), not two:
//! on a busy host each wakeup can wait for a CPU, and with a Linux guest a
//! slow RST decides races its sockets run (a port is free to bind again
//! only once the peer's RST has arrived).
//! The packet is forwarded as it is, header and all: flow control between
//! the two guests is their own credit, end to end.
//!
//! A packet for a CID that no device here serves, or one outside the
//! sender's groups, is answered with an RST (never an RST for an RST), as
//! a Linux host answers a connect to a CID nobody has.
//!
//! An inbox holds at most [`INBOX_PACKETS`] packets: the guests' credit
//! bounds the data in flight, so only a guest that ignores credit, or one
//! whose sibling has stopped reading its queue, fills it. Beyond that a
//! packet is answered with an RST instead of being queued, and counted.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hashbrown::HashMap;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use pier_device::bridge::Bridge;
use pier_device::{EventSource, InlineKick, Siblings, WithSiblings};
use pier_stack::wire::{Op, RawHeader, seq_flags};
use pier_stack::{Instant, SocketType, Stack, TxSink};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// How many packets wait for one guest at most.
pub const INBOX_PACKETS: usize = 4096;

/// Payload buffers an inbox keeps for reuse: enough for a burst of full
/// packets in flight between two guests (64 × 64 KiB).
const SPARE_BUFFERS: usize = 64;

/// A packet on its way, and how much of its payload went out already
/// (a packet larger than the receiver's buffers goes in pieces).
#[derive(Debug)]
struct Forwarded {
    header: RawHeader,
    payload: Vec<u8>,
    sent: usize,
}

/// Packets on their way into one guest's receive queue.
#[derive(Debug)]
struct Inbox {
    packets: Mutex<VecDeque<Forwarded>>,
    /// Payload buffers of delivered packets, reused for the next ones so
    /// that forwarding allocates only until the traffic's steady state.
    spare: Mutex<Vec<Vec<u8>>>,
    /// Signalled when packets arrive, to wake the guest's device loop,
    /// when [`Self::deliver`] cannot have it run a round.
    wake: EventFd,
    /// The guest's device loop, once it runs: packets are delivered by a
    /// round of it on the sending thread.
    deliver: OnceLock<InlineKick>,
    groups: Vec<String>,
}

impl Inbox {
    /// Queues a packet; `false` if the inbox is full.
    fn push(&self, header: RawHeader, payload: &[u8]) -> bool {
        let mut packets = self.packets.lock().expect("inbox");
        if packets.len() >= INBOX_PACKETS {
            return false;
        }
        let was_empty = packets.is_empty();
        let mut buffer = self.spare.lock().expect("spare buffers").pop().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(payload);
        packets.push_back(Forwarded { header, payload: buffer, sent: 0 });
        drop(packets);
        if was_empty && !self.deliver.get().is_some_and(InlineKick::try_deliver) {
            let _ = self.wake.write(1);
        }
        true
    }

    fn shares_group_with(&self, other: &Inbox) -> bool {
        self.groups.iter().any(|g| other.groups.contains(g))
    }
}

/// The router's counters.
#[derive(Debug, Default)]
pub struct RouterStats {
    /// Packets forwarded from one guest to another.
    pub forwarded: AtomicU64,
    /// Packets for a CID nobody here serves (or outside the sender's
    /// groups), answered with an RST.
    pub unknown_cid: AtomicU64,
    /// Packets refused because the receiver's inbox was full.
    pub inbox_full: AtomicU64,
}

/// Which guests are served here, by CID; see the [module
/// documentation](self).
#[derive(Debug, Default)]
pub struct Router {
    routes: Mutex<HashMap<u64, Arc<Inbox>>>,
    stats: RouterStats,
}

impl Router {
    /// An empty router.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The router's counters.
    pub fn stats(&self) -> &RouterStats {
        &self.stats
    }

    /// Registers the guest at `cid`, in `groups`; returns its inbox.
    fn join(&self, cid: u64, groups: Vec<String>) -> io::Result<Arc<Inbox>> {
        let inbox = Arc::new(Inbox {
            packets: Mutex::new(VecDeque::new()),
            spare: Mutex::new(Vec::new()),
            wake: EventFd::new(EFD_NONBLOCK)?,
            deliver: OnceLock::new(),
            groups,
        });
        let mut routes = self.routes.lock().expect("routes");
        if routes.contains_key(&cid) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("two guests with CID {cid}"),
            ));
        }
        routes.insert(cid, inbox.clone());
        Ok(inbox)
    }

    /// From now on packets for the guest at `cid` are delivered by
    /// `device_loop`'s rounds on the sending thread where it can (see the
    /// [module documentation](self)); until then through its eventfd.
    pub fn deliver_with(&self, cid: u64, device_loop: InlineKick) {
        if let Some(inbox) = self.routes.lock().expect("routes").get(&cid) {
            let _ = inbox.deliver.set(device_loop);
        }
    }

    /// Sends a packet from the guest whose inbox is `from` towards its
    /// destination CID, or an RST back.
    fn route(&self, from: &Inbox, header: &RawHeader, payload: &[u8]) {
        let to = self.routes.lock().expect("routes").get(&header.dst_cid).cloned();
        let refused = match to {
            Some(to) if to.shares_group_with(from) => {
                if to.push(*header, payload) {
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                &self.stats.inbox_full
            }
            _ => &self.stats.unknown_cid,
        };
        refused.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            src_cid = header.src_cid,
            dst_cid = header.dst_cid,
            dst_port = header.dst_port,
            "vhost-user: no sibling takes the packet: RST"
        );
        if header.op != Op::Rst as u16 {
            // The sender's own inbox: full only if its guest stopped
            // reading, and then the RST is lost like any packet to it.
            from.push(RawHeader::rst_reply(header), &[]);
        }
    }
}

/// One guest's place in the [`Router`]: its inbox, and the device loop's
/// wakeup for it. Beside the guest's bridge (see
/// [`WithSiblings`]), it is that guest's device's
/// [`Siblings`] role.
#[derive(Debug)]
pub struct SiblingPort {
    router: Arc<Router>,
    inbox: Arc<Inbox>,
    token: Token,
}

/// The host side of a guest that has siblings: its bridge and its port.
pub type RoutedBridge = WithSiblings<Bridge, SiblingPort>;

impl SiblingPort {
    /// Joins the guest at `cid` to `router` (in `groups`) and registers its
    /// inbox's wakeup with the device loop at `token`.
    pub fn new(
        router: Arc<Router>,
        cid: u64,
        groups: Vec<String>,
        registry: &Registry,
        token: Token,
    ) -> io::Result<Self> {
        let inbox = router.join(cid, groups)?;
        registry.register(&mut SourceFd(&inbox.wake.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Self { router, inbox, token })
    }
}

/// The inbox's wakeup.
impl EventSource for SiblingPort {
    fn handle_event(&mut self, _stack: &mut Stack, event: &mio::event::Event, _now: Instant) {
        if event.token() == self.token {
            // The round that follows every wakeup empties the inbox.
            let _ = self.inbox.wake.read();
        }
    }
}

impl Siblings for SiblingPort {
    fn guest_packet_elsewhere(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        self.router.route(&self.inbox, header, payload);
        true
    }

    fn packets_from_elsewhere(&mut self, sink: &mut dyn TxSink, max_payload: usize) {
        let mut packets = self.inbox.packets.lock().expect("inbox");
        while let Some(packet) = packets.front_mut() {
            if !transmit_piece(sink, packet, max_payload) {
                break;
            }
            if packet.sent == packet.payload.len()
                && let Some(done) = packets.pop_front()
            {
                let mut spare = self.inbox.spare.lock().expect("spare buffers");
                if spare.len() < SPARE_BUFFERS {
                    spare.push(done.payload);
                }
            }
        }
    }
}

/// Writes the next piece of `packet` into `sink`: all that is left, or, for
/// stream and seqpacket data larger than the receiver's buffers take
/// (`max_payload`), the next `max_payload` bytes as a packet of its own.
/// Splitting is what the sender would have done for a receiver with small
/// buffers: stream bytes are only bytes, credit counts bytes, and a
/// seqpacket message may travel in several packets of which only the last
/// carries EOM (and EOR). Returns `false` if `sink` took nothing.
fn transmit_piece(sink: &mut dyn TxSink, packet: &mut Forwarded, max_payload: usize) -> bool {
    let left = &packet.payload[packet.sent..];
    let splittable = packet.header.op == Op::Rw as u16
        && (packet.header.type_ == SocketType::Stream as u16
            || packet.header.type_ == SocketType::SeqPacket as u16);
    let piece =
        if splittable && max_payload > 0 { left.len().min(max_payload) } else { left.len() };
    let mut header = packet.header;
    header.len = piece as u32;
    if piece < left.len() {
        header.flags &= !(seq_flags::EOM | seq_flags::EOR);
    }
    if sink.transmit(&header, &left[..piece]).is_err() {
        return false;
    }
    packet.sent += piece;
    true
}
