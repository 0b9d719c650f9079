//! The `tokio` types against the same stand-ins as `socat.rs`: a stream
//! echo with a half-close, the three error kinds, seqpacket and datagram
//! echoes, and guest-initiated connections of both types.

mod common;

use std::io;
use std::time::Duration;

use common::{Backend, ECHO, data};
use pier_client::tokio::{
    HybridDatagram, HybridListener, HybridSeqpacket, HybridSeqpacketListener, HybridStream,
};
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

#[test]
fn stream_echo_with_half_close() {
    let backend = Backend::new();
    backend.stream(ECHO);
    block_on(async {
        let mut conn = HybridStream::connect(backend.uds(), 1234).await.unwrap();
        assert_eq!(conn.local_port(), 1_073_741_824);
        // Small enough for the socket buffers, so one task can write it
        // all before reading.
        let payload = data(3, 64 * 1024);
        conn.write_all(&payload).await.unwrap();
        conn.shutdown().await.unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).await.unwrap();
        assert!(back == payload, "every byte came back");
    });
}

#[test]
fn errors_are_the_blocking_ones() {
    let refusing = Backend::new();
    refusing.stream("read line; exit 0");
    let garbage = Backend::new();
    garbage.stream("read line; echo HELLO THERE; sleep 5");
    let silent = Backend::new();
    silent.stream("read line; exec sleep 30");
    block_on(async {
        let e = HybridStream::connect(refusing.uds(), 4321).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        let e = HybridStream::connect(garbage.uds(), 4321).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("HELLO THERE"), "{e}");
        let missing = refusing.uds().with_file_name("missing.vsock");
        let e = HybridStream::connect(&missing, 1).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("missing.vsock"), "{e}");
        let e = HybridSeqpacket::connect(&missing, 1).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = HybridStream::connect_timeout(silent.uds(), 1, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    });
}

#[test]
fn seqpacket_and_datagram_echoes() {
    let backend = Backend::new();
    backend.seqpacket("read line; echo OK 3; exec cat");
    backend.datagram_echo();
    block_on(async {
        let conn = HybridSeqpacket::connect_timeout(backend.uds(), 77, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(conn.local_port(), 3);
        let mut buf = vec![0u8; 8192];
        for (i, size) in [1usize, 100, 4000].into_iter().enumerate() {
            let (message, eor) = (data(i as u64, size), i % 2 == 1);
            conn.send(&message, eor).await.unwrap();
            let (n, got_eor) = conn.recv(&mut buf).await.unwrap();
            assert_eq!((n, got_eor), (size, eor));
            assert!(buf[..n] == message[..]);
        }
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(conn.recv(&mut buf).await.unwrap(), (0, false));

        let me = HybridDatagram::bind(backend.uds(), 9000).unwrap();
        for (guest_port, size) in [(5u32, 0usize), (6, 1000), (7, 65536)] {
            let payload = data(u64::from(guest_port), size);
            me.send_to(guest_port, &payload).await.unwrap();
            let mut buf = vec![0u8; 65536];
            let (n, from) = me.recv_from(&mut buf).await.unwrap();
            assert_eq!((n, from), (size, guest_port));
            assert!(buf[..n] == payload[..]);
        }
    });
}

#[test]
fn guest_initiated_connections() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    block_on(async {
        let listener = HybridListener::bind(&uds, 5000).unwrap();
        let mut backend = tokio::net::UnixStream::connect(listener.path()).await.unwrap();
        let mut conn = listener.accept().await.unwrap();
        assert_eq!(conn.local_port(), 5000);
        backend.write_all(b"hi").await.unwrap();
        let mut two = [0u8; 2];
        conn.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"hi");

        let listener = HybridSeqpacketListener::bind(&uds, 6000).unwrap();
        let backend = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        backend.connect(&SockAddr::unix(listener.path()).unwrap()).unwrap();
        let message = [&[pier_hybrid::seqpacket_flags(true)][..], b"message"].concat();
        backend.send(&message).unwrap();
        let conn = listener.accept().await.unwrap();
        let mut buf = [0u8; 64];
        let (n, eor) = conn.recv(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], eor), (&b"message"[..], true));
        let path = listener.path().to_owned();
        drop(listener);
        assert!(!path.exists());
    });
}
