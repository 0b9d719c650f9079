//! pier's loopback demo: two stacks, a guest (CID 3) and a host (CID 2),
//! wired back to back in one process. The host listens, the guest
//! connects, streams data, and closes; every packet is traced.
//!
//! `cargo run -p pier-stack --example loopback_demo -- [MEBIBYTES]`

use std::time::Instant as WallClock;

use pier_stack::phy::{Loopback, Side, Tracer};
use pier_stack::{SocketType, VMADDR_CID_ANY, VMADDR_CID_HOST, VsockAddr};

const PORT: u32 = 1234;

fn main() {
    let mebibytes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(64);

    println!("pier loopback demo: guest CID 3 <-> host CID 2, port {PORT}\n");
    println!("1. Handshake and a small exchange, traced packet by packet:\n");
    let mut lb = Loopback::guest_and_host();
    lb.add_middleware(Tracer::new(|event| println!("   {event}")));
    let (guest, host) = handshake(&mut lb);
    lb.a.send(guest, b"hello from the guest").unwrap();
    lb.run();
    let mut buf = [0u8; 64];
    let info = lb.b.recv(host, &mut buf).unwrap();
    println!(
        "\n   host read {:?} ({} bytes, {} still queued)\n",
        String::from_utf8_lossy(&buf[..info.len]),
        info.len,
        info.inq
    );
    lb.a.close(guest, lb.now()).unwrap();
    lb.run();
    let eof = lb.b.recv(host, &mut buf).unwrap();
    println!("\n   host sees EOF: {}", eof.eof);
    lb.b.close(host, lb.now()).unwrap();
    lb.run();

    println!("\n2. Streaming {mebibytes} MiB guest -> host with 64 KiB writes (no tracing):\n");
    let mut lb = Loopback::guest_and_host();
    let (guest, host) = handshake(&mut lb);
    let total = mebibytes << 20;
    let chunk = vec![0x5au8; 64 * 1024];
    let mut buf = vec![0u8; 64 * 1024];
    let (mut sent, mut received) = (0usize, 0usize);
    let started = WallClock::now();
    while received < total {
        if sent < total {
            let want = chunk.len().min(total - sent);
            if let Ok(n) = lb.a.send(guest, &chunk[..want]) {
                sent += n;
            }
        }
        lb.step();
        while let Ok(info) = lb.b.recv(host, &mut buf) {
            if info.len == 0 {
                break;
            }
            received += info.len;
        }
        lb.step();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "   moved {} MiB in {:.3} s: {:.2} Gbit/s\n",
        received >> 20,
        secs,
        received as f64 * 8.0 / secs / 1e9
    );
    println!("   guest stack counters:\n{}", indent(&lb.a.stats().to_string()));
    println!("   host stack counters:\n{}", indent(&lb.b.stats().to_string()));
}

fn handshake(lb: &mut Loopback) -> (pier_stack::SocketHandle, pier_stack::SocketHandle) {
    let listener = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.bind(listener, VsockAddr::new(VMADDR_CID_ANY, PORT)).unwrap();
    lb.b.listen(listener, 16).unwrap();
    let guest = lb.a.socket(SocketType::Stream).unwrap();
    let now = lb.now();
    lb.a.connect(guest, VsockAddr::new(VMADDR_CID_HOST, PORT), now).unwrap();
    lb.run();
    lb.stack(Side::A).finish_connect(guest).expect("connect");
    let (host, _) = lb.b.accept(listener).expect("accept");
    (guest, host)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("     {l}\n")).collect()
}
