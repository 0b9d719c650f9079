//! Reading a ring trace back: [`parse`] checks every line and turns the
//! file into [`Record`]s; [`Rings`] replays them into the state of each
//! queue, whose [`Rings::view`] is the [`RingView`] the walkthrough
//! prints; [`describe`] says in words what each record means, with the
//! section of the virtio 1.2 spec that governs it; [`pcap_frames`] finds,
//! in the matching packet capture, the frame each packet was.
//!
//! A trace is rejected whole, with the line and the reason, when a line is
//! not a record of [`super::FORMAT_VERSION`] (a corrupt file), or when the
//! file ends in the middle of one (a truncated file). Records the device
//! dropped are not an error: each record carries absolute ring indices,
//! so the replay stays right after a gap, and [`Trace::missing`] counts
//! the gaps in the sequence numbers.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use pier_stack::phy::{FILE_HEADER_LEN, VSOCKMON_HEADER_LEN};
use pier_stack::wire::HEADER_LEN;
use serde_json::Value;

use super::view::{self, Descriptor, RingSource, RingView};
use super::{FORMAT_VERSION, HEADER_KEY};
use crate::device::NUM_QUEUES;

/// Why a trace could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The file holds nothing, not even a header.
    Empty,
    /// The first line is not a ring trace's header.
    NotATrace(String),
    /// The trace is of a format version this reader does not know.
    Version(u64),
    /// Line `line` (1-based) is not a record: `why`.
    Corrupt { line: usize, why: String },
    /// The file ends inside line `line`: it was cut short.
    Truncated { line: usize },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Empty => write!(f, "the file is empty: not a ring trace"),
            ReadError::NotATrace(why) => {
                write!(f, "not a ring trace: the first line is not its header ({why})")
            }
            ReadError::Version(v) => {
                write!(f, "ring trace format version {v}; this pier reads version {FORMAT_VERSION}")
            }
            ReadError::Corrupt { line, why } => write!(f, "line {line} is corrupt: {why}"),
            ReadError::Truncated { line } => write!(
                f,
                "the trace is truncated: line {line} ends without its newline (the file was cut \
                 short while it was written?)"
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// Where the device saw a kick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KickVia {
    /// The in-process bus: the driver's own call, as it made it.
    Driver,
    /// The device loop woke on the queue's eventfd (an ioeventfd under
    /// KVM; under vhost-user, the worker's when another thread held the
    /// round), which adds kicks up.
    Eventfd,
    /// The in-process bus or vhost-user's worker, with the device loop
    /// idle: the kicking thread ran the device's round itself, and no
    /// eventfd was written.
    Inline,
    /// The same, with the device loop awake: the kick was noted for the
    /// loop, which looks at its queues once more before it sleeps, and no
    /// eventfd was written.
    Noted,
}

/// One event of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Status {
        written: u32,
        now: u32,
    },
    Features {
        device: u64,
        driver: u64,
        accepted: bool,
    },
    Reset,
    QueueLive {
        q: usize,
        size: u16,
        desc: u64,
        avail: u64,
        used: u64,
        next_avail: u16,
        next_used: u16,
        event_idx: bool,
    },
    QueueReset {
        q: usize,
    },
    /// The device found the driver's entry `pos` of the available ring
    /// (the index was `idx`) naming the chain `head`.
    Avail {
        q: usize,
        pos: u16,
        idx: u16,
        used_event: u16,
        head: u16,
        descs: Vec<Descriptor>,
        cut: bool,
    },
    Take {
        q: usize,
        pos: u16,
        head: u16,
    },
    PutBack {
        q: usize,
        pos: u16,
    },
    Used {
        q: usize,
        head: u16,
        len: u32,
        idx: u16,
        header: Option<[u8; HEADER_LEN]>,
    },
    Notify {
        q: usize,
        used_flags: u16,
        avail_event: u16,
    },
    Irq {
        q: usize,
        raised: bool,
        used_idx: u16,
        used_event: u16,
        avail_flags: u16,
        event_idx: bool,
    },
    Kick {
        q: usize,
        via: KickVia,
        count: u64,
    },
}

