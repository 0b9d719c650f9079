//! pier-client against a stand-in hybrid vsock backend built from socat
//! and a few lines of shell: nothing of pier runs here, so the stream
//! client is shown to assume nothing beyond the protocol (`CONNECT <port>`
//! out, one `OK <n>` line back, then plain bytes), and the error kinds
//! are checked against backends that refuse, answer garbage, or never
//! answer. Seqpacket and datagram framings are checked on the wire
//! against raw Unix sockets playing the backend, which frame with
//! `pier_hybrid` (whose own tests pin every byte).
//!
//! socat comes from `pier_testkit::tools::ensure` (Debian's package, installed
//! when missing); where it cannot be installed these tests fail with the
//! command to run by hand, never skip.
//!
//! The `tokio` types run the same exchanges in `tokio.rs`.

mod common;

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{Backend, data};
use pier_client::{
    HybridDatagram, HybridListener, HybridSeqpacket, HybridSeqpacketListener, HybridStream,
    datagram_path, listener_path, retry,
};
use pier_hybrid::{connect_line, encode_datagram_header, ok_line, seqpacket_flags};
use socket2::{Domain, SockAddr, Socket, Type};

/// One framed seqpacket message: the flags byte, then `message`.
fn framed(end_of_record: bool, message: &[u8]) -> Vec<u8> {
    [&[seqpacket_flags(end_of_record)][..], message].concat()
}

/// One Unix-side datagram: the ports header, then `payload`.
fn with_header(guest_port: u32, host_port: u32, payload: &[u8]) -> Vec<u8> {
    [&encode_datagram_header(guest_port, host_port)[..], payload].concat()
}

/// A stream through the stand-in: the port in `OK` is the one reported,
/// a megabyte goes both ways with a half-close, and the backend saw the
/// exact line the protocol prescribes (it refuses anything else).
#[test]
fn stream_echo_with_half_close() {
    let backend = Backend::new();
    backend.stream(
        r#"read line; [ "$line" = "CONNECT 1234" ] || exit 0; echo OK 1073741824; exec cat"#,
    );
    let conn = HybridStream::connect(backend.uds(), 1234).unwrap();
    assert_eq!(conn.local_port(), 1_073_741_824, "the port in the OK answer");
    let payload = data(1, 1 << 20);
    let writer = conn.try_clone().unwrap();
    let sent = payload.clone();
    let sender = thread::spawn(move || {
        (&writer).write_all(&sent).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    (&conn).read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    assert!(back == payload, "every byte came back ({} of {})", back.len(), payload.len());
}

/// Bytes the backend sends in the same write as `OK` belong to the
/// connection: the client reads the answer without taking them.
#[test]
fn bytes_right_after_ok_stay_in_the_stream() {
    let backend = Backend::new();
    backend.stream(r#"read line; printf 'OK 5\nearly'; exec cat"#);
    let mut conn = HybridStream::connect_timeout(backend.uds(), 5, Duration::from_secs(10))
        .expect("connect_timeout");
    assert_eq!(conn.read_timeout().unwrap(), None, "the handshake's timeouts are cleared");
    let mut early = [0u8; 5];
    conn.read_exact(&mut early).unwrap();
    assert_eq!(&early, b"early");
    let inner: UnixStream = conn.into_inner();
    (&inner).write_all(b"then more").unwrap();
    let mut more = [0u8; 9];
    (&inner).read_exact(&mut more).unwrap();
    assert_eq!(&more, b"then more", "into_inner is the connection itself");
}

/// A backend that closes without `OK` refused the port: `ConnectionRefused`,
/// whatever port was asked for; the port it accepts still works.
#[test]
fn a_refused_port_is_connection_refused() {
    let backend = Backend::new();
    backend.stream(r#"read word port; [ "$port" = 1234 ] || exit 0; echo OK 1; exec cat"#);
    let e = HybridStream::connect(backend.uds(), 4321).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("4321"), "the message names the port: {e}");
    let e = HybridStream::connect_timeout(backend.uds(), 4321, Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    HybridStream::connect(backend.uds(), 1234).expect("the port it serves");
}

/// A backend that answers something other than `OK <n>` is not one:
/// `InvalidData`, with the line it sent in the message.
#[test]
fn a_garbage_answer_is_invalid_data_with_the_line() {
    let backend = Backend::new();
    backend.stream("read line; echo HELLO THERE; sleep 5");
    let e = HybridStream::connect(backend.uds(), 1234).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("HELLO THERE"), "the message quotes the answer: {e}");
    // A line that never ends is no better.
    let backend = Backend::new();
    backend.stream("read line; head -c 200 /dev/zero | tr '\\0' x; sleep 5");
    let e = HybridStream::connect(backend.uds(), 1234).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
}

/// A socket file that does not exist is `NotFound`, naming the path, for
/// every type; one that exists with nobody behind it is refused.
#[test]
fn a_missing_socket_file_is_not_found_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("nobody.vsock");
    let e = HybridStream::connect(&uds, 1234).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains(uds.to_str().unwrap()), "names the path: {e}");
    let e = HybridStream::connect_timeout(&uds, 1234, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let e = HybridSeqpacket::connect(&uds, 1234).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("nobody.vsock_seqpacket"), "names the path: {e}");
    let dgram = HybridDatagram::bind(&uds, 9000).unwrap();
    let e = dgram.send_to(5, b"x").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("nobody.vsock_dgram"), "names the path: {e}");

    // A stale socket file (its listener is gone).
    drop(UnixListener::bind(&uds).unwrap());
    let e = HybridStream::connect(&uds, 1234).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains(uds.to_str().unwrap()), "names the path: {e}");
}

