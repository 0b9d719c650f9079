//! One bridged connection: a Unix socket on one side, a host-stack socket
//! on the other, and the code that moves bytes or messages between them.
//!
//! # Life of a connection
//!
//! ```text
//!  host program connects to <uds>           guest connects to (2, port)
//!            │                                        │
//!      AwaitLine ── bad line, 2 s, hang-up ──▶ closed  │ catch-all accept;
//!            │ CONNECT <port>                          │ connect <uds>_<port>
//!      Connecting ── RST, 2 s, hang-up ──▶ closed      │ (fails → refuse: RST)
//!            │ RESPONSE: write "OK <port>\n"           │ (works → confirm: RESPONSE)
//!            ▼                                        ▼
//!          Relay ◀────────────────────────────────────┘
//!            │ both directions finished, or an error
//!            ▼
//!          closed (Unix socket closed, stack socket closed in the background)
//! ```
//!
//! # No copy buffers of our own
//!
//! The relay keeps no bytes between calls. Whatever it has not moved yet
//! stays where it already is: in the Unix socket's kernel buffer (host →
//! guest) or in the host stack's receive buffer (guest → host). That makes
//! memory per connection exactly what the kernel and the stack already
//! bound, and it makes backpressure exact: a guest that stops reading stops
//! the host program's writes, through the stack's credit and the Unix
//! socket's buffer, with nothing in between to fill up.
//!
//! - **Unix → vsock** reads from the Unix socket straight into the
//!   guest's receive buffer when the device lends one
//!   ([`RxLender`], `Stack::send_in_place`: the host stack only counts the
//!   bytes and makes their header), or else into the stack's send buffer
//!   (`Stack::send_with`), at most what the connection's credit lets it
//!   take. What exceeds the credit is never read, so it waits in the Unix
//!   socket. (Seqpacket messages go through one scratch buffer shared by
//!   all connections, since a message is peeked whole before it is taken.)
//! - **vsock → Unix** uses `Stack::recv_with`, whose closure writes the
//!   stack's queued bytes straight into the Unix socket and reports how many
//!   the write took; a partial write or `EAGAIN` consumes only that much.
//!
//! The CONNECT line is read the same way: peeked, and consumed only up to
//! its newline, so bytes a client writes after the line (even in the same
//! write) stay queued in the socket and reach the guest once it answers.
//!
//! # Seqpacket: one flags byte per message
//!
//! Linux's `SOCK_SEQPACKET` Unix sockets keep message boundaries but drop
//! `MSG_EOR` (checked by the `unix_seqpacket_drops_msg_eor` test), so on
//! the Unix side every data message starts with a flags byte that carries
//! vsock's EOR; `pier_hybrid` defines it (and why it also tells an empty
//! message from end-of-file). A message is peeked whole, decoded, and
//! consumed only once the other side took it.
//!
//! # Edge-triggered readiness
//!
//! mio reports readiness edges. The connection keeps "may be readable" and
//! "may be writable" flags, set by events and cleared by `EAGAIN`, and
//! every pump moves data until one side refuses (EAGAIN, no credit, nothing
//! queued). A stream read that returns less than it asked for, or a write
//! that takes less than it was given, clears its flag too: the socket is
//! empty (full) at that moment, and on Linux every later arrival (every
//! buffer the reader frees) wakes epoll again, so the `EAGAIN` a further
//! call would fetch costs a system call and tells nothing. The one
//! exception is a read side the host program has shut: its EOF raises no
//! new edge, so that socket is read until it says 0. The stack side is woken through wakers parked on its sockets
//! (see `wake.rs`).
//!
//! # Logs
//!
//! Every way a connection ends is counted in [`BridgeStats`] and also
//! logged (target `pier_device::bridge`): refusals, timeouts and resets at
//! `info`, since a host program only ever sees a closed socket and the log
//! is where a user finds out why; successful CONNECTs and orderly closes at
//! `debug`. Nothing is logged per byte or per packet.

use std::convert::Infallible;
use std::io;
use std::net::Shutdown as NetShutdown;
use std::task::Waker;