impl Event {
    /// The queue the event concerns, if one.
    pub fn queue(&self) -> Option<usize> {
        match *self {
            Event::Status { .. } | Event::Features { .. } | Event::Reset => None,
            Event::QueueLive { q, .. }
            | Event::QueueReset { q }
            | Event::Avail { q, .. }
            | Event::Take { q, .. }
            | Event::PutBack { q, .. }
            | Event::Used { q, .. }
            | Event::Notify { q, .. }
            | Event::Irq { q, .. }
            | Event::Kick { q, .. } => Some(q),
        }
    }

    /// The record's `ev` name, as the format documents it.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Status { .. } => "status",
            Event::Features { .. } => "features",
            Event::Reset => "reset",
            Event::QueueLive { .. } => "queue",
            Event::QueueReset { .. } => "queue_reset",
            Event::Avail { .. } => "avail",
            Event::Take { .. } => "take",
            Event::PutBack { .. } => "putback",
            Event::Used { .. } => "used",
            Event::Notify { .. } => "notify",
            Event::Irq { .. } => "irq",
            Event::Kick { .. } => "kick",
        }
    }
}

/// One line of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The device's sequence number: gaps are records it dropped.
    pub seq: u64,
    /// Microseconds since the trace began.
    pub t_us: u64,
    pub event: Event,
}

/// A whole trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// When the trace began, in microseconds since the Unix epoch.
    pub unix_us: u64,
    pub records: Vec<Record>,
    /// Records the device dropped (gaps in the sequence numbers).
    pub missing: u64,
}

/// Reads a whole trace; see the [module documentation](self).
pub fn parse(text: &str) -> Result<Trace, ReadError> {
    if text.is_empty() {
        return Err(ReadError::Empty);
    }
    let mut lines = text.split_inclusive('\n').enumerate();
    let (_, first) = lines.next().ok_or(ReadError::Empty)?;
    let header: Value =
        serde_json::from_str(first.trim_end()).map_err(|e| ReadError::NotATrace(e.to_string()))?;
    let version = header
        .get(HEADER_KEY)
        .and_then(Value::as_u64)
        .ok_or_else(|| ReadError::NotATrace(format!("no \"{HEADER_KEY}\" version")))?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(ReadError::Version(version));
    }
    if !first.ends_with('\n') {
        return Err(ReadError::Truncated { line: 1 });
    }
    let unix_us = header.get("unix_us").and_then(Value::as_u64).unwrap_or(0);
    let mut records = Vec::new();
    let mut next_seq = 0u64;
    let mut missing = 0u64;
    for (i, line) in lines {
        let number = i + 1;
        let Some(body) = line.strip_suffix('\n') else {
            return Err(ReadError::Truncated { line: number });
        };
        let record = parse_record(body).map_err(|why| ReadError::Corrupt { line: number, why })?;
        // Two threads record (the device's and the guest's kicks), so a
        // record may come just after one numbered later: not a gap.
        if record.seq >= next_seq {
            missing += record.seq - next_seq;
            next_seq = record.seq + 1;
        } else {
            missing = missing.saturating_sub(1);
        }
        records.push(record);
    }
    Ok(Trace { unix_us, records, missing })
}

/// The fields of one record, each checked.
struct Fields<'a>(&'a serde_json::Map<String, Value>);

