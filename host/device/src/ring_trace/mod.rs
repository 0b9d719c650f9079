//! The ring trace (`pier run|boot|vhost-user --ring-trace FILE`): one
//! line of JSON per virtqueue event, the layer below the packet capture.
//!
//! The packet capture shows what crossed the device; the ring trace shows
//! how: the driver's available entries with their descriptors, the device
//! taking each chain and returning it with its used length, the changes
//! to `avail_event` and the used ring's flags that turn kicks on and off,
//! each interrupt raised or suppressed with the `used_event` or
//! `NO_INTERRUPT` that decided it, kicks where the device can see them,
//! feature negotiation, queue setup and reset. Each returned chain that
//! carried a packet names it by its 44-byte header, so the trace lines up
//! with the pcap (`pier trace --pcap`). The format is `docs/ring-trace.md`'s
//! ([`FORMAT_VERSION`]).
//!
//! Recording follows the capture's rules ([`crate::record_queue`]): a
//! record is formatted on the stack into a fixed buffer, never allocated,
//! and queued to a writer thread, or dropped and counted when the queue
//! is full; every record carries a sequence number, so a reader knows
//! where some are missing. Switched off, each hook is one branch on an
//! `Option` that is `None`.
//!
//! [`RingTrace`] is what the device's parts hold (it is cheap to clone);
//! [`RingTraceHandle`] is the program's: counters, and
//! [`RingTraceHandle::finish`] before it exits. [`read`] turns a trace
//! back into steps and the ring state after each.

pub mod read;
pub mod view;

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pier_stack::wire::HEADER_LEN;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use crate::record_queue::{CaptureReport, RecordQueue, create_file};

/// The version the header line names; a reader refuses other versions.
pub const FORMAT_VERSION: u32 = 1;

/// The key of the header line, whose value is [`FORMAT_VERSION`].
pub const HEADER_KEY: &str = "pier_ring_trace";

/// Bytes the queue to the writer holds (twice this is allocated): about
/// 40 000 typical records between two writes.
pub const DEFAULT_QUEUE_BYTES: usize = 4 << 20;

/// Descriptors written per available entry; a longer chain's record says
/// `"cut":true`. pier's chains have one or two.
pub const MAX_DESCRIPTORS: usize = 16;

/// The longest record: an available entry with [`MAX_DESCRIPTORS`]
/// descriptors of the widest numbers fits with room to spare.
const RECORD_BYTES: usize = 2048;

const VIRTQ_DESC_F_NEXT: u16 = 1;

/// The device's end of a ring trace, shared by its queues, its register
/// file and the kicks; see the [module documentation](self).
#[derive(Clone)]
pub struct RingTrace {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Arc<RecordQueue>,
    seq: AtomicU64,
    started: Instant,
}

impl fmt::Debug for RingTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingTrace").field("seq", &self.inner.seq).finish_non_exhaustive()
    }
}

/// The program's end of a ring trace.
#[derive(Clone, Debug)]
pub struct RingTraceHandle {
    queue: Arc<RecordQueue>,
}

/// What a ring trace has done so far (the capture's counters, counting
/// ring events).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingTraceReport(pub CaptureReport);

impl fmt::Display for RingTraceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.0;
        write!(f, "{} ring events written, {} dropped (queue full)", r.written, r.dropped)?;
        if let Some(error) = &r.error {
            write!(f, ", {} lost: writing failed: {error}", r.lost)?;
        }
        Ok(())
    }
}

impl RingTraceHandle {
    /// The counters so far.
    pub fn report(&self) -> RingTraceReport {
        RingTraceReport(self.queue.report())
    }

    /// Ends the trace: what is queued is written and the file flushed;
    /// events from now on are not recorded. Later calls return the same.
    pub fn finish(&self) -> RingTraceReport {
        RingTraceReport(self.queue.finish())
    }
}

/// A record being formatted in a fixed buffer on the stack; one that
/// would not fit is abandoned whole (and counted as dropped). The buffer
/// starts uninitialised: zeroing its 2 KiB for every record cost more
/// than most records take to format.
struct Line {
    buf: [MaybeUninit<u8>; RECORD_BYTES],
    len: usize,
    overflow: bool,
}

impl Line {
    fn new() -> Self {
        Self { buf: [MaybeUninit::uninit(); RECORD_BYTES], len: 0, overflow: false }
    }

    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `write_str` wrote every byte before `len`.
        unsafe { self.buf[..self.len].assume_init_ref() }
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > RECORD_BYTES {
            self.overflow = true;
            return Err(fmt::Error);
        }
        self.buf[self.len..end].write_copy_of_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A 44-byte header as 88 lowercase hex digits. The digits are made in
/// a stack buffer and written in one call: formatting each byte with
/// `{:02x}` went through the formatter's padding 44 times per record,
/// most of what a traced packet cost.
struct Hex<'a>(&'a [u8; HEADER_LEN]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 2 * HEADER_LEN];
        for (pair, byte) in digits.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
        // Every byte is an ASCII hex digit.
        f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
    }
}