use mio::event::Event;
use pier_hybrid::{
    MAX_CONNECT_LINE, SEQPACKET_FLAGS_LEN, decode_seqpacket_message, ok_line, parse_connect,
    seqpacket_flags,
};
use pier_stack::wire::SocketType;
use pier_stack::{
    Error, InPlace, Instant, Interest, Payload, Shutdown, SocketHandle, Stack, VsockAddr,
};
use socket2::Socket;

use super::BridgeStats;
use super::sys::{recv, recv_into_iovecs, recv_parts, send_guest_bytes, send_parts, would_block};
use crate::host_side::RxLender;
use crate::queues::GuestPayload;

/// The Unix socket's type, which is also the vsock socket's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Stream,
    SeqPacket,
}

impl Kind {
    pub(crate) fn socket_type(self) -> SocketType {
        match self {
            Kind::Stream => SocketType::Stream,
            Kind::SeqPacket => SocketType::SeqPacket,
        }
    }

    pub(crate) fn unix_type(self) -> socket2::Type {
        match self {
            Kind::Stream => socket2::Type::STREAM,
            Kind::SeqPacket => socket2::Type::SEQPACKET,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Phase {
    /// A host program connected; its CONNECT line has not arrived in full.
    AwaitLine { deadline: Instant },
    /// The host stack is connecting to the guest.
    /// The host stack is connecting to the guest's `guest_port` (kept for
    /// the log: a refused socket no longer has a peer to ask for).
    Connecting { h: SocketHandle, guest_port: u32 },
    /// Data flows. Each direction ends once: `to_guest_done` when the host
    /// program's EOF has become our SHUTDOWN(SEND), `to_host_done` when the
    /// guest's EOF has become the Unix socket's `shutdown(Write)`.
    Relay { h: SocketHandle, to_guest_done: bool, to_host_done: bool },
}

impl Phase {
    pub(crate) fn handle(&self) -> Option<SocketHandle> {
        match *self {
            Phase::AwaitLine { .. } => None,
            Phase::Connecting { h, .. } | Phase::Relay { h, .. } => Some(h),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) sock: Socket,
    pub(crate) kind: Kind,
    pub(crate) phase: Phase,
    /// The Unix socket may have bytes or a message to read (or EOF/error).
    readable: bool,
    /// The Unix socket may take a write.
    writable: bool,
    /// The host program shut its write side (EPOLLRDHUP).
    read_closed: bool,
    /// The host program shut both sides or closed (EPOLLHUP): it will
    /// read nothing more.
    hung_up: bool,
    /// The host program reset the connection (its socket reported
    /// `ECONNRESET`: it closed with data unread). The guest's side is
    /// then aborted with an RST, not closed in order, so the guest does not
    /// take the end for an orderly one.
    pub(crate) reset_by_host: bool,
    /// Host → guest bytes wait in the Unix socket for the device to lend a
    /// receive buffer ([`Conn::lend_rx`]).
    pub(crate) awaiting_rx: bool,
    /// The send buffer the Unix socket gets once its program has drained
    /// it ([`BridgeConfig::stream_send_buffer`](super::BridgeConfig::stream_send_buffer));
    /// `None` once it has it, or for none.
    pub(crate) grow_send_buffer_to: Option<usize>,
}

/// What the bridge does with the connection after a pump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Keep,
    /// Close both sides; whatever caused it has been counted.
    Close,
}

/// What a pump needs besides the connection.
pub(crate) struct Ctx<'a> {
    pub(crate) stack: &'a mut Stack,
    pub(crate) now: Instant,
    pub(crate) scratch: &'a mut [u8],
    pub(crate) stats: &'a mut BridgeStats,
    pub(crate) waker: &'a Waker,
    pub(crate) guest_cid: u32,
    pub(crate) policy: &'a super::PortPolicy,
    /// The device lends receive buffers ([`RxLender`]): host → guest
    /// stream bytes wait in their Unix socket for one instead of entering
    /// the host stack.
    pub(crate) in_place: bool,
}

impl Ctx<'_> {
    fn park(&mut self, h: SocketHandle, interest: Interest) {
        let _ = self.stack.register_waker(h, interest, self.waker);
    }
}

impl Conn {
    pub(crate) fn new(sock: Socket, kind: Kind, phase: Phase) -> Self {
        // Optimistic: the first pump finds out, and EAGAIN clears them.
        Conn {
            sock,
            kind,
            phase,
            readable: true,
            writable: true,
            read_closed: false,
            hung_up: false,
            reset_by_host: false,
            awaiting_rx: false,
            grow_send_buffer_to: None,
        }
    }