impl Fields<'_> {
    fn value(&self, key: &str) -> Result<&Value, String> {
        self.0.get(key).ok_or_else(|| format!("no \"{key}\""))
    }
    fn u64(&self, key: &str) -> Result<u64, String> {
        self.value(key)?.as_u64().ok_or_else(|| format!("\"{key}\" is not a number"))
    }
    fn u32(&self, key: &str) -> Result<u32, String> {
        u32::try_from(self.u64(key)?).map_err(|_| format!("\"{key}\" is out of range"))
    }
    fn u16(&self, key: &str) -> Result<u16, String> {
        u16::try_from(self.u64(key)?).map_err(|_| format!("\"{key}\" is out of range"))
    }
    fn bool(&self, key: &str) -> Result<bool, String> {
        self.value(key)?.as_bool().ok_or_else(|| format!("\"{key}\" is not true or false"))
    }
    fn queue(&self) -> Result<usize, String> {
        let q = self.u64("q")?;
        usize::try_from(q)
            .ok()
            .filter(|&q| q < NUM_QUEUES)
            .ok_or_else(|| format!("queue {q} does not exist"))
    }
}

fn parse_record(line: &str) -> Result<Record, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let map = value.as_object().ok_or("not a JSON object")?;
    let f = Fields(map);
    let ev = f.value("ev")?.as_str().ok_or("\"ev\" is not a string")?;
    let event = match ev {
        "status" => Event::Status { written: f.u32("written")?, now: f.u32("now")? },
        "features" => Event::Features {
            device: f.u64("device")?,
            driver: f.u64("driver")?,
            accepted: f.bool("accepted")?,
        },
        "reset" => Event::Reset,
        "queue" => Event::QueueLive {
            q: f.queue()?,
            size: f.u16("size")?,
            desc: f.u64("desc")?,
            avail: f.u64("avail")?,
            used: f.u64("used")?,
            next_avail: f.u16("next_avail")?,
            next_used: f.u16("next_used")?,
            event_idx: f.bool("event_idx")?,
        },
        "queue_reset" => Event::QueueReset { q: f.queue()? },
        "avail" => Event::Avail {
            q: f.queue()?,
            pos: f.u16("pos")?,
            idx: f.u16("idx")?,
            used_event: f.u16("used_event")?,
            head: f.u16("head")?,
            descs: descriptors(f.value("descs")?)?,
            cut: f.bool("cut")?,
        },
        "take" => Event::Take { q: f.queue()?, pos: f.u16("pos")?, head: f.u16("head")? },
        "putback" => Event::PutBack { q: f.queue()?, pos: f.u16("pos")? },
        "used" => Event::Used {
            q: f.queue()?,
            head: f.u16("head")?,
            len: f.u32("len")?,
            idx: f.u16("idx")?,
            header: match map.get("hdr") {
                None => None,
                Some(hex) => Some(header_bytes(hex.as_str().ok_or("\"hdr\" is not a string")?)?),
            },
        },
        "notify" => Event::Notify {
            q: f.queue()?,
            used_flags: f.u16("used_flags")?,
            avail_event: f.u16("avail_event")?,
        },
        "irq" => Event::Irq {
            q: f.queue()?,
            raised: f.bool("raised")?,
            used_idx: f.u16("used_idx")?,
            used_event: f.u16("used_event")?,
            avail_flags: f.u16("avail_flags")?,
            event_idx: f.bool("event_idx")?,
        },
        "kick" => Event::Kick {
            q: f.queue()?,
            via: match f.value("via")?.as_str() {
                Some("driver") => KickVia::Driver,
                Some("eventfd") => KickVia::Eventfd,
                Some("inline") => KickVia::Inline,
                Some("noted") => KickVia::Noted,
                _ => {
                    return Err("\"via\" is none of \"driver\", \"eventfd\", \"inline\"".into());
                }
            },
            count: f.u64("count")?,
        },
        other => return Err(format!("unknown event {other:?}")),
    };
    Ok(Record { seq: f.u64("seq")?, t_us: f.u64("t")?, event })
}

