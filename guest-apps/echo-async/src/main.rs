//! Stream echo server, async: what `echo` does, written as one task per
//! peer on pier-rt's executor instead of a hand-written poll loop.
//!
//! Each task reads into its own buffer and writes everything back; when
//! the peer half-closes, it finishes the echo, then half-closes too.
//!
//! Usage: `echo-async [--port N]` (default 1234).
//!
//! The same source builds for wasm32-wasip2 and x86_64-unknown-none.

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::asynch::{self, AsyncReadExt, AsyncWriteExt, VsockListener, VsockStream};
use pier_rt::io::{self, ErrorKind};
use pier_rt::prelude::*;
use pier_rt::{VsockAddr, VsockAddrExt, eprintln};

pier_rt::main!(async serve);

const DEFAULT_PORT: u32 = 1234;
/// Bytes read per connection before they are written back, as in `echo`.
const BUF_SIZE: usize = 16 * 1024;

async fn serve() -> io::Result<()> {
    let port = pier_rt::args::port_only(
        pier_rt::env::args(),
        DEFAULT_PORT,
        &format!("usage: echo-async [--port N]   (default port {DEFAULT_PORT})"),
    )?;
    let listener = VsockListener::bind(VsockAddr::any_cid(port))?;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                asynch::spawn(async move {
                    if let Err(e) = echo(stream).await {
                        eprintln!("echo-async: connection {peer}: {e}");
                    }
                });
            }
            // A peer that gave up before we accepted it, or one refused
            // because the host's socket limit is reached: not our failure.
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::Other) => {}
            Err(e) => return Err(e),
        }
    }
}

async fn echo(mut stream: VsockStream) -> io::Result<()> {
    let mut buf = vec![0; BUF_SIZE];
    loop {
        match stream.read(&mut buf).await? {
            // The peer half-closed and everything is echoed: close our side.
            0 => return stream.close().await,
            n => stream.write_all(&buf[..n]).await?,
        }
    }
}