    /// The host stack's socket whose received bytes this connection still
    /// writes to its host program: none before the relay, after the
    /// guest's EOF reached the Unix socket, or once the program hung up.
    pub(crate) fn guest_bytes_deliverable(&self) -> Option<SocketHandle> {
        match self.phase {
            Phase::Relay { h, to_host_done: false, .. } if !self.hung_up => Some(h),
            _ => None,
        }
    }

    /// Records a readiness edge from epoll. Returns whether the socket's
    /// send buffer grew: a write found it full, and this edge says the
    /// program has read most of it since (Unix reports room again only
    /// below a quarter full), so it is a reader the larger buffer serves.
    /// Best effort, as the kernel's cap is: a smaller buffer only costs
    /// the copy the setting's documentation describes.
    pub(crate) fn note_event(&mut self, event: &Event) -> bool {
        let error = event.is_error();
        let drained_after_a_stall = !self.writable && event.is_writable() && !error;
        self.readable |= event.is_readable() || event.is_read_closed() || error;
        self.writable |= event.is_writable() || event.is_write_closed() || error;
        self.read_closed |= event.is_read_closed();
        self.hung_up |= event.is_read_closed() && event.is_write_closed();
        let grow_to = if drained_after_a_stall { self.grow_send_buffer_to.take() } else { None };
        grow_to.is_some_and(|size| self.sock.set_send_buffer_size(size).is_ok())
    }

    /// Moves the connection as far as it can go now.
    pub(crate) fn pump(&mut self, ctx: &mut Ctx<'_>) -> Verdict {
        loop {
            let step = match self.phase {
                Phase::AwaitLine { .. } => self.read_line(ctx),
                Phase::Connecting { h, guest_port } => self.finish_connect(ctx, h, guest_port),
                Phase::Relay { .. } => return self.relay(ctx),
            };
            match step {
                Step::Advanced => continue,
                Step::Wait => return Verdict::Keep,
                Step::Close => return Verdict::Close,
            }
        }
    }

    /// `AwaitLine`: take the CONNECT line, if it is all there, and start
    /// connecting to the guest.
    fn read_line(&mut self, ctx: &mut Ctx<'_>) -> Step {
        if !self.readable {
            return Step::Wait;
        }
        let mut line = [0u8; MAX_CONNECT_LINE];
        let text_len = match self.kind {
            Kind::Stream => {
                // Peek, so that nothing past the newline is taken.
                let n = match recv(&self.sock, &mut line, libc::MSG_PEEK) {
                    Ok(n) => n,
                    Err(e) if would_block(&e) => {
                        self.readable = false;
                        return Step::Wait;
                    }
                    Err(_) => return fail(&mut ctx.stats.unix_errors),
                };
                match line[..n].iter().position(|&b| b == b'\n') {
                    Some(end) => {
                        if recv(&self.sock, &mut line[..=end], 0).ok() != Some(end + 1) {
                            return fail(&mut ctx.stats.unix_errors);
                        }
                        end
                    }
                    // EOF before a newline, or a line too long to be one.
                    None if n == 0 || n == MAX_CONNECT_LINE || self.read_closed => {
                        return fail(&mut ctx.stats.malformed_lines);
                    }
                    None => {
                        // The rest has not arrived; its arrival is a new edge.
                        self.readable = false;
                        return Step::Wait;
                    }
                }
            }
            Kind::SeqPacket => {
                // One message is the whole line; MSG_TRUNC reports its real size.
                let n = match recv(&self.sock, &mut line, libc::MSG_TRUNC) {
                    Ok(n) => n,
                    Err(e) if would_block(&e) => {
                        self.readable = false;
                        return Step::Wait;
                    }
                    Err(_) => return fail(&mut ctx.stats.unix_errors),
                };
                if n == 0 || n > MAX_CONNECT_LINE {
                    return fail(&mut ctx.stats.malformed_lines);
                }
                if line[n - 1] == b'\n' { n - 1 } else { n }
            }
        };
        let Ok(port) = parse_connect(&line[..text_len]) else {
            tracing::info!(
                line = %String::from_utf8_lossy(&line[..text_len]).escape_debug(),
                "host program sent a malformed CONNECT line: closing"
            );
            return fail(&mut ctx.stats.malformed_lines);
        };
        if !ctx.policy.to_guest.allows(port) {
            tracing::warn!(
                guest_cid = ctx.guest_cid,
                guest_port = port,
                "denied: a host program's CONNECT to guest port {port} (not an allowed guest port)"
            );
            return fail(&mut ctx.stats.denied);
        }
        let Ok(h) = ctx.stack.socket(self.kind.socket_type()) else {
            return fail(&mut ctx.stats.stack_errors);
        };
        if ctx.stack.connect(h, VsockAddr::new(ctx.guest_cid, port), ctx.now).is_err() {
            let _ = ctx.stack.close(h, ctx.now);
            return fail(&mut ctx.stats.stack_errors);
        }
        self.phase = Phase::Connecting { h, guest_port: port };
        Step::Advanced
    }

