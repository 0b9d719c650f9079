//! `pier connect`: the host side of the hybrid vsock protocol, as a tool.
//!
//! It dials `<uds>` (or `<uds>_seqpacket`), says `CONNECT <port>`, accepts
//! any `OK ` answer (pier sends the host port; other implementations send
//! the guest port), then copies stdin to the connection and the
//! connection to stdout until the guest closes its side. End of stdin
//! becomes `shutdown(SHUT_WR)`, which the guest reads as end-of-file while
//! its answer keeps flowing back: half-close, as `docs/host-sockets.md`
//! describes it.
//!
//! Seqpacket data uses the documented framing: each message carries a
//! flags byte (bit 0: end of record) before its bytes. Each chunk read
//! from stdin is sent as one message; each message received is written to
//! stdout without its flags byte.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use socket2::{Domain, SockAddr, Socket, Type};

/// Longest answer line we wait for (the request line is capped at 64
/// bytes; the answer is shorter).
const MAX_LINE: usize = 64;
/// Largest message we can receive: the guest's default buffer, plus the
/// flags byte.
const MAX_MESSAGE: usize = 256 * 1024 + 1;
/// Bytes read from stdin per message or write.
const CHUNK: usize = 64 * 1024;

pub fn run(uds: &Path, port: u32, seqpacket: bool) -> Result<()> {
    if seqpacket { run_seqpacket(uds, port) } else { run_stream(uds, port) }
}

fn refused(port: u32) -> anyhow::Error {
    anyhow::anyhow!(
        "the connection to port {port} was closed before OK: nothing listens there, the guest \
         did not answer in time, or it refused"
    )
}

fn check_ok(line: &[u8], port: u32) -> Result<()> {
    if line.starts_with(b"OK ") {
        return Ok(());
    }
    if line.is_empty() {
        return Err(refused(port));
    }
    bail!("unexpected answer to CONNECT: {:?}", String::from_utf8_lossy(line))
}

fn run_stream(uds: &Path, port: u32) -> Result<()> {
    let mut stream =
        UnixStream::connect(uds).with_context(|| format!("connecting to {}", uds.display()))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes()).context("sending CONNECT")?;
    // One byte at a time: whatever follows the newline is the guest's data.
    let mut line = Vec::new();
    let mut byte = [0u8];
    while line.len() < MAX_LINE {
        match stream.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(e).context("reading the answer to CONNECT"),
        }
    }
    check_ok(&line, port)?;
    tracing::debug!(port, answer = %String::from_utf8_lossy(&line), "connected");

    let writer = stream.try_clone().context("cloning the socket")?;
    std::thread::spawn(move || {
        let result = io::copy(&mut io::stdin().lock(), &mut &writer);
        if let Err(e) = result {
            tracing::debug!("stdin to guest: {e}");
        }
        // Half-close: the guest reads end-of-file, its answer keeps coming.
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut out = io::stdout().lock();
    io::copy(&mut stream, &mut out).context("copying from the guest")?;
    out.flush().context("writing to stdout")?;
    Ok(())
}

fn seqpacket_path(uds: &Path) -> PathBuf {
    let mut name = uds.as_os_str().to_owned();
    name.push("_seqpacket");
    PathBuf::from(name)
}

fn run_seqpacket(uds: &Path, port: u32) -> Result<()> {
    let path = seqpacket_path(uds);
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).context("creating a socket")?;
    let addr = SockAddr::unix(&path).with_context(|| format!("bad path {}", path.display()))?;
    socket.connect(&addr).with_context(|| format!("connecting to {}", path.display()))?;
    socket.send(format!("CONNECT {port}\n").as_bytes()).context("sending CONNECT")?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = match (&socket).read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
        Err(e) => return Err(e).context("reading the answer to CONNECT"),
    };
    check_ok(&buf[..n], port)?;

    let writer = socket.try_clone().context("cloning the socket")?;
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut chunk = vec![0u8; CHUNK + 1];
        loop {
            match stdin.read(&mut chunk[1..]) {
                Ok(0) => break,
                Ok(n) => {
                    chunk[0] = 0; // flags: no end-of-record
                    if let Err(e) = writer.send(&chunk[..=n]) {
                        tracing::debug!("stdin to guest: {e}");
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("stdin: {e}");
                    break;
                }
            }
        }
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut out = io::stdout().lock();
    loop {
        let n = (&socket).read(&mut buf).context("receiving from the guest")?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[1..n]).context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
    }
    Ok(())
}
