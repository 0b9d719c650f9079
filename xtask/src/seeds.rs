//! The seed corpus of the fuzz targets (`fuzz/corpus/<target>/`), written
//! by `cargo xtask fuzz-seeds`.
//!
//! Seeds are real inputs: packets encoded by pier-stack's own wire code,
//! CONNECT lines and Unix-side frames as host programs write them, rings
//! laid out as a driver lays them out, and stack scripts that open and use
//! connections. Starting from them, the fuzzer spends its time on the
//! edges of valid input instead of first rediscovering the formats. The
//! ring and script seeds follow the input layouts documented at the top of
//! `fuzz/fuzz_targets/virtqueue.rs` and `stack_sequence.rs`; change both
//! together.

use std::path::Path;

use pier_hybrid::{connect_line, encode_datagram_header, ok_line, seqpacket_flags};
use pier_stack::VsockAddr;
use pier_stack::wire::HEADER_LEN;
use pier_stack::wire::{Header, Op, RawHeader, SocketType, seq_flags, shutdown_flags};

/// Every seed, as (target, file name, bytes).
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let guest = VsockAddr::new(3, 1234);
    let host = VsockAddr::new(2, 80);
    let packet = |h: Header, payload: &[u8]| {
        let mut v = h.with_len(payload.len() as u32).encode().to_vec();
        v.extend_from_slice(payload);
        v
    };
    let stream = |op| Header::new(SocketType::Stream, op, guest, host).with_credit(262_144, 0);
    let mut unknown_op = stream(Op::Rw).to_raw();
    unknown_op.op = 42;
    let mut out = vec![
        ("wire_decode", "request", packet(stream(Op::Request), b"")),
        ("wire_decode", "rw", packet(stream(Op::Rw), b"hello")),
        (
            "wire_decode",
            "shutdown",
            packet(stream(Op::Shutdown).with_flags(shutdown_flags::BOTH), b""),
        ),
        ("wire_decode", "credit_update", packet(stream(Op::CreditUpdate), b"")),
        (
            "wire_decode",
            "seqpacket_eor",
            packet(
                Header::new(SocketType::SeqPacket, Op::Rw, guest, host)
                    .with_flags(seq_flags::EOM | seq_flags::EOR),
                b"message",
            ),
        ),
        ("wire_decode", "datagram", packet(Header::datagram(guest, host, 0), b"dgram")),
        (
            "wire_decode",
            "rst",
            RawHeader::rst_reply(&stream(Op::Request).to_raw()).encode().to_vec(),
        ),
        ("wire_decode", "unknown_op", unknown_op.encode().to_vec()),
        ("wire_decode", "truncated", packet(stream(Op::Rw), b"")[..HEADER_LEN - 4].to_vec()),
        ("connect_line", "plain", connect_line(1234).trim_end().as_bytes().to_vec()),
        ("connect_line", "lower_tab", b"connect\t80".to_vec()),
        ("connect_line", "largest", connect_line(u32::MAX - 1).trim_end().as_bytes().to_vec()),
        ("connect_line", "port_any", connect_line(u32::MAX).trim_end().as_bytes().to_vec()),
        ("connect_line", "signed", b"CONNECT +52".to_vec()),
        ("bridge_framing", "datagram", [&encode_datagram_header(1234, 80)[..], b"ping"].concat()),
        ("bridge_framing", "seqpacket_eor", [&[seqpacket_flags(true)][..], b"message"].concat()),
        ("bridge_framing", "seqpacket_empty", vec![seqpacket_flags(false)]),
        ("bridge_framing", "seqpacket_bad_flags", vec![2, b'x']),
    ];
    for (name, bytes) in ring_seeds(&packet(stream(Op::Rw), b"hello")) {
        out.push(("virtqueue", name, bytes));
    }
    for (name, bytes) in stack_seeds() {
        out.push(("stack_sequence", name, bytes));
    }
    out.extend([
        ("client_reply", "ok", ok_line(1234).as_bytes().to_vec()),
        ("client_reply", "ok_crlf_then_data", b"\x03OK 52\r\nhello from the guest".to_vec()),
        ("client_reply", "cut_off", b"OK 1234".to_vec()),
        ("client_reply", "refused", Vec::new()),
        ("client_reply", "garbage", b"HTTP/1.1 400 Bad Request\r\n".to_vec()),
        ("config_file", "documented", CONFIG_EXAMPLE.as_bytes().to_vec()),
        ("config_file", "firecracker_names", CONFIG_FIRECRACKER.as_bytes().to_vec()),
        ("containerd_annotations", "kubernetes", ANNOTATIONS_KUBERNETES.as_bytes().to_vec()),
        ("containerd_annotations", "plain_ctr", ANNOTATIONS_CTR.as_bytes().to_vec()),
        ("vhost_user_vrings", "three_queues", vring_seed()),
    ]);
    out
}