    /// `Connecting`: on RESPONSE write `OK <port>\n`; on RST or the stack's
    /// connect timeout, close without a word (as Firecracker does).
    fn finish_connect(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle, guest_port: u32) -> Step {
        match ctx.stack.finish_connect(h) {
            Ok(()) => {}
            Err(Error::WouldBlock) => {
                if self.hung_up {
                    return fail(&mut ctx.stats.abandoned);
                }
                ctx.park(h, Interest::Write);
                return Step::Wait;
            }
            Err(error) => {
                let counter = match error {
                    Error::ConnectionReset => {
                        tracing::info!(
                            guest_port,
                            "CONNECT {guest_port} refused by the guest (RST: nothing listens there)"
                        );
                        &mut ctx.stats.guest_refused
                    }
                    Error::TimedOut => {
                        tracing::info!(
                            guest_port,
                            "CONNECT {guest_port}: the guest did not answer in time"
                        );
                        &mut ctx.stats.guest_timeouts
                    }
                    other => {
                        tracing::info!(guest_port, "CONNECT {guest_port} failed: {other}");
                        &mut ctx.stats.stack_errors
                    }
                };
                return fail(counter);
            }
        }
        let port = ctx.stack.local_addr(h).map_or(0, |a| a.port);
        tracing::debug!(guest_port, host_port = port, "CONNECT {guest_port} accepted by the guest");
        let ok = ok_line(port);
        // A fresh socket's buffer is empty, so the line goes in one write;
        // anything else means the host program is gone.
        if send_parts(&self.sock, &[ok.as_bytes()]).ok() != Some(ok.len()) {
            return fail(&mut ctx.stats.abandoned);
        }
        ctx.stats.established += 1;
        self.phase = Phase::Relay { h, to_guest_done: false, to_host_done: false };
        // Bytes written after the line have been waiting in the socket.
        self.readable = true;
        Step::Advanced
    }

    /// The device lends receive buffers: a stream whose host → guest bytes
    /// wait for one reads them straight into it, as far as the buffers,
    /// the guest's credit and the Unix socket go.
    pub(crate) fn lend_rx(&mut self, ctx: &mut Ctx<'_>, rx: &mut dyn RxLender) -> Verdict {
        let Phase::Relay { h, to_guest_done: false, to_host_done } = self.phase else {
            self.awaiting_rx = false;
            return Verdict::Keep;
        };
        match self.stream_in_place(ctx, h, rx) {
            Err(Closed) => Verdict::Close,
            Ok(to_guest_done) => {
                self.phase = Phase::Relay { h, to_guest_done, to_host_done };
                if to_guest_done && to_host_done { Verdict::Close } else { Verdict::Keep }
            }
        }
    }