/// `[[index, addr, len, flags, next], ...]`.
fn descriptors(value: &Value) -> Result<Vec<Descriptor>, String> {
    let bad = || "\"descs\" is not a list of [index, addr, len, flags, next]".to_string();
    let list = value.as_array().ok_or_else(bad)?;
    list.iter()
        .map(|d| {
            let n: Vec<u64> = d
                .as_array()
                .filter(|a| a.len() == 5)
                .ok_or_else(bad)?
                .iter()
                .map(|v| v.as_u64().ok_or_else(bad))
                .collect::<Result<_, _>>()?;
            let small = |v: u64| u16::try_from(v).map_err(|_| bad());
            Ok(Descriptor {
                index: small(n[0])?,
                addr: n[1],
                len: u32::try_from(n[2]).map_err(|_| bad())?,
                flags: small(n[3])?,
                next: small(n[4])?,
            })
        })
        .collect()
}

fn header_bytes(hex: &str) -> Result<[u8; HEADER_LEN], String> {
    let bad = || format!("\"hdr\" is not {HEADER_LEN} bytes of hex");
    if hex.len() != 2 * HEADER_LEN || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; HEADER_LEN];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// One queue as the trace has shown it so far: every field of its rings
/// the device reported (what it never saw stays 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    pub live: bool,
    pub size: u16,
    pub event_idx: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub avail_idx: u16,
    /// One past the last available entry the device read: entries up to
    /// `avail_idx` past this one are published but not in the trace yet.
    pub avail_seen: u16,
    pub used_idx: u16,
    pub next_avail: u16,
    pub used_event: u16,
    pub avail_event: u16,
    pub used_flags: u16,
    pub avail_flags: u16,
    pub descs: Vec<Descriptor>,
    pub avail: Vec<u16>,
    pub used: Vec<(u16, u32)>,
    /// The packet each chain carries, by head, once the device returned it.
    pub packets: Vec<Option<[u8; HEADER_LEN]>>,
}

impl RingSource for QueueState {
    fn avail_head(&self, slot: u16) -> u16 {
        self.avail.get(usize::from(slot)).copied().unwrap_or(0)
    }

    fn used_element(&self, slot: u16) -> (u16, u32) {
        self.used.get(usize::from(slot)).copied().unwrap_or((0, 0))
    }

    fn descriptor(&self, index: u16) -> Descriptor {
        self.descs.get(usize::from(index)).copied().unwrap_or(Descriptor {
            index,
            addr: 0,
            len: 0,
            flags: 0,
            next: 0,
        })
    }

    fn packet(&self, chain: &[Descriptor], _used_len: Option<u32>) -> Option<String> {
        let head = chain.first()?.index;
        view::packet_text(self.packets.get(usize::from(head))?.as_ref()?)
    }
}

/// The three queues as a trace replayed so far shows them.
#[derive(Clone, Debug, Default)]
pub struct Rings {
    queues: [QueueState; NUM_QUEUES],
}

