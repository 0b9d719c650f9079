//! A test probe: small, hostile or pointed things a component can do, one
//! per subcommand, each reporting on stderr what the host answered.
//!
//! The host's tests run it to check what the other apps cannot show
//! sharply: capability checks per operation, the per-component socket
//! limit, and a peer that never reads.
//!
//! Usage:
//! - `probe listen PORT`: bind a stream listener; exit 0, or print the error.
//! - `probe connect CID PORT`: connect a stream; exit 0, or print the error.
//! - `probe dgram-send CID PORT`: send one datagram from an ephemeral port.
//! - `probe sockets`: open datagram sockets until the host refuses one;
//!   prints how many it got and the error (exits 1).
//! - `probe hoard PORT`: accept stream connections and never read them.
//! - `probe sink PORT`: accept one stream connection, copy it to stdout,
//!   exit.
//! - `probe tcp-listen IP:PORT`: bind a wasi:sockets TCP listener; exit 0,
//!   or print the error.
//! - `probe tcp-echo PORT`: echo one TCP connection on 127.0.0.1, then exit.
//! - `probe blurt CID PORT BYTES [WRITE]`: connect, write BYTES bytes of a
//!   fixed pattern (in writes of WRITE bytes; one write without it), and
//!   exit at once without waiting for the peer.
//! - `probe blurt-messages CID PORT SIZE COUNT`: connect a seqpacket
//!   socket, send COUNT messages of SIZE bytes (message i filled with
//!   byte i), and exit at once without waiting for the peer.
//! - `probe spin PORT`: listen on PORT (so the host knows it is up), then
//!   compute forever without calling the host.
//! - `probe sleep PORT`: listen on PORT, then sleep for an hour in
//!   `wasi:clocks`.
//! - `probe grow MIB`: allocate MIB MiB, one MiB at a time, writing every
//!   page, then print `grew MIB MiB` and exit 0: what a memory limit
//!   stops.
//! - `probe send CID PORT`: connect (retrying for up to 10 s while the
//!   peer refuses, so a peer component may still be starting), send stdin
//!   while reading the answer, half-close, print the answer, exit.
//! - `probe hash PORT`: serve stream connections one after another: read
//!   an 8-byte little-endian length L, then L bytes, and answer `L SUM`
//!   on a line (SUM the 16 hex digits of pier-testkit's `WordChecksum`,
//!   which the host computes too), then close. One way only, so it
//!   measures and checks host-to-guest transfers with any backend: the
//!   checksum takes two additions per 8 bytes, so the guest's check is not
//!   what bounds the rate. Says `probe: hash listening` once it listens.
//! - `probe reset PORT`: accept one stream connection, set SO_LINGER 0
//!   and drop it: an abortive close, the peer sees a reset; then exit.
//! - `probe ring PORT`: accept one stream connection and write back
//!   `privilege level N` (the CPU ring the app and its stack run in;
//!   `none` on WASI), then close.
//! - `probe quiet PORT MS`: accept one stream connection, wait up to MS
//!   milliseconds for it to become readable, and write back `quiet for N
//!   ms` if nothing came (or `data after N ms`), then close. The wait is a
//!   blocked receive that only a timer can end.
//! - `probe accept-cost PORT CALLS`: listen on PORT without blocking and
//!   call accept CALLS times on the empty backlog (each must say
//!   would-block); print `accept-cost N ns` on stdout, N the mean per
//!   call. Through the shim, each call is one WIT `accept`; in the
//!   unikernel, a call into the stack in the image.
//! - `probe copy-file FROM TO`: read file FROM whole, write it to file TO,
//!   print `copied N bytes`: what a component with preopened folders
//!   (a container's mounts) can and cannot reach. WASI only.
//! - `probe trap-echo PORT BYTES`: accept one stream connection, echo it,
//!   and panic (a trap, under wasmtime) once BYTES bytes have been echoed:
//!   a component dying mid-transfer, for the soak tests. Says `probe:
//!   trap-echo listening` once it listens.
//! - `probe shut-wait PORT`: accept one stream connection, shut down
//!   writing, wait (at most 10 s, a guard against a hang) until the
//!   stream's writable pollable resolves, then write and print `writable
//!   after shutdown, write: KIND`, KIND the write's error (or `wrote N`).

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::io::{self, ErrorKind, Read, Write};
use pier_rt::net::{SocketAddr, TcpListener};
use pier_rt::prelude::*;
use pier_rt::process::ExitCode;
use pier_rt::time::{Duration, Instant};
use pier_rt::{eprintln, println};

use pier_rt::{
    Poller, SeqpacketStream, Shutdown, VMADDR_PORT_ANY, VsockAddr, VsockAddrExt, VsockDatagram,
    VsockListener, VsockStream,
};

// One source for the host's benchmarks and tests and this app: both
// compute the checksum of what `probe hash` reads.
#[path = "../../../testkit/src/pattern/word_checksum.rs"]
mod word_checksum;

use word_checksum::WordChecksum;

