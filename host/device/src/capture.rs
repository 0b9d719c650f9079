//! Packet capture for the device (`pier run --pcap FILE`): every packet
//! that crosses the virtqueues, both ways, into a pcap file Wireshark and
//! tshark decode (pier-stack's [`PcapWriter`] does the encoding).
//!
//! The device thread is the data path for every connection, so a capture
//! never makes it wait for a disk: records go through a bounded queue to a
//! writer thread ([`crate::record_queue`]), and a record the queue has no
//! room for is dropped and counted. Records are whole or absent, so the
//! file stays readable whatever was dropped.
//!
//! [`Capture`] is the device thread's end ([`crate::HostEndpoint::set_capture`]);
//! [`CaptureHandle`] is everyone else's: counters at any time, and
//! [`CaptureHandle::finish`] to write out what is queued before the
//! process exits.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use pier_stack::Instant;
use pier_stack::phy::{DEFAULT_SNAPLEN, FILE_HEADER_LEN, MIN_SNAPLEN, PcapSink, PcapWriter};
use pier_stack::wire::RawHeader;

pub use crate::record_queue::CaptureReport;
use crate::record_queue::{RecordQueue, create_file};

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

/// The device thread's end of a capture.
#[derive(Debug)]
pub struct Capture {
    writer: PcapWriter<QueueSink>,
}

/// The rest of the program's end of a capture.
#[derive(Clone, Debug)]
pub struct CaptureHandle {
    shared: Arc<RecordQueue>,
}

/// Puts records into the queue, or drops them when it is full.
#[derive(Debug)]
struct QueueSink {
    shared: Arc<RecordQueue>,
}

impl PcapSink for QueueSink {
    fn begin(&mut self, file_header: &[u8]) {
        // The queue is empty and larger than a header (`CaptureConfig::check`).
        self.shared.begin(file_header);
    }

    fn record(&mut self, prefix: &[u8], payload: &[u8]) -> bool {
        self.shared.push(&[prefix, payload])
    }
}

impl Capture {
    /// Creates (or truncates) the file at `path` and starts capturing into
    /// it. Fails at once, with the path named, when the file cannot be
    /// created.
    pub fn create(path: &Path, config: CaptureConfig) -> io::Result<(Capture, CaptureHandle)> {
        config.check()?;
        Self::start(create_file(path)?, config)
    }

    /// Starts capturing into `out`, written from a thread of its own.
    pub fn start(
        out: impl Write + Send + 'static,
        config: CaptureConfig,
    ) -> io::Result<(Capture, CaptureHandle)> {
        config.check()?;
        let shared = RecordQueue::start(out, config.queue_bytes, "pier-capture")?;
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
        self.shared.report()
    }

    /// Ends the capture: records queued are written and the file is
    /// flushed; packets from now on are not recorded. Returns the final
    /// counters. Later calls return them again.
    pub fn finish(&self) -> CaptureReport {
        self.shared.finish()
    }
}
