//! Packet capture for the device (`pier run --pcap FILE`): every packet
//! that crosses the virtqueues, both ways, into a pcap file Wireshark and
//! tshark decode (pier-stack's [`PcapWriter`] does the encoding).
//!
//! The device thread is the data path for every connection, so a capture
//! must never make it wait for a disk. Records therefore go into a bounded
//! buffer, allocated once, under a lock held only for the copy; a writer
//! thread swaps the full buffer for its empty twin and writes it out. When
//! the file cannot keep up and the buffer is full, the record is dropped
//! and counted, never waited for. Records are whole or absent, so the file
//! stays readable whatever was dropped.
//!
//! [`Capture`] is the device thread's end ([`crate::HostEndpoint::set_capture`]);
//! [`CaptureHandle`] is everyone else's: counters at any time, and
//! [`CaptureHandle::finish`] to write out what is queued before the
//! process exits.

use std::fs::File;
use std::io::{self, Write};
use std::mem;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use pier_stack::Instant;
use pier_stack::phy::{DEFAULT_SNAPLEN, FILE_HEADER_LEN, MIN_SNAPLEN, PcapSink, PcapWriter};
use pier_stack::wire::RawHeader;

/// Settings of one capture.
#[derive(Clone, Copy, Debug)]
pub struct CaptureConfig {
    /// Bytes kept of each packet, counting the 32-byte vsockmon header
    /// and the 44-byte virtio header; the rest of the payload is cut.
    pub snaplen: u32,
    /// Bytes the queue to the writer thread holds (twice this is
    /// allocated: the buffer being filled and the one being written).
    pub queue_bytes: usize,
}

impl Default for CaptureConfig {
    /// Whole packets, and 4 MiB of queue: about 60 full-size packets, or
    /// tens of thousands of small ones, between two writes.
    fn default() -> Self {
        Self { snaplen: DEFAULT_SNAPLEN, queue_bytes: 4 << 20 }
    }
}

impl CaptureConfig {
    fn check(&self) -> io::Result<()> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
        if !(MIN_SNAPLEN..=DEFAULT_SNAPLEN).contains(&self.snaplen) {
            return Err(invalid(format!(
                "the snap length must be between {MIN_SNAPLEN} (both headers) and {DEFAULT_SNAPLEN}, not {}",
                self.snaplen
            )));
        }
        if self.queue_bytes < FILE_HEADER_LEN + self.snaplen as usize {
            return Err(invalid(format!(
                "the capture queue ({} bytes) must hold at least one record of the snap length",
                self.queue_bytes
            )));
        }
        Ok(())
    }
}

/// What a capture has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureReport {
    /// Records in the file.
    pub written: u64,
    /// Records dropped because the queue was full (the file could not keep
    /// up with the device).
    pub dropped: u64,
    /// Records lost because writing the file failed.
    pub lost: u64,
    /// The write error that ended the capture, if one did.
    pub error: Option<String>,
}

impl std::fmt::Display for CaptureReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} packets written, {} dropped (queue full)", self.written, self.dropped)?;
        if let Some(error) = &self.error {
            write!(f, ", {} lost: writing failed: {error}", self.lost)?;
        }
        Ok(())
    }
}

/// The device thread's end of a capture.
#[derive(Debug)]
pub struct Capture {
    writer: PcapWriter<QueueSink>,
}

/// The rest of the program's end of a capture.
#[derive(Clone, Debug)]
pub struct CaptureHandle {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the writer has something to do.
    work: Condvar,
    writer: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Queue {
    /// Records waiting for the writer; never grows past its capacity.
    filling: Vec<u8>,
    /// Records in `filling`.
    records: u64,
    /// The writer sleeps until the next record.
    writer_idle: bool,
    /// No more records: the writer writes what is queued and ends.
    closing: bool,
    report: CaptureReport,
}

/// Puts records into the queue, or drops them when it is full.
#[derive(Debug)]
struct QueueSink {
    shared: Arc<Shared>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A writer that panicked leaves a consistent queue (it only
        // swaps buffers and adds counts), so its state is still usable.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn close(&self) {
        self.lock().closing = true;
        self.work.notify_one();
    }
}

impl PcapSink for QueueSink {
    fn begin(&mut self, file_header: &[u8]) {
        // The queue is empty and larger than a header (`CaptureConfig::check`).
        self.shared.lock().filling.extend_from_slice(file_header);
    }

