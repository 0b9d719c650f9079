//! A guided walk through the virtqueues: pier-driver and the device model
//! on a [`Testbed`], moved one half-step at a time (the driver's poll, or
//! one device round), with the rings as they stand in guest memory after
//! each step.
//!
//! [`walk`] runs the whole sequence a driver goes through, from feature
//! negotiation to a reset, and returns it as [`Step`]s: what happened,
//! the virtio 1.2 section that governs it, and a [`RingView`] of each
//! queue the step changed. `cargo run -p pier-device --example
//! virtqueue_walk` prints them; the crate's tests check them. Everything
//! is read back from the real rings (the descriptor table, the available
//! and used rings and their event indices) and the device's register
//! file, never from what the walk expects.
//!
//! Each chain's owner follows from the ring indices, by the rule
//! [`crate::ring_trace::view`] states, which the ring trace's reader
//! shares: this walk's rings are read from guest memory, a trace's from
//! what the device recorded.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use pier_driver::DriverConfig;
use pier_stack::wire::HEADER_LEN;
use pier_stack::{SocketType, VMADDR_CID_ANY, VMADDR_CID_HOST, VsockAddr};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::Testbed;
use crate::device::{EVENT_QUEUE, LifecycleEvent, RX_QUEUE, TX_QUEUE, VsockConfig, VsockDevice};
use crate::host_side::NoHostSide;
use crate::inprocess::SetupError;
use crate::ring_trace::RingTrace;
pub use crate::ring_trace::view::{
    Chain, Descriptor, Owner, RingView, feature_names, status_names, vring_need_event,
};
use crate::ring_trace::view::{RingSource, packet_text, queue_name, wrapped};

/// The walk's steps, declared in the order [`walk`] takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepKind {
    /// Reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK, queues, DRIVER_OK.
    Initialisation,
    /// Where each queue's three areas are, and how big.
    QueueSetup,
    /// The event and rx buffers posted before DRIVER_OK, and their kicks.
    BuffersPosted,
    /// The guest's REQUEST on the tx queue, and the kick.
    Request,
    /// The device takes the REQUEST and writes the RESPONSE into an rx buffer.
    Response,
    /// The driver takes the RESPONSE and posts its buffer again.
    ResponseTaken,
    /// A data packet published: a header and a payload descriptor.
    DataPublished,
    /// The device takes the data packet and returns its chain.
    DataTaken,
    /// The host read the data; its CREDIT_UPDATE arrives in an rx buffer.
    CreditUpdate,
    /// A second rx buffer used before the driver caught up: no interrupt.
    InterruptSuppressed,
    /// Two publications with no device round between them: the second
    /// kick, which the spec's EVENT_IDX rule would suppress.
    SecondKick,
    /// More messages than rx buffers: the rx ring runs dry.
    RxRingDry,
    /// The driver takes them all, posts the buffers again and kicks.
    RxRefilled,
    /// The device, kicked, delivers the message that waited.
    WaitingDelivered,
    /// The guest reboots: status 0, then a new driver sets the device up.
    Reset,
}

/// One step of the walk.
#[derive(Clone, Debug)]
pub struct Step {
    pub kind: StepKind,
    /// What happened, in a few words.
    pub title: &'static str,
    /// The sections of the virtio 1.2 spec that govern the step.
    pub spec: &'static str,
    /// What the step showed, one line each.
    pub notes: Vec<String>,
    /// The queues this step changed (every queue for the setup steps).
    pub rings: Vec<RingView>,
    /// Per queue (rx, tx, event): whether the driver kicked it.
    pub kicks: [bool; 3],
    /// Interrupts the device raised during the step.
    pub interrupts: u64,
    /// The driver's status writes and queue activations during the step.
    pub lifecycle: Vec<LifecycleEvent>,
}

/// The port the host listens on, and the guest's.
const PORT: u32 = 1234;
const GUEST_PORT: u32 = 1025;
/// Receive buffers: few, so that the ring runs dry and the output is short.
const RX_BUFFERS: usize = 4;

fn read_u16(mem: &GuestMemoryMmap, addr: u64) -> u16 {
    u16::from_le(mem.read_obj(GuestAddress(addr)).expect("rings lie in guest memory"))
}

