//! Packet capture at the device (`pier run --pcap`): what the endpoint
//! records, read back through tshark, against what the test made happen;
//! a capture (or a ring trace, through the same queue) that cannot keep up
//! drops and counts instead of blocking; and bad settings or files are
//! errors.

use std::io::{self, Write};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pier_device::testing::Testbed;
use pier_device::testing::pcap::{Decoded, decode};

/// tshark, installed first when the machine lacks it.
fn tshark() -> std::path::PathBuf {
    pier_testkit::tools::ensure(pier_testkit::tools::TSHARK).unwrap_or_else(|e| panic!("{e}"))
}
use pier_device::{Capture, CaptureConfig, RingTrace};
use pier_stack::phy::{FILE_HEADER_LEN, MIN_SNAPLEN, RECORD_PREFIX_LEN};
use pier_stack::wire::{Op, RawHeader, SocketType, shutdown_flags};
use pier_stack::{Error, Shutdown, SocketHandle, Stack, VMADDR_CID_ANY, VsockAddr};

const GUEST: u64 = 3;
const HOST: u64 = 2;
const CONNECT: u16 = 1;
const DISCONNECT: u16 = 2;
const CONTROL: u16 = 3;
const PAYLOAD: u16 = 4;

fn listen(stack: &mut Stack, port: u32) -> SocketHandle {
    let l = stack.socket(SocketType::Stream).unwrap();
    stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
    stack.listen(l, 16).unwrap();
    l
}

/// What a test expects of one decoded packet.
fn packet(from_guest: bool, ports: (u32, u32), op: Op, monitor_op: u16, len: u32) -> Decoded {
    let (src_cid, dst_cid) = if from_guest { (GUEST, HOST) } else { (HOST, GUEST) };
    Decoded {
        frame_len: 32 + 44 + len,
        captured_len: 32 + 44 + len,
        src_cid,
        dst_cid,
        src_port: ports.0,
        dst_port: ports.1,
        monitor_op,
        transport: 2,
        transport_len: 44,
        virtio_type: SocketType::Stream as u16,
        virtio_op: op as u16,
        virtio_len: len,
        ..Decoded::default()
    }
}

/// Compares what tshark decoded with what was expected, leaving out
/// credit values (which the test does not control) and the summary line
/// (checked on its own).
fn assert_packets(decoded: &[Decoded], expected: &[Decoded]) {
    let strip = |d: &Decoded| Decoded { summary: String::new(), ..d.clone() };
    let decoded: Vec<Decoded> = decoded.iter().map(strip).collect();
    assert_eq!(decoded.len(), expected.len(), "{decoded:#?}");
    for (i, (got, want)) in decoded.iter().zip(expected).enumerate() {
        assert_eq!(got, want, "packet {}", i + 1);
    }
}