impl Rings {
    /// Applies one record.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Reset => {
                for q in &mut self.queues {
                    q.live = false;
                }
            }
            &Event::QueueLive { q, size, desc, avail, used, next_avail, next_used, event_idx } => {
                let n = usize::from(size);
                self.queues[q] = QueueState {
                    live: true,
                    size,
                    event_idx,
                    desc_table: desc,
                    avail_ring: avail,
                    used_ring: used,
                    avail_idx: next_avail,
                    avail_seen: next_avail,
                    used_idx: next_used,
                    next_avail,
                    used_event: next_used,
                    descs: (0..size)
                        .map(|index| Descriptor { index, addr: 0, len: 0, flags: 0, next: 0 })
                        .collect(),
                    avail: vec![0; n],
                    used: vec![(0, 0); n],
                    packets: vec![None; n],
                    ..QueueState::default()
                };
            }
            &Event::QueueReset { q } => self.queues[q].live = false,
            Event::Avail { q, pos, idx, used_event, head, descs, .. } => {
                let s = &mut self.queues[*q];
                if s.size == 0 {
                    return;
                }
                for d in descs {
                    if let Some(slot) = s.descs.get_mut(usize::from(d.index)) {
                        *slot = *d;
                    }
                }
                s.avail[usize::from(pos % s.size)] = *head;
                s.avail_idx = *idx;
                s.avail_seen = pos.wrapping_add(1);
                s.used_event = *used_event;
                if let Some(p) = s.packets.get_mut(usize::from(*head)) {
                    *p = None;
                }
            }
            &Event::Take { q, pos, .. } => self.queues[q].next_avail = pos.wrapping_add(1),
            &Event::PutBack { q, pos } => self.queues[q].next_avail = pos,
            &Event::Used { q, head, len, idx, header } => {
                let s = &mut self.queues[q];
                if s.size == 0 {
                    return;
                }
                s.used[usize::from(idx.wrapping_sub(1) % s.size)] = (head, len);
                s.used_idx = idx;
                if let Some(p) = s.packets.get_mut(usize::from(head)) {
                    *p = header;
                }
            }
            &Event::Notify { q, used_flags, avail_event } => {
                let s = &mut self.queues[q];
                s.used_flags = used_flags;
                s.avail_event = avail_event;
            }
            &Event::Irq { q, used_event, avail_flags, .. } => {
                let s = &mut self.queues[q];
                s.used_event = used_event;
                s.avail_flags = avail_flags;
            }
            Event::Status { .. } | Event::Features { .. } | Event::Kick { .. } => {}
        }
    }

    /// Every field of queue `queue` as it stands now.
    pub fn state(&self, queue: usize) -> &QueueState {
        &self.queues[queue]
    }

    /// Queue `queue` as it stands now.
    pub fn view(&self, queue: usize) -> RingView {
        let s = &self.queues[queue];
        let mut view = RingView {
            queue,
            size: if s.live { s.size } else { 0 },
            event_idx: s.event_idx,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
            avail_flags: s.avail_flags,
            avail_idx: s.avail_idx,
            used_event: s.used_event,
            used_flags: s.used_flags,
            used_idx: s.used_idx,
            avail_event: s.avail_event,
            device_next_avail: s.next_avail,
            chains: Vec::new(),
        };
        if s.live {
            view.fill_chains(s);
            // The trace knows an entry only once the device read it.
            let seen = s.avail_seen.wrapping_sub(s.used_event);
            view.chains.retain(|c| c.position.wrapping_sub(s.used_event) < seen);
        }
        view
    }

    /// The `avail_event` queue `queue` last showed the driver.
    fn avail_event(&self, queue: usize) -> (bool, u16) {
        let s = &self.queues[queue];
        (s.event_idx, s.avail_event)
    }
}

/// A record in words: what happened, the virtio 1.2 section that governs
/// it, and what follows from the ring state before it (`before`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub title: String,
    /// The spec's section number and title.
    pub spec: &'static str,
    pub notes: Vec<String>,
    /// The packet the record carried, as text.
    pub packet: Option<String>,
}

/// The virtio 1.2 section each event belongs to.
pub fn spec_section(event: &Event) -> &'static str {
    match event {
        Event::Status { .. } => "2.1 Device Status Field",
        Event::Features { .. } => "2.2 Feature Bits",
        Event::Reset | Event::QueueReset { .. } => "2.4 Device Reset",
        Event::QueueLive { .. } => "4.2.3.2 Virtqueue Configuration",
        Event::Avail { .. } => "2.7.13 Supplying Buffers to The Device",
        Event::Take { .. } => "2.7.6 The Virtqueue Available Ring",
        Event::PutBack { .. } => "5.10.6 Device Operation",
        Event::Used { .. } => "2.7.8 The Virtqueue Used Ring",
        Event::Notify { .. } => "2.7.10 Available Buffer Notification Suppression",
        Event::Irq { .. } => "2.7.7 Used Buffer Notification Suppression",
        Event::Kick { .. } => "2.7.13.4 Notifying The Device",
    }
}

fn short_queue(q: usize) -> &'static str {
    ["rx", "tx", "event"].get(q).copied().unwrap_or("?")
}

