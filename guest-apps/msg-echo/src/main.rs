//! Message echo server: seqpacket and datagrams on the same port number.
//!
//! Seqpacket messages come back one for one, with their boundaries and
//! end-of-record marks, so a peer can check both. Datagrams come back to
//! their sender. The two share a port number because datagram ports are a
//! space of their own; one `Poller` serves the listener, the datagram
//! socket and every connection from a single thread.
//!
//! Usage: `msg-echo [--port N]` (default 1235).

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::eprintln;
use pier_rt::io::{self, ErrorKind};
use pier_rt::prelude::*;
use pier_rt::process::ExitCode;
use pier_rt::{Poller, SeqpacketListener, SeqpacketStream, VsockAddr, VsockAddrExt, VsockDatagram};

pier_rt::main!(main);

const DEFAULT_PORT: u32 = 1235;
/// The largest seqpacket message a default connection can carry (both
/// sides' buffer size, 256 KiB); larger ones would be truncated.
const MAX_MESSAGE: usize = 256 * 1024;
/// The largest vsock datagram.
const MAX_DATAGRAM: usize = 64 * 1024;
/// Connections served at once; more wait in the backlog.
const MAX_CONNS: usize = 128;
/// Messages one socket may handle per wakeup before the others get a turn.
const ROUNDS: usize = 16;

const LISTENER: usize = usize::MAX;
const DATAGRAM: usize = usize::MAX - 1;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("msg-echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let port = pier_rt::args::port_only(
        pier_rt::env::args(),
        DEFAULT_PORT,
        &format!("usage: msg-echo [--port N]   (default port {DEFAULT_PORT})"),
    )?;
    // A transport may offer only one of the two socket types; serve
    // whichever exists.
    let listener = optional(SeqpacketListener::bind(VsockAddr::any_cid(port)), "seqpacket")?;
    if let Some(l) = &listener {
        l.set_nonblocking(true)?;
    }
    let mut dgram = optional(Datagrams::bind(port), "datagrams")?;
    if listener.is_none() && dgram.is_none() {
        return Err(io::Error::new(ErrorKind::Unsupported, "no seqpacket and no datagrams"));
    }
    let mut conns: Vec<Conn> = Vec::new();
    // One receive buffer for all connections: a message is sent back right
    // away, and only one that cannot leave yet is copied into its
    // connection.
    let mut scratch = vec![0; MAX_MESSAGE];
    loop {
        let mut poller = Poller::with_capacity(conns.len() + 2);
        if let Some(l) = &listener
            && conns.len() < MAX_CONNS
        {
            poller.add(l.readable(), LISTENER);
        }
        if let Some(d) = &dgram {
            poller.add(d.readiness(), DATAGRAM);
        }
        for (i, conn) in conns.iter().enumerate() {
            if conn.pending.is_some() {
                poller.add(conn.stream.writable(), i);
            } else {
                poller.add(conn.stream.readable(), i);
            }
        }
        for token in poller.wait(None)? {
            match token {
                LISTENER => {
                    if let Some(l) = &listener {
                        accept_all(l, &mut conns)?;
                    }
                }
                DATAGRAM => {
                    if let Some(d) = &mut dgram {
                        d.serve(&mut scratch[..MAX_DATAGRAM])?;
                    }
                }
                i => {
                    if let Err(e) = conns[i].serve(&mut scratch) {
                        eprintln!("msg-echo: connection {}: {e}", conns[i].peer);
                        conns[i].done = true;
                    }
                }
            }
        }
        conns.retain(|c| !c.done);
    }
}

/// Turns "this transport has no such socket type" into `None`, with a note
/// on stderr; any other error is fatal.
fn optional<T>(result: io::Result<T>, what: &str) -> io::Result<Option<T>> {
    match result {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("msg-echo: {what} not available ({e}); serving without");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn accept_all(listener: &SeqpacketListener, conns: &mut Vec<Conn>) -> io::Result<()> {
    while conns.len() < MAX_CONNS {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(true)?;
                conns.push(Conn { stream, peer, pending: None, eof: false, done: false });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Conn {
    stream: SeqpacketStream,
    peer: VsockAddr,
    /// A message (and its end-of-record mark) the peer's credit did not
    /// admit yet.
    pending: Option<(Vec<u8>, bool)>,
    eof: bool,
    done: bool,
}

impl Conn {
    fn serve(&mut self, scratch: &mut [u8]) -> io::Result<()> {
        for _ in 0..ROUNDS {
            if let Some((message, eor)) = &self.pending {
                match self.stream.send_eor(message, *eor) {
                    Ok(_) => self.pending = None,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            if self.eof {
                // Dropping the connection closes it after the last echo.
                self.done = true;
                return Ok(());
            }
            let m = match self.stream.recv(scratch) {
                Ok(m) => m,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            if m.len == 0 {
                self.eof = true;
                continue;
            }
            let message = &scratch[..m.len];
            match self.stream.send_eor(message, m.end_of_record) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.pending = Some((message.to_vec(), m.end_of_record));
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            // The inq hint: nothing left means another `recv` would only
            // come back with WouldBlock, so go back to waiting now.
            if self.stream.recv_queued()? == 0 {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The datagram half. At most one echo waits for room; until it leaves,
/// nothing more is read, so a flood is dropped by the transport instead of
/// piling up here.
struct Datagrams {
    socket: VsockDatagram,
    pending: Option<(Vec<u8>, VsockAddr)>,
}

impl Datagrams {
    fn bind(port: u32) -> io::Result<Self> {
        let socket = VsockDatagram::bind(VsockAddr::any_cid(port))?;
        socket.set_nonblocking(true)?;
        Ok(Self { socket, pending: None })
    }

    fn readiness(&self) -> pier_rt::Readiness<'_> {
        if self.pending.is_some() { self.socket.writable() } else { self.socket.readable() }
    }

    fn serve(&mut self, scratch: &mut [u8]) -> io::Result<()> {
        for _ in 0..ROUNDS {
            if let Some((data, to)) = &self.pending {
                match self.socket.send_to(data, *to) {
                    Ok(_) => self.pending = None,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    // One peer's failure (say, one the host does not let us
                    // answer) must not stop the others.
                    Err(e) => {
                        eprintln!("msg-echo: datagram to {to}: {e}");
                        self.pending = None;
                    }
                }
            }
            let (n, from) = match self.socket.recv_from(scratch) {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            match self.socket.send_to(&scratch[..n], from) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.pending = Some((scratch[..n].to_vec(), from));
                    return Ok(());
                }
                Err(e) => eprintln!("msg-echo: datagram to {from}: {e}"),
            }
            if self.socket.recv_queued()? == 0 {
                return Ok(());
            }
        }
        Ok(())
    }
}
