//! Message echo server, async: what `msg-echo` does (seqpacket messages
//! back one for one with their end-of-record marks, datagrams back to
//! their sender, both on one port number), as one task per connection
//! and one for the datagram socket.
//!
//! Usage: `msg-echo-async [--port N]` (default 1235).

#![cfg_attr(target_os = "none", no_std, no_main)]

use pier_rt::asynch::{self, SeqpacketListener, SeqpacketStream, VsockDatagram};
use pier_rt::io::{self, ErrorKind};
use pier_rt::prelude::*;
use pier_rt::{VsockAddr, VsockAddrExt, eprintln};

pier_rt::main!(async serve);

const DEFAULT_PORT: u32 = 1235;
/// The largest message a default connection carries (256 KiB).
const MAX_MESSAGE: usize = 256 * 1024;
const MAX_DATAGRAM: usize = 64 * 1024;

async fn serve() -> io::Result<()> {
    let port = pier_rt::args::port_only(
        pier_rt::env::args(),
        DEFAULT_PORT,
        &format!("usage: msg-echo-async [--port N]   (default port {DEFAULT_PORT})"),
    )?;
    let addr = VsockAddr::any_cid(port);
    // A transport may offer only one of the two socket types.
    let listener = optional(SeqpacketListener::bind(addr), "seqpacket")?;
    let datagrams = optional(VsockDatagram::bind(addr), "datagrams")?.map(|socket| {
        asynch::spawn(async move {
            let mut buf = vec![0; MAX_DATAGRAM];
            loop {
                let (n, from) = socket.recv_from(&mut buf).await?;
                if let Err(e) = socket.send_to(&buf[..n], from).await {
                    eprintln!("msg-echo-async: datagram to {from}: {e}");
                }
            }
        })
    });
    let Some(listener) = listener else {
        return match datagrams {
            Some(task) => task.await,
            None => Err(io::Error::new(ErrorKind::Unsupported, "no seqpacket and no datagrams")),
        };
    };
    loop {
        match listener.accept().await {
            Ok((conn, peer)) => {
                asynch::spawn(async move {
                    if let Err(e) = echo(conn).await {
                        eprintln!("msg-echo-async: connection {peer}: {e}");
                    }
                });
            }
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::Other) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Echoes messages until the peer finishes; dropping the connection then
/// closes it after the last echo.
async fn echo(conn: SeqpacketStream) -> io::Result<()> {
    let mut buf = vec![0; MAX_MESSAGE];
    loop {
        let m = conn.recv(&mut buf).await?;
        if m.len == 0 {
            return Ok(());
        }
        conn.send_eor(&buf[..m.len], m.end_of_record).await?;
    }
}

/// "This transport has no such socket type" becomes `None`, with a note.
fn optional<T>(result: io::Result<T>, what: &str) -> io::Result<Option<T>> {
    match result {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("msg-echo-async: {what} not available ({e}); serving without");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
