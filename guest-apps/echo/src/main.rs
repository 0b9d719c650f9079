//! Stream echo server: everything a peer sends comes back to it.
//!
//! It is the worked example of serving many connections from one thread:
//! every socket is non-blocking, one `Poller` waits for whichever is ready,
//! and each connection keeps just the bytes it could not write back yet.
//! When a peer half-closes, the server finishes echoing what it read, then
//! closes its side.
//!
//! Usage: `echo [--port N] [--log-ends]` (default port 1234). With
//! `--log-ends` it also says when a peer's stream ended in order (an
//! error always is): how a test sees that this side saw the end of a
//! connection its peer killed, not only that a counter dropped.
//!
//! The same source builds for wasm32-wasip2 and x86_64-unknown-none; the
//! attribute below is its one per-target line.

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::eprintln;
use pier_rt::io::{self, ErrorKind, Read, Write};
use pier_rt::prelude::*;
use pier_rt::process::ExitCode;
use pier_rt::{Poller, Shutdown, VsockAddr, VsockAddrExt, VsockListener, VsockStream};

pier_rt::main!(main);

const DEFAULT_PORT: u32 = 1234;
/// Bytes read per connection before they must be written back: small, as
/// echo serves many peers at once rather than one fast one (bench-echo is
/// the fast one).
const BUF_SIZE: usize = 16 * 1024;
/// Connections served at once: as many as the shim's default socket limit
/// allows, so echo accepts eagerly and a burst is served rather than
/// refused. Past this, new peers wait in the backlog, and memory stays
/// bounded (16 KiB each) whatever the peers do.
const MAX_CONNS: usize = 1000;
/// Read/write rounds one connection gets per wakeup, so a fast peer cannot
/// starve the others. Readiness is level-triggered: leftovers are reported
/// again on the next wait.
const ROUNDS: usize = 16;
/// The listener's token; connections use their index.
const LISTENER: usize = usize::MAX;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let (port, log_ends) = parse_args()?;
    let listener = VsockListener::bind(VsockAddr::any_cid(port))?;
    listener.set_nonblocking(true)?;
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let mut poller = Poller::with_capacity(conns.len() + 1);
        if conns.len() < MAX_CONNS {
            poller.add(listener.readable(), LISTENER);
        }
        for (i, conn) in conns.iter().enumerate() {
            if conn.has_pending() {
                poller.add(conn.stream.writable(), i);
            } else {
                poller.add(conn.stream.readable(), i);
            }
        }
        for token in poller.wait(None)? {
            if token == LISTENER {
                accept_all(&listener, &mut conns)?;
            } else {
                match conns[token].serve() {
                    Err(e) => {
                        eprintln!("echo: connection {}: {e}", conns[token].peer);
                        conns[token].done = true;
                    }
                    Ok(()) if log_ends && conns[token].done => {
                        eprintln!("echo: connection {}: ended in order", conns[token].peer);
                    }
                    Ok(()) => {}
                }
            }
        }
        // Dropping a finished connection closes it.
        conns.retain(|c| !c.done);
    }
}

fn parse_args() -> io::Result<(u32, bool)> {
    let (mut port, mut log_ends) = (DEFAULT_PORT, false);
    let mut args = pier_rt::env::args();
    while let Some(arg) = args.next() {
        match arg {
            "--port" => port = pier_rt::args::number(args.next(), "--port")?,
            "--log-ends" => log_ends = true,
            "-h" | "--help" => {
                pier_rt::println!(
                    "usage: echo [--port N] [--log-ends]   (default port {DEFAULT_PORT})"
                );
                pier_rt::process::exit(0);
            }
            other => return Err(pier_rt::args::usage(format!("unknown argument {other:?}"))),
        }
    }
    Ok((port, log_ends))
}

fn accept_all(listener: &VsockListener, conns: &mut Vec<Conn>) -> io::Result<()> {
    while conns.len() < MAX_CONNS {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(true)?;
                conns.push(Conn {
                    stream,
                    peer,
                    buf: vec![0; BUF_SIZE],
                    start: 0,
                    end: 0,
                    eof: false,
                    done: false,
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // A peer that gave up before we accepted it is not our failure.
            Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Conn {
    stream: VsockStream,
    peer: VsockAddr,
    buf: Vec<u8>,
    /// `buf[start..end]` was read but not yet written back.
    start: usize,
    end: usize,
    /// The peer has half-closed: echo what is left, then close.
    eof: bool,
    done: bool,
}

impl Conn {
    fn has_pending(&self) -> bool {
        self.start < self.end
    }

    /// Moves bytes until the socket would block or the echo is complete.
    fn serve(&mut self) -> io::Result<()> {
        for _ in 0..ROUNDS {
            if self.has_pending() {
                match (&self.stream).write(&self.buf[self.start..self.end]) {
                    Ok(n) => self.start += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
                continue;
            }
            if self.eof {
                // Everything read has been echoed: close our side too.
                self.stream.shutdown(Shutdown::Write)?;
                self.done = true;
                return Ok(());
            }
            match (&self.stream).read(&mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => (self.start, self.end) = (0, n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