/// `pier run --config`'s documented example (`host/cli/src/config.rs`).
const CONFIG_EXAMPLE: &str = r#"cid = 3
uds = "/run/pier/app.vsock"
wasi_tcp = false

[[component]]
name = "echo"
wasm = "echo.wasm"
args = ["--port", "1234"]
listen = ["1234"]
dirs = ["data::/data"]
env = { RUST_LOG = "debug" }
max_memory = "64M"

[[component]]
wasm = "send-file.wasm"
args = ["--cid", "1", "--port", "1234"]
connect = ["1:1234", "*:80", "3:*"]
"#;

/// Firecracker's key names, a read-only folder and a wildcard grant.
const CONFIG_FIRECRACKER: &str = r#"guest_cid = 9
uds_path = "vm.vsock"

[[component]]
wasm = "apps/probe.wasm"
listen = ["*", "80"]
connect = ["*"]
dirs = ["/srv/www::/www:ro"]
max_memory = "1G"
"#;

/// A container id, then one annotation per line, its first byte picking
/// the key (`fuzz/fuzz_targets/containerd_annotations.rs`): 0 listen, 1
/// connect, 2 cid, 3 socket, 4 socket-limit, 5 image-files, 6 to 8 the
/// CRI's Pod name, Pod namespace and container name.
const ANNOTATIONS_KUBERNETES: &str = "0123abcd\n\x001234, 8080\n\x012:5000 *:80 3:*\n\x027\n\
    \x03{pod-namespace}-{pod}-{container}.sock\n\x0416\n\x05read-only\n\x06web-7f9c\n\
    \x07shop\n\x08frontend";

/// Outside Kubernetes: the id names the socket, and an unknown key.
const ANNOTATIONS_CTR: &str = "web-1\n\x00*\n\x03{id}.sock\n\x09listne=1234";