    fn record(&mut self, prefix: &[u8], payload: &[u8]) -> bool {
        let mut queue = self.shared.lock();
        if queue.closing {
            return false;
        }
        if queue.report.error.is_some() {
            queue.report.lost += 1;
            return false;
        }
        let len = prefix.len() + payload.len();
        if queue.filling.len() + len > queue.filling.capacity() {
            queue.report.dropped += 1;
            return false;
        }
        queue.filling.extend_from_slice(prefix);
        queue.filling.extend_from_slice(payload);
        queue.records += 1;
        // Only a sleeping writer needs the wake-up (a syscall); a busy one
        // looks at the queue again before it sleeps.
        let wake = mem::take(&mut queue.writer_idle);
        drop(queue);
        if wake {
            self.shared.work.notify_one();
        }
        true
    }
}

impl Capture {
    /// Creates (or truncates) the file at `path` and starts capturing into
    /// it. Fails at once, with the path named, when the file cannot be
    /// created.
    pub fn create(path: &Path, config: CaptureConfig) -> io::Result<(Capture, CaptureHandle)> {
        config.check()?;
        let file = File::create(path).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display()))
        })?;
        Self::start(file, config)
    }

    /// Starts capturing into `out`, written from a thread of its own.
    pub fn start(
        out: impl Write + Send + 'static,
        config: CaptureConfig,
    ) -> io::Result<(Capture, CaptureHandle)> {
        config.check()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                filling: Vec::with_capacity(config.queue_bytes),
                records: 0,
                writer_idle: false,
                closing: false,
                report: CaptureReport::default(),
            }),
            work: Condvar::new(),
            writer: Mutex::new(None),
        });
        let writer = {
            let shared = shared.clone();
            let spare = Vec::with_capacity(config.queue_bytes);
            std::thread::Builder::new()
                .name("pier-capture".into())
                .spawn(move || write_queue(&shared, out, spare))?
        };
        *shared.writer.lock().expect("capture writer") = Some(writer);
        let sink = QueueSink { shared: shared.clone() };
        let capture = Capture { writer: PcapWriter::new(sink, config.snaplen) };
        Ok((capture, CaptureHandle { shared }))
    }

    /// Records one packet, stamped with the wall clock; drops it (counted)
    /// when the queue is full.
    pub fn packet(&mut self, header: &RawHeader, payload: &[u8]) {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let now = Instant::from_micros(since_epoch.as_micros() as u64);
        self.writer.packet(now, header, payload);
    }
}

impl Drop for Capture {
    /// The device is gone: the writer writes what is queued and ends.
    fn drop(&mut self) {
        self.writer.sink().shared.close();
    }
}

impl CaptureHandle {
    /// The counters so far; records still queued are in neither `written`
    /// nor `dropped` yet.
    pub fn report(&self) -> CaptureReport {
        self.shared.lock().report.clone()
    }

    /// Ends the capture: records queued are written and the file is
    /// flushed; packets from now on are not recorded. Returns the final
    /// counters. Later calls return them again.
    pub fn finish(&self) -> CaptureReport {
        self.shared.close();
        let writer = self.shared.writer.lock().expect("capture writer").take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        self.report()
    }
}

/// The writer thread: waits for records, swaps the full buffer for the
/// empty `spare`, writes it without holding the lock; ends once closed and
/// empty, or at the first write error (later records count as lost).
fn write_queue(shared: &Shared, mut out: impl Write, mut spare: Vec<u8>) {
    loop {
        let (records, closing) = {
            let mut queue = shared.lock();
            while queue.filling.is_empty() && !queue.closing {
                queue.writer_idle = true;
                queue = shared.work.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            queue.writer_idle = false;
            mem::swap(&mut queue.filling, &mut spare);
            (mem::take(&mut queue.records), queue.closing)
        };
        let mut result = out.write_all(&spare);
        if closing {
            result = result.and_then(|()| out.flush());
        }
        spare.clear();
        let mut queue = shared.lock();
        match result {
            Ok(()) => queue.report.written += records,
            Err(e) => {
                // What queued up meanwhile will never be written either.
                queue.report.lost += records + mem::take(&mut queue.records);
                queue.filling.clear();
                queue.report.error = Some(e.to_string());
                return;
            }
        }
        if closing && queue.filling.is_empty() {
            return;
        }
    }
}
