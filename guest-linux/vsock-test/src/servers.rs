//! The guest's listeners: the two echo servers and the two probes. Each
//! listener has an accept thread, each connection a thread of its own, so
//! one slow or stuck peer never holds up another test.
//!
//! The probes do not answer on their own connection: what they saw is
//! queued as one line in an [`Outcomes`] queue, which the control port's
//! `halfclose-result` and `reset-result` commands hand to the host test.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::pattern::{Pattern, data};
use crate::sys::{self, errno_name};

/// How long a served connection may sit with no progress before its
/// thread gives up on it (`SO_RCVTIMEO`/`SO_SNDTIMEO`).
const IDLE: Duration = Duration::from_secs(120);

/// The largest seqpacket message the echo takes: the vsock socket buffer
/// (256 KiB by default), plus one byte to see truncation.
const MAX_MESSAGE: usize = 256 * 1024 + 1;

/// Serves `listener` for ever: each accepted connection goes to `serve` on
/// a thread of its own.
pub fn spawn_acceptor(name: &'static str, listener: OwnedFd, serve: fn(OwnedFd, u32, u32)) {
    let spawned = thread::Builder::new().name(name.to_owned()).spawn(move || {
        loop {
            match sys::accept(&listener) {
                Ok((conn, cid, port)) => {
                    let started = thread::Builder::new()
                        .name(format!("{name} {cid}:{port}"))
                        .spawn(move || serve(conn, cid, port));
                    if let Err(e) = started {
                        crate::console::log(&format!("{name}: no thread for {cid}:{port}: {e}"));
                    }
                }
                Err(e) => {
                    crate::console::log(&format!("{name}: accept failed: {}", errno_name(&e)));
                    // ENFILE, ENOMEM and the like: let it pass before trying again.
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    });
    if let Err(e) = spawned {
        crate::console::log(&format!("{name}: no accept thread: {e}"));
    }
}

/// Stream echo: everything back until end-of-file, then `SHUT_WR`, so the
/// host reads every byte and then end-of-file.
pub fn stream_echo(conn: OwnedFd, cid: u32, port: u32) {
    let fd = conn.as_raw_fd();
    let _ = sys::set_timeouts(fd, IDLE);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match sys::read(fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Err((e, _)) = sys::write_all(fd, &buf[..n]) {
                    crate::console::log(&format!(
                        "stream echo {cid}:{port}: write: {}",
                        errno_name(&e)
                    ));
                    return;
                }
            }
            Err(e) => {
                crate::console::log(&format!("stream echo {cid}:{port}: read: {}", errno_name(&e)));
                return;
            }
        }
    }
    if let Err(e) = sys::shutdown(fd, libc::SHUT_WR) {
        crate::console::log(&format!("stream echo {cid}:{port}: shutdown: {}", errno_name(&e)));
    }
}

/// Seqpacket echo: each message back as one message, same bytes, with
/// `MSG_EOR` when it came with it.
pub fn seqpacket_echo(conn: OwnedFd, cid: u32, port: u32) {
    let fd = conn.as_raw_fd();
    let _ = sys::set_timeouts(fd, IDLE);
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        match sys::recv_msg(fd, &mut buf) {
            Ok((0, flags)) if flags & libc::MSG_EOR == 0 => return,
            Ok((_, flags)) if flags & libc::MSG_TRUNC != 0 => {
                crate::console::log(&format!(
                    "seqpacket echo {cid}:{port}: message over {MAX_MESSAGE}"
                ));
                return;
            }
            Ok((n, flags)) => {
                if let Err(e) = sys::send_msg(fd, &buf[..n], flags & libc::MSG_EOR != 0) {
                    crate::console::log(&format!(
                        "seqpacket echo {cid}:{port}: send: {}",
                        errno_name(&e)
                    ));
                    return;
                }
            }
            Err(e) => {
                crate::console::log(&format!(
                    "seqpacket echo {cid}:{port}: recv: {}",
                    errno_name(&e)
                ));
                return;
            }
        }
    }
}

/// Outcomes of one probe, oldest first, for the control port to hand out.
#[derive(Debug)]
pub struct Outcomes {
    queue: Mutex<VecDeque<String>>,
    ready: Condvar,
}

impl Outcomes {
    pub const fn new() -> Self {
        Self { queue: Mutex::new(VecDeque::new()), ready: Condvar::new() }
    }