/// Describes `event`, which comes after the ring state `rings`.
pub fn describe(event: &Event, rings: &Rings) -> Described {
    let spec = spec_section(event);
    let mut notes = Vec::new();
    let mut packet = None;
    let title = match event {
        Event::Status { written, now } if written == now => {
            format!("status <- {}", view::status_names(*written))
        }
        Event::Status { written, now } => format!(
            "status <- {}, the device keeps {}",
            view::status_names(*written),
            view::status_names(*now)
        ),
        Event::Features { device, driver, accepted } => {
            notes.push(format!("device offers:  {}", view::feature_names(*device)));
            notes.push(format!("driver accepts: {}", view::feature_names(*driver)));
            if *accepted {
                "features negotiated: the device keeps FEATURES_OK".into()
            } else {
                "features refused: the device leaves FEATURES_OK clear".into()
            }
        }
        Event::Reset => {
            notes.push(
                "the device records its reset as it happens, inside the status write that \
                 caused it: that write is the next step"
                    .into(),
            );
            "reset: every queue is forgotten".into()
        }
        Event::QueueLive { q, size, desc, avail, used, event_idx, .. } => {
            notes.push(format!(
                "descriptor table {desc:#x}, available ring {avail:#x}, used ring {used:#x}"
            ));
            if *event_idx {
                notes.push("EVENT_IDX: used_event and avail_event decide notifications".into());
            }
            format!("{} is live: {size} entries", view::queue_name(*q))
        }
        Event::QueueReset { q } => format!("{} stops", view::queue_name(*q)),
        Event::Avail { q, pos, idx, head, descs, cut, .. } => {
            let (event_idx, avail_event) = rings.avail_event(*q);
            let total: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
            notes.push(format!(
                "{} descriptor{}, {total} bytes{}",
                descs.len(),
                if descs.len() == 1 { "" } else { "s" },
                if *cut { " (chain cut in the trace)" } else { "" }
            ));
            if event_idx {
                let new = pos.wrapping_add(1);
                let kick = view::vring_need_event(avail_event, new, *pos);
                notes.push(if kick {
                    format!(
                        "publishing this entry moved avail idx from {pos} to {new}, past \
                         avail_event {avail_event}: the driver had to kick"
                    )
                } else {
                    format!(
                        "avail_event is {avail_event}, outside [{pos}, {new}): no kick was due \
                         for this entry"
                    )
                });
            }
            let size = rings.queues[*q].size.max(1);
            format!(
                "{}: the device reads avail[{}], entry {pos}: the driver published chain {head} \
                 there (its avail idx is {idx} now)",
                short_queue(*q),
                pos % size
            )
        }
        Event::Take { q, head, .. } => {
            format!("{}: the device takes chain {head}", short_queue(*q))
        }
        Event::PutBack { q, .. } => {
            notes.push("the packet waits for a buffer it fits in".into());
            format!("{}: the device puts the chain back, unused", short_queue(*q))
        }
        Event::Used { q, head, len, idx, header } => {
            packet = header.as_ref().and_then(view::packet_text);
            let size = rings.queues[*q].size.max(1);
            format!(
                "{}: the device returns chain {head}, len {len}, at used[{}] (used idx {idx})",
                short_queue(*q),
                idx.wrapping_sub(1) % size
            )
        }
        Event::Notify { q, used_flags, avail_event } => {
            let (event_idx, _) = rings.avail_event(*q);
            if event_idx {
                let idx = rings.queues[*q].avail_idx;
                let when = if *avail_event == idx {
                    "the next publication must kick".to_string()
                } else if (avail_event.wrapping_sub(idx) as i16) < 0 {
                    format!(
                        "it is behind avail idx {idx}, so no kick is due until the index comes \
                         round to it again"
                    )
                } else {
                    format!("the publication that moves avail idx past it must kick (now {idx})")
                };
                notes.push(
                    "a publication must kick when avail_event lies in [old idx, new idx)".into(),
                );
                format!("{}: the device sets avail_event {avail_event}: {when}", short_queue(*q))
            } else if used_flags & 1 != 0 {
                format!("{}: the device sets NO_NOTIFY: no kicks wanted", short_queue(*q))
            } else {
                format!("{}: the device clears NO_NOTIFY: kick me", short_queue(*q))
            }
        }
        Event::Irq { q, raised, used_idx, used_event, avail_flags, event_idx } => {
            let why = match (raised, event_idx) {
                (true, true) => format!("used idx {used_idx} passed used_event {used_event}"),
                (false, true) => format!(
                    "used idx {used_idx} did not pass used_event {used_event}: the driver wants \
                     no interrupt yet"
                ),
                (true, false) => "NO_INTERRUPT is clear".to_string(),
                (false, false) => format!("avail flags {avail_flags}: NO_INTERRUPT"),
            };
            notes.push(why);
            let what = if *raised { "interrupt raised" } else { "interrupt suppressed" };
            format!("{}: {what}", short_queue(*q))
        }
        Event::Kick { q, via, count } => match via {
            KickVia::Driver => format!("{}: the driver kicks", short_queue(*q)),
            KickVia::Eventfd => format!(
                "{}: the device wakes on its kick eventfd ({count} kick{})",
                short_queue(*q),
                if *count == 1 { "" } else { "s" }
            ),
            KickVia::Inline => format!(
                "{}: the device loop is idle: the kicking thread runs the device's round itself",
                short_queue(*q)
            ),
            KickVia::Noted => format!(
                "{}: the device loop is awake: the kick is noted for its next round, no eventfd",
                short_queue(*q)
            ),
        },
    };
    Described { title, spec, notes, packet }
}

