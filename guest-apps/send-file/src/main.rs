//! Streams a file, or stdin, to a vsock port, then waits for the peer to
//! close.
//!
//! It is the client-side example: connect, write, half-close with
//! `shutdown(Write)` so the peer sees end-of-stream, then read until the
//! peer closes too. Waiting for that close is what tells the sender the
//! peer has everything: a connection dropped right after the last write
//! could still be reset before the peer read it. Whatever the peer sends
//! back is read and discarded.
//!
//! It is WASI-only, because it needs a filesystem: the file is read through
//! WASI filesystem preopens, so the host must grant the directory that
//! holds it. Run it with `pier run`, which gives it vsock sockets (plain
//! `wasmtime run` has no vsock imports), granting the directory with
//! `--dir HOST[::GUEST]` and the connection with `--connect CID:PORT`:
//!
//! ```text
//! pier run send-file.wasm --connect 2:5000 --dir data::/data -- --port 5000 --file /data/log.txt
//! ```
//!
//! A host program receives it by listening on `<uds>_5000` (see
//! the repository's `docs/host-sockets.md`).
//!
//! Usage: `send-file --port N [--cid N] [--file PATH]` (CID 2, the host,
//! by default; stdin when no file is given).

use std::fs::File;
use std::io::{self, ErrorKind, Read, Write};
use std::process::ExitCode;

use pier_rt::args::{number, usage};
use pier_rt::{Shutdown, VMADDR_CID_HOST, VsockAddr, VsockStream};

/// Bytes per read and write: large enough that per-call overhead stays
/// small next to copying.
const CHUNK: usize = 64 * 1024;

struct Args {
    cid: u32,
    port: u32,
    file: Option<&'static str>,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("send-file: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let args = parse_args(pier_rt::env::args())?;
    let mut input: Box<dyn Read> = match &args.file {
        Some(path) => Box::new(File::open(path).map_err(|e| annotate(e, path))?),
        None => Box::new(io::stdin().lock()),
    };
    let addr = VsockAddr::new(args.cid, args.port);
    let mut stream =
        VsockStream::connect(addr).map_err(|e| annotate(e, &format!("connect {addr}")))?;

    let mut buf = vec![0; CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        stream.write_all(&buf[..n])?;
    }
    stream.flush()?;
    stream.shutdown(Shutdown::Write)?;

    // The peer closes when it has everything; until then, drain its replies.
    while stream.read(&mut buf)? != 0 {}
    Ok(())
}

fn annotate(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn parse_args(mut args: impl Iterator<Item = &'static str>) -> io::Result<Args> {
    let mut cid = VMADDR_CID_HOST;
    let mut port = None;
    let mut file = None;
    while let Some(arg) = args.next() {
        match arg {
            "--cid" => cid = number(args.next(), "--cid")?,
            "--port" => port = Some(number(args.next(), "--port")?),
            "--file" => file = Some(args.next().ok_or_else(|| usage("--file needs a path"))?),
            "-h" | "--help" => {
                println!("usage: send-file --port N [--cid N] [--file PATH]");
                std::process::exit(0);
            }
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    let port = port.ok_or_else(|| usage("--port is required"))?;
    Ok(Args { cid, port, file })
}