#[test]
fn an_echo_with_a_half_close_and_a_refused_connect_decode_in_tshark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("echo.pcap");
    let mut bed = Testbed::with_defaults().unwrap();
    let (capture, handle) = Capture::create(&path, CaptureConfig::default()).unwrap();
    bed.host.set_capture(Some(capture));

    // The guest dials host port 4321, where nobody listens.
    let refused = bed.guest.socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.guest.connect(refused, VsockAddr::new(2, 4321), now).unwrap();
    bed.run();
    assert_eq!(bed.guest.finish_connect(refused), Err(Error::ConnectionReset));
    let refused_port = bed.guest.local_addr(refused).unwrap().port;

    // An echo on host port 1234: the guest sends a line and half-closes;
    // the host reads to EOF, sends the line back and closes.
    let listener = listen(bed.host.stack(), 1234);
    let client = bed.guest.socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.guest.connect(client, VsockAddr::new(2, 1234), now).unwrap();
    bed.run();
    bed.guest.finish_connect(client).unwrap();
    let port = bed.guest.local_addr(client).unwrap().port;
    let (server, _) = bed.host.stack().accept(listener).unwrap();
    let line = b"hello over vsock\n";
    assert_eq!(bed.guest.send(client, line).unwrap(), line.len());
    bed.guest.shutdown(client, Shutdown::Write).unwrap();
    bed.run();
    let mut buf = [0u8; 64];
    let got = bed.host.stack().recv(server, &mut buf).unwrap();
    assert_eq!(&buf[..got.len], line);
    assert!(bed.host.stack().recv(server, &mut buf).unwrap().eof);
    bed.host.stack().send(server, line).unwrap();
    let now = bed.now();
    bed.host.stack().close(server, now).unwrap();
    bed.run();
    let got = bed.guest.recv(client, &mut buf).unwrap();
    assert_eq!(&buf[..got.len], line);
    assert!(bed.guest.recv(client, &mut buf).unwrap().eof);
    let now = bed.now();
    bed.guest.close(client, now).unwrap();
    bed.run();

    bed.host.set_capture(None);
    let report = handle.finish();
    let decoded = decode(&tshark(), &path);
    let to_host = (port, 1234);
    let to_guest = (1234, port);
    let mut expected = vec![
        packet(true, (refused_port, 4321), Op::Request, CONNECT, 0),
        packet(false, (4321, refused_port), Op::Rst, DISCONNECT, 0),
        packet(true, to_host, Op::Request, CONNECT, 0),
        packet(false, to_guest, Op::Response, CONNECT, 0),
        packet(true, to_host, Op::Rw, PAYLOAD, line.len() as u32),
        packet(true, to_host, Op::Shutdown, DISCONNECT, 0),
        packet(false, to_guest, Op::Rw, PAYLOAD, line.len() as u32),
        packet(false, to_guest, Op::Shutdown, DISCONNECT, 0),
        // The guest, having read everything, ends the connection.
        packet(true, to_host, Op::Rst, DISCONNECT, 0),
    ];
    expected[4].payload = line.to_vec();
    expected[6].payload = line.to_vec();
    expected[5].virtio_flags = shutdown_flags::SEND;
    expected[7].virtio_flags = shutdown_flags::BOTH;
    assert_packets(&decoded, &expected);
    let summaries: Vec<&str> = decoded.iter().map(|d| d.summary.as_str()).collect();
    assert_eq!(summaries[0], "vSocket, Op: Connect, Transport: Virtio");
    assert_eq!(summaries[1], "vSocket, Op: Disconnect, Transport: Virtio");
    assert_eq!(summaries[4], "vSocket, Op: Payload, Transport: Virtio");
    assert_eq!(report.written, expected.len() as u64);
    assert_eq!((report.dropped, report.lost, report.error), (0, 0, None));
}

#[test]
fn the_snap_length_cuts_payload_and_keeps_the_original_length() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.pcap");
    let config = CaptureConfig { snaplen: MIN_SNAPLEN + 4, ..CaptureConfig::default() };
    let (mut capture, handle) = Capture::create(&path, config).unwrap();
    let header = RawHeader {
        src_cid: GUEST,
        dst_cid: HOST,
        src_port: 5,
        dst_port: 6,
        len: 1000,
        type_: SocketType::Stream as u16,
        op: Op::CreditUpdate as u16,
        ..RawHeader::default()
    };
    capture.packet(&header, &[7u8; 1000]);
    drop(capture);
    handle.finish();
    let decoded = decode(&tshark(), &path);
    assert_eq!(decoded.len(), 1);
    assert_eq!((decoded[0].frame_len, decoded[0].captured_len), (76 + 1000, 80));
    // tshark shows no payload field for a cut packet, so the file itself
    // says what was kept: one record of 80 bytes.
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len(), FILE_HEADER_LEN + 16 + 80);
    assert_eq!(file[file.len() - 4..], [7u8; 4]);
    assert_eq!(decoded[0].monitor_op, CONTROL);
    assert_eq!(decoded[0].virtio_len, 1000, "the header says what was sent");
}