    /// `Relay`: both directions, each until it blocks or ends.
    fn relay(&mut self, ctx: &mut Ctx<'_>) -> Verdict {
        let Phase::Relay { h, mut to_guest_done, mut to_host_done } = self.phase else {
            unreachable!("relay outside the Relay phase");
        };
        let result = (|| {
            if self.hung_up && !to_host_done {
                // The host program can read nothing more: tell the guest
                // (its writes now fail with EPIPE) instead of waiting for
                // data to fail on.
                let _ = ctx.stack.shutdown(h, Shutdown::Read);
                to_host_done = true;
            }
            if !to_host_done {
                to_host_done = match self.kind {
                    Kind::Stream => self.stream_to_host(ctx, h)?,
                    Kind::SeqPacket => self.seqpacket_to_host(ctx, h)?,
                };
            }
            if !to_guest_done {
                to_guest_done = match self.kind {
                    Kind::Stream if ctx.in_place => self.await_rx(ctx, h)?,
                    Kind::Stream => self.stream_to_guest(ctx, h)?,
                    Kind::SeqPacket => self.seqpacket_to_guest(ctx, h)?,
                };
            }
            Ok::<(), Closed>(())
        })();
        self.phase = Phase::Relay { h, to_guest_done, to_host_done };
        match result {
            Err(Closed) => Verdict::Close,
            Ok(()) if to_guest_done && to_host_done => Verdict::Close,
            Ok(()) => Verdict::Keep,
        }
    }

    /// Guest → host, stream, on arrival: bytes the host stack offers before
    /// buffering them go into the Unix socket now, as far as it takes
    /// them. Anything it does not take (or any failure) stays with the
    /// stack, and [`Self::stream_to_host`] handles it as usual.
    ///
    /// Bytes left in guest memory are sent from there by address; a shared
    /// payload of any other kind is left to the stack.
    pub(crate) fn write_direct(&mut self, data: Payload<'_>) -> usize {
        let open = matches!(self.phase, Phase::Relay { to_host_done: false, .. });
        if self.kind != Kind::Stream || !open || !self.writable || self.hung_up {
            return 0;
        }
        let sent = if let Some(bytes) = data.as_bytes() {
            send_parts(&self.sock, &[bytes])
        } else if let Some((source, range)) = data.as_shared()
            && let Some(guest) = (source as &dyn std::any::Any).downcast_ref::<GuestPayload>()
        {
            send_guest_bytes(&self.sock, guest, range)
        } else {
            return 0;
        };
        match sent {
            Ok(n) => {
                if n < data.len() {
                    self.writable = false;
                }
                n
            }
            Err(e) => {
                if would_block(&e) {
                    self.writable = false;
                }
                0
            }
        }
    }

    /// Guest → host, stream: the stack's queued bytes go straight into the
    /// Unix socket. Returns whether this direction has finished.
    fn stream_to_host(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        while self.writable {
            let mut io_error = None;
            let mut full = false;
            let sock = &self.sock;
            let received = ctx.stack.recv_with(h, false, |a, b| {
                let n = send_parts(sock, &[a, b]).map_err(|e| io_error = Some(e))?;
                full = n < a.len() + b.len();
                Ok::<_, ()>(n)
            });
            match received {
                Ok(info) if info.eof => {
                    let _ = self.sock.shutdown(NetShutdown::Write);
                    return Ok(true);
                }
                Ok(info) => {
                    ctx.stats.bytes_from_guest += info.len as u64;
                    // A short write filled the socket's buffer: trying
                    // again would only fetch EAGAIN. Its draining below
                    // the mark raises a new writable edge.
                    if full {
                        self.writable = false;
                        ctx.stats.unix_stalls += 1;
                    }
                }
                Err(Error::WouldBlock) => {
                    ctx.park(h, Interest::Read);
                    return Ok(false);
                }
                Err(Error::Fault) => return self.unix_write_failed(ctx, h, io_error),
                Err(_) => return Err(closed(&mut ctx.stats.stack_errors)),
            }
        }
        Ok(false)
    }