impl RingTrace {
    /// Creates (or truncates) the file at `path` and starts tracing into
    /// it. Fails at once, with the path named, when it cannot be created.
    pub fn create(path: &Path) -> io::Result<(RingTrace, RingTraceHandle)> {
        Self::start(create_file(path)?, DEFAULT_QUEUE_BYTES)
    }

    /// Starts tracing into `out` through a queue of `queue_bytes` (at
    /// least a few records' worth), written from a thread of its own.
    pub fn start(
        out: impl Write + Send + 'static,
        queue_bytes: usize,
    ) -> io::Result<(RingTrace, RingTraceHandle)> {
        if queue_bytes < 2 * RECORD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the ring trace queue must hold at least {} bytes", 2 * RECORD_BYTES),
            ));
        }
        let queue = RecordQueue::start(out, queue_bytes, "pier-ring-trace")?;
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let header = format!(
            "{{\"{HEADER_KEY}\":{FORMAT_VERSION},\"queues\":[\"rx\",\"tx\",\"event\"],\"unix_us\":{}}}\n",
            since_epoch.as_micros()
        );
        queue.begin(header.as_bytes());
        let inner = Arc::new(Inner {
            queue: queue.clone(),
            seq: AtomicU64::new(0),
            started: Instant::now(),
        });
        Ok((RingTrace { inner }, RingTraceHandle { queue }))
    }

    /// Formats one record: the common fields, `ev`, then what `body`
    /// writes (starting with a comma), and queues it.
    fn emit(&self, ev: &str, body: impl FnOnce(&mut Line) -> fmt::Result) {
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let t = self.inner.started.elapsed().as_micros();
        let mut line = Line::new();
        let written = write!(line, "{{\"seq\":{seq},\"t\":{t},\"ev\":\"{ev}\"")
            .and_then(|()| body(&mut line))
            .and_then(|()| line.write_str("}\n"));
        if written.is_err() || line.overflow {
            // Cannot happen with the bounds above; counted, never half-written.
            self.inner.queue.count_dropped();
            return;
        }
        self.inner.queue.push(&[line.as_bytes()]);
    }

    /// The driver wrote the status register; the device kept `now`.
    pub(crate) fn status(&self, written: u32, now: u32) {
        self.emit("status", |l| write!(l, ",\"written\":{written},\"now\":{now}"));
    }

    /// Features as they stood when the driver asked for FEATURES_OK (or a
    /// vhost-user frontend set them), and whether the device accepted.
    pub(crate) fn features(&self, device: u64, driver: u64, accepted: bool) {
        self.emit("features", |l| {
            write!(l, ",\"device\":{device},\"driver\":{driver},\"accepted\":{accepted}")
        });
    }

    /// The device was reset: every queue is forgotten.
    pub(crate) fn reset(&self) {
        self.emit("reset", |_| Ok(()));
    }

    /// A driver kicked `queue`: `via` is where the device saw it, `count`
    /// how many kicks it stands for (an eventfd adds them up).
    pub fn kick(&self, queue: usize, via: &str, count: u64) {
        self.emit("kick", |l| write!(l, ",\"q\":{queue},\"via\":\"{via}\",\"count\":{count}"));
    }
}

/// One queue's part of the trace, kept in its [`crate::DeviceQueue`]:
/// what the device has already reported of the rings.
#[derive(Debug)]
pub(crate) struct QueueTrace {
    trace: RingTrace,
    queue: usize,
    /// The available index up to which entries were reported.
    seen_avail: u16,
    /// The used ring's flags and `avail_event` last reported.
    notify_state: Option<(u16, u16)>,
    /// The header of the packet the next returned chain carries.
    packet: Option<[u8; HEADER_LEN]>,
}

fn load_u16<M: GuestMemory>(mem: &M, addr: u64) -> u16 {
    mem.read_obj::<u16>(GuestAddress(addr)).map(u16::from_le).unwrap_or(0)
}

impl QueueTrace {
    pub(crate) fn new(trace: RingTrace, queue: usize) -> Self {
        Self { trace, queue, seen_avail: 0, notify_state: None, packet: None }
    }

    /// The queue went live, its indices starting where `queue` says.
    pub(crate) fn live(&mut self, queue: &Queue) {
        let q = self.queue;
        let (next_avail, next_used) = (queue.next_avail(), queue.next_used());
        self.seen_avail = next_avail;
        self.notify_state = None;
        let (size, desc, avail, used) =
            (queue.size(), queue.desc_table(), queue.avail_ring(), queue.used_ring());
        let event_idx = queue.event_idx_enabled();
        self.trace.emit("queue", |l| {
            write!(
                l,
                ",\"q\":{q},\"size\":{size},\"desc\":{desc},\"avail\":{avail},\"used\":{used},\
                 \"next_avail\":{next_avail},\"next_used\":{next_used},\"event_idx\":{event_idx}"
            )
        });
    }

    /// The queue was stopped (or the device reset).
    pub(crate) fn stopped(&mut self) {
        let q = self.queue;
        self.packet = None;
        self.trace.emit("queue_reset", |l| write!(l, ",\"q\":{q}"));
    }

