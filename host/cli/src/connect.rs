//! `pier connect`: the host side of the hybrid vsock protocol, as a tool.
//!
//! The protocol itself (the `CONNECT`/`OK` exchange, the seqpacket flags
//! byte) is pier-client's; this module joins the connection to stdin and
//! stdout, copying until the guest closes its side. End of stdin becomes
//! `shutdown(SHUT_WR)`, which the guest reads as end-of-file while its
//! answer keeps flowing back: half-close, as `docs/host-sockets.md`
//! describes it.
//!
//! With `--seqpacket`, each chunk read from stdin is sent as one message
//! (no end-of-record mark), and each message received is written to
//! stdout.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;
use pier_client::{HybridSeqpacket, HybridStream, MAX_MESSAGE};

#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// The hybrid vsock Unix socket (`pier run` prints it).
    uds: PathBuf,
    /// The component's port.
    port: u32,
    /// Use a seqpacket connection (`<uds>_seqpacket`): each chunk read from
    /// stdin becomes one message; each message received is written out.
    #[arg(long)]
    seqpacket: bool,
}

/// Bytes read from stdin per message or write.
const CHUNK: usize = 64 * 1024;

pub fn run(args: &ConnectArgs) -> Result<()> {
    let (uds, port) = (args.uds.as_path(), args.port);
    if args.seqpacket { run_seqpacket(uds, port) } else { run_stream(uds, port) }
}

fn run_stream(uds: &Path, port: u32) -> Result<()> {
    let stream = HybridStream::connect(uds, port)
        .with_context(|| format!("connecting to guest port {port}"))?;
    tracing::debug!(port, local_port = stream.local_port(), "connected");

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
    io::copy(&mut &stream, &mut out).context("copying from the guest")?;
    out.flush().context("writing to stdout")?;
    Ok(())
}

fn run_seqpacket(uds: &Path, port: u32) -> Result<()> {
    let conn = HybridSeqpacket::connect(uds, port)
        .with_context(|| format!("connecting to guest port {port} (seqpacket)"))?;
    tracing::debug!(port, local_port = conn.local_port(), "connected");

    let writer = conn.try_clone().context("cloning the socket")?;
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut chunk = vec![0u8; CHUNK];
        loop {
            match stdin.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    if let Err(e) = writer.send(&chunk[..n], false) {
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
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (n, _eor) = conn.recv(&mut buf).context("receiving from the guest")?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
    }
    Ok(())
}
