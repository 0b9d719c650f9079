//! pier-client against `pier run`, with the guest components on the
//! other side: streams to `echo` with a half-close, refused ports,
//! seqpacket messages and datagrams through `msg-echo`, and the tokio
//! types. The listeners meet the guest in `send_file.rs`
//! (`HybridListener`) and `messages.rs` (`HybridSeqpacketListener`), and
//! every other test file connects through the crate too (`common`). The
//! crate's own tests (`host/client/tests/`) use a socat stand-in instead;
//! these show it against the real bridge.

mod common;

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::{Duration, Instant};

use common::{Fnv, PierRun, data, wasm};
use pier_client::{HybridDatagram, HybridSeqpacket, HybridStream, retry};

fn echo() -> PierRun {
    PierRun::start(&[wasm("echo").to_str().unwrap(), "--listen", "1234"])
}

fn msg_echo() -> PierRun {
    let app = wasm("msg-echo");
    // It answers datagrams to their sender, so it may send to the host.
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1235", "--connect", "2:*"])
}

/// Waits (up to 20 s) for `port` to accept a stream connection.
fn stream(run: &PierRun, port: u32) -> HybridStream {
    retry(Duration::from_secs(20), || HybridStream::connect(&run.uds, port))
        .unwrap_or_else(|e| panic!("port {port}: {e}; stderr:\n{}", run.stderr()))
}

/// 4 MiB through `echo` with a half-close, from two handles on one
/// connection; the port in `OK` is the host port pier chose, not the
/// guest's; a port nobody listens on is refused at once.
#[test]
fn stream_echo_with_half_close_and_a_refusal() {
    let run = echo();
    let conn = stream(&run, 1234);
    assert_ne!(conn.local_port(), 1234, "the host-side port pier chose");
    let payload = data(21, 4 << 20);
    let writer = conn.try_clone().unwrap();
    let sent = payload.clone();
    let sender = thread::spawn(move || {
        (&writer).write_all(&sent).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::with_capacity(payload.len());
    (&conn).read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    assert_eq!(back.len(), payload.len(), "stderr:\n{}", run.stderr());
    assert_eq!(Fnv::of(&back), Fnv::of(&payload), "the echo is what was sent");

    let asked = Instant::now();
    let e = HybridStream::connect(&run.uds, 4321).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    assert!(asked.elapsed() < Duration::from_secs(2), "refused in {:?}", asked.elapsed());
    let e = HybridSeqpacket::connect(&run.uds, 4321).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
}

/// Seqpacket messages keep their size and end-of-record mark, and
/// datagrams come back from the guest port they went to, through
/// `msg-echo` (the full scenarios run in `messages.rs` on the same
/// types).
#[test]
fn seqpacket_and_datagrams_through_msg_echo() {
    let run = msg_echo();
    let conn = retry(Duration::from_secs(20), || HybridSeqpacket::connect(&run.uds, 1235)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; pier_client::MAX_MESSAGE];
    for (i, size) in [1usize, 5000, 256 * 1024].into_iter().enumerate() {
        let (message, eor) = (data(i as u64 + 3, size), i != 1);
        conn.send(&message, eor).unwrap();
        let (n, got_eor) = conn.recv(&mut buf).unwrap();
        assert_eq!((n, got_eor), (size, eor), "message {i}");
        assert!(buf[..n] == message[..], "message {i}: same bytes");
    }

    let me = HybridDatagram::bind(&run.uds, 9100).unwrap();
    me.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (n, from) = loop {
        me.send_to(1235, b"ping").unwrap();
        if let Ok(got) = me.recv_from(&mut buf) {
            break got;
        }
        assert!(Instant::now() < deadline, "no datagram came back; stderr:\n{}", run.stderr());
    };
    assert_eq!((&buf[..n], from), (&b"ping"[..], 1235));
}

/// The tokio types against the same components.
#[test]
fn tokio_types_against_pier_run() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = echo();
    let msg_echo = msg_echo();
    drop(stream(&echo, 1234));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = pier_client::tokio::HybridStream::connect(&echo.uds, 1234).await.unwrap();
        // Small enough to sit in the socket buffers while one task writes
        // it all before reading.
        let payload = data(8, 32 * 1024);
        conn.write_all(&payload).await.unwrap();
        conn.shutdown().await.unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).await.unwrap();
        assert!(back == payload, "the async echo is what was sent");
        let e = pier_client::tokio::HybridStream::connect(&echo.uds, 4321).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");

        let mut connected = None;
        for _ in 0..400 {
            match pier_client::tokio::HybridSeqpacket::connect(&msg_echo.uds, 1235).await {
                Ok(conn) => {
                    connected = Some(conn);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let conn = connected.expect("msg-echo never answered");
        let mut buf = vec![0u8; pier_client::MAX_MESSAGE];
        conn.send(b"one message", true).await.unwrap();
        let (n, eor) = conn.recv(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], eor), (&b"one message"[..], true));

        let me = pier_client::tokio::HybridDatagram::bind(&msg_echo.uds, 9200).unwrap();
        me.send_to(1235, b"pong").await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), me.recv_from(&mut buf))
            .await
            .expect("a datagram back within 10 s")
            .unwrap();
        assert_eq!((&buf[..got.0], got.1), (&b"pong"[..], 1235));
    });
}
