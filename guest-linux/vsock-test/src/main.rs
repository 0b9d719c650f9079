//! `vsock-test`: the guest side of pier's Linux-guest tests. The image's
//! `/init` starts it once; it serves every test at the same time, each
//! connection on a thread of its own, over `AF_VSOCK` sockets of the
//! guest's own kernel (Linux's virtio-vsock driver, talking to the
//! vhost-user backend under test).
//!
//! It prints `vsock-test: ready` on stdout (the serial console) once every
//! listener is up, and one line for each error it meets. It never exits on
//! its own: the control command `exit` ends it, and `/init` then powers
//! the guest off.
//!
//! # Listeners (any CID)
//!
//! | port | type | what it does |
//! |---|---|---|
//! | 1234 | stream | echo: every byte back until end-of-file, then `SHUT_WR` and close |
//! | 1235 | seqpacket | echo: each message back as one message, same bytes, `MSG_EOR` kept |
//! | 1236 | stream | half-close probe: read the 16-byte header `N, seed` (u64 LE each) and the rest to end-of-file, then write `N` bytes of the pattern from `seed`, then `SHUT_WR` |
//! | 1237 | stream | reset probe: write 4 KiB at once, read until the connection ends, try one more write |
//! | 9999 | stream | the control port, below |
//!
//! # Control commands (one line each, one answer line each)
//!
//! - `ping` → `pong`.
//! - `stream CID PORT LEN SEED`: connect a stream socket to `(CID, PORT)`,
//!   send `LEN` bytes of the pattern from `SEED`, `SHUT_WR`, read the answer
//!   to end-of-file (reading and writing at once) → `ok <bytes read> <FNV-1a
//!   of them, 16 hex digits>`.
//! - `seqpacket CID PORT SEED S1,S2,...`: connect a seqpacket socket, then
//!   for each size `Si` send one message (the pattern from `SEED + i`, with
//!   `MSG_EOR`) and receive one → `ok intact <count>` when each came back
//!   with its length, bytes and `MSG_EOR`, `ok broken <i> <what>` otherwise.
//! - `halfclose-result` → the oldest outcome of the half-close probe not
//!   yet reported (waiting up to 30 s for one): `ok received=R wrote=N`,
//!   or `err ERRNO <step> ...` (`EPIPE` on the write: the host's half-close
//!   arrived as a full shutdown).
//! - `reset-result` → the same for the reset probe: `ok read=R
//!   end=<eof|ERRNO> write=<ok|ERRNO> so_error=<0|ERRNO>`.
//! - `dgram PORT`: a `SOCK_DGRAM` vsock socket, bound, one datagram to
//!   `(2, PORT)` → `ok sent`, or `err ERRNO <socket|bind|sendto>` at the
//!   first step that fails (Linux 6.1's virtio transport has no datagrams:
//!   `socket` fails with `ENODEV`).
//! - `exit` → `bye`, then the program exits 0.
//! - `reboot` → `rebooting`; once the host closes the control
//!   connection, the guest restarts at once (no orderly shutdown: its
//!   connections end the way a crash or a watchdog reset ends them) and
//!   boots this program again.
//!
//! A client command that fails answers `err ERRNO <step> ...`, with the
//! errno by name (`ECONNRESET`); a bad line answers `err usage ...`.
//! Sockets the program uses time out after 30 s (client commands and
//! probes) or 120 s (echoes) without progress, so a stuck peer ends a
//! command with `EAGAIN` rather than wedging it.
//!
//! # Test data
//!
//! The pattern is xorshift64* from `seed | 1`, eight little-endian bytes a
//! step, and the hash FNV-1a 64: this program compiles the very file that
//! defines them for pier's host tests (`testkit/src/pattern/`, in
//! pier-testkit's `pattern` module), so both sides name data by seed and
//! length.

mod console;
mod control;
// One source for the host tests and this program (see "Test data" above).
#[path = "../../../testkit/src/pattern/shared_with_guest.rs"]
mod pattern;
mod servers;
mod sys;

/// The stream echo server's port.
pub const STREAM_ECHO_PORT: u32 = 1234;
/// The seqpacket echo server's port.
pub const SEQPACKET_ECHO_PORT: u32 = 1235;
/// The half-close probe's port.
pub const HALF_CLOSE_PORT: u32 = 1236;
/// The reset probe's port.
pub const RESET_PORT: u32 = 1237;
/// The control port.
pub const CONTROL_PORT: u32 = 9999;

fn main() {
    type Serve = fn(std::os::fd::OwnedFd, u32, u32);
    let listeners: [(&str, libc::c_int, u32, Serve); 5] = [
        ("stream echo", libc::SOCK_STREAM, STREAM_ECHO_PORT, servers::stream_echo),
        ("seqpacket echo", libc::SOCK_SEQPACKET, SEQPACKET_ECHO_PORT, servers::seqpacket_echo),
        ("half-close probe", libc::SOCK_STREAM, HALF_CLOSE_PORT, servers::half_close_probe),
        ("reset probe", libc::SOCK_STREAM, RESET_PORT, servers::reset_probe),
        ("control", libc::SOCK_STREAM, CONTROL_PORT, control::serve),
    ];
    let mut failed = false;
    for (name, ty, port, serve) in listeners {
        match sys::listen(ty, port, 128) {
            Ok(listener) => servers::spawn_acceptor(name, listener, serve),
            Err(e) => {
                // A missing socket type (seqpacket without the backend's
                // support is still a socket; this is the kernel refusing)
                // is reported, and the rest still serve.
                console::log(&format!(
                    "{name}: cannot listen on port {port}: {}",
                    sys::errno_name(&e)
                ));
                failed = true;
            }
        }
    }
    console::log(if failed { "ready (with errors above)" } else { "ready" });
    loop {
        std::thread::park();
    }
}