/// A backend that never answers: `connect_timeout` gives up on time.
#[test]
fn a_silent_backend_times_out() {
    let backend = Backend::new();
    backend.stream("read line; exec sleep 30");
    let started = Instant::now();
    let e =
        HybridStream::connect_timeout(backend.uds(), 1234, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

/// `retry` waits out a backend that is not there yet.
#[test]
fn retry_waits_for_a_backend_that_starts_later() {
    let backend = Backend::new();
    let started = Instant::now();
    let later = thread::spawn({
        let backend = backend.clone();
        move || {
            thread::sleep(Duration::from_millis(300));
            backend.stream("read line; echo OK 9; exec cat");
        }
    });
    let conn = retry(Duration::from_secs(20), || HybridStream::connect(backend.uds(), 9))
        .expect("connected once the backend came up");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(conn.local_port(), 9);
    later.join().unwrap();
    // Errors waiting cannot fix end the retries at once.
    let garbage = Backend::new();
    garbage.stream("read line; echo NO");
    let started = Instant::now();
    let e = retry(Duration::from_secs(20), || HybridStream::connect(garbage.uds(), 9)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The guest's connections arrive at `<uds>_<port>`, with no exchange:
/// socat plays the backend connecting there.
#[test]
fn a_listener_accepts_what_the_backend_connects() {
    let backend = Backend::new();
    let listener = HybridListener::bind(backend.uds(), 5000).unwrap();
    assert_eq!(listener.path(), listener_path(backend.uds(), 5000));
    let mut socat = backend
        .command()
        .arg("-")
        .arg(format!("UNIX-CONNECT:{}", listener.path().display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    socat.stdin.take().unwrap().write_all(b"from the guest").unwrap();
    let mut conn = listener.incoming().next().unwrap().unwrap();
    assert_eq!(conn.local_port(), 5000, "the host port the guest dialled");
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"from the guest");
    conn.write_all(b"answer").unwrap();
    drop(conn);
    let mut answer = String::new();
    socat.stdout.take().unwrap().read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "answer");
    socat.wait().unwrap();

    // The name is taken while the listener lives, freed when it goes.
    let e = HybridListener::bind(backend.uds(), 5000).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
    let path = listener.path().to_owned();
    drop(listener);
    assert!(!path.exists(), "the socket file goes with the listener");
    // A stale file (left by `into_inner`, then closed) is replaced.
    drop(HybridListener::bind(backend.uds(), 5000).unwrap().into_inner());
    assert!(path.exists());
    HybridListener::bind(backend.uds(), 5000).expect("a stale socket file is replaced");
}

/// Seqpacket through socat (a `SOCK_SEQPACKET` listener that echoes each
/// message, flags byte and all): messages keep their size and their
/// end-of-record mark, and a half-close ends in end-of-file.
#[test]
fn seqpacket_echo_through_socat() {
    let backend = Backend::new();
    backend.seqpacket(r#"read line; [ "$line" = "CONNECT 77" ] || exit 0; echo OK 3; exec cat"#);
    let conn = HybridSeqpacket::connect(backend.uds(), 77).unwrap();
    assert_eq!(conn.local_port(), 3);
    let mut buf = vec![0u8; 8192];
    for (i, size) in [1usize, 10, 100, 1000, 4000].into_iter().enumerate() {
        let (message, eor) = (data(i as u64, size), i % 2 == 0);
        conn.send(&message, eor).unwrap();
        let (n, got_eor) = conn.recv(&mut buf).unwrap();
        assert_eq!((n, got_eor), (size, eor), "message {i}");
        assert!(buf[..n] == message[..], "message {i}: same bytes");
    }
    conn.shutdown(Shutdown::Write).unwrap();
    assert_eq!(conn.recv(&mut buf).unwrap(), (0, false), "end-of-file");
    let e = HybridSeqpacket::connect(backend.uds(), 78).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
}

/// The seqpacket framing on the wire, both ways, with a raw socket as
/// the backend: one flags byte (bit 0: end of record) before each
/// message, none on `CONNECT` and `OK`; and a guest-initiated connection
/// through [`HybridSeqpacketListener`].
#[test]
fn seqpacket_framing_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let backend = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    backend.bind(&SockAddr::unix(pier_client::seqpacket_path(&uds)).unwrap()).unwrap();
    backend.listen(4).unwrap();
    let peer = thread::spawn(move || {
        let (s, _) = backend.accept().unwrap();
        let mut buf = [0u8; 64];
        let n = (&s).read(&mut buf).unwrap();
        assert_eq!(&buf[..n], connect_line(1235).as_bytes());
        s.send(ok_line(1_073_741_825).as_bytes()).unwrap();
        let n = (&s).read(&mut buf).unwrap();
        assert_eq!(buf[..n], framed(true, b"abc"), "flags byte, then the message");
        let n = (&s).read(&mut buf).unwrap();
        assert_eq!(buf[..n], framed(false, b""), "an empty message is its flags byte alone");
        s.send(&framed(false, b"xyz")).unwrap();
        s.send(&framed(true, b"")).unwrap();
        // Bit 1 is no flag the wire defines.
        s.send(b"\x02bad").unwrap();
    });
    let conn = HybridSeqpacket::connect(&uds, 1235).unwrap();
    assert_eq!(conn.local_port(), 1_073_741_825);
    conn.send(b"abc", true).unwrap();
    conn.send(b"", false).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(conn.recv(&mut buf).unwrap(), (3, false));
    assert_eq!(&buf[..3], b"xyz");
    assert_eq!(conn.recv(&mut buf).unwrap(), (0, true), "an empty message with EOR");
    let e = conn.recv(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "unknown flag bits: {e}");
    peer.join().unwrap();

    // Guest to host: the backend connects to `<uds>_<port>` and frames the
    // same way.
    let listener = HybridSeqpacketListener::bind(&uds, 6000).unwrap();
    let backend = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    backend.connect(&SockAddr::unix(listener.path()).unwrap()).unwrap();
    backend.send(&framed(true, b"from the guest")).unwrap();
    let conn = listener.accept().unwrap();
    assert_eq!(conn.local_port(), 6000);
    let mut buf = [0u8; 64];
    let (n, eor) = conn.recv(&mut buf).unwrap();
    assert_eq!((&buf[..n], eor), (&b"from the guest"[..], true));
    conn.send(b"back", false).unwrap();
    let n = (&backend).read(&mut buf).unwrap();
    assert_eq!(buf[..n], framed(false, b"back"));
    // A message larger than the buffer is an error, not a silent cut.
    backend.send(&[0u8; 100]).unwrap();
    let e = conn.recv(&mut [0u8; 10]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
}

/// Datagrams through socat (an echo bound at `<uds>_dgram` that answers
/// each datagram to its sender unchanged), then the header on the wire
/// with a raw socket as the backend.
#[test]
fn datagrams_through_socat_and_on_the_wire() {
    let backend = Backend::new();
    backend.datagram_echo();
    let me = HybridDatagram::bind(backend.uds(), 9000).unwrap();
    me.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(me.local_port(), 9000);
    let mut buf = vec![0u8; pier_client::MAX_DATAGRAM];
    for (guest_port, size) in [(5u32, 0usize), (6, 1), (7, 1000), (8, 60_000)] {
        let payload = data(u64::from(guest_port), size);
        assert_eq!(me.send_to(guest_port, &payload).unwrap(), size);
        let (n, from) = me.recv_from(&mut buf).unwrap();
        assert_eq!((n, from), (size, guest_port));
        assert!(buf[..n] == payload[..]);
    }
    let e = me.send_to(5, &vec![0u8; pier_client::MAX_DATAGRAM + 1]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

    // The header on the wire: guest port, then host port.
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let raw = UnixDatagram::bind(datagram_path(&uds)).unwrap();
    let me = HybridDatagram::bind(&uds, 0x0102_0304).unwrap();
    me.send_to(0x0a0b_0c0d, b"hi").unwrap();
    let mut wire = [0u8; 64];
    let (n, sender) = raw.recv_from(&mut wire).unwrap();
    assert_eq!(wire[..n], with_header(0x0a0b_0c0d, 0x0102_0304, b"hi"));
    assert_eq!(sender.as_pathname(), Some(me.path()), "sent from its own socket file");
    raw.send_to(&with_header(5, 0x0102_0304, b"back"), me.path()).unwrap();
    let (n, from) = me.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"back"[..], 5));
    raw.send_to(b"short", me.path()).unwrap();
    let e = me.recv_from(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    let path = me.path().to_owned();
    drop(me);
    assert!(!path.exists(), "the socket file goes with the socket");
}