fn read_u32(mem: &GuestMemoryMmap, addr: u64) -> u32 {
    u32::from_le(mem.read_obj(GuestAddress(addr)).expect("rings lie in guest memory"))
}

fn read_u64(mem: &GuestMemoryMmap, addr: u64) -> u64 {
    u64::from_le(mem.read_obj(GuestAddress(addr)).expect("rings lie in guest memory"))
}

/// A queue's rings in guest memory, for [`RingView::fill_chains`].
struct InMemory<'a> {
    mem: &'a GuestMemoryMmap,
    queue: usize,
    view: &'a RingView,
}

impl RingSource for InMemory<'_> {
    fn avail_head(&self, slot: u16) -> u16 {
        read_u16(self.mem, self.view.avail_ring + 4 + 2 * u64::from(slot))
    }

    fn used_element(&self, slot: u16) -> (u16, u32) {
        let element = self.view.used_ring + 4 + 8 * u64::from(slot);
        (read_u32(self.mem, element) as u16, read_u32(self.mem, element + 4))
    }

    fn descriptor(&self, index: u16) -> Descriptor {
        let at = self.view.desc_table + 16 * u64::from(index);
        Descriptor {
            index,
            addr: read_u64(self.mem, at),
            len: read_u32(self.mem, at + 8),
            flags: read_u16(self.mem, at + 12),
            next: read_u16(self.mem, at + 14),
        }
    }

    /// A tx chain's first descriptor holds a header as soon as it is
    /// published, an rx buffer once the device has used it.
    fn packet(&self, chain: &[Descriptor], used_len: Option<u32>) -> Option<String> {
        let first = chain.first()?;
        let readable = match self.queue {
            TX_QUEUE => true,
            RX_QUEUE => used_len.is_some_and(|len| len as usize >= HEADER_LEN),
            _ => false,
        };
        if !readable || (first.len as usize) < HEADER_LEN {
            return None;
        }
        let mut bytes = [0u8; HEADER_LEN];
        self.mem
            .read_slice(&mut bytes, GuestAddress(first.addr))
            .expect("buffers lie in guest memory");
        packet_text(&bytes)
    }
}

/// Reads queue `queue` of `device` out of guest memory.
fn read_view(device: &VsockDevice<Arc<GuestMemoryMmap>>, queue: usize) -> RingView {
    let mem: &GuestMemoryMmap = device.memory();
    let q = device.queue(queue).expect("queue").queue();
    let (size, avail, used) = (q.size(), q.avail_ring(), q.used_ring());
    let slots = u64::from(size);
    let mut view = RingView {
        queue,
        size,
        event_idx: q.event_idx_enabled(),
        desc_table: q.desc_table(),
        avail_ring: avail,
        used_ring: used,
        avail_flags: read_u16(mem, avail),
        avail_idx: read_u16(mem, avail + 2),
        used_event: read_u16(mem, avail + 4 + 2 * slots),
        used_flags: read_u16(mem, used),
        used_idx: read_u16(mem, used + 2),
        avail_event: read_u16(mem, used + 4 + 8 * slots),
        device_next_avail: q.next_avail(),
        chains: Vec::new(),
    };
    if q.ready() {
        let source = InMemory { mem, queue, view: &view.clone() };
        view.fill_chains(&source);
    }
    view
}

/// What a step changed ([`Walker::observe`]).
struct Observed {
    rings: Vec<RingView>,
    kicks: [bool; 3],
    interrupts: u64,
    lifecycle: Vec<LifecycleEvent>,
}

/// The walk as it goes: the testbed, and what was last shown of it.
struct Walker {
    bed: Testbed,
    shown: Vec<RingView>,
    lifecycle_seen: usize,
    interrupts_seen: u64,
    steps: Vec<Step>,
}

impl Walker {
    fn views(&self) -> Vec<RingView> {
        let mmio = self.bed.mmio.lock().expect("device lock");
        [RX_QUEUE, TX_QUEUE, EVENT_QUEUE].map(|q| read_view(mmio.device(), q)).into()
    }

