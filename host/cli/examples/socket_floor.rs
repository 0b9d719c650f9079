//! The floor under every hybrid-socket benchmark: how fast the host's own
//! sockets echo with no pier code in the path, beside the kernel path the
//! benchmarks compare pier with.
//!
//! `docs/benchmarks.md` compares pier's datagram echo with kernel UDP and
//! its stream echo with wasmtime's TCP. Both of pier's paths enter and
//! leave through Unix sockets (the hybrid socket's contract), and split the
//! work between a device thread, which receives, and an application
//! thread, which answers. This program measures what that contract and
//! that split cost by themselves, with the benchmarks' own client loops
//! and kernel baselines (`benches/common`'s `stream_echo` and
//! `datagram_echo`, shared with the benchmarks):
//!
//! - **kernel**: UDP (`--datagram`) or TCP (`--stream`) on 127.0.0.1,
//!   echoed by one thread: the benchmarks' kernel baseline;
//! - **unix**: a Unix socket echoed by one thread with the calls pier's
//!   bridge makes (a datagram is received on one bound path and sent by
//!   name to the client's bound path, here without the bridge's 8-byte
//!   ports header; a stream is a connected pair);
//! - **unix-2**: the same with the receive on one thread and the send on
//!   another, each buffer handed over through a bounded channel: pier's
//!   device thread receives from the hybrid socket, and its application's
//!   thread makes most of the sends (through the device round that its
//!   kick runs).
//!
//! Each size runs five rounds; a round measures the three in turn
//! (reversed in odd rounds), and the table gives each one's median and
//! the median of the rounds' own ratios to the kernel's.
//!
//! ```sh
//! cargo run --release -p pier-cli --example socket_floor -- --datagram [--sizes=4096,65507]
//! cargo run --release -p pier-cli --example socket_floor -- --stream [--sizes=1024,4096,65536]
//! ```

#[path = "../benches/common/datagram_echo.rs"]
mod datagram_echo;
#[path = "../benches/common/stream_echo.rs"]
mod stream_echo;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;

use datagram_echo::{Echo, LOSS_TIMEOUT, echo_windows, udp_echo};
use pier_hybrid::{datagram_path, datagram_receiver_path};
use pier_testkit::bench::{PairedRatio, ROUNDS, chosen_sizes, median, round_order};
use stream_echo::{echo, serve_echo, unix_pair_echo};

/// Bytes each way per datagram run (at most 32 Ki datagrams).
const DATAGRAM_BYTES: usize = 128 << 20;
/// Bytes each way per stream run.
const STREAM_BYTES: u64 = 512 << 20;
/// The largest datagram or read; every buffer is this big.
const BUF: usize = 64 * 1024;
/// Buffers in flight between the two threads of `unix-2`.
const HANDOFF_SLOTS: usize = 16;
/// The host port the client's socket is bound for, as a host program
/// bound at `<uds>_dgram_9000` would be.
const CLIENT_PORT: u32 = 9000;

const SERVERS: [&str; 3] = ["kernel", "unix", "unix-2"];

fn main() -> io::Result<()> {
    let datagram = std::env::args().any(|a| a == "--datagram");
    let stream = std::env::args().any(|a| a == "--stream");
    if datagram == stream {
        eprintln!("socket_floor: give one of --datagram or --stream");
        std::process::exit(2);
    }
    let dir = tempfile::tempdir()?;
    let (sizes, kernel) = if datagram {
        (chosen_sizes().unwrap_or_else(|| vec![4096, 65_507]), "kernel UDP")
    } else {
        (chosen_sizes().unwrap_or_else(|| vec![1024, 4096, 65_536]), "kernel TCP")
    };
    let unit = if datagram { "MB/s" } else { "Gbit/s" };
    println!(
        "socket floor, {}: median of {ROUNDS} alternated rounds (a ratio: the median of the rounds' own ratios)\n",
        if datagram { "windowed datagram echo" } else { "stream echo" }
    );
    println!(
        "| size | {kernel}, one thread | Unix, one thread | Unix, two threads | one thread / kernel | two threads / kernel | two threads, lowest, highest round |"
    );
    println!("|---|---|---|---|---|---|---|");
    for size in sizes {
        let mut rates: [Vec<f64>; 3] = Default::default();
        for round in 0..ROUNDS {
            for server in round_order(round, SERVERS.len()) {
                let rate = if datagram {
                    datagram_floor(dir.path(), SERVERS[server], size)? / 1e6
                } else {
                    stream_floor(SERVERS[server], size)? * 8.0 / 1e9
                };
                rates[server].push(rate);
            }
        }
        let one = PairedRatio::of(&rates[1], &rates[0]);
        let two = PairedRatio::of(&rates[2], &rates[0]);
        println!(
            "| {size} B | {:.2} {unit} | {:.2} {unit} | {:.2} {unit} | {:.2}x | {:.2}x | {:.2}x, {:.2}x |",
            median(&rates[0]),
            median(&rates[1]),
            median(&rates[2]),
            one.median,
            two.median,
            two.lowest,
            two.highest
        );
    }
    Ok(())
}

/// The hand-over between `unix-2`'s two threads: filled buffers one way
/// (with their length), empty ones back, so no message allocates.
struct Handoff {
    full_tx: SyncSender<(Vec<u8>, usize)>,
    full_rx: Receiver<(Vec<u8>, usize)>,
    free_tx: SyncSender<Vec<u8>>,
    free_rx: Receiver<Vec<u8>>,
}