    /// The device took the chain at `head`: first the available entries
    /// published since the last look, each with its descriptors, then the
    /// take.
    pub(crate) fn took<M: GuestMemory>(&mut self, mem: &M, queue: &Queue, head: u16) {
        let q = self.queue;
        let size = queue.size();
        let avail = queue.avail_ring();
        let idx = load_u16(mem, avail + 2);
        let used_event = load_u16(mem, avail + 4 + 2 * u64::from(size));
        let new = idx.wrapping_sub(self.seen_avail).min(size);
        for k in 0..new {
            let pos = self.seen_avail.wrapping_add(k);
            let slot = u64::from(pos % size.max(1));
            let chain_head = load_u16(mem, avail + 4 + 2 * slot);
            self.trace.emit("avail", |l| {
                write!(
                    l,
                    ",\"q\":{q},\"pos\":{pos},\"idx\":{idx},\"used_event\":{used_event},\
                     \"head\":{chain_head},\"descs\":["
                )?;
                let cut = write_chain(l, mem, queue.desc_table(), size, chain_head)?;
                write!(l, "],\"cut\":{cut}")
            });
        }
        self.seen_avail = idx;
        let pos = queue.next_avail().wrapping_sub(1);
        self.trace.emit("take", |l| write!(l, ",\"q\":{q},\"pos\":{pos},\"head\":{head}"));
    }

    /// The device put the chain it took back on the ring (a packet that
    /// did not fit waits for a bigger buffer).
    pub(crate) fn put_back(&mut self, queue: &Queue) {
        let q = self.queue;
        let pos = queue.next_avail();
        self.trace.emit("putback", |l| write!(l, ",\"q\":{q},\"pos\":{pos}"));
    }

    /// The packet the next returned chain carries.
    pub(crate) fn carries(&mut self, header: &[u8]) {
        self.packet = header.first_chunk::<HEADER_LEN>().copied();
    }

    /// The device returned the chain at `head` with `len` bytes written.
    pub(crate) fn used(&mut self, queue: &Queue, head: u16, len: u32) {
        let q = self.queue;
        let idx = queue.next_used();
        let packet = self.packet.take();
        self.trace.emit("used", |l| {
            write!(l, ",\"q\":{q},\"head\":{head},\"len\":{len},\"idx\":{idx}")?;
            match &packet {
                Some(h) => write!(l, ",\"hdr\":\"{}\"", Hex(h)),
                None => Ok(()),
            }
        });
    }

    /// The device turned the driver's kicks on or off: records the used
    /// ring's flags and `avail_event` when they changed.
    pub(crate) fn notifications<M: GuestMemory>(&mut self, mem: &M, queue: &Queue) {
        let used = queue.used_ring();
        let flags = load_u16(mem, used);
        let avail_event = load_u16(mem, used + 4 + 8 * u64::from(queue.size()));
        if self.notify_state == Some((flags, avail_event)) {
            return;
        }
        self.notify_state = Some((flags, avail_event));
        let q = self.queue;
        self.trace.emit("notify", |l| {
            write!(l, ",\"q\":{q},\"used_flags\":{flags},\"avail_event\":{avail_event}")
        });
    }

    /// The device decided whether the used entries since its last decision
    /// call for an interrupt: with what the driver had asked.
    pub(crate) fn interrupt<M: GuestMemory>(&mut self, mem: &M, queue: &Queue, raised: bool) {
        let q = self.queue;
        let avail = queue.avail_ring();
        let avail_flags = load_u16(mem, avail);
        let used_event = load_u16(mem, avail + 4 + 2 * u64::from(queue.size()));
        let used_idx = queue.next_used();
        let event_idx = queue.event_idx_enabled();
        self.trace.emit("irq", |l| {
            write!(
                l,
                ",\"q\":{q},\"raised\":{raised},\"used_idx\":{used_idx},\"used_event\":{used_event},\
                 \"avail_flags\":{avail_flags},\"event_idx\":{event_idx}"
            )
        });
    }
}

/// Writes the chain at `head` as `[index,addr,len,flags,next]` arrays;
/// returns whether it was cut at [`MAX_DESCRIPTORS`].
fn write_chain<M: GuestMemory>(
    l: &mut Line,
    mem: &M,
    table: u64,
    size: u16,
    head: u16,
) -> Result<bool, fmt::Error> {
    let mut index = head;
    // A loop in the chain ends at the queue's size, as the device's walk does.
    for shown in 0..usize::from(size) {
        if index >= size {
            break;
        }
        let at = GuestAddress(table).checked_add(16 * u64::from(index));
        let Some(desc) =
            at.and_then(|at| mem.read_obj::<virtio_queue::desc::split::Descriptor>(at).ok())
        else {
            break;
        };
        if shown == MAX_DESCRIPTORS {
            return Ok(true);
        }
        let sep = if shown == 0 { "" } else { "," };
        write!(
            l,
            "{sep}[{index},{},{},{},{}]",
            desc.addr().raw_value(),
            desc.len(),
            desc.flags(),
            desc.next()
        )?;
        if desc.flags() & VIRTQ_DESC_F_NEXT == 0 {
            break;
        }
        index = desc.next();
    }
    Ok(false)
}
