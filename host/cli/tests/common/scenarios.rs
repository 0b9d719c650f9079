//! Scenarios a host program runs against a guest app, written once and
//! run against both targets: the app as a WASI component under `pier
//! run`, and the same app's source as a unikernel under `pier boot`. A
//! host program must not be able to tell the two apart, so both must pass
//! the very same checks.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::{Duration, Instant};

use pier_client::{HybridDatagram, HybridSeqpacket};

use super::{Fnv, PierRun, connect, data};

/// What a scenario needs of the guest it runs against: where its hybrid
/// vsock socket is, and what to show when a check fails.
pub trait Target {
    /// The hybrid vsock socket.
    fn uds(&self) -> &std::path::Path;
    /// The log that explains a failure (pier's stderr, a guest console).
    fn stderr(&self) -> String;
}

impl Target for PierRun {
    fn uds(&self) -> &std::path::Path {
        &self.uds
    }
    fn stderr(&self) -> String {
        PierRun::stderr(self)
    }
}

const MIB: usize = 1 << 20;

/// 64 MiB through an echo on `port`, checked with a hash; the client
/// half-closes and must get every byte back, then end-of-file.
pub fn echo_64_mib_with_half_close(run: &impl Target, port: u32) {
    let mut conn = connect(run.uds(), port);
    let total = 64 * MIB;
    let mut writer = conn.try_clone().unwrap();
    let sender = thread::spawn(move || {
        let mut sent = Fnv::default();
        for i in 0..total / MIB {
            let chunk = data(i as u64 + 1, MIB);
            sent.update(&chunk);
            writer.write_all(&chunk).unwrap();
        }
        // Half-close: the guest sees end-of-file, its echo keeps coming.
        writer.shutdown(Shutdown::Write).unwrap();
        sent
    });
    let mut received = Fnv::default();
    let mut count = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = conn.read(&mut buf).unwrap_or_else(|e| {
            panic!("read failed after {count} bytes: {e}; pier stderr:\n{}", run.stderr())
        });
        if n == 0 {
            break;
        }
        received.update(&buf[..n]);
        count += n;
    }
    let sent = sender.join().unwrap();
    assert_eq!(count, total, "every byte comes back before end-of-file");
    assert_eq!(received, sent, "the echo is byte for byte what was sent");
    assert!(!run.stderr().contains("echo:"), "echo reported an error:\n{}", run.stderr());
}

/// `clients` clients at once, client `i` sending `size(i)` bytes and
/// half-closing; each must get exactly its own bytes back, then EOF.
pub fn echo_serves_concurrent_clients(
    run: &impl Target,
    port: u32,
    clients: u64,
    size: impl Fn(u64) -> usize,
) {
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let mut conn = connect(run.uds(), port);
            let payload = data(100 + i, size(i));
            thread::spawn(move || {
                let mut writer = conn.try_clone().unwrap();
                let expected = payload.clone();
                let sender = thread::spawn(move || {
                    writer.write_all(&payload).unwrap();
                    writer.shutdown(Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                conn.read_to_end(&mut back).unwrap();
                sender.join().unwrap();
                assert!(
                    back == expected,
                    "client {i}: {} bytes back of {}",
                    back.len(),
                    expected.len()
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A seqpacket connection to the guest's `port`, retrying while it starts.
pub fn seqpacket(run: &impl Target, port: u32) -> HybridSeqpacket {
    let attempt = || HybridSeqpacket::connect_timeout(run.uds(), port, Duration::from_secs(10));
    let conn = pier_client::retry(Duration::from_secs(20), attempt)
        .unwrap_or_else(|e| panic!("seqpacket port {port} never answered: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    conn
}

/// Messages of many sizes come back one for one, with their boundaries
/// and their end-of-record marks; then a half-close ends the echo.
pub fn seqpacket_keeps_boundaries_and_end_of_record(run: &impl Target, port: u32) {
    let conn = seqpacket(run, port);
    let sizes = [1usize, 2, 100, 4096, 65_535, 65_536, 65_537, 200_000, 256 * 1024, 7];
    let mut buf = vec![0u8; pier_client::MAX_MESSAGE];
    for (i, &size) in sizes.iter().enumerate() {
        let eor = i % 3 == 0;
        let payload = data(i as u64 + 40, size);
        conn.send(&payload, eor).unwrap();
        let (n, got_eor) = conn.recv(&mut buf).unwrap_or_else(|e| {
            panic!("message {i} ({size} bytes): {e}; pier stderr:\n{}", run.stderr())
        });
        assert_eq!(n, size, "message {i}: one message back, whole");
        assert_eq!(got_eor, eor, "message {i}: the end-of-record mark survives");
        assert!(buf[..n] == payload[..], "message {i}: same bytes");
    }
    // A burst: boundaries hold even when messages queue up.
    for i in 0..50u64 {
        conn.send(&data(i, 1000 + i as usize), i % 2 == 1).unwrap();
    }
    for i in 0..50u64 {
        let (n, eor) = conn.recv(&mut buf).unwrap();
        assert_eq!(n, 1000 + i as usize, "burst message {i} keeps its size");
        assert_eq!(eor, i % 2 == 1);
        assert!(buf[..n] == data(i, 1000 + i as usize)[..]);
    }
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let (n, _) = conn.recv(&mut buf).unwrap();
    assert_eq!(n, 0, "after our half-close the guest finishes and closes");
}

/// A datagram to the guest comes back to the socket it came from, from
/// the guest port it went to (the 8-byte ports header, read back).
pub fn datagrams_round_trip(run: &impl Target, port: u32) {
    // Our host port 9000: the guest's reply to (2, 9000) arrives at
    // `<uds>_dgram_9000`, so bind there; send from it too.
    let me = HybridDatagram::bind(run.uds(), 9000).unwrap();
    me.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = vec![0u8; pier_client::MAX_DATAGRAM];
    // The component may still be binding: resend until the first answer.
    let (n, from) = loop {
        let _ = me.send_to(port, b"ping");
        if let Ok(got) = me.recv_from(&mut buf) {
            break got;
        }
        assert!(Instant::now() < deadline, "no datagram came back; stderr:\n{}", run.stderr());
    };
    assert_eq!(from, port, "from the guest port we sent to");
    assert_eq!(&buf[..n], b"ping");

    me.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for (i, size) in [0usize, 1, 1000, 32 * 1024, 65536].into_iter().enumerate() {
        let payload = data(i as u64 + 9, size);
        me.send_to(port, &payload).unwrap();
        let (n, from) = me.recv_from(&mut buf).unwrap();
        assert_eq!((n, from), (size, port), "datagram {i}: whole");
        assert!(buf[..n] == payload[..], "datagram {i}: same bytes");
    }
}
