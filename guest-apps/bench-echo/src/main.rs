//! The echo the shim benchmark runs twice: once over pier's vsock sockets,
//! once over wasmtime's own `wasi:sockets` TCP on loopback.
//!
//! Both modes run the very same loop (accept one connection, read, write it
//! all back, until EOF, then the next), so the benchmark compares the two
//! transports and nothing else. The concurrent, event-driven server is
//! `echo`; this one is deliberately plain.
//!
//! Usage: `bench-echo --vsock PORT` or `bench-echo --tcp PORT` (127.0.0.1).

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::eprintln;
use pier_rt::io::{self, Read, Write};
use pier_rt::net::TcpListener;
use pier_rt::prelude::*;
use pier_rt::process::ExitCode;
use pier_rt::{Shutdown, VsockAddr, VsockAddrExt, VsockListener};

pier_rt::main!(main);

const BUF_SIZE: usize = 64 * 1024;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let args: Vec<&str> = pier_rt::env::args().collect();
    let port = |i: usize| -> io::Result<u32> {
        args.get(i)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "expected a port number"))
    };
    let mut buf = vec![0u8; BUF_SIZE];
    match args.first().copied() {
        Some("--vsock") => {
            let listener = VsockListener::bind(VsockAddr::any_cid(port(1)?))?;
            loop {
                let (mut stream, _) = listener.accept()?;
                echo(&mut stream, &mut buf)?;
                stream.shutdown(Shutdown::Write)?;
            }
        }
        Some("--tcp") => {
            let listener = TcpListener::bind(("127.0.0.1", port(1)? as u16))?;
            loop {
                let (mut stream, _) = listener.accept()?;
                echo(&mut stream, &mut buf)?;
                stream.shutdown(Shutdown::Write)?;
            }
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "usage: bench-echo --vsock PORT | --tcp PORT",
        )),
    }
}

/// Reads until EOF, writing every chunk back before reading the next.
fn echo(stream: &mut (impl Read + Write), buf: &mut [u8]) -> io::Result<()> {
    loop {
        let n = stream.read(buf)?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buf[..n])?;
    }
}