    /// Guest → host, seqpacket: one vsock message becomes one Unix message,
    /// its flags byte first. The message is only consumed from the stack
    /// once the Unix socket took it, so `EAGAIN` loses nothing.
    fn seqpacket_to_host(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        while self.writable {
            // A zero-byte peek learns the message's size and EOR flag.
            let info = match ctx.stack.peek(h, &mut []) {
                Ok(info) if info.eof => {
                    let _ = self.sock.shutdown(NetShutdown::Write);
                    return Ok(true);
                }
                Ok(info) => info,
                Err(Error::WouldBlock) => {
                    ctx.park(h, Interest::Read);
                    return Ok(false);
                }
                Err(_) => return Err(closed(&mut ctx.stats.stack_errors)),
            };
            let flags = [seqpacket_flags(info.end_of_record)];
            let mut io_error = None;
            let sock = &self.sock;
            let sent = ctx.stack.recv_with(h, true, |a, b| {
                send_parts(sock, &[&flags, a, b]).map_err(|e| io_error = Some(e))
            });
            match sent {
                Ok(_) => {
                    let len = info.message_len;
                    let _ = ctx.stack.recv_with(h, false, |_, _| Ok::<_, Infallible>(len));
                    ctx.stats.messages_from_guest += 1;
                    ctx.stats.bytes_from_guest += len as u64;
                }
                Err(Error::Fault) => return self.unix_write_failed(ctx, h, io_error),
                Err(_) => return Err(closed(&mut ctx.stats.stack_errors)),
            }
        }
        Ok(false)
    }

    /// A write to the Unix socket failed: wait (`EAGAIN`), end this
    /// direction (`EPIPE`: the host program reads no more), or give up.
    fn unix_write_failed(
        &mut self,
        ctx: &mut Ctx<'_>,
        h: SocketHandle,
        error: Option<io::Error>,
    ) -> Result<bool, Closed> {
        let Some(error) = error else {
            return Err(closed(&mut ctx.stats.stack_errors));
        };
        if would_block(&error) {
            self.writable = false;
            ctx.stats.unix_stalls += 1;
            return Ok(false);
        }
        match error.raw_os_error() {
            Some(libc::EPIPE) => {
                // Like a peer's SHUT_RD: the guest's further writes fail with EPIPE.
                let _ = ctx.stack.shutdown(h, Shutdown::Read);
                Ok(true)
            }
            Some(libc::EMSGSIZE) => Err(closed(&mut ctx.stats.messages_too_large)),
            _ => Err(self.unix_error(ctx, &error)),
        }
    }

    /// A Unix socket error that ends the relay: counted, and remembered
    /// as a reset when it is one.
    fn unix_error(&mut self, ctx: &mut Ctx<'_>, error: &io::Error) -> Closed {
        if error.raw_os_error() == Some(libc::ECONNRESET) {
            self.reset_by_host = true;
            tracing::info!("host program reset its connection: resetting the guest's side");
        } else {
            tracing::info!("host connection failed: {error}");
        }
        closed(&mut ctx.stats.unix_errors)
    }

    /// Host → guest, stream: read from the Unix socket exactly what the
    /// stack's credit lets it take, and hand it over. Bytes beyond the
    /// credit stay in the Unix socket, so backpressure reaches the host
    /// program's `write`.
    fn stream_to_guest(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        while self.readable {
            // Read straight into the stack's send buffer, exactly as much as
            // the guest's credit allows.
            let mut io_error = None;
            let mut drained = false;
            let sock = &self.sock;
            let sent = ctx.stack.send_with(h, |a, b| {
                let offered = a.len() + b.len();
                let n = recv_parts(sock, a, b).map_err(|e| io_error = Some(e))?;
                drained = n < offered;
                Ok::<_, ()>(n)
            });
            match sent {
                Ok(0) => return Ok(self.host_eof(ctx, h)),
                Ok(n) => {
                    ctx.stats.bytes_to_guest += n as u64;
                    // A short read took everything queued: reading again
                    // would only fetch EAGAIN, and every later write
                    // raises a new readable edge. Not so once the host
                    // program shut its side: its EOF raises no new edge
                    // and must still be read.
                    if drained && !self.read_closed {
                        self.readable = false;
                        break;
                    }
                }
                Err(error) => match self.send_failed(ctx, h, error, io_error)? {
                    Some(done) => return Ok(done),
                    None => break,
                },
            }
        }
        self.probe_guest_reading(ctx, h)
    }

