//! Message echo for the WASI 0.3 world: seqpacket and datagrams on one
//! port number, over `vsock:sockets@0.2.0`, as `msg-echo` does over
//! 0.1.0.
//!
//! A seqpacket message comes back whole, with its end-of-record mark; a
//! datagram goes back to its sender. Each seqpacket connection is its own
//! task, and so is the datagram socket, so none waits for another. Like
//! `echo-p3`, it is written on the generated bindings alone.
//!
//! Usage: `msg-echo-p3 [--port N]` (default 1235). It prints
//! `msg-echo-p3: listening on PORT` once both sockets are bound, and
//! reports any failure on stderr.

wit_bindgen::generate!({
    path: ["../../wit/v0.2.0", "../wit-p3"],
    world: "pier:apps-p3/command",
    generate_all,
});

use vsock::sockets::types::{DatagramSocket, SeqpacketSocket, VsockAddress};

const DEFAULT_PORT: u32 = 1235;
/// `VMADDR_CID_ANY`.
const ANY_CID: u32 = u32::MAX;

struct MsgEcho;

impl exports::wasi::cli::run::Guest for MsgEcho {
    async fn run() -> Result<(), ()> {
        let port = parse_port().map_err(|e| eprintln!("msg-echo-p3: {e}"))?;
        serve(port).await.map_err(|e| eprintln!("msg-echo-p3: {e}"))
    }
}

export!(MsgEcho);

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
    let here = VsockAddress { cid: ANY_CID, port };
    let listener = SeqpacketSocket::create().map_err(|e| format!("seqpacket: {e:?}"))?;
    listener.bind(here).map_err(|e| format!("seqpacket bind: {e:?}"))?;
    let mut incoming = listener.listen().map_err(|e| format!("seqpacket listen: {e:?}"))?;
    let datagrams = DatagramSocket::create().map_err(|e| format!("datagram: {e:?}"))?;
    datagrams.bind(here).map_err(|e| format!("datagram bind: {e:?}"))?;
    eprintln!("msg-echo-p3: listening on {port}");
    wit_bindgen::spawn_local(echo_datagrams(datagrams));
    while let Some(conn) = incoming.next().await {
        wit_bindgen::spawn_local(echo_messages(conn));
    }
    Err("the seqpacket listener's stream ended".into())
}

/// Echoes one connection's messages until its peer shuts its side; the
/// connection closes when the socket is dropped.
async fn echo_messages(conn: SeqpacketSocket) {
    loop {
        match conn.receive().await {
            Ok(Some(message)) => {
                if let Err(e) = conn.send(message.data, message.end_of_record).await {
                    eprintln!("msg-echo-p3: seqpacket send: {e:?}");
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                eprintln!("msg-echo-p3: seqpacket receive: {e:?}");
                return;
            }
        }
    }
}

/// Sends every datagram back where it came from.
async fn echo_datagrams(socket: DatagramSocket) {
    loop {
        let datagram = match socket.receive().await {
            Ok(datagram) => datagram,
            Err(e) => {
                eprintln!("msg-echo-p3: datagram receive: {e:?}");
                return;
            }
        };
        if let Err(e) = socket.send(datagram.data, Some(datagram.remote_address)).await {
            eprintln!("msg-echo-p3: datagram send: {e:?}");
        }
    }
}

/// std's entry, which `wasi:cli/run@0.2` calls. A host that serves WASI
/// 0.3 calls `run@0.3.0` above instead; one that does not gets here, and
/// hears why nothing happens.
fn main() {
    eprintln!("msg-echo-p3: this is a WASI 0.3 command; run it where wasi:cli/run@0.3.0 is called");
    std::process::exit(1);
}