impl Handoff {
    fn new() -> Self {
        let (full_tx, full_rx) = sync_channel(HANDOFF_SLOTS);
        let (free_tx, free_rx) = sync_channel(HANDOFF_SLOTS);
        for _ in 0..HANDOFF_SLOTS {
            free_tx.send(vec![0u8; BUF]).expect("the pool has room");
        }
        Self { full_tx, full_rx, free_tx, free_rx }
    }

    /// Starts the two threads: one `receive`s into free buffers until it
    /// gets 0 bytes or an error, the other `answer`s from the full ones
    /// and runs `finish` once the first has stopped.
    fn spawn(
        self,
        mut receive: impl FnMut(&mut [u8]) -> io::Result<usize> + Send + 'static,
        mut answer: impl FnMut(&[u8]) -> io::Result<()> + Send + 'static,
        finish: impl FnOnce() + Send + 'static,
    ) -> [thread::JoinHandle<()>; 2] {
        let Self { full_tx, full_rx, free_tx, free_rx } = self;
        let receiver = thread::spawn(move || {
            while let Ok(mut buf) = free_rx.recv() {
                match receive(&mut buf) {
                    Ok(n) if n > 0 => {
                        if full_tx.send((buf, n)).is_err() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        });
        let answerer = thread::spawn(move || {
            while let Ok((buf, n)) = full_rx.recv() {
                if answer(&buf[..n]).is_err() {
                    break;
                }
                // The receiving thread is gone once it met the end; what
                // it filled before still goes out.
                let _ = free_tx.send(buf);
            }
            finish();
        });
        [receiver, answerer]
    }
}

/// The client's socket at `<uds>_dgram_9000`, talking to the echo bound
/// at `<uds>_dgram`, with no ports header.
struct UnixClient {
    me: UnixDatagram,
    server: PathBuf,
}

impl Echo for UnixClient {
    fn send(&self, payload: &[u8]) {
        self.me.send_to(payload, &self.server).expect("sending to the Unix echo");
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.me.recv(buf).ok()
    }
}

/// A datagram the echoes take as their end, as `udp_echo`'s does.
fn is_end(len: usize) -> bool {
    len == 1
}

/// One windowed echo of `size`-byte datagrams through `server`; payload
/// bytes per second each way.
fn datagram_floor(dir: &Path, server: &str, size: usize) -> io::Result<f64> {
    let count = (DATAGRAM_BYTES / size).min(32 << 10);
    if server == "kernel" {
        let (udp, echoer) = udp_echo();
        let (rate, _lost) = echo_windows(&udp, size, count);
        udp.send(&[0]);
        let _ = echoer.join();
        return Ok(rate);
    }
    // The bridge's names: it receives at `<uds>_dgram` and sends by name
    // to `<uds>_dgram_<port>`.
    let uds = dir.join(format!("{server}-{size}.vsock"));
    let (server_path, client_path) =
        (datagram_path(&uds), datagram_receiver_path(&uds, CLIENT_PORT));
    // The names of the previous round's run.
    let _ = std::fs::remove_file(&server_path);
    let _ = std::fs::remove_file(&client_path);
    let echo_socket = UnixDatagram::bind(&server_path)?;
    let client = UnixClient { me: UnixDatagram::bind(&client_path)?, server: server_path };
    client.me.set_read_timeout(Some(LOSS_TIMEOUT))?;
    let mut echoers = Vec::new();
    if server == "unix" {
        echoers.push(thread::spawn(move || {
            let mut buf = vec![0u8; BUF];
            while let Ok(n) = echo_socket.recv(&mut buf) {
                if is_end(n) || echo_socket.send_to(&buf[..n], &client_path).is_err() {
                    break;
                }
            }
        }));
    } else {
        let sender = echo_socket.try_clone()?;
        echoers.extend(Handoff::new().spawn(
            move |buf| echo_socket.recv(buf).map(|n| if is_end(n) { 0 } else { n }),
            move |buf| sender.send_to(buf, &client_path).map(drop),
            || {},
        ));
    }
    let (rate, _lost) = echo_windows(&client, size, count);
    client.send(&[0]);
    for echoer in echoers {
        let _ = echoer.join();
    }
    Ok(rate)
}

/// One stream echo of 512 MiB in `size`-byte writes through `server`;
/// bytes per second each way.
fn stream_floor(server: &str, size: usize) -> io::Result<f64> {
    match server {
        "kernel" => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let client = TcpStream::connect(listener.local_addr()?)?;
            let (served, _) = listener.accept()?;
            let echoer = serve_echo(served, |s| s.shutdown(Shutdown::Write).unwrap());
            let reader = client.try_clone()?;
            let rate =
                echo(client, reader, |s| s.shutdown(Shutdown::Write).unwrap(), STREAM_BYTES, size);
            let _ = echoer.join();
            Ok(rate)
        }
        "unix" => Ok(unix_pair_echo(STREAM_BYTES, size)),
        _ => {
            let (client, served) = UnixStream::pair()?;
            let mut reader = served.try_clone()?;
            let closer = served.try_clone()?;
            let mut writer = served;
            let echoers = Handoff::new().spawn(
                move |buf| reader.read(buf),
                move |buf| writer.write_all(buf),
                move || {
                    let _ = closer.shutdown(Shutdown::Write);
                },
            );
            let reader = client.try_clone()?;
            let rate =
                echo(client, reader, |s| s.shutdown(Shutdown::Write).unwrap(), STREAM_BYTES, size);
            for echoer in echoers {
                let _ = echoer.join();
            }
            Ok(rate)
        }
    }
}