    /// Host → guest, stream, while the device lends receive buffers: the
    /// bytes wait in the Unix socket until [`Self::lend_rx`] reads them
    /// straight into one, so they skip the host stack's send buffer. The
    /// guest's state is still probed now, and the read waker parked, so a
    /// guest that stops reading is passed on without waiting for a buffer.
    fn await_rx(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        let done = self.probe_guest_reading(ctx, h)?;
        self.awaiting_rx = self.readable && !done;
        Ok(done)
    }

    /// The loop of [`Self::stream_to_guest`], reading into the receive
    /// buffers the device lends instead of the host stack's send buffer
    /// ([`Stack::send_in_place`] counts the bytes and makes the header).
    /// Falls back to the host stack when bytes are queued there (they go
    /// first) or the device stops lending. Returns whether this direction
    /// has finished.
    fn stream_in_place(
        &mut self,
        ctx: &mut Ctx<'_>,
        h: SocketHandle,
        rx: &mut dyn RxLender,
    ) -> Result<bool, Closed> {
        while self.readable {
            let mut io_error = None;
            let mut offered = 0;
            let mut outcome = None;
            let (sock, stack) = (&self.sock, &mut *ctx.stack);
            let lent = rx.fill(&mut |payload| {
                let sent = stack.send_in_place(h, payload.capacity(), |limit| {
                    offered = limit;
                    payload.read_with(limit, |iovecs| {
                        // SAFETY: `read_with` hands out iovecs over mapped,
                        // writable guest memory that no reference covers,
                        // valid until this closure returns.
                        unsafe { recv_into_iovecs(sock, iovecs) }.map_err(|e| io_error = Some(e))
                    })
                });
                let header = match sent {
                    Ok(InPlace::Packet(header)) => Some(header),
                    _ => None,
                };
                outcome = Some(sent);
                header
            });
            let Some(outcome) = outcome else {
                if lent || rx.lends() {
                    // No buffer now: the driver's next one brings another call.
                    return Ok(false);
                }
                self.awaiting_rx = false;
                return self.stream_to_guest(ctx, h);
            };
            match outcome {
                Ok(InPlace::Packet(header)) => {
                    ctx.stats.bytes_to_guest += u64::from(header.len);
                    // A short read took everything queued (see stream_to_guest).
                    if (header.len as usize) < offered && !self.read_closed {
                        self.readable = false;
                    }
                }
                Ok(InPlace::Queued) => {
                    self.awaiting_rx = false;
                    return self.stream_to_guest(ctx, h);
                }
                Ok(InPlace::Empty) => {
                    self.awaiting_rx = false;
                    return Ok(self.host_eof(ctx, h));
                }
                Err(error) => {
                    if let Some(done) = self.send_failed(ctx, h, error, io_error)? {
                        self.awaiting_rx = false;
                        return Ok(done);
                    }
                }
            }
        }
        self.awaiting_rx = false;
        self.probe_guest_reading(ctx, h)
    }

    /// A host → guest stream send failed: out of credit (the rest waits
    /// in the Unix socket until the guest's credit update wakes us), the
    /// Unix socket drained (`None`: probe the guest and wait for the next
    /// readable edge), the guest stopped reading, or a failure that ends
    /// the relay. `Some(done)` ends this pump of the direction.
    fn send_failed(
        &mut self,
        ctx: &mut Ctx<'_>,
        h: SocketHandle,
        error: Error,
        io_error: Option<io::Error>,
    ) -> Result<Option<bool>, Closed> {
        match error {
            Error::WouldBlock => {
                ctx.stats.credit_stalls += 1;
                ctx.park(h, Interest::Write);
                Ok(Some(false))
            }
            Error::Fault => match io_error {
                Some(e) if would_block(&e) => {
                    self.readable = false;
                    Ok(None)
                }
                Some(e) => Err(self.unix_error(ctx, &e)),
                None => Err(closed(&mut ctx.stats.unix_errors)),
            },
            Error::BrokenPipe => Ok(Some(self.guest_stopped_reading())),
            _ => Err(closed(&mut ctx.stats.stack_errors)),
        }
    }

