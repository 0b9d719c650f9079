//! What a split virtqueue looks like at one moment (virtio 1.2 §2.7):
//! its indices, event fields and the descriptor chains in flight, with
//! who owns each, as text for an 80-column terminal.
//!
//! Two readers build these views: the virtqueue walkthrough
//! (`testing::walk`) from the rings in guest memory, and the ring trace's
//! reader ([`super::read`]) from what a trace recorded of them. Both give
//! [`RingView::fill_chains`] a [`RingSource`], so the chains and their
//! owners follow from the indices by one rule:
//!
//! entries the device has not taken yet (from its `next_avail` to the
//! available index) are the device's to take; entries it returned that
//! the driver has not taken back (from the driver's `used_event` to the
//! used index) are the driver's to take. pier's device returns chains in
//! order, so the available ring's slots between the two hold the chains
//! in flight. (`used_event` counts what the driver took back only with
//! EVENT_IDX.)

use std::fmt;

use pier_stack::virtio::VsockFeatures;
use pier_stack::wire::{self, HEADER_LEN};
use virtio_drivers::transport::DeviceStatus;

use crate::device::{RX_QUEUE, TX_QUEUE};

/// One split virtqueue at one moment (virtio 1.2 §2.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingView {
    pub queue: usize,
    pub size: u16,
    pub event_idx: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    /// The available ring's flags (NO_INTERRUPT = 1).
    pub avail_flags: u16,
    /// Chains the driver has published, ever (mod 2^16).
    pub avail_idx: u16,
    /// The used entry after which the driver wants an interrupt (EVENT_IDX);
    /// pier's driver sets it to the used entries it has taken back.
    pub used_event: u16,
    /// The used ring's flags (NO_NOTIFY = 1).
    pub used_flags: u16,
    /// Chains the device has returned, ever (mod 2^16).
    pub used_idx: u16,
    /// The available entry after which the device wants a kick (EVENT_IDX).
    pub avail_event: u16,
    /// The device's next available entry to take (not in guest memory).
    pub device_next_avail: u16,
    /// The chains in flight, oldest first.
    pub chains: Vec<Chain>,
}

/// Who may touch a chain's buffers now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// On the available ring, not taken by the device yet.
    DeviceToTake,
    /// Taken by the device, not returned yet.
    Device,
    /// On the used ring, not taken back by the driver yet.
    DriverToTake,
}

/// A descriptor chain in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Its position in the available ring's sequence (mod 2^16).
    pub position: u16,
    /// Its first descriptor's index: the id the used ring returns.
    pub head: u16,
    pub owner: Owner,
    /// The chain as the descriptor table links it, head first.
    pub descriptors: Vec<Descriptor>,
    /// The bytes the device wrote, once the chain is on the used ring.
    pub used_len: Option<u32>,
    /// The vsock packet the chain carries, once it has one.
    pub packet: Option<String>,
}

/// One entry of the descriptor table (virtio 1.2 §2.7.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub index: u16,
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
/// Longest chain followed; pier's are one or two descriptors.
const MAX_CHAIN: usize = 8;
/// Chains printed per ring; the rest are summed up.
const CHAINS_SHOWN: usize = 4;
/// The output's width.
const COLUMNS: usize = 80;

/// Where a [`RingView`]'s chains are read from: guest memory, or what a
/// ring trace recorded of it.
pub trait RingSource {
    /// The chain head in the available ring's `slot`.
    fn avail_head(&self, slot: u16) -> u16;
    /// The used ring's `slot`: the chain id and its used length.
    fn used_element(&self, slot: u16) -> (u16, u32);
    /// The descriptor at `index` of the table.
    fn descriptor(&self, index: u16) -> Descriptor;
    /// The vsock packet, as text, that the chain at `head` carries, once
    /// it carries one (`used_len` is set once it is on the used ring).
    fn packet(&self, chain: &[Descriptor], used_len: Option<u32>) -> Option<String>;
}

impl RingView {
    /// Fills [`Self::chains`] from `source`, by the rule of the [module
    /// documentation](self).
    pub fn fill_chains(&mut self, source: &impl RingSource) {
        self.chains.clear();
        let size = self.size;
        if size == 0 {
            return;
        }
        let taken_back = self.used_event;
        let in_flight = self.avail_idx.wrapping_sub(taken_back);
        for k in 0..in_flight.min(size) {
            let position = taken_back.wrapping_add(k);
            let slot = position % size;
            let returned =
                position.wrapping_sub(taken_back) < self.used_idx.wrapping_sub(taken_back);
            let (head, owner, used_len) = if returned {
                let (id, len) = source.used_element(slot);
                (id, Owner::DriverToTake, Some(len))
            } else {
                let head = source.avail_head(slot);
                let taken = position.wrapping_sub(taken_back)
                    < self.device_next_avail.wrapping_sub(taken_back);
                (head, if taken { Owner::Device } else { Owner::DeviceToTake }, None)
            };
            let descriptors = read_chain(source, size, head);
            let packet = source.packet(&descriptors, used_len);
            self.chains.push(Chain { position, head, owner, descriptors, used_len, packet });
        }
    }
}