    /// What changed since the last look: the rings (all of them if
    /// `all`), the kicks waiting on the queues' eventfds, the interrupts
    /// raised and the lifecycle events.
    fn observe(&mut self, all: bool) -> Observed {
        let views = self.views();
        let rings =
            views.iter().filter(|v| all || self.shown.get(v.queue) != Some(v)).cloned().collect();
        self.shown = views;
        let kicks = [RX_QUEUE, TX_QUEUE, EVENT_QUEUE].map(|q| self.bed.take_kick(q));
        let mmio = self.bed.mmio.lock().expect("device lock");
        let device = mmio.device();
        let log = device.lifecycle();
        let lifecycle = log[self.lifecycle_seen.min(log.len())..].to_vec();
        self.lifecycle_seen = log.len();
        let interrupts = device.interrupts_raised() - self.interrupts_seen;
        self.interrupts_seen = device.interrupts_raised();
        Observed { rings, kicks, interrupts, lifecycle }
    }

    /// Records a step with what changed since the last one.
    fn record(
        &mut self,
        kind: StepKind,
        title: &'static str,
        spec: &'static str,
        notes: Vec<String>,
        all: bool,
    ) {
        let Observed { rings, kicks, interrupts, lifecycle } = self.observe(all);
        self.steps.push(Step { kind, title, spec, notes, rings, kicks, interrupts, lifecycle });
    }

    fn device_round(&mut self) -> usize {
        self.bed.device_round(&mut NoHostSide, true)
    }

    /// The driver as an interrupt handler runs it: acknowledge, then poll.
    fn interrupt_handler(&mut self) -> pier_driver::PollOutcome {
        self.bed.driver.ack_interrupt();
        self.bed.poll_driver()
    }
}

/// Runs the walk: a seqpacket connection (each message is one packet)
/// from the guest to a host listener, a message each way, the notification
/// rules at work, the rx ring running dry, and a reset.
pub fn walk() -> Result<Vec<Step>, SetupError> {
    walk_traced(None)
}