    /// Host → guest, seqpacket: one Unix message (flags byte first) becomes
    /// one vsock message, consumed from the Unix socket only once the stack
    /// took it whole.
    fn seqpacket_to_guest(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        while self.readable {
            let len = match recv(&self.sock, ctx.scratch, libc::MSG_PEEK | libc::MSG_TRUNC) {
                // A framed message is never empty, so 0 is end-of-file.
                Ok(0) => return Ok(self.host_eof(ctx, h)),
                Ok(n) => n,
                Err(e) if would_block(&e) => {
                    self.readable = false;
                    break;
                }
                Err(e) => return Err(self.unix_error(ctx, &e)),
            };
            if len > ctx.scratch.len() {
                return Err(closed(&mut ctx.stats.messages_too_large));
            }
            let Ok((eor, payload)) = decode_seqpacket_message(&ctx.scratch[..len]) else {
                return Err(closed(&mut ctx.stats.bad_frames));
            };
            match ctx.stack.send_message(h, payload, eor) {
                Ok(()) => {}
                Err(Error::WouldBlock) => {
                    ctx.stats.credit_stalls += 1;
                    ctx.park(h, Interest::Write);
                    return Ok(false);
                }
                Err(Error::BrokenPipe) => return Ok(self.guest_stopped_reading()),
                Err(Error::MessageTooLarge) => {
                    return Err(closed(&mut ctx.stats.messages_too_large));
                }
                Err(_) => return Err(closed(&mut ctx.stats.stack_errors)),
            }
            if recv(&self.sock, &mut [], libc::MSG_TRUNC).is_err() {
                return Err(closed(&mut ctx.stats.unix_errors));
            }
            ctx.stats.messages_to_guest += 1;
            ctx.stats.bytes_to_guest += (len - SEQPACKET_FLAGS_LEN) as u64;
        }
        self.probe_guest_reading(ctx, h)
    }

    /// The host program has nothing to send right now; find out whether
    /// the guest would still read it. A zero-byte send does every check a
    /// real one does and queues nothing, so a guest that shut its read side,
    /// closed or reset is passed on now, not at the host program's next
    /// write. The read waker stays parked meanwhile: the stack wakes it for
    /// those changes even after the guest's EOF, when nothing else would.
    fn probe_guest_reading(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> Result<bool, Closed> {
        match ctx.stack.send(h, &[]) {
            Ok(_) | Err(Error::WouldBlock) => {
                ctx.park(h, Interest::Read);
                Ok(false)
            }
            Err(Error::BrokenPipe) => Ok(self.guest_stopped_reading()),
            Err(_) => Err(closed(&mut ctx.stats.stack_errors)),
        }
    }

    /// The host program's EOF: the guest hears SHUTDOWN(SEND) once the
    /// bytes before it have gone out. Returns `true`: the direction is done.
    fn host_eof(&mut self, ctx: &mut Ctx<'_>, h: SocketHandle) -> bool {
        let _ = ctx.stack.shutdown(h, Shutdown::Write);
        true
    }

    /// The guest shut its read side (or the connection ended): the host
    /// program's further writes fail with EPIPE, as they would against a
    /// peer's SHUT_RD. Returns `true`: the direction is done.
    fn guest_stopped_reading(&mut self) -> bool {
        let _ = self.sock.shutdown(NetShutdown::Read);
        true
    }
}

/// How a phase ended.
enum Step {
    Advanced,
    Wait,
    Close,
}

/// The connection must close; the cause has been counted.
struct Closed;

/// Counts a failure that ends the connection during setup.
fn fail(counter: &mut u64) -> Step {
    *counter += 1;
    Step::Close
}

/// Counts a failure that ends an established connection.
fn closed(counter: &mut u64) -> Closed {
    *counter += 1;
    Closed
}