/// One 64 KiB region at 0; VIRTIO_F_VERSION_1 acked; then for each of the
/// three queues (rx, tx, event) a 16-entry ring in its own page, its kick,
/// enable and ready; then a TX drain, an RX write, an event, and the rx
/// queue stopped again (`fuzz/fuzz_targets/vhost_user_vrings.rs`).
fn vring_seed() -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend(0u64.to_le_bytes());
    v.push(15);
    v.extend((1u64 << 32).to_le_bytes());
    for q in 0u8..3 {
        let base = u64::from(q) * 0x1000;
        v.extend([q, 16, 0]);
        v.push(1 << 2 | q);
        for ring in [base, base + 0x100, base + 0x200] {
            v.extend(ring.to_le_bytes());
        }
        v.extend([4 << 2 | q, 6 << 2 | q, 1, 7 << 2 | q, 1]);
    }
    v.push(10 << 2 | 1);
    v.extend([11 << 2, 5]);
    v.extend(b"hello");
    v.extend([12 << 2 | 2, 0, 0, 0, 0]);
    v.extend([7 << 2, 0]);
    v
}

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// Guest memory images for a 4-entry queue: descriptor table at 0, the
/// available ring at 64, the used ring at 80, buffers from 256.
fn ring_seeds(tx: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    fn desc(mem: &mut [u8], at: usize, addr: u64, len: u32, flags: u16, next: u16) {
        mem[at..at + 8].copy_from_slice(&addr.to_le_bytes());
        mem[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
        mem[at + 12..at + 14].copy_from_slice(&flags.to_le_bytes());
        mem[at + 14..at + 16].copy_from_slice(&next.to_le_bytes());
    }
    fn avail(mem: &mut [u8], heads: &[u16]) {
        mem[66..68].copy_from_slice(&(heads.len() as u16).to_le_bytes());
        for (i, h) in heads.iter().enumerate() {
            mem[68 + 2 * i..70 + 2 * i].copy_from_slice(&h.to_le_bytes());
        }
    }
    // setup byte: queue size 4, EVENT_IDX (0x08), indirect (0x10).
    // Script: pop, write_rx (u32 + u8), drain (budget 4), interrupt check.
    let script = [0u8, 2, 1, 0, 0, 0, 3, 1, 4, 4];
    let input = |setup: u8, mem: Vec<u8>| {
        let mut v = vec![setup, script.len() as u8];
        v.extend_from_slice(&script);
        v.extend(mem);
        v
    };
    let mut one = vec![0u8; 1024];
    one[256..256 + tx.len()].copy_from_slice(tx);
    desc(&mut one, 0, 256, tx.len() as u32, 0, 0);
    desc(&mut one, 16, 512, 256, F_WRITE, 0);
    avail(&mut one, &[0, 1]);

    let mut split = vec![0u8; 1024];
    split[256..256 + tx.len()].copy_from_slice(tx);
    desc(&mut split, 0, 256, HEADER_LEN as u32, F_NEXT, 2);
    desc(&mut split, 32, 256 + HEADER_LEN as u64, (tx.len() - HEADER_LEN) as u32, 0, 0);
    desc(&mut split, 16, 512, 44, F_WRITE | F_NEXT, 3);
    desc(&mut split, 48, 556, 200, F_WRITE, 0);
    avail(&mut split, &[0, 1]);

    let mut indirect = vec![0u8; 1024];
    indirect[256..256 + tx.len()].copy_from_slice(tx);
    desc(&mut indirect, 0, 768, 32, F_INDIRECT, 0);
    desc(&mut indirect, 768, 256, HEADER_LEN as u32, F_NEXT, 1);
    desc(&mut indirect, 784, 256 + HEADER_LEN as u64, (tx.len() - HEADER_LEN) as u32, 0, 0);
    desc(&mut indirect, 16, 512, 256, F_WRITE, 0);
    avail(&mut indirect, &[0, 1]);

    vec![
        ("one_descriptor_each", input(0x02, one)),
        ("split_chains_event_idx", input(0x02 | 0x08, split)),
        ("indirect_table", input(0x02 | 0x10, indirect)),
    ]
}

/// Scripts for the stack harness: a forged peer opens a seqpacket
/// connection and sends a message, the driven peer streams, the
/// application reads, the clock runs.
fn stack_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // One forged packet as `forged` reads it: src (2, 7001) -> (3, port),
    // the given type and op, flags, credit 4096, fwd_cnt 0, payload.
    fn forged(ty: u8, op: u8, port: &[u8], flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![2, 4, 2, 2, 1];
        v.extend_from_slice(port);
        v.extend([ty, op, flags, 3, 0, 0, 0, 0]);
        v.push((payload.len() / 4) as u8);
        v.extend_from_slice(&payload[..payload.len() / 4 * 4]);
        v.push(1);
        v
    }
    let batch = |packets: &[Vec<u8>]| {
        let mut v = vec![0, packets.len() as u8 - 1];
        for p in packets {
            v.extend_from_slice(p);
        }
        v
    };
    let seq = 2; // seqpacket
    let stream = 1;
    let mut open_seq = batch(&[forged(seq, 1, &[1], 0, b"")]);
    open_seq.extend([2, 8]); // dispatch: the RESPONSE goes out
    open_seq.extend([6, 0, 1]); // the application accepts it
    open_seq.extend(batch(&[forged(seq, 5, &[1], 3, b"a message!!!")]));
    open_seq.extend([6, 3, 1, 4]); // recv on it
    open_seq.extend([6, 5, 1]); // close it
    open_seq.extend([3, 0x10, 0x27]); // 10 s later
    open_seq.extend([2, 8]);

    let mut driven = vec![4, 0xe8, 0x03]; // the driven peer sends 1000 bytes
    driven.extend([5, 0x00, 0x02]); // the application reads 512
    driven.extend([2, 8]);
    driven.extend([4, 0x00, 0x10]);
    driven.extend([5, 0xff, 0xff]);

    let mut catch_all =
        batch(&[forged(stream, 1, &[3, 0], 0, b""), forged(stream, 5, &[3, 0], 0, b"early")]);
    catch_all.extend([6, 0, 2]); // accept from the catch-all listener
    catch_all.extend([6, 6, 1, 0]); // confirm
    catch_all.extend([2, 8]);
    catch_all.extend([6, 2, 1, 4]); // send 64 bytes
    catch_all.extend([2, 8]);

    let mut connect = vec![6, 1, 0, 0]; // connect a stream to (2, 1024)
    connect.extend([2, 8]);
    connect.extend([3, 0xb8, 0x0b]); // the connect times out
    vec![
        ("seqpacket_open", open_seq),
        ("driven_stream", driven),
        ("catch_all", catch_all),
        ("connect_timeout", connect),
    ]
}

/// Writes every seed under `root/fuzz/corpus/`.
pub fn write_seeds(root: &Path) -> Result<usize, String> {
    let seeds = seeds();
    for (target, name, bytes) in &seeds {
        let dir = root.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let file = dir.join(name);
        std::fs::write(&file, bytes).map_err(|e| format!("writing {}: {e}", file.display()))?;
    }
    Ok(seeds.len())
}
