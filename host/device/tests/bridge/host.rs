//! Host programs' side of the tests: plain blocking Unix sockets, always
//! with timeouts, and a deterministic byte pattern to check transfers with.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use pier_hybrid::{MAX_OK_LINE, connect_line, decode_seqpacket_message, parse_ok, seqpacket_flags};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::driver::TIMEOUT;

/// Connects to `<uds>` and sends `line` as given; returns the stream.
pub fn dial(uds: &Path) -> UnixStream {
    let stream = UnixStream::connect(uds).expect("connect to <uds>");
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(TIMEOUT)).unwrap();
    stream
}

/// Reads one `\n`-terminated line, a byte at a time so nothing after it is
/// taken. `None` if the socket closed first.
pub fn read_line(stream: &mut UnixStream) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => return None,
            Ok(_) if byte[0] == b'\n' => return Some(String::from_utf8(line).expect("utf-8 line")),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a line: {e}"),
        }
        assert!(line.len() < MAX_OK_LINE, "line too long: {line:?}");
    }
}

/// Parses `OK <port>`; panics on anything else.
pub fn expect_ok(line: Option<String>) -> u32 {
    let line = line.expect("socket closed instead of OK");
    parse_ok(line.as_bytes()).unwrap_or_else(|| panic!("not an OK line: {line:?}"))
}

/// `CONNECT <port>` in one write, then the `OK` line; returns the stream
/// and the host port the OK named.
pub fn connect(uds: &Path, port: u32) -> (UnixStream, u32) {
    let mut stream = dial(uds);
    stream.write_all(connect_line(port).as_bytes()).unwrap();
    let ok = expect_ok(read_line(&mut stream));
    (stream, ok)
}

/// Reads until EOF; panics on error or timeout.
pub fn read_to_end(stream: &mut UnixStream) -> Vec<u8> {
    let mut out = Vec::new();
    stream.read_to_end(&mut out).expect("read to EOF");
    out
}

/// Asserts the socket is closed with nothing in it: read returns 0 (or a
/// reset) and no bytes ever came.
pub fn expect_closed(stream: &mut UnixStream) {
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("expected the socket closed, got {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("expected the socket closed, got error {e}"),
    }
}

/// A listener for guest connections to host port `port`: `<uds>_<port>`.
pub fn listen(uds: &Path, port: u32) -> UnixListener {
    UnixListener::bind(pier_hybrid::listener_path(uds, port)).expect("bind <uds>_<port>")
}

/// Accepts one connection within the timeout.
pub fn accept(listener: &UnixListener) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(TIMEOUT)).unwrap();
                stream.set_write_timeout(Some(TIMEOUT)).unwrap();
                return stream;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "no connection arrived");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

// ----- seqpacket -----------------------------------------------------------

/// A blocking SOCK_SEQPACKET socket connected to `path`.
pub fn seq_dial(path: &Path) -> Socket {
    let sock = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    sock.connect(&SockAddr::unix(path).unwrap()).expect("connect seqpacket");
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    sock.set_write_timeout(Some(TIMEOUT)).unwrap();
    // Large messages must fit the send buffer.
    let _ = sock.set_send_buffer_size(1 << 20);
    sock
}

/// A SOCK_SEQPACKET listener at `path`.
pub fn seq_listen(path: &Path) -> Socket {
    let sock = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    sock.bind(&SockAddr::unix(path).unwrap()).unwrap();
    sock.listen(16).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    sock
}

pub fn seq_accept(listener: &Socket) -> Socket {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match listener.accept() {
            Ok((sock, _)) => {
                sock.set_nonblocking(false).unwrap();
                sock.set_read_timeout(Some(TIMEOUT)).unwrap();
                sock.set_write_timeout(Some(TIMEOUT)).unwrap();
                let _ = sock.set_send_buffer_size(1 << 20);
                return sock;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "no seqpacket connection arrived");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Sends one raw message (no framing added).
pub fn seq_send_raw(sock: &Socket, message: &[u8]) {
    let n = sock.send(message).expect("seqpacket send");
    assert_eq!(n, message.len());
}

/// Sends one data message in the bridge's framing: flags byte, then payload.
pub fn seq_send(sock: &Socket, payload: &[u8], end_of_record: bool) {
    seq_send_raw(sock, &[&[seqpacket_flags(end_of_record)][..], payload].concat());
}

/// Receives one raw message; `None` at EOF. Panics if it was truncated.
pub fn seq_recv_raw(sock: &Socket) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 1 << 20];
    let n = recv_flags(sock, &mut buf, libc::MSG_TRUNC).expect("seqpacket recv");
    assert!(n <= buf.len(), "message of {n} bytes truncated");
    if n == 0 {
        return None;
    }
    buf.truncate(n);
    Some(buf)
}

/// Asserts the bridge aborted the connection: with our offending message
/// still unread in its socket, closing it reads as ECONNRESET here.
pub fn seq_expect_reset(sock: &Socket) {
    let mut buf = [0u8; 64];
    match recv_flags(sock, &mut buf, 0) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("expected a reset, got {other:?}"),
    }
}

/// Receives one framed data message: (payload, end of record).
pub fn seq_recv(sock: &Socket) -> Option<(Vec<u8>, bool)> {
    let message = seq_recv_raw(sock)?;
    let (eor, payload) = decode_seqpacket_message(&message).expect("a framed message");
    Some((payload.to_vec(), eor))
}

/// `recv(2)` with flags into an initialised buffer (blocking, honours SO_RCVTIMEO).
pub fn recv_flags(sock: &Socket, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
    let n = unsafe {
        libc::recv(std::os::fd::AsRawFd::as_raw_fd(sock), buf.as_mut_ptr().cast(), buf.len(), flags)
    };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

// ----- a deterministic byte stream -----------------------------------------

/// The pattern repeats every PERIOD bytes; a prime, so that a lost,
/// duplicated or reordered chunk of any power-of-two size shows.
const PERIOD: usize = 65_521;

fn table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = pier_testkit::pattern::data(0x9e37_79b9_7f4a_7c15, PERIOD);
        // Twice the period, so any window of up to PERIOD bytes is one slice.
        t.extend_from_within(..);
        t
    })
}

/// Fills `buf` with the stream's bytes starting at `offset`.
pub fn fill(offset: u64, buf: &mut [u8]) {
    let t = table();
    let mut done = 0;
    while done < buf.len() {
        let start = ((offset + done as u64) % PERIOD as u64) as usize;
        let n = (buf.len() - done).min(PERIOD);
        buf[done..done + n].copy_from_slice(&t[start..start + n]);
        done += n;
    }
}

/// Whether `buf` holds the stream's bytes starting at `offset`.
pub fn matches(offset: u64, buf: &[u8]) -> bool {
    let t = table();
    let mut done = 0;
    while done < buf.len() {
        let start = ((offset + done as u64) % PERIOD as u64) as usize;
        let n = (buf.len() - done).min(PERIOD);
        if buf[done..done + n] != t[start..start + n] {
            return false;
        }
        done += n;
    }
    true
}

/// `len` bytes of the stream from `offset`.
pub fn pattern(offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(offset, &mut v);
    v
}