pier_rt::main!(main);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let args: Vec<&str> = pier_rt::env::args().collect();
    match args.as_slice() {
        ["listen", port] => {
            VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            eprintln!("probe: listen ok");
            Ok(())
        }
        ["connect", cid, port] => {
            VsockStream::connect(VsockAddr::new(number(cid)?, number(port)?))?;
            eprintln!("probe: connect ok");
            Ok(())
        }
        ["dgram-send", cid, port] => {
            let socket = VsockDatagram::bind(VsockAddr::any_cid(VMADDR_PORT_ANY))?;
            socket.send_to(b"probe", VsockAddr::new(number(cid)?, number(port)?))?;
            eprintln!("probe: dgram-send ok");
            Ok(())
        }
        ["sockets"] => {
            let mut held = Vec::new();
            loop {
                match VsockDatagram::bind(VsockAddr::any_cid(VMADDR_PORT_ANY)) {
                    Ok(s) => held.push(s),
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("opened {} sockets, then: {e}", held.len()),
                        ));
                    }
                }
            }
        }
        ["hoard", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            let mut hoard = Vec::new();
            for stream in listener.incoming() {
                // Keep every connection open and never read from it.
                hoard.push(stream?);
            }
            Ok(())
        }
        ["blurt-messages", cid, port, size, count] => {
            let stream = SeqpacketStream::connect(VsockAddr::new(number(cid)?, number(port)?))?;
            let size = number(size)? as usize;
            for i in 0..number(count)? {
                stream.send(&vec![i as u8; size])?;
            }
            // Exit right away: messages still waiting for credit must go.
            Ok(())
        }
        ["spin", port] => {
            let _listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            eprintln!("probe: spinning");
            let mut x: u64 = 1;
            loop {
                x = core::hint::black_box(
                    x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                );
            }
        }
        ["copy-file", from, to] => copy_file(from, to),
        ["grow", mib] => {
            let mib = number(mib)?;
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..mib {
                held.push(core::hint::black_box(vec![0xa5u8; 1 << 20]));
            }
            println!("grew {} MiB", held.len());
            Ok(())
        }
        ["sleep", port] => {
            let _listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            eprintln!("probe: sleeping");
            pier_rt::thread::sleep(Duration::from_secs(3600));
            Ok(())
        }
        ["sink", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            let (mut stream, _) = listener.accept()?;
            io::copy(&mut stream, &mut io::stdout().lock())?;
            io::stdout().flush()
        }
        ["tcp-listen", addr] => {
            let addr: SocketAddr = addr.parse().map_err(|_| bad_input(addr))?;
            TcpListener::bind(addr)?;
            eprintln!("probe: tcp-listen ok");
            Ok(())
        }
        ["tcp-echo", port] => {
            let port: u16 = port.parse().map_err(|_| bad_input(port))?;
            let listener = TcpListener::bind(("127.0.0.1", port))?;
            let (mut stream, _) = listener.accept()?;
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    return stream.shutdown(Shutdown::Write);
                }
                stream.write_all(&buf[..n])?;
            }
        }
        ["blurt", cid, port, bytes, rest @ ..] => {
            let bytes = number(bytes)? as usize;
            // Made before connecting, so a peer that times the transfer
            // from its accept times the path, not this loop and the
            // first touches of the buffer's memory (on a nested host,
            // the guest's first touch of each page costs the host a
            // zeroed huge page: tens of milliseconds for 64 MiB).
            let pattern: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
            let mut stream = VsockStream::connect(VsockAddr::new(number(cid)?, number(port)?))?;
            let write = match rest {
                [] => bytes.max(1),
                [write] => number(write)?.max(1) as usize,
                _ => {
                    return Err(io::Error::new(
                        ErrorKind::InvalidInput,
                        "blurt: too many arguments",
                    ));
                }
            };
            for chunk in pattern.chunks(write) {
                stream.write_all(chunk)?;
            }
            // Exit right away: the host must still deliver every byte.
            Ok(())
        }
        ["send", cid, port] => send(VsockAddr::new(number(cid)?, number(port)?)),
        ["hash", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            eprintln!("probe: hash listening");
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let (mut stream, _) = listener.accept()?;
                let mut len = [0u8; 8];
                stream.read_exact(&mut len)?;
                let total = u64::from_le_bytes(len);
                let (mut left, mut sum) = (total, WordChecksum::new());
                while left > 0 {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = stream.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "hash: stream ended early",
                        ));
                    }
                    sum.update(&buf[..n]);
                    left -= n as u64;
                }
                stream.write_all(format!("{total} {:016x}\n", sum.value()).as_bytes())?;
            }
        }
        ["accept-cost", port, calls] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            listener.set_nonblocking(true)?;
            let calls = number(calls)?.max(1);
            let start = Instant::now();
            for _ in 0..calls {
                match listener.accept() {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Ok(_) => return Err(io::Error::other("a peer connected")),
                    Err(e) => return Err(e),
                }
            }
            let ns = start.elapsed().as_nanos() / u128::from(calls);
            pier_rt::println!("accept-cost {ns} ns");
            Ok(())
        }
        ["reset", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            {
                let (conn, _) = listener.accept()?;
                conn.set_linger(Some(Duration::ZERO))?;
            } // dropping the connection resets it
            eprintln!("probe: reset the connection");
            Ok(())
        }
        ["trap-echo", port, bytes] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            eprintln!("probe: trap-echo listening");
            let (mut stream, _) = listener.accept()?;
            let limit = number(bytes)? as usize;
            let mut buf = vec![0u8; 16 * 1024];
            let mut echoed = 0;
            while echoed < limit {
                let want = buf.len().min(limit - echoed);
                let n = stream.read(&mut buf[..want])?;
                if n == 0 {
                    return Ok(());
                }
                stream.write_all(&buf[..n])?;
                echoed += n;
            }
            panic!("trap-echo: trapping after {echoed} bytes");
        }
        ["ring", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            let (mut stream, _) = listener.accept()?;
            let level = pier_rt::diag::privilege_level();
            let answer = match level {
                Some(level) => format!("privilege level {level}\n"),
                None => String::from("privilege level none\n"),
            };
            stream.write_all(answer.as_bytes())?;
            stream.shutdown(Shutdown::Write)
        }
        ["quiet", port, ms] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            let (mut stream, _) = listener.accept()?;
            let limit = Duration::from_millis(u64::from(number(ms)?));
            let start = Instant::now();
            let mut poller = Poller::new();
            poller.add(stream.readable(), 0);
            let ready = poller.wait(Some(limit))?;
            let waited = start.elapsed().as_millis();
            let answer = if ready.is_empty() {
                format!("quiet for {waited} ms\n")
            } else {
                format!("data after {waited} ms\n")
            };
            stream.write_all(answer.as_bytes())?;
            stream.shutdown(Shutdown::Write)
        }
        ["shut-wait", port] => {
            let listener = VsockListener::bind(VsockAddr::any_cid(number(port)?))?;
            let (mut stream, _) = listener.accept()?;
            stream.shutdown(Shutdown::Write)?;
            let mut poller = Poller::new();
            poller.add(stream.writable(), 0);
            if poller.wait(Some(Duration::from_secs(10)))?.is_empty() {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    "the writable pollable never resolved after shutdown",
                ));
            }
            let outcome = match stream.write(b"late") {
                Ok(n) => format!("wrote {n}"),
                Err(e) => format!("{:?}", e.kind()),
            };
            eprintln!("probe: writable after shutdown, write: {outcome}");
            Ok(())
        }
        _ => Err(io::Error::new(
            ErrorKind::InvalidInput,
            "usage: probe listen PORT | connect CID PORT | dgram-send CID PORT | sockets | hoard PORT \
             | sink PORT | send CID PORT | blurt CID PORT BYTES [WRITE] \
             | blurt-messages CID PORT SIZE COUNT | tcp-listen IP:PORT | tcp-echo PORT \
             | spin PORT | sleep PORT | grow MIB | hash PORT | ring PORT | quiet PORT MS \
             | accept-cost PORT CALLS | trap-echo PORT BYTES | shut-wait PORT",
        )),
    }
}