/// A file that takes nothing until the test opens the gate.
#[derive(Clone, Default)]
struct GatedFile {
    open: Arc<(Mutex<bool>, Condvar)>,
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl GatedFile {
    fn open_gate(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl Write for GatedFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut open = self.open.0.lock().unwrap();
        while !*open {
            open = self.open.1.wait(open).unwrap();
        }
        self.bytes.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_capture_that_cannot_keep_up_drops_and_counts_and_never_blocks() {
    let file = GatedFile::default();
    // Room for the file header and four 100-byte packets.
    let record = RECORD_PREFIX_LEN + 100;
    let config =
        CaptureConfig { snaplen: 65_536, queue_bytes: 65_536 + FILE_HEADER_LEN + 4 * record };
    let (mut capture, handle) = Capture::start(file.clone(), config).unwrap();
    let header = RawHeader {
        src_cid: GUEST,
        dst_cid: HOST,
        len: 100,
        op: 5,
        type_: 1,
        ..RawHeader::default()
    };
    // With the file stuck, every packet must still return at once.
    let (done, finished) = mpsc::channel();
    let producer = std::thread::spawn(move || {
        for _ in 0..5000 {
            capture.packet(&header, &[1u8; 100]);
        }
        done.send(()).unwrap();
        capture
    });
    finished.recv_timeout(Duration::from_secs(10)).expect("recording a packet waited for the file");
    let capture = producer.join().unwrap();
    let stuck = handle.report();
    assert!(stuck.dropped > 0, "{stuck:?}");
    file.open_gate();
    drop(capture);
    let report = handle.finish();
    assert_eq!(report.written + report.dropped, 5000, "{report:?}");
    assert!(report.written > 0 && report.dropped == stuck.dropped, "{report:?}");
    assert_eq!(
        report.to_string(),
        format!("{} packets written, {} dropped (queue full)", report.written, report.dropped)
    );
    // The file holds exactly the records counted as written, all whole.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gated.pcap");
    std::fs::write(&path, &*file.bytes.lock().unwrap()).unwrap();
    let decoded = decode(&tshark(), &path);
    assert_eq!(decoded.len() as u64, report.written);
    assert!(decoded.iter().all(|d| d.payload == [1u8; 100] && d.monitor_op == PAYLOAD));
}

/// The ring trace goes through the same queue: stuck on its file, it
/// drops and counts rather than waits, and what it wrote reads back whole,
/// its gaps where the dropped records were.
#[test]
fn a_ring_trace_that_cannot_keep_up_drops_and_counts_and_never_blocks() {
    let file = GatedFile::default();
    let (trace, handle) = RingTrace::start(file.clone(), 8192).unwrap();
    let (done, finished) = mpsc::channel();
    let producer = std::thread::spawn(move || {
        for _ in 0..5000 {
            trace.kick(1, "driver", 1);
        }
        done.send(()).unwrap();
        trace
    });
    finished.recv_timeout(Duration::from_secs(10)).expect("recording an event waited for the file");
    let trace = producer.join().unwrap();
    assert!(handle.report().0.dropped > 0);
    file.open_gate();
    drop(trace);
    let report = handle.finish();
    assert_eq!(report.0.written + report.0.dropped, 5000, "{report}");
    let text = String::from_utf8(file.bytes.lock().unwrap().clone()).unwrap();
    let read = pier_device::ring_trace::read::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read.records.len() as u64, report.0.written);
    // The records dropped after the last one written leave no gap.
    let last = read.records.last().unwrap().seq;
    assert_eq!(read.missing, last + 1 - report.0.written);
}

/// A file whose every write fails.
struct BrokenFile;

impl Write for BrokenFile {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk on fire"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failing_file_ends_the_capture_with_its_error() {
    let (mut capture, handle) = Capture::start(BrokenFile, CaptureConfig::default()).unwrap();
    let header =
        RawHeader { src_cid: GUEST, dst_cid: HOST, op: 1, type_: 1, ..RawHeader::default() };
    capture.packet(&header, &[]);
    drop(capture);
    let report = handle.finish();
    assert_eq!(report.error.as_deref(), Some("disk on fire"));
    assert_eq!((report.written, report.lost), (0, 1));
    assert!(report.to_string().contains("1 lost: writing failed: disk on fire"), "{report}");
}

#[test]
fn bad_files_and_settings_are_errors() {
    let missing = std::path::Path::new("/nonexistent-pier-dir/capture.pcap");
    let e = Capture::create(missing, CaptureConfig::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("/nonexistent-pier-dir/capture.pcap"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pcap");
    for config in [
        CaptureConfig { snaplen: MIN_SNAPLEN - 1, ..CaptureConfig::default() },
        CaptureConfig { snaplen: 262_145, ..CaptureConfig::default() },
        CaptureConfig { queue_bytes: 100, ..CaptureConfig::default() },
    ] {
        let e = Capture::create(&path, config).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{config:?}: {e}");
    }
    assert!(!path.exists(), "a refused capture creates no file");
}
