//! The control port: one command a line, one answer line each, so a host
//! test can make the guest act as a client and collect what the probes
//! saw. The commands are listed in the crate's documentation (`main.rs`).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::pattern::{Fnv, Pattern, data};
use crate::servers::{HALF_CLOSE, RESET};
use crate::sys::{self, errno_name};

/// How long a client command may sit with no progress before it answers
/// `err EAGAIN ...`.
const STALL: Duration = Duration::from_secs(30);

/// How long `halfclose-result` and `reset-result` wait for a probe.
const PROBE_WAIT: Duration = Duration::from_secs(30);

/// Serves one control connection: a line in, a line out, until the host
/// closes it.
pub fn serve(conn: OwnedFd, cid: u32, port: u32) {
    let file = std::fs::File::from(conn);
    let mut writer = match file.try_clone() {
        Ok(w) => w,
        Err(e) => {
            crate::console::log(&format!("control {cid}:{port}: dup: {e}"));
            return;
        }
    };
    let mut reboot_asked = false;
    for line in BufReader::new(file).lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                crate::console::log(&format!("control {cid}:{port}: read: {e}"));
                break;
            }
        };
        let answer = command(line.trim());
        if let Err(e) = writer.write_all(format!("{answer}\n").as_bytes()) {
            crate::console::log(&format!("control {cid}:{port}: write: {e}"));
            return;
        }
        if line.trim() == "exit" {
            std::process::exit(0);
        }
        // The answer must reach the host first: the restart follows once
        // the host has closed the control connection.
        reboot_asked |= line.trim() == "reboot";
    }
    if reboot_asked {
        crate::sys::restart_machine();
    }
}

fn command(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["ping"] => "pong".to_owned(),
        ["stream", cid, port, len, seed] => match (num(cid), num(port), num(len), num(seed)) {
            (Some(cid), Some(port), Some(len), Some(seed)) => {
                stream_client(cid as u32, port as u32, len, seed)
            }
            _ => usage(line),
        },
        ["seqpacket", cid, port, seed, sizes] => {
            let sizes: Option<Vec<usize>> =
                sizes.split(',').map(|s| num(s).map(|n| n as usize)).collect();
            match (num(cid), num(port), num(seed), sizes) {
                (Some(cid), Some(port), Some(seed), Some(sizes)) => {
                    seqpacket_client(cid as u32, port as u32, seed, &sizes)
                }
                _ => usage(line),
            }
        }
        ["halfclose-result"] => HALF_CLOSE.pop(PROBE_WAIT).unwrap_or_else(|| "err timeout".into()),
        ["reset-result"] => RESET.pop(PROBE_WAIT).unwrap_or_else(|| "err timeout".into()),
        ["dgram", port] => match num(port) {
            Some(port) => dgram_probe(port as u32),
            None => usage(line),
        },
        ["exit"] => "bye".to_owned(),
        ["reboot"] => "rebooting".to_owned(),
        _ => usage(line),
    }
}

fn num(word: &str) -> Option<u64> {
    word.parse().ok()
}

fn usage(line: &str) -> String {
    format!("err usage {line:?}")
}