/// Connects (retrying while refused), then writes stdin and reads the
/// answer at the same time, so a peer that echoes never deadlocks with us
/// on full buffers; prints the answer once the peer has closed.
fn send(addr: VsockAddr) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stream = loop {
        match VsockStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                pier_rt::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    };
    let mut input = Vec::new();
    io::stdin().lock().read_to_end(&mut input)?;
    stream.set_nonblocking(true)?;
    let (mut sent, mut shut) = (0, false);
    let mut answer = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        while sent < input.len() {
            let end = input.len().min(sent + buf.len());
            match (&stream).write(&input[sent..end]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if sent == input.len() && !shut {
            stream.shutdown(Shutdown::Write)?;
            shut = true;
        }
        loop {
            match (&stream).read(&mut buf) {
                Ok(0) => {
                    io::stdout().write_all(&answer)?;
                    return io::stdout().flush();
                }
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let mut poller = Poller::new();
        poller.add(stream.readable(), 0);
        if sent < input.len() {
            poller.add(stream.writable(), 1);
        }
        poller.wait(None)?;
    }
}

fn number(s: &str) -> io::Result<u32> {
    s.parse().map_err(|_| bad_input(s))
}

#[cfg(target_os = "wasi")]
fn copy_file(from: &str, to: &str) -> io::Result<()> {
    let bytes =
        std::fs::read(from).map_err(|e| io::Error::new(e.kind(), format!("{from}: {e}")))?;
    std::fs::write(to, &bytes).map_err(|e| io::Error::new(e.kind(), format!("{to}: {e}")))?;
    println!("copied {} bytes", bytes.len());
    Ok(())
}

/// A unikernel has no file system.
#[cfg(not(target_os = "wasi"))]
fn copy_file(_from: &str, _to: &str) -> io::Result<()> {
    Err(io::Error::new(ErrorKind::Unsupported, "probe: no files outside WASI"))
}

fn bad_input(s: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, format!("bad argument: {s:?}"))
}
