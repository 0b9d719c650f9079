//! The bounded queue between the device thread and a recorder's writer
//! thread, shared by the packet capture ([`crate::capture`]) and the ring
//! trace ([`crate::ring_trace`]).
//!
//! The device thread is the data path for every connection, so a recorder
//! must never make it wait for a disk. Records therefore go into a buffer
//! allocated once, under a lock held only for the copy; a writer thread
//! swaps the full buffer for its empty twin and writes it out. When the
//! file cannot keep up and the buffer is full, the record is dropped and
//! counted, never waited for. Records are whole or absent, so the file
//! stays readable whatever was dropped.

use std::fs::File;
use std::io::{self, Write};
use std::mem;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What a recorder (a capture, a ring trace) has done so far.
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

/// Creates (or truncates) a recorder's file at `path`; the error names
/// the path.
pub(crate) fn create_file(path: &Path) -> io::Result<File> {
    File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))
}

/// Both ends of one queue: the device thread's [`RecordQueue::push`] and
/// everyone else's counters and [`RecordQueue::finish`].
#[derive(Debug)]
pub(crate) struct RecordQueue {
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

impl RecordQueue {
    /// Allocates the two buffers of `bytes` each and starts the writer
    /// thread `name`, which writes into `out`.
    pub(crate) fn start(
        out: impl Write + Send + 'static,
        bytes: usize,
        name: &str,
    ) -> io::Result<Arc<Self>> {
        let shared = Arc::new(RecordQueue {
            queue: Mutex::new(Queue {
                filling: Vec::with_capacity(bytes),
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
            let spare = Vec::with_capacity(bytes);
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || write_queue(&shared, out, spare))?
        };
        *shared.writer.lock().expect("recorder writer") = Some(writer);
        Ok(shared)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A writer that panicked leaves a consistent queue (it only
        // swaps buffers and adds counts), so its state is still usable.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues bytes that are not a record (a file header): they are
    /// written first and counted as nothing. The queue is empty and larger
    /// than them when this is called, right after [`Self::start`].
    pub(crate) fn begin(&self, bytes: &[u8]) {
        self.lock().filling.extend_from_slice(bytes);
    }

    /// Queues one record made of `parts`, back to back, or drops it
    /// (counted) when the queue is full; `false` when it was not queued.
    pub(crate) fn push(&self, parts: &[&[u8]]) -> bool {
        let mut queue = self.lock();
        if queue.closing {
            return false;
        }
        if queue.report.error.is_some() {
            queue.report.lost += 1;
            return false;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if queue.filling.len() + len > queue.filling.capacity() {
            queue.report.dropped += 1;
            return false;
        }
        for part in parts {
            queue.filling.extend_from_slice(part);
        }
        queue.records += 1;
        // Only a sleeping writer needs the wake-up (a syscall); a busy one
        // looks at the queue again before it sleeps.
        let wake = mem::take(&mut queue.writer_idle);
        drop(queue);
        if wake {
            self.work.notify_one();
        }
        true
    }

    /// Counts a record that was never queued (it could not be made).
    pub(crate) fn count_dropped(&self) {
        self.lock().report.dropped += 1;
    }

    /// No more records: the writer writes what is queued and ends.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.work.notify_one();
    }

    /// The counters so far; records still queued are in neither `written`
    /// nor `dropped` yet.
    pub(crate) fn report(&self) -> CaptureReport {
        self.lock().report.clone()
    }

    /// Closes the queue, waits until the writer has written what was
    /// queued and flushed, and returns the final counters.
    pub(crate) fn finish(&self) -> CaptureReport {
        self.close();
        let writer = self.writer.lock().expect("recorder writer").take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        self.report()
    }
}

/// The writer thread: waits for records, swaps the full buffer for the
/// empty `spare`, writes it without holding the lock; ends once closed and
/// empty, or at the first write error (later records count as lost).
fn write_queue(shared: &RecordQueue, mut out: impl Write, mut spare: Vec<u8>) {
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
