//! Stream echo for the WASI 0.3 world: everything a peer sends comes back
//! to it, over `vsock:sockets@0.2.0`.
//!
//! It is written against the generated bindings directly, with no pier-rt
//! in between, so it shows what the async package looks like to a
//! component: `connect` and friends are `async fn`s, a listener is a
//! stream of connections, and each connection is a `stream<u8>` each way
//! plus a future that says how the peer's side ended. Each connection is
//! its own task (`wit_bindgen::spawn_local`), so one slow peer does not
//! hold up the rest; when a peer half-closes, its task finishes echoing
//! what it read, then ends its own side by closing the send stream.
//!
//! Usage: `echo-p3 [--port N]` (default port 1234). It prints
//! `echo-p3: listening on PORT` once it listens, and for each connection
//! how many bytes it echoed, how the peer ended (`ok`, or the error
//! code's WIT name, `connection-reset` for a reset) and how its own send
//! ended.

use std::cell::Cell;
use std::rc::Rc;

wit_bindgen::generate!({
    path: ["../../wit/v0.2.0", "../wit-p3"],
    world: "pier:apps-p3/command",
    generate_all,
});

use vsock::sockets::types::{StreamSocket, VsockAddress};
use wit_bindgen::StreamResult;

const DEFAULT_PORT: u32 = 1234;
/// `VMADDR_CID_ANY`.
const ANY_CID: u32 = u32::MAX;
/// Bytes one read asks for: the shim copies up to this much from the
/// stack straight into the buffer in one call.
const BUF_SIZE: usize = 64 * 1024;

struct Echo;

impl exports::wasi::cli::run::Guest for Echo {
    async fn run() -> Result<(), ()> {
        let port = parse_port().map_err(|e| eprintln!("echo-p3: {e}"))?;
        serve(port).await.map_err(|e| eprintln!("echo-p3: {e}"))
    }
}

export!(Echo);

fn parse_port() -> Result<u32, String> {
    let mut args = std::env::args().skip(1);
    let mut port = DEFAULT_PORT;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                let value = args.next().ok_or("--port needs a value")?;
                port = value.parse().map_err(|_| format!("bad port {value}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(port)
}

async fn serve(port: u32) -> Result<(), String> {
    let listener = StreamSocket::create().map_err(|e| format!("create: {e:?}"))?;
    listener.bind(VsockAddress { cid: ANY_CID, port }).map_err(|e| format!("bind: {e:?}"))?;
    let mut incoming = listener.listen().map_err(|e| format!("listen: {e:?}"))?;
    eprintln!("echo-p3: listening on {port}");
    let open = Rc::new(Cell::new(0usize));
    while let Some(conn) = incoming.next().await {
        open.set(open.get() + 1);
        let open = open.clone();
        wit_bindgen::spawn_local(async move {
            echo(conn).await;
            open.set(open.get() - 1);
        });
    }
    Err("the listener's stream ended".into())
}

/// Echoes one connection until its peer ends its side, then ends ours.
async fn echo(conn: StreamSocket) {
    let (mut from_peer, peer_ended) = conn.receive();
    let (mut to_peer, outgoing) = wit_stream::new::<u8>();
    let sent = conn.send(outgoing);
    let mut echoed = 0usize;
    let mut buf = Vec::with_capacity(BUF_SIZE);
    loop {
        let (status, filled) = from_peer.read(buf).await;
        buf = filled;
        match status {
            StreamResult::Complete(_) => {
                echoed += buf.len();
                let unsent = to_peer.write_all(std::mem::take(&mut buf)).await;
                if !unsent.is_empty() {
                    // The shim dropped its end: the connection failed, and
                    // the send future says how. Stop reading too: the
                    // peer's end is no longer this side's to wait for.
                    drop(from_peer);
                    drop(to_peer);
                    let sent = sent.await;
                    eprintln!("echo-p3: echoed {echoed} bytes; send {}", said(sent));
                    return;
                }
                // `write_all` gives the buffer back only when it could not
                // send all of it; take a fresh one for the next read.
                buf = Vec::with_capacity(BUF_SIZE);
            }
            StreamResult::Dropped | StreamResult::Cancelled => break,
        }
    }
    // Closing our end of the send stream is SHUT_WR.
    drop(to_peer);
    let sent = sent.await;
    let ended = peer_ended.await;
    eprintln!("echo-p3: echoed {echoed} bytes; peer ended {}; send {}", said(ended), said(sent));
}

/// An outcome as the error code's WIT name, or `ok`.
fn said(outcome: Result<(), vsock::sockets::types::ErrorCode>) -> &'static str {
    match outcome {
        Ok(()) => "ok",
        Err(e) => e.name(),
    }
}

/// std's entry, which `wasi:cli/run@0.2` calls. A host that serves WASI
/// 0.3 calls `run@0.3.0` above instead; one that does not gets here, and
/// hears why nothing happens.
fn main() {
    eprintln!("echo-p3: this is a WASI 0.3 command; run it where wasi:cli/run@0.3.0 is called");
    std::process::exit(1);
}