    fn push(&self, line: String) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push_back(line);
        self.ready.notify_all();
    }

    /// The oldest outcome, waiting up to `timeout` for one.
    pub fn pop(&self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(line) = queue.pop_front() {
                return Some(line);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            queue = self.ready.wait_timeout(queue, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

pub static HALF_CLOSE: Outcomes = Outcomes::new();
pub static RESET: Outcomes = Outcomes::new();

/// The half-close probe. The host sends a 16-byte header (the length `N`
/// and the seed of the answer, both u64 little-endian), anything after it,
/// then `SHUT_WR`. The guest reads to end-of-file, then writes the `N`
/// bytes of `Pattern(seed)`, then `SHUT_WR` and close. The outcome is
/// `ok received=R wrote=N`, or `err ERRNO <step> ...`: a host half-close
/// that arrived as a full shutdown shows as `EPIPE` on the write.
pub fn half_close_probe(conn: OwnedFd, cid: u32, port: u32) {
    let outcome = half_close(&conn);
    if outcome.starts_with("err") {
        crate::console::log(&format!("half-close probe {cid}:{port}: {outcome}"));
    }
    HALF_CLOSE.push(outcome);
}

fn half_close(conn: &OwnedFd) -> String {
    let fd = conn.as_raw_fd();
    let _ = sys::set_timeouts(fd, Duration::from_secs(30));
    let mut header = Vec::with_capacity(16);
    let mut received = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match sys::read(fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let want = 16 - header.len().min(16);
                header.extend_from_slice(&buf[..n.min(want)]);
                received += n;
            }
            Err(e) => return format!("err {} read received={received}", errno_name(&e)),
        }
    }
    if header.len() < 16 {
        return format!("err EINVAL header received={received}");
    }
    let len = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
    let seed = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    let mut pattern = Pattern::new(seed);
    let mut wrote = 0u64;
    while wrote < len {
        let n = (len - wrote).min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        if let Err((e, done)) = sys::write_all(fd, &buf[..n]) {
            return format!(
                "err {} write after={} received={received}",
                errno_name(&e),
                wrote + done as u64
            );
        }
        wrote += n as u64;
    }
    if let Err(e) = sys::shutdown(fd, libc::SHUT_WR) {
        return format!("err {} shutdown wrote={wrote} received={received}", errno_name(&e));
    }
    format!("ok received={received} wrote={wrote}")
}

/// The reset probe. The guest first reads the [`RESET_FIRST_BYTES`] the
/// host program sends at once, then writes 4 KiB (so the host program,
/// which resets once it has them, closes with bytes unread, which makes
/// its close a reset): the greeting's arrival tells the host that its
/// bytes are in, so the reset never races them. Then it reads until the
/// connection ends and tries one more write. The outcome:
/// `ok read=R end=<eof|ERRNO> write=<ok|ERRNO> so_error=<0|ERRNO>`.
pub fn reset_probe(conn: OwnedFd, _cid: u32, _port: u32) {
    RESET.push(reset(&conn));
}

/// What the host program sends before it waits for the greeting.
pub const RESET_FIRST_BYTES: usize = 1000;

fn reset(conn: &OwnedFd) -> String {
    let fd = conn.as_raw_fd();
    let _ = sys::set_timeouts(fd, Duration::from_secs(30));
    let mut read = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while read < RESET_FIRST_BYTES {
        match sys::read(fd, &mut buf[..RESET_FIRST_BYTES - read]) {
            Ok(0) => return format!("err eof before the first bytes read={read}"),
            Ok(n) => read += n,
            Err(e) => return format!("err {} before the first bytes read={read}", errno_name(&e)),
        }
    }
    if let Err((e, done)) = sys::write_all(fd, &data(1, 4096)) {
        return format!("err {} greeting after={done}", errno_name(&e));
    }
    let end = loop {
        match sys::read(fd, &mut buf) {
            Ok(0) => break "eof".to_owned(),
            Ok(n) => read += n,
            Err(e) => break errno_name(&e),
        }
    };
    let write = match sys::write_all(fd, b"x") {
        Ok(()) => "ok".to_owned(),
        Err((e, _)) => errno_name(&e),
    };
    let so_error = match sys::so_error(fd) {
        Ok(0) => "0".to_owned(),
        Ok(code) => errno_name(&std::io::Error::from_raw_os_error(code)),
        Err(e) => format!("getsockopt-{}", errno_name(&e)),
    };
    format!("ok read={read} end={end} write={write} so_error={so_error}")
}
