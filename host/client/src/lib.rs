//! Host programs' side of the hybrid vsock Unix sockets that pier (and
//! Firecracker, Cloud Hypervisor, vhost-device-vsock) expose for a guest.
//!
//! A guest's vsock device is emulated in user space, so a host program has
//! no `AF_VSOCK` socket to open; it talks to the guest through Unix
//! sockets derived from one path, `<uds>`, with a little protocol on top
//! (`docs/host-sockets.md` in the pier repository). This crate is that
//! protocol on sockets, so that host programs stop re-implementing it (the
//! bytes themselves are `pier-hybrid`'s, which pier's bridge uses too):
//!
//! | vsock | host side | here |
//! |---|---|---|
//! | stream, host dials | `<uds>`, `CONNECT <port>\n` then `OK <n>\n` | [`HybridStream`] |
//! | stream, guest dials | a listener at `<uds>_<port>` | [`HybridListener`] |
//! | seqpacket, host dials | `<uds>_seqpacket`, one flags byte per message | [`HybridSeqpacket`] |
//! | seqpacket, guest dials | a `SOCK_SEQPACKET` listener at `<uds>_<port>` | [`HybridSeqpacketListener`] |
//! | datagrams | bound at `<uds>_dgram_<port>`, 8-byte ports header, sent to `<uds>_dgram` | [`HybridDatagram`] |
//!
//! Everything is a plain Unix socket underneath (each type hands out its
//! file descriptor), so it fits any event loop; the `tokio` feature adds
//! the same types for tokio in [`mod@tokio`].
//!
//! ```no_run
//! use std::io::{Read, Write};
//!
//! let mut conn = pier_client::HybridStream::connect("/tmp/pier-3.vsock", 1234)?;
//! conn.write_all(b"hello over vsock\n")?;
//! conn.shutdown(std::net::Shutdown::Write)?;
//! let mut echo = String::new();
//! conn.read_to_string(&mut echo)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Failures are [`std::io::Error`]s whose kind says what a caller can do
//! about them: a socket file that does not exist is
//! [`NotFound`](std::io::ErrorKind::NotFound) (naming the path), a port
//! the guest refuses (the backend closes the connection without `OK`, the
//! protocol's only way to say no) is
//! [`ConnectionRefused`](std::io::ErrorKind::ConnectionRefused), and a
//! backend that answers something other than `OK <n>` is
//! [`InvalidData`](std::io::ErrorKind::InvalidData) with the line it sent.
//! [`retry`] waits out the errors a guest that is still booting causes.
//!
//! Modules (their types re-exported here): `handshake` (the CONNECT
//! exchange and [`retry`]), `stream` ([`HybridStream`]), `listen`
//! ([`HybridListener`], guest-initiated connections), `seqpacket`
//! ([`HybridSeqpacket`] and its listener), `datagram` ([`HybridDatagram`]),
//! and `tokio` (the same types on tokio, behind the `tokio` feature).

mod datagram;
mod handshake;
mod listen;
mod seqpacket;
mod stream;
#[cfg(feature = "tokio")]
pub mod tokio;

use std::io;
use std::time::{Duration, Instant};

pub use datagram::{HybridDatagram, MAX_DATAGRAM};
pub use pier_hybrid::{
    DATAGRAM_HEADER_LEN, SEQPACKET_EOR, datagram_path, datagram_receiver_path, listener_path,
    seqpacket_path,
};
pub use seqpacket::{HybridSeqpacket, HybridSeqpacketListener, MAX_MESSAGE};
pub use stream::{HybridListener, HybridStream, Incoming};

/// Whether `error` is one that a guest (or backend) that is still
/// starting causes, so that trying again later can succeed: the socket
/// file is not there yet, nobody answers on it yet, the guest refused
/// (its app is not listening yet), or the answer did not come in time
/// (some backends never answer a CONNECT that arrives before the guest's
/// driver is up). A garbled answer or a bad path is not.
pub fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
    )
}

/// Runs `attempt` until it succeeds, fails in a way waiting cannot fix
/// (see [`is_transient`]), or `within` has passed, pausing 50 ms between
/// attempts; returns the last error.
///
/// Why: the protocol cannot tell "not yet" from "no": a guest that is
/// still booting refuses exactly like one that will never listen, so a
/// client started together with its guest retries with a deadline
/// (Firecracker issue #1253 describes the same need). Give each attempt
/// its own timeout ([`HybridStream::connect_timeout`]) when the backend
/// may leave a CONNECT unanswered.
pub fn retry<T>(within: Duration, mut attempt: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + within;
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if is_transient(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}
