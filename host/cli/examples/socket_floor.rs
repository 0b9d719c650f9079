//! The floor under every hybrid-socket benchmark: how fast the host's own
//! sockets echo with no pier code in the path, beside the kernel path the
//! benchmarks compare pier with.
//!
//! `docs/benchmarks.md` compares pier's datagram echo with kernel UDP and
//! its stream echo with wasmtime's TCP. Both of pier's paths enter and
//! leave through Unix sockets (the hybrid socket's contract), and split the
//! work between a device thread, which receives, and an application
//! thread, which answers. This program measures what that contract and
//! that split cost by themselves, with the benchmarks' own client loops:
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

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::Instant;

use pier_testkit::bench::{PairedRatio, ROUNDS, chosen_sizes, median, round_order};

/// Datagrams in flight per window: the `datagrams` benchmark's 8, or
/// 128 KiB, whichever is fewer.
fn window(size: usize) -> usize {
    (128 * 1024 / size).clamp(1, 8)
}

/// The largest datagram or read; every buffer is this big.
const BUF: usize = 64 * 1024;
/// Buffers in flight between the two threads of `unix-2`.
const HANDOFF_SLOTS: usize = 16;

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
                    datagram_echo(dir.path(), SERVERS[server], size)?
                } else {
                    stream_echo(SERVERS[server], size)?
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
                if answer(&buf[..n]).is_err() || free_tx.send(buf).is_err() {
                    break;
                }
            }
            finish();
        });
        [receiver, answerer]
    }
}

/// The client's side of a datagram echo: send one, receive one.
type ClientSend = Box<dyn Fn(&[u8]) -> io::Result<usize>>;
type ClientRecv = Box<dyn FnMut(&mut [u8]) -> io::Result<usize>>;

/// One windowed echo of `size`-byte datagrams, 128 MiB at most (as few as
/// 2,048 datagrams); payload MB/s each way.
fn datagram_echo(dir: &Path, server: &str, size: usize) -> io::Result<f64> {
    let count = (128 * 1024 * 1024 / size).max(2048) / window(size) * window(size);
    let payload = vec![7u8; size];
    let mut reply = vec![0u8; BUF];
    let mut echo_threads = Vec::new();
    // The client's send and receive, for either transport.
    let (send, mut recv): (ClientSend, ClientRecv) = if server == "kernel" {
        let srv = UdpSocket::bind("127.0.0.1:0")?;
        let cli = UdpSocket::bind("127.0.0.1:0")?;
        cli.connect(srv.local_addr()?)?;
        let cli2 = cli.try_clone()?;
        echo_threads.push(thread::spawn(move || {
            let mut buf = vec![0u8; BUF];
            while let Ok((n, from)) = srv.recv_from(&mut buf) {
                if n == 0 || srv.send_to(&buf[..n], from).is_err() {
                    break;
                }
            }
        }));
        (Box::new(move |b| cli.send(b)), Box::new(move |b| cli2.recv(b)))
    } else {
        let srv_path = dir.join(format!("{server}-{size}.sock_dgram"));
        let cli_path = dir.join(format!("{server}-{size}.sock_dgram_9000"));
        // The names of the previous round's sockets.
        let _ = std::fs::remove_file(&srv_path);
        let _ = std::fs::remove_file(&cli_path);
        let srv = UnixDatagram::bind(&srv_path)?;
        let cli = UnixDatagram::bind(&cli_path)?;
        let to = cli_path.clone();
        if server == "unix" {
            echo_threads.push(thread::spawn(move || {
                let mut buf = vec![0u8; BUF];
                while let Ok(n) = srv.recv(&mut buf) {
                    if n == 0 || srv.send_to(&buf[..n], &to).is_err() {
                        break;
                    }
                }
            }));
        } else {
            let sender = srv.try_clone()?;
            echo_threads.extend(Handoff::new().spawn(
                move |buf| srv.recv(buf),
                move |buf| sender.send_to(buf, &to).map(drop),
                || {},
            ));
        }
        let cli2 = cli.try_clone()?;
        (Box::new(move |b| cli.send_to(b, &srv_path)), Box::new(move |b| cli2.recv(b)))
    };
    let start = Instant::now();
    for _ in 0..count / window(size) {
        for _ in 0..window(size) {
            send(&payload)?;
        }
        for _ in 0..window(size) {
            recv(&mut reply)?;
        }
    }
    let rate = (count * size) as f64 / start.elapsed().as_secs_f64() / 1e6;
    // An empty datagram ends every echo thread (the second of unix-2 ends
    // when the first drops its channel).
    send(&[])?;
    for t in echo_threads {
        let _ = t.join();
    }
    Ok(rate)
}

/// One stream echo: a client thread writes 512 MiB in `size`-byte writes
/// while this thread reads the echo; Gbit/s each way.
fn stream_echo(server: &str, size: usize) -> io::Result<f64> {
    const TOTAL: usize = 512 * 1024 * 1024;
    let (client, served): (Box<dyn ReadWrite>, Box<dyn ReadWrite>) = if server == "kernel" {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let client = TcpStream::connect(listener.local_addr()?)?;
        let (served, _) = listener.accept()?;
        (Box::new(client), Box::new(served))
    } else {
        let (client, served) = UnixStream::pair()?;
        (Box::new(client), Box::new(served))
    };
    let mut echo_threads = Vec::new();
    if server == "unix-2" {
        let mut reader = served.try_clone_box()?;
        let closer = served.try_clone_box()?;
        let mut writer = served;
        echo_threads.extend(Handoff::new().spawn(
            move |buf| reader.read(buf),
            move |buf| writer.write_all(buf),
            move || {
                let _ = closer.shutdown_write();
            },
        ));
    } else {
        let mut served = served;
        echo_threads.push(thread::spawn(move || {
            let mut buf = vec![0u8; BUF];
            while let Ok(n) = served.read(&mut buf) {
                if n == 0 || served.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = served.shutdown_write();
        }));
    }
    let mut writer = client.try_clone_box()?;
    let mut reader = client;
    let start = Instant::now();
    let client_writer = thread::spawn(move || -> io::Result<()> {
        let chunk = vec![1u8; size];
        let mut sent = 0;
        while sent < TOTAL {
            writer.write_all(&chunk)?;
            sent += size;
        }
        writer.shutdown_write()
    });
    let mut buf = vec![0u8; BUF];
    let mut echoed = 0usize;
    loop {
        match reader.read(&mut buf)? {
            0 => break,
            n => echoed += n,
        }
    }
    let rate = echoed as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9;
    client_writer.join().expect("the client's writer")?;
    for t in echo_threads {
        let _ = t.join();
    }
    Ok(rate)
}

/// A connected stream of either kind, shared by two threads.
trait ReadWrite: Read + Write + Send {
    fn try_clone_box(&self) -> io::Result<Box<dyn ReadWrite>>;
    fn shutdown_write(&self) -> io::Result<()>;
}

impl ReadWrite for TcpStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn ReadWrite>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl ReadWrite for UnixStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn ReadWrite>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