/// The virtio headers of a pcap file's frames, in order (frame `i` is
/// Wireshark's frame number `i + 1`).
pub fn pcap_frames(bytes: &[u8]) -> Result<Vec<[u8; HEADER_LEN]>, String> {
    const RECORD_HEADER_LEN: usize = 16;
    let magic = bytes.get(..4).ok_or("the pcap file has no header")?;
    if magic != 0xa1b2_c3d4u32.to_le_bytes() {
        return Err("not a little-endian microsecond pcap file (pier writes those)".into());
    }
    let mut at = FILE_HEADER_LEN;
    let mut frames = Vec::new();
    while at < bytes.len() {
        let record = bytes
            .get(at..at + RECORD_HEADER_LEN)
            .ok_or_else(|| format!("pcap frame {} is cut short", frames.len() + 1))?;
        let caught = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes")) as usize;
        let data = bytes
            .get(at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + caught)
            .ok_or_else(|| format!("pcap frame {} is cut short", frames.len() + 1))?;
        let header = data
            .get(VSOCKMON_HEADER_LEN..VSOCKMON_HEADER_LEN + HEADER_LEN)
            .ok_or_else(|| format!("pcap frame {} holds no virtio header", frames.len() + 1))?;
        frames.push(header.try_into().expect("a header"));
        at += RECORD_HEADER_LEN + caught;
    }
    Ok(frames)
}

/// For each record of `trace`, the pcap frame number (1-based) of the
/// packet it carried, matched by the packet's whole header: each frame
/// matches at most one record, the earliest.
pub fn match_frames(trace: &Trace, frames: &[[u8; HEADER_LEN]]) -> Vec<Option<usize>> {
    let mut by_header: HashMap<&[u8; HEADER_LEN], VecDeque<usize>> = HashMap::new();
    for (i, h) in frames.iter().enumerate() {
        by_header.entry(h).or_default().push_back(i + 1);
    }
    trace
        .records
        .iter()
        .map(|r| match &r.event {
            Event::Used { header: Some(h), .. } => {
                by_header.get_mut(h).and_then(VecDeque::pop_front)
            }
            _ => None,
        })
        .collect()
}