/// [`walk`], with the device recording every queue event into
/// `ring_trace` (`virtqueue_walk --ring-trace FILE`).
pub fn walk_traced(ring_trace: Option<RingTrace>) -> Result<Vec<Step>, SetupError> {
    let driver = DriverConfig { rx_buffers: RX_BUFFERS, tx_buffers: 4, ..DriverConfig::default() };
    let mut bed = Testbed::new(VsockConfig { ring_trace, ..VsockConfig::default() }, driver)?;
    bed.freeze_clock();
    let mut w =
        Walker { bed, shown: Vec::new(), lifecycle_seen: 0, interrupts_seen: 0, steps: Vec::new() };

    let (offered, accepted) = {
        let mmio = w.bed.mmio.lock().expect("device lock");
        (mmio.device().device_features(), mmio.device().driver_features())
    };
    // The driver set the device up inside `Testbed::new`; the device
    // logged each status write and queue activation, in order: before the
    // first queue, the negotiation; then the queues; then DRIVER_OK.
    let setup = w.observe(true);
    let first_queue = setup
        .lifecycle
        .iter()
        .position(|e| matches!(e, LifecycleEvent::QueueLive(_)))
        .unwrap_or(setup.lifecycle.len());
    let last_queue = setup
        .lifecycle
        .iter()
        .rposition(|e| matches!(e, LifecycleEvent::QueueLive(_)))
        .map_or(first_queue, |i| i + 1);
    let rings = &setup.rings;
    w.steps.push(Step {
        kind: StepKind::Initialisation,
        title: "The driver resets the device and negotiates features",
        spec: "3.1.1 Driver Requirements: Device Initialization; 2.1 Device Status Field; \
               2.2 Feature Bits; 5.10.3 Feature bits",
        notes: vec![
            format!("device offers:  {}", feature_names(offered)),
            format!("driver accepts: {}", feature_names(accepted)),
            "the driver reads FEATURES_OK back before it goes on (3.1.1 step 6)".into(),
        ],
        rings: Vec::new(),
        kicks: [false; 3],
        interrupts: 0,
        lifecycle: setup.lifecycle[..first_queue].to_vec(),
    });
    w.steps.push(Step {
        kind: StepKind::QueueSetup,
        title: "Each queue's areas go to QueueDesc/Driver/Device, then QueueReady",
        spec: "4.2.3.2 Virtqueue Configuration; 2.7 Split Virtqueues",
        notes: rings
            .iter()
            .map(|v| {
                format!(
                    "{}: {} entries; desc {:#x}, avail {:#x}, used {:#x}",
                    queue_name(v.queue),
                    v.size,
                    v.desc_table,
                    v.avail_ring,
                    v.used_ring
                )
            })
            .collect(),
        rings: Vec::new(),
        kicks: [false; 3],
        interrupts: 0,
        lifecycle: setup.lifecycle[first_queue..last_queue].to_vec(),
    });
    w.steps.push(Step {
        kind: StepKind::BuffersPosted,
        title: "Empty device-writable buffers go on the event and rx queues",
        spec: "2.7.13 Supplying Buffers to The Device; 5.10.5 Device Initialization",
        notes: vec![
            format!(
                "rx: {} buffers of {} bytes (a 44-byte header and a 64 KiB payload)",
                rings[RX_QUEUE].chains.len(),
                rings[RX_QUEUE].chains.first().map_or(0, |c| c.descriptors[0].len)
            ),
            format!("event: {} buffers of 4 bytes", rings[EVENT_QUEUE].chains.len()),
            "then DRIVER_OK, and a kick for each queue".into(),
        ],
        rings: rings.iter().filter(|v| v.queue != TX_QUEUE).cloned().collect(),
        kicks: setup.kicks,
        interrupts: setup.interrupts,
        lifecycle: setup.lifecycle[last_queue..].to_vec(),
    });

    // The REQUEST: the guest connects; its driver publishes the packet.
    let listener = {
        let host = w.bed.host.stack();
        let listener = host.socket(SocketType::SeqPacket).expect("host socket");
        host.bind(listener, VsockAddr::new(VMADDR_CID_ANY, PORT)).expect("host bind");
        host.listen(listener, 4).expect("host listen");
        listener
    };
    let guest = w.bed.guest.socket(SocketType::SeqPacket).expect("guest socket");
    // A fixed port, so that the output is the same every run.
    w.bed.guest.bind(guest, VsockAddr::new(VMADDR_CID_ANY, GUEST_PORT)).expect("guest bind");
    let now = w.bed.now();
    w.bed.guest.connect(guest, VsockAddr::new(VMADDR_CID_HOST, PORT), now).expect("connect");
    w.bed.poll_driver();
    let avail_event = w.views()[TX_QUEUE].avail_event;
    w.record(
        StepKind::Request,
        "The driver publishes a REQUEST on tx and kicks",
        "2.7.13 Supplying Buffers to The Device; 2.7.13.4 Notifying The Device; \
         5.10.6 Device Operation",
        vec![
            "one device-readable descriptor: the 44-byte header, no payload".into(),
            format!(
                "kick: avail idx 1 passes avail_event {avail_event} (2.7.10; pier-driver's \
                 need_kick also kicks while the index is under 128)"
            ),
        ],
        false,
    );

    w.device_round();
    w.record(
        StepKind::Response,
        "The device takes the REQUEST and answers with a RESPONSE in an rx buffer",
        "2.7.8 The Virtqueue Used Ring; 2.7.7 Used Buffer Notification Suppression; \
         5.10.6 Device Operation",
        vec![
            "tx: used entry with len 0 (the device wrote nothing into the chain)".into(),
            "rx: used entry with len 44, the RESPONSE's header".into(),
            "on both queues used idx passed used_event: an interrupt for each".into(),
        ],
        false,
    );

    w.interrupt_handler();
    w.bed.guest.finish_connect(guest).expect("connected over virtio");
    let (host_conn, _) = w.bed.host.stack().accept(listener).expect("host accept");
    let rx = w.views()[RX_QUEUE].clone();
    w.record(
        StepKind::ResponseTaken,
        "The interrupt handler takes both used entries and reposts the rx buffer",
        "2.7.14 Receiving Used Buffers From The Device; 4.2.3.4 Notifications From The Device",
        vec![
            "it acks InterruptStatus, then pops each used entry; used_event moves to the \
             used index: interrupt me at the next one"
                .into(),
            format!("the rx buffer goes back on the available ring (avail idx {})", rx.avail_idx),
            "the connection is up".into(),
        ],
        false,
    );

    // A data packet, guest to host.
    let message = b"hello, device";
    w.bed.guest.send_message(guest, message, true).expect("send");
    w.bed.poll_driver();
    w.record(
        StepKind::DataPublished,
        "The driver publishes a data packet: header and payload, chained",
        "2.7.5 The Virtqueue Descriptor Table; 2.7.13 Supplying Buffers to The Device",
        vec![
            "the chain's first descriptor holds the header; flags NEXT: another follows".into(),
            format!("the second holds the {}-byte payload; flags 0: end of chain", message.len()),
        ],
        false,
    );

    w.device_round();
    let mut received = [0u8; 64];
    let got = w.bed.host.stack().recv(host_conn, &mut received).expect("host recv");
    let data_notes = vec![
        format!("the host read {:?}", String::from_utf8_lossy(&received[..got.len])),
        "the tx chain is back on the used ring, len 0".into(),
    ];
    w.record(
        StepKind::DataTaken,
        "The device takes the data packet and returns its chain",
        "2.7.8 The Virtqueue Used Ring; 5.10.6 Device Operation",
        data_notes,
        false,
    );

    w.device_round();
    w.record(
        StepKind::CreditUpdate,
        "The host read the bytes, so it tells the guest: a CREDIT_UPDATE",
        "5.10.6.3 Buffer Space Management",
        vec![
            "fwd_cnt in its header says how many bytes the host has consumed".into(),
            "a seqpacket message must fit whole, so any new credit is sent at once".into(),
        ],
        false,
    );

    // Without the driver running, a second rx buffer gets used.
    w.bed.host.stack().send_message(host_conn, b"ping", true).expect("host send");
    w.device_round();
    let rx = w.views()[RX_QUEUE].clone();
    w.record(
        StepKind::InterruptSuppressed,
        "A second rx buffer is used before the driver caught up: no interrupt",
        "2.7.7 Used Buffer Notification Suppression; 2.7.7.2 Device Requirements",
        vec![
            format!(
                "used_event is still {}: the driver asked for an interrupt once entry {} is used,",
                rx.used_event, rx.used_event
            ),
            format!(
                "and that interrupt was sent; used idx {} adds nothing to ask for",
                rx.used_idx
            ),
        ],
        false,
    );

    // The driver takes both, then two publications without a device round.
    w.interrupt_handler();
    let mut buf = [0u8; 16];
    while w.bed.guest.recv(guest, &mut buf).is_ok() {}
    w.bed.poll_driver();
    w.device_round();
    w.interrupt_handler();
    w.observe(false);
    w.bed.guest.send_message(guest, b"one", true).expect("send");
    w.bed.poll_driver();
    let first_kick = w.bed.take_kick(TX_QUEUE);
    let before = w.views()[TX_QUEUE].clone();
    w.bed.guest.send_message(guest, b"two", true).expect("send");
    w.bed.poll_driver();
    let after = w.views()[TX_QUEUE].clone();
    let spec_kicks = vring_need_event(after.avail_event, after.avail_idx, before.avail_idx);
    w.record(
        StepKind::SecondKick,
        "Two publications, no device round between: the second kick",
        "2.7.10 Available Buffer Notification Suppression; 2.7.13.4 Notifying The Device",
        vec![
            format!(
                "meanwhile the guest read the ping and sent its CREDIT_UPDATE; the \
                 device took it and re-armed: avail_event {}",
                before.avail_event
            ),
            format!(
                "first packet: avail idx {} passes avail_event {}: kick ({})",
                before.avail_idx,
                before.avail_event,
                if first_kick { "sent" } else { "not sent" }
            ),
            format!(
                "second: the spec's rule, (new - avail_event - 1) < (new - old) with new {}, \
                 old {}, avail_event {}, says {}",
                after.avail_idx,
                before.avail_idx,
                after.avail_event,
                if spec_kicks { "kick" } else { "no kick: the device is awake already" }
            ),
            "virtio-drivers 0.13 asks only new > avail_event, so pier-driver kicks again".into(),
        ],
        false,
    );
    w.device_round();
    w.interrupt_handler();
    while w.bed.host.stack().recv(host_conn, &mut buf).is_ok() {}
    w.device_round();
    w.interrupt_handler();
    w.observe(false);

    // More messages than rx buffers, while the driver is not running.
    for i in 0..=RX_BUFFERS {
        w.bed.host.stack().send_message(host_conn, format!("m{i}").as_bytes(), true).expect("send");
    }
    w.device_round();
    let rx = w.views()[RX_QUEUE].clone();
    w.record(
        StepKind::RxRingDry,
        "The host has 5 messages for 4 rx buffers: the ring runs dry",
        "2.7.10 Available Buffer Notification Suppression; 5.10.6 Device Operation",
        vec![
            format!("all {RX_BUFFERS} buffers used; one message waits in the host's stack"),
            format!(
                "finding no buffer, the device sets avail_event to {}: kick me at the next one",
                rx.avail_event
            ),
        ],
        false,
    );

    w.interrupt_handler();
    while w.bed.guest.recv(guest, &mut buf).is_ok() {}
    let rx = w.views()[RX_QUEUE].clone();
    w.record(
        StepKind::RxRefilled,
        "The driver takes the 4 messages and posts the buffers again, then kicks",
        "2.7.13 Supplying Buffers to The Device; 2.7.13.4 Notifying The Device",
        vec![format!(
            "avail idx {} passes avail_event {}: the kick wakes the device",
            rx.avail_idx, rx.avail_event
        )],
        false,
    );

    w.device_round();
    w.record(
        StepKind::WaitingDelivered,
        "Kicked, the device delivers the message that waited",
        "2.7.13.4 Notifying The Device; 2.7.8 The Virtqueue Used Ring",
        vec!["the guest also owes the host credit now; its CREDIT_UPDATE follows".into()],
        false,
    );

    // A reboot: the old driver resets the device, a new one sets it up.
    let Walker { bed, shown, lifecycle_seen, interrupts_seen, steps } = w;
    let bed = bed.restart_guest(driver)?;
    let mut w = Walker { bed, shown, lifecycle_seen, interrupts_seen, steps };
    w.device_round();
    let resets = w.bed.host.stats().driver_resets;
    w.record(
        StepKind::Reset,
        "The guest reboots: status 0 resets the device, a new driver starts over",
        "2.4 Device Reset; 3.1.1 Driver Requirements: Device Initialization",
        vec![
            "the old driver's transport writes 0 as it goes; the new driver starts with 0".into(),
            "every queue is forgotten: the new driver's rings start at index 0".into(),
            format!("the host side resets the old driver's connections (driver resets: {resets})"),
        ],
        true,
    );
    Ok(w.steps)
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", wrapped("    ", self.title).trim_start())?;
        write!(f, "{}", wrapped("  spec: ", self.spec))?;
        for event in &self.lifecycle {
            match event {
                LifecycleEvent::Status { written, now } if written == now => {
                    writeln!(f, "  status <- {}", status_names(*written))?
                }
                LifecycleEvent::Status { written, now } => writeln!(
                    f,
                    "  status <- {}, device keeps {}",
                    status_names(*written),
                    status_names(*now)
                )?,
                LifecycleEvent::QueueLive(q) => {
                    writeln!(f, "  QueueReady: {} is live", queue_name(*q))?
                }
            }
        }
        for note in &self.notes {
            write!(f, "{}", wrapped("  ", note))?;
        }
        let kicked: Vec<&str> = [RX_QUEUE, TX_QUEUE, EVENT_QUEUE]
            .into_iter()
            .filter(|&q| self.kicks[q])
            .map(|q| ["rx", "tx", "event"][q])
            .collect();
        let mut line = String::new();
        if !kicked.is_empty() {
            let _ = write!(line, "kicked: {}", kicked.join(", "));
        }
        if self.interrupts > 0 {
            let sep = if line.is_empty() { "" } else { "; " };
            let _ = write!(line, "{sep}interrupts raised: {}", self.interrupts);
        }
        if !line.is_empty() {
            writeln!(f, "  {line}")?;
        }
        for ring in &self.rings {
            write!(f, "{ring}")?;
        }
        Ok(())
    }
}

/// The walk as text, numbered, for an 80-column terminal.
pub fn render(steps: &[Step]) -> String {
    let mut out = String::new();
    for (i, step) in steps.iter().enumerate() {
        let gap = if i == 0 { "" } else { "\n" };
        let _ = write!(out, "{gap}{:>2}. {step}", i + 1);
    }
    out
}