/// `stream CID PORT LEN SEED`: connect, send `LEN` bytes of
/// `Pattern(SEED)` from a second thread while this one reads the echo,
/// half-close, read to end-of-file. Answers `ok <received> <fnv hex>`.
fn stream_client(cid: u32, port: u32, len: u64, seed: u64) -> String {
    let conn = match sys::connect(libc::SOCK_STREAM, cid, port) {
        Ok(conn) => Arc::new(conn),
        Err(e) => return format!("err {} connect", errno_name(&e)),
    };
    let _ = sys::set_timeouts(conn.as_raw_fd(), STALL);
    let sender = {
        let conn = conn.clone();
        thread::Builder::new().name("stream client writer".into()).spawn(move || {
            let fd = conn.as_raw_fd();
            let mut pattern = Pattern::new(seed);
            let mut buf = vec![0u8; 64 * 1024];
            let mut sent = 0u64;
            while sent < len {
                let n = (len - sent).min(buf.len() as u64) as usize;
                pattern.fill(&mut buf[..n]);
                sys::write_all(fd, &buf[..n]).map_err(|(e, done)| {
                    format!("err {} write after={}", errno_name(&e), sent + done as u64)
                })?;
                sent += n as u64;
            }
            sys::shutdown(fd, libc::SHUT_WR).map_err(|e| format!("err {} shutdown", errno_name(&e)))
        })
    };
    let sender = match sender {
        Ok(handle) => handle,
        Err(e) => return format!("err ENOMEM thread {e}"),
    };
    let mut hash = Fnv::default();
    let mut received = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let read = loop {
        match sys::read(conn.as_raw_fd(), &mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                hash.update(&buf[..n]);
                received += n as u64;
            }
            Err(e) => break Err(format!("err {} read received={received}", errno_name(&e))),
        }
    };
    // A failed read leaves the writer maybe blocked on credit: shutting the
    // socket down both ways wakes it.
    if read.is_err() {
        let _ = sys::shutdown(conn.as_raw_fd(), libc::SHUT_RDWR);
    }
    let sent = sender.join().unwrap_or_else(|_| Err("err EOTHER writer panicked".into()));
    match (read, sent) {
        (Err(e), _) | (Ok(()), Err(e)) => e,
        (Ok(()), Ok(())) => format!("ok {received} {:016x}", hash.0),
    }
}

/// `seqpacket CID PORT SEED SIZES`: connect, then for each size `i` send
/// one message of `Pattern(SEED + i)` with `MSG_EOR` and read one message
/// back, which must be the same bytes and carry `MSG_EOR`. Answers
/// `ok intact <count>` or `ok broken <index> <what>`.
fn seqpacket_client(cid: u32, port: u32, seed: u64, sizes: &[usize]) -> String {
    let conn = match sys::connect(libc::SOCK_SEQPACKET, cid, port) {
        Ok(conn) => conn,
        Err(e) => return format!("err {} connect", errno_name(&e)),
    };
    let fd = conn.as_raw_fd();
    let _ = sys::set_timeouts(fd, STALL);
    let mut buf = vec![0u8; sizes.iter().max().copied().unwrap_or(0) + 1];
    for (i, &size) in sizes.iter().enumerate() {
        let message = data(seed.wrapping_add(i as u64), size);
        match sys::send_msg(fd, &message, true) {
            Ok(n) if n == size => {}
            Ok(n) => return format!("err EMSGSIZE send {i} sent={n} of {size}"),
            Err(e) => return format!("err {} send {i}", errno_name(&e)),
        }
        let (n, flags) = match sys::recv_msg(fd, &mut buf) {
            Ok(got) => got,
            Err(e) => return format!("err {} recv {i}", errno_name(&e)),
        };
        if flags & libc::MSG_TRUNC != 0 || n != size {
            return format!("ok broken {i} length {n} of {size}");
        }
        if buf[..n] != message[..] {
            return format!("ok broken {i} contents");
        }
        if flags & libc::MSG_EOR == 0 {
            return format!("ok broken {i} no-eor");
        }
    }
    format!("ok intact {}", sizes.len())
}

/// `dgram PORT`: a vsock datagram socket, bound, one datagram to the host's
/// `PORT`. Answers `err ERRNO <step>` at the first step that fails, or
/// `ok sent`. The virtio transport of Linux 6.1 has no datagrams, so
/// `socket` itself is expected to fail.
fn dgram_probe(port: u32) -> String {
    let fd = match sys::socket(libc::SOCK_DGRAM) {
        Ok(fd) => fd,
        Err(e) => return format!("err {} socket", errno_name(&e)),
    };
    if let Err(e) = sys::bind(&fd, libc::VMADDR_PORT_ANY) {
        return format!("err {} bind", errno_name(&e));
    }
    match sys::send_to(&fd, sys::HOST_CID, port, b"vsock-test datagram") {
        Ok(_) => "ok sent".to_owned(),
        Err(e) => format!("err {} sendto", errno_name(&e)),
    }
}