/// A vsock header as one line of text, if it is a well-formed one.
pub fn packet_text(header: &[u8; HEADER_LEN]) -> Option<String> {
    let raw = wire::RawHeader::parse(header).ok()?;
    Some(raw.check().ok()?.to_string())
}

/// Follows the chain from `head` through the descriptor table.
fn read_chain(source: &impl RingSource, size: u16, head: u16) -> Vec<Descriptor> {
    let mut chain = Vec::new();
    let mut index = head;
    while chain.len() < MAX_CHAIN && index < size {
        let d = source.descriptor(index);
        chain.push(d);
        if d.flags & DESC_F_NEXT == 0 {
            break;
        }
        index = d.next;
    }
    chain
}

/// The spec's kick rule with EVENT_IDX (virtio 1.2 §2.7.10,
/// `vring_need_event`): kick if `avail_event` lies in the entries this
/// publication added, `old..new`, in 16-bit wrapping arithmetic.
pub fn vring_need_event(avail_event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(avail_event).wrapping_sub(1) < new.wrapping_sub(old)
}

pub fn queue_name(queue: usize) -> &'static str {
    match queue {
        RX_QUEUE => "rx (queue 0)",
        TX_QUEUE => "tx (queue 1)",
        _ => "event (queue 2)",
    }
}

/// Feature bits by name (pier-stack's names for the ones it knows).
pub fn feature_names(bits: u64) -> String {
    let known = VsockFeatures::from_bits_truncate(bits);
    let mut names: Vec<String> = known.iter_names().map(|(name, _)| name.to_string()).collect();
    let mut rest = bits & !known.bits();
    while rest != 0 {
        names.push(format!("bit {}", rest.trailing_zeros()));
        rest &= rest - 1;
    }
    if names.is_empty() { "none".into() } else { names.join(" ") }
}

/// Status bits by name (virtio 1.2 §2.1), as virtio-drivers names them.
pub fn status_names(bits: u32) -> String {
    if bits == 0 {
        return "0 (reset)".into();
    }
    let names: Vec<&str> =
        DeviceStatus::from_bits_retain(bits).iter_names().map(|(name, _)| name).collect();
    format!("{bits:#04x} {}", names.join("|"))
}

pub fn desc_flags(flags: u16) -> &'static str {
    match flags & (DESC_F_NEXT | DESC_F_WRITE) {
        0 => "-",
        DESC_F_NEXT => "NEXT",
        DESC_F_WRITE => "WRITE",
        _ => "NEXT|WRITE",
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Owner::DeviceToTake => "avail: the device's to take",
            Owner::Device => "taken: the device holds it",
            Owner::DriverToTake => "used: the driver's to take back",
        })
    }
}

impl fmt::Display for RingView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  {}, {} entries", queue_name(self.queue), self.size)?;
        if self.size == 0 {
            return writeln!(f, "    not set up");
        }
        writeln!(
            f,
            "    avail: idx {:<5} flags {}  used_event {:<5}  device took {}",
            self.avail_idx, self.avail_flags, self.used_event, self.device_next_avail
        )?;
        writeln!(
            f,
            "    used:  idx {:<5} flags {}  avail_event {}",
            self.used_idx, self.used_flags, self.avail_event
        )?;
        if self.chains.is_empty() {
            return writeln!(f, "    no chain in flight: every buffer is the driver's");
        }
        for c in self.chains.iter().take(CHAINS_SHOWN) {
            let slot = c.position % self.size;
            match c.used_len {
                Some(len) => {
                    writeln!(f, "    used[{slot}] = id {} len {len}: {}", c.head, c.owner)?
                }
                None => writeln!(f, "    avail[{slot}] = {}: {}", c.head, c.owner)?,
            }
            for d in &c.descriptors {
                let next = if d.flags & DESC_F_NEXT != 0 { d.next.to_string() } else { "-".into() };
                writeln!(
                    f,
                    "      desc {:>3}  addr {:#010x}  len {:>5}  {:<5}  next {next}",
                    d.index,
                    d.addr,
                    d.len,
                    desc_flags(d.flags)
                )?;
            }
            if let Some(packet) = &c.packet {
                write!(f, "{}", wrapped("      ", packet))?;
            }
        }
        if let Some(more) = self.chains.len().checked_sub(CHAINS_SHOWN).filter(|&n| n > 0) {
            writeln!(f, "    ... and {more} more chains like the last")?;
        }
        Ok(())
    }
}

/// `text` as lines of at most [`COLUMNS`], each starting with `indent`
/// (words longer than a line stay whole).
pub fn wrapped(indent: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from(indent);
    let hang = " ".repeat(indent.len() + 2);
    for word in text.split_whitespace() {
        let fresh = line.ends_with(' ');
        if !fresh && line.len() + 1 + word.len() > COLUMNS {
            out.push_str(line.trim_end());
            out.push('\n');
            line.clone_from(&hang);
        } else if !fresh {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}
