//! The stream echo every throughput benchmark measures the same way: a
//! host program writing in chunks from one thread while another reads the
//! echo back ([`echo`]), and the floor under every hybrid-socket path, a
//! Unix socket pair that a thread echoes ([`unix_pair_echo`], through
//! [`serve_echo`]).
//!
//! It needs nothing from the benchmark harness, so the `socket_floor`
//! example shares it too.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Instant;

/// Echoes `total` bytes in `write`-byte writes; returns bytes per second.
pub fn echo<S: Read + Write + Send + 'static>(
    stream: S,
    mut reader: S,
    shutdown: impl FnOnce(&S) + Send + 'static,
    total: u64,
    write: usize,
) -> f64 {
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut stream = stream;
        let chunk = vec![0x42u8; write];
        let mut sent = 0u64;
        while sent < total {
            stream.write_all(&chunk).unwrap();
            sent += write as u64;
        }
        shutdown(&stream);
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    writer.join().unwrap();
    assert_eq!(got, total, "every byte echoed");
    total as f64 / started.elapsed().as_secs_f64()
}

/// A Unix socket pair whose far end a thread echoes: the floor any
/// hybrid-socket path sits on.
pub fn unix_pair_echo(total: u64, write: usize) -> f64 {
    let (near, far) = UnixStream::pair().unwrap();
    let echoer = serve_echo(far, |s| s.shutdown(Shutdown::Write).unwrap());
    let reader = near.try_clone().unwrap();
    let rate = echo(near, reader, |s| s.shutdown(Shutdown::Write).unwrap(), total, write);
    echoer.join().unwrap();
    rate
}

/// Echoes what `far` reads back into it, on a thread of its own, until
/// end of file; then `shutdown` ends its writing side.
pub fn serve_echo<S: Read + Write + Send + 'static>(
    mut far: S,
    shutdown: impl FnOnce(&S) + Send + 'static,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = far.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            far.write_all(&buf[..n]).unwrap();
        }
        shutdown(&far);
    })
}
