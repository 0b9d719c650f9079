//! The hybrid vsock bridge: host programs reach the guest through Unix
//! sockets, with Firecracker's protocol.
//!
//! A host program that wants to talk to a guest over vsock usually has no
//! `AF_VSOCK` to use: the guest's device is emulated by the VMM (or by the
//! Wasm shim), not by the host kernel. Firecracker solved this with a
//! *hybrid* socket: the VMM listens on a Unix socket, a host program
//! connects and names a guest port in one line of text, and from then on
//! the Unix connection *is* the vsock connection. Existing tooling speaks
//! that protocol, so pier speaks it too. This module is the whole host side
//! of it.
//!
//! # Where it sits
//!
//! ```text
//!  guest ══ virtqueues ══ device ── host Stack (CID 2) ── Bridge ── Unix sockets ── host programs
//!                            │                                  ▲
//!                            └──────── datagrams ───────────────┘
//! ```
//!
//! The device's host endpoint is an ordinary [`pier_stack::Stack`] at CID 2,
//! owned by the caller and lent to every call here as `&mut Stack`. The
//! bridge only opens, accepts, reads, writes and closes sockets on that
//! stack, the same calls any application makes, so credit, RST rules,
//! timers, half-close and seqpacket all come from the one protocol core the
//! guest runs too. What the bridge adds is the mapping to Unix sockets:
//!
//! | host path | type | direction |
//! |---|---|---|
//! | `<uds>` | `SOCK_STREAM` listener | host → guest stream: `CONNECT <port>\n`, `OK <port>\n` |
//! | `<uds>_seqpacket` | `SOCK_SEQPACKET` listener | host → guest seqpacket: the same exchange, one message each |
//! | `<uds>_<port>` | bound by a host program | guest → host, stream or seqpacket, to host port `<port>` |
//! | `<uds>_dgram` | `SOCK_DGRAM`, bound by the bridge | host → guest datagrams, 8-byte header first |
//! | `<uds>_dgram_<port>` | `SOCK_DGRAM`, bound by a host program | guest → host datagrams to host port `<port>` |
//!
//! `docs/host-sockets.md` describes these for users, with every framing;
//! the names, the lines and the framings themselves are `pier_hybrid`'s,
//! which pier-client builds on too.
//!
//! # Why it is built this way
//!
//! - **One thread, the caller's.** The bridge owns no thread, no clock and
//!   no poller. It registers its file descriptors with the caller's
//!   [`mio::Registry`] and is driven by four calls, in the spirit of
//!   quinn-proto and smoltcp: [`Bridge::handle_event`] for epoll events on
//!   its tokens, [`Bridge::service`] after the stack took packets or fired
//!   timers, [`Bridge::poll_at`] for its next deadline, and the datagram
//!   pair [`Bridge::forward_guest_datagram`] / [`Bridge::drain_host_datagrams`].
//!   It implements [`HostSide`](crate::host_side::HostSide) with them,
//!   which is how the device loop drives it; a test's loop drives it the
//!   same way by hand.
//! - **Nothing blocks.** Every socket is non-blocking; a Unix `connect` to
//!   `<uds>_<port>` completes or fails at once (no handshake), so even the
//!   guest → host path decides inside one call. A slow or stuck host
//!   program costs its own connection's progress and nothing else.
//! - **No buffers of its own.** Unsent bytes stay in the Unix socket's
//!   kernel buffer or in the stack's socket buffer, where they already are
//!   and already bounded; the bridge has one scratch buffer for everybody.
//!   Backpressure therefore runs end to end: a guest that stops reading
//!   stops the host program's `write`. See `conn.rs` for how.
//! - **Every refusal is visible.** A host program only ever sees its socket
//!   closed (that is the protocol), so the bridge counts each reason in
//!   [`BridgeStats`].
//! - **Bounded.** At most [`BridgeConfig::max_connections`] connections; a
//!   CONNECT line is at most
//!   [`MAX_CONNECT_LINE`](pier_hybrid::MAX_CONNECT_LINE) bytes and must
//!   arrive within [`BridgeConfig::connect_line_timeout`]; the guest must
//!   answer within the stack's connect timeout. Nothing queues without a
//!   bound.
//!
//! # Better than the other implementations
//!
//! Firecracker, Cloud Hypervisor and vhost-device-vsock share this
//! protocol; pier fixes what they get wrong: a CONNECT line may arrive in
//! any number of writes, bytes written right after it are kept, half-close
//! is propagated both ways (`shutdown(Write)` on either side reaches the
//! other as EOF while the other direction keeps flowing), seqpacket has a
//! host side (with record boundaries intact), and datagrams have one too.
//!
//! # Tokens
//!
//! The bridge uses the mio tokens `first_token ..
//! first_token + RESERVED_TOKENS + 2 * max_connections` (see
//! [`Bridge::token_range`]); pass every event whose token falls in that
//! range to [`Bridge::handle_event`], then call [`Bridge::events_handled`].
//! Connections take twice the tokens they can hold because a closed
//! connection's token rests until that call: one `epoll_wait` may return
//! events for a socket that was closed after the kernel collected them
//! (by an earlier event of the same batch, or by a round another thread
//! ran while the poll was under way), and those must not reach a new
//! connection that took its token (a stale hang-up would cut it off).

mod conn;
mod datagram;
mod held_datagram;
pub mod policy;
mod sys;
mod wake;

use std::collections::HashMap;
use std::io;
use std::mem;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest as MioInterest, Registry, Token};
use pier_stack::wire::SocketType;
use pier_stack::{Error, Instant, Interest, SocketHandle, Stack, VsockAddr};

use crate::cid::GuestCid;
use socket2::{SockAddr, Socket};

use conn::{Conn, Ctx, Kind, Phase, Verdict};
use sys::{OwnedSocketFile, Paths, claim_socket_path, unix_socket, would_block};
use wake::{KeyWaker, WakeQueue};

pub use policy::{PortPolicy, Ports};
pub use sys::peer_credentials;

/// Tokens before the first connection's: stream listener, seqpacket
/// listener, datagram socket.
pub const RESERVED_TOKENS: usize = 3;

const STREAM_LISTENER: usize = 0;
const SEQPACKET_LISTENER: usize = 1;
const DATAGRAM_SOCKET: usize = 2;
/// Wake key of the host stack's catch-all listeners.
const LISTENER_KEY: usize = usize::MAX;
/// How long the bridge waits before accepting again after `accept`
/// failed (EMFILE: the process is out of file descriptors). The listener
/// is edge-triggered, so no new event says when a descriptor is free;
/// retrying on every device round instead would run one failing `accept`
/// per round while other connections are busy, and never while all is
/// idle. A connection the bridge closes frees a descriptor, so that
/// retries at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Settings of one bridge; [`BridgeConfig::new`] gives Firecracker's values.
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    /// `<uds>`: the stream listener's path, and the base of every other name.
    pub uds_path: PathBuf,
    /// The guest's CID: where host connections and datagrams go, and the
    /// only CID whose connections and datagrams are bridged to the host.
    pub guest_cid: GuestCid,
    /// Most connections open at once, in both directions together
    /// (Firecracker allows 1023). Beyond it a host program's connection is
    /// closed at once and a guest's is refused with RST.
    pub max_connections: usize,
    /// Most of those the guest may open to host programs
    /// (`max_connections` bounds it too). The rest of the table stays for
    /// host programs, so a guest (or a component) that connects without
    /// end cannot lock every host program out; past it the guest's
    /// connection is refused with RST.
    pub max_guest_connections: usize,
    /// How long a host program has to send its whole CONNECT line.
    pub connect_line_timeout: Duration,
    /// Most host connections waiting for their CONNECT line before they
    /// must make room, shared fairly between the local users that made
    /// them (the peer uid the kernel records, `SO_PEERCRED`). Past this
    /// budget (or at `max_connections`), a new connection makes room in
    /// one of two ways:
    ///
    /// - if another user holds more waiting connections than its equal
    ///   share of the budget, and more than the newcomer's user, that
    ///   user's longest-waiting connection is closed, however young: one
    ///   user cycling connections faster than the grace cannot keep other
    ///   users out;
    /// - otherwise the connection that has waited longest is closed, if
    ///   it has waited at least `line_grace`: a real client sends its line
    ///   at once, so a connection silent that long is the likeliest to be
    ///   idle, while a burst of real clients that are merely slow to write
    ///   (all younger than the grace) is not cut.
    pub max_pending_lines: usize,
    /// How long a connection may wait for its CONNECT line before a new
    /// connection may take its place (see `max_pending_lines`).
    pub line_grace: Duration,
    /// Backlog of the two Unix listeners: Linux's default somaxconn, so a
    /// burst of host programs queues in the kernel instead of failing.
    pub unix_backlog: i32,
    /// Backlog of the host stack's catch-all listeners: guest connections
    /// the bridge has not accepted yet (it accepts them within one
    /// `service` call, so this only has to cover one batch).
    pub guest_backlog: usize,
    /// Largest datagram payload sent to the guest; larger ones are dropped
    /// and counted. At most 64 KiB (one vsock packet); lower it when the
    /// guest posts smaller receive buffers.
    pub max_datagram_payload: usize,
    /// Which ports each side may reach (every port by default).
    pub policy: PortPolicy,
    /// The send buffer (`SO_SNDBUF`) a bridged stream's Unix socket grows
    /// to once its host program has shown that it reads: the first time
    /// the socket, having filled, has room again. Until then it has the
    /// kernel's default (`net.core.wmem_default`, 208 KiB on most
    /// systems); `None` keeps that default for good.
    ///
    /// Guest bytes that arrive while the socket has room go from guest
    /// memory straight into it; once it is full they are copied into the
    /// host stack's receive buffer and written later by the device loop,
    /// when the kernel reports room again: a copy and a wakeup more. The
    /// guest may have a whole credit window in flight (its buffer, 256 KiB
    /// by default, up to the host stack's, which grows to 1 MiB while the
    /// program keeps up), so a socket smaller than that window fills while
    /// its reader keeps up. The default asks for half the largest window,
    /// which the kernel doubles (its count includes each buffer's
    /// bookkeeping): 1 MiB. The kernel caps the request at
    /// `net.core.wmem_max` (doubled, 416 KiB by default). The cost is
    /// memory, and the growth rule is why it is paid only for programs
    /// that read, as the host stack's receive buffer grows only while its
    /// reader keeps up: a program that never reads holds the default in
    /// the kernel for each connection; one that read and then stopped, up
    /// to this size (charged to this process), on top of the host stack's
    /// buffer.
    pub stream_send_buffer: Option<usize>,
}

impl BridgeConfig {
    pub fn new(uds_path: impl Into<PathBuf>, guest_cid: GuestCid) -> Self {
        Self {
            uds_path: uds_path.into(),
            guest_cid,
            max_connections: 1024,
            max_guest_connections: 768,
            connect_line_timeout: Duration::from_secs(2),
            max_pending_lines: 128,
            line_grace: Duration::from_millis(500),
            unix_backlog: 4096,
            guest_backlog: 128,
            max_datagram_payload: pier_stack::wire::MAX_PAYLOAD,
            policy: PortPolicy::default(),
            stream_send_buffer: Some(pier_stack::DEFAULT_BUFFER_AUTOTUNE_MAX as usize / 2),
        }
    }
}

pub use crate::host_side::BridgeStats;

/// One connection slot: the connection, and the waker the stack uses to
/// point at it.
#[derive(Debug)]
struct Slot {
    conn: Option<Conn>,
    /// Who opened the connection: the budget it counts against.
    origin: Origin,
    notify: Arc<KeyWaker>,
    waker: Waker,
}

/// Which side opened a bridged connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A host program, with its effective uid (`None` if the kernel had
    /// no credentials for it, a budget of its own).
    Host {
        uid: Option<u32>,
    },
    Guest,
}

/// The hybrid vsock bridge; see the [module documentation](self).
#[derive(Debug)]
pub struct Bridge {
    config: BridgeConfig,
    paths: Paths,
    registry: Registry,
    first_token: usize,
    stream_listener: Socket,
    seqpacket_listener: Socket,
    /// `<uds>_dgram`: host → guest datagrams arrive here, guest → host
    /// datagrams are sent from here.
    dgram: Socket,
    /// `dgram` may have a datagram queued.
    dgram_readable: bool,
    /// The host datagram taken off `dgram` and not yet given to the guest.
    held_dgram: held_datagram::HeldDatagram,
    /// Socket files the bridge created, removed again on drop (if still
    /// theirs).
    created: Vec<OwnedSocketFile>,
    /// The host stack's catch-all listeners (stream, seqpacket).
    catch_all: [Option<SocketHandle>; 2],
    listener_notify: Arc<KeyWaker>,
    listener_waker: Waker,
    /// A Unix `accept` failed with something other than EAGAIN (EMFILE):
    /// when to accept again (see [`ACCEPT_BACKOFF`]), as no new edge may
    /// come.
    accept_retry: Option<Instant>,
    /// The last `accept` failed: its error was logged, the next ones are
    /// only counted until one succeeds.
    accept_failing: bool,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Slots closed since the last [`Bridge::service`]: events of the
    /// batch that closed them may still be on their way to
    /// [`Bridge::handle_event`], so they join `free` only once the batch is
    /// over (see the module's Tokens section).
    resting: Vec<usize>,
    /// The slot of each connection that has a host stack socket, for the
    /// direct path (guest bytes written to the Unix socket on arrival).
    by_handle: HashMap<SocketHandle, usize>,
    /// Slots in `AwaitLine`, the only phase with a bridge deadline.
    awaiting_line: Vec<usize>,
    /// How many of `awaiting_line` each host user holds (see
    /// [`BridgeConfig::max_pending_lines`]).
    awaiting_line_by_uid: HashMap<Option<u32>, usize>,
    /// Open connections the guest made (see
    /// [`BridgeConfig::max_guest_connections`]).
    guest_active: usize,
    wakes: Arc<WakeQueue>,
    woken: Vec<usize>,
    /// One buffer for every peek: the largest seqpacket message plus its
    /// flags byte plus one (to tell "too large" from "fits").
    scratch: Vec<u8>,
    stats: BridgeStats,
    /// Slots whose host → guest bytes wait for a receive buffer the device
    /// lends ([`Relay::lend_rx`](crate::host_side::Relay::lend_rx)).
    awaiting_rx: Vec<usize>,
    /// The device lent receive buffers at its last call: streams leave
    /// their bytes in the Unix socket for the next one.
    rx_lent: bool,
}

impl Bridge {
    /// Binds `<uds>`, `<uds>_seqpacket` and `<uds>_dgram` (removing stale
    /// socket files first), registers them with `registry` under
    /// `first_token ..`, and makes the bridge the host stack's catch-all
    /// listener for stream and seqpacket.
    pub fn new(
        config: BridgeConfig,
        stack: &mut Stack,
        registry: &Registry,
        first_token: usize,
    ) -> io::Result<Self> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
        if config.max_connections == 0 {
            return Err(invalid("max_connections must be at least 1"));
        }
        if config.max_guest_connections == 0 {
            return Err(invalid("max_guest_connections must be at least 1"));
        }
        if config.max_pending_lines == 0 {
            return Err(invalid("max_pending_lines must be at least 1"));
        }
        let tokens =
            config.max_connections.checked_mul(2).and_then(|t| t.checked_add(RESERVED_TOKENS));
        if tokens.and_then(|t| first_token.checked_add(t)).is_none() {
            return Err(invalid("the token range overflows"));
        }
        let paths = Paths::new(config.uds_path.clone())?;
        let registry = registry.try_clone()?;
        let mut created = Vec::new();
        let result = (|| {
            let stream_listener =
                listen(paths.stream_listener().into(), Kind::Stream, &config, &mut created)?;
            let seqpacket_listener =
                listen(paths.seqpacket_listener(), Kind::SeqPacket, &config, &mut created)?;
            let dgram_path = paths.datagram_socket();
            claim_socket_path(&dgram_path, socket2::Type::DGRAM)?;
            let dgram = unix_socket(socket2::Type::DGRAM)?;
            dgram.bind(&SockAddr::unix(&dgram_path)?)?;
            created.push(OwnedSocketFile::new(dgram_path));
            for (sock, index, interest) in [
                (&stream_listener, STREAM_LISTENER, MioInterest::READABLE),
                (&seqpacket_listener, SEQPACKET_LISTENER, MioInterest::READABLE),
                (&dgram, DATAGRAM_SOCKET, MioInterest::READABLE),
            ] {
                registry.register(
                    &mut SourceFd(&sock.as_raw_fd()),
                    Token(first_token + index),
                    interest,
                )?;
            }
            Ok::<_, io::Error>((stream_listener, seqpacket_listener, dgram))
        })();
        let (stream_listener, seqpacket_listener, dgram) = match result {
            Ok(sockets) => sockets,
            Err(e) => {
                for file in &created {
                    file.remove();
                }
                return Err(e);
            }
        };

        // The largest seqpacket message the stack can carry, its flags
        // byte, and one more byte to see that a message is too large; at
        // least a whole datagram with its header.
        let max_message = stack.config().max_buffer_size as usize;
        let scratch_len = (max_message + pier_hybrid::SEQPACKET_FLAGS_LEN + 1)
            .max(pier_hybrid::DATAGRAM_HEADER_LEN + pier_stack::wire::MAX_PAYLOAD + 1);

        let wakes = Arc::new(WakeQueue::default());
        let (listener_notify, listener_waker) = KeyWaker::new(&wakes, LISTENER_KEY);
        let guest_backlog = config.guest_backlog;
        // From here on, dropping `bridge` on an error removes the socket files.
        let mut bridge = Self {
            config,
            paths,
            registry,
            first_token,
            stream_listener,
            seqpacket_listener,
            dgram,
            dgram_readable: true,
            held_dgram: Default::default(),
            created,
            catch_all: [None, None],
            listener_notify,
            listener_waker,
            accept_retry: None,
            accept_failing: false,
            slots: Vec::new(),
            free: Vec::new(),
            resting: Vec::new(),
            by_handle: HashMap::new(),
            awaiting_line: Vec::new(),
            awaiting_line_by_uid: HashMap::new(),
            guest_active: 0,
            wakes,
            woken: Vec::new(),
            scratch: vec![0; scratch_len],
            stats: BridgeStats::default(),
            awaiting_rx: Vec::new(),
            rx_lent: false,
        };
        for (slot, ty) in [SocketType::Stream, SocketType::SeqPacket].into_iter().enumerate() {
            let h = match stack.socket(ty) {
                Ok(h) => h,
                // A transport without seqpacket: the stack itself answers
                // the guest's seqpacket connects with RST.
                Err(Error::SocketTypeNotSupported) => continue,
                Err(e) => {
                    bridge.shutdown(stack, Instant::ZERO);
                    return Err(io::Error::other(format!("host stack: {e}")));
                }
            };
            if let Err(e) = stack.listen_catch_all(h, guest_backlog) {
                let _ = stack.close(h, Instant::ZERO);
                bridge.shutdown(stack, Instant::ZERO);
                return Err(io::Error::other(format!("host stack catch-all listener: {e}")));
            }
            let _ = stack.register_waker(h, Interest::Read, &bridge.listener_waker);
            bridge.catch_all[slot] = Some(h);
        }
        Ok(bridge)
    }

    /// Addresses the guest at `cid` from now on: host programs' CONNECTs
    /// and datagrams go there, and only that CID's connections and
    /// datagrams are bridged. The host stack's transport reset, which comes
    /// with a CID change, ends the connections to the old one.
    pub fn set_guest_cid(&mut self, cid: GuestCid) {
        self.config.guest_cid = cid;
    }

    pub fn config(&self) -> &BridgeConfig {
        &self.config
    }

    pub fn stats(&self) -> BridgeStats {
        self.stats
    }

    /// The mio tokens the bridge registers with; events for them go to
    /// [`Bridge::handle_event`].
    pub fn token_range(&self) -> Range<usize> {
        self.first_token..self.first_token + RESERVED_TOKENS + 2 * self.config.max_connections
    }

    /// Reacts to an epoll event on one of the bridge's tokens: accepts host
    /// programs, reads CONNECT lines, moves data. Events for other tokens
    /// are ignored.
    pub fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        let token = event.token().0;
        if !self.token_range().contains(&token) {
            return;
        }
        match token - self.first_token {
            STREAM_LISTENER => self.accept_host(stack, Kind::Stream, now),
            SEQPACKET_LISTENER => self.accept_host(stack, Kind::SeqPacket, now),
            DATAGRAM_SOCKET => self.dgram_readable = true,
            index => {
                let slot = index - RESERVED_TOKENS;
                if let Some(conn) = self.slots.get_mut(slot).and_then(|s| s.conn.as_mut()) {
                    if conn.note_event(event) {
                        self.stats.send_buffers_grown += 1;
                    }
                    self.pump(stack, slot, now);
                }
            }
        }
    }

    /// Call after the stack took packets or fired timers, and after waking
    /// the wakers it returned: accepts guest connections, finishes host
    /// connects, moves data the stack's credit or queue now allows, and
    /// closes connections whose CONNECT line is overdue.
    pub fn service(&mut self, stack: &mut Stack, now: Instant) {
        self.expire_lines(stack, now);
        let mut woken = mem::take(&mut self.woken);
        self.wakes.take(&mut woken);
        for &key in &woken {
            if key == LISTENER_KEY {
                self.listener_notify.clear();
                self.accept_guests(stack, now);
            } else if let Some(slot) = self.slots.get(key) {
                slot.notify.clear();
                self.pump(stack, key, now);
            }
        }
        woken.clear();
        self.woken = woken;
        if self.accept_retry.is_some_and(|at| at <= now) {
            self.accept_retry = None;
            self.accept_host(stack, Kind::Stream, now);
            self.accept_host(stack, Kind::SeqPacket, now);
        }
    }

    /// Call once every event of a poll's batch has been passed to
    /// [`Bridge::handle_event`], on the thread that polled: the tokens of
    /// connections closed since the last call may then go to new ones.
    /// Until then a closed connection's token rests, because the batch may
    /// still hold its events (see [Tokens](self#tokens)); `service` does
    /// not free them, as it may run on another thread while the poll that
    /// collects those events is under way.
    pub fn events_handled(&mut self) {
        self.free.append(&mut self.resting);
    }

    /// The bridge's next deadline (a CONNECT line falling due), if any:
    /// call [`Bridge::service`] at or after it. The stack's own deadlines
    /// (connect and close timers) are in `Stack::poll_at`.
    pub fn poll_at(&self) -> Option<Instant> {
        self.awaiting_line
            .iter()
            .filter_map(|&slot| match self.slots[slot].conn.as_ref()?.phase {
                Phase::AwaitLine { deadline } => Some(deadline),
                _ => None,
            })
            .chain(self.accept_retry)
            .min()
    }

    /// Guest bytes the host stack holds for host programs that can still
    /// read them (a connection whose program hung up or reset gets none):
    /// what a stopping device delivers before the bridge closes their
    /// sockets.
    pub fn undelivered_guest_bytes(&self, stack: &Stack) -> usize {
        self.slots
            .iter()
            .filter_map(|slot| slot.conn.as_ref()?.guest_bytes_deliverable())
            .map(|h| stack.recv_queued(h).unwrap_or(0))
            .sum()
    }

    /// Connections open now.
    pub fn connection_count(&self) -> usize {
        self.stats.active
    }

    /// Closes every connection (the stack closes its side in the
    /// background) and the catch-all listeners. The Unix listeners stay
    /// until the bridge is dropped.
    pub fn shutdown(&mut self, stack: &mut Stack, now: Instant) {
        for slot in 0..self.slots.len() {
            self.close_slot(stack, slot, now);
        }
        for h in self.catch_all.iter_mut().filter_map(Option::take) {
            let _ = stack.close(h, now);
        }
    }

    // ----- connections --------------------------------------------------

    fn accept_host(&mut self, stack: &mut Stack, kind: Kind, now: Instant) {
        loop {
            let listener = match kind {
                Kind::Stream => &self.stream_listener,
                Kind::SeqPacket => &self.seqpacket_listener,
            };
            let sock = match listener.accept() {
                Ok((sock, _)) => sock,
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.stats.accept_errors += 1;
                    // Said once per run of failures, not once per retry.
                    if !mem::replace(&mut self.accept_failing, true) {
                        tracing::warn!(
                            "accepting a host connection failed: {e}; retrying every {} ms",
                            ACCEPT_BACKOFF.as_millis()
                        );
                    }
                    self.accept_retry = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            };
            if mem::take(&mut self.accept_failing) {
                tracing::info!("accepting host connections again");
            }
            self.stats.host_connections += 1;
            tracing::debug!(?kind, "host program connected");
            if sock.set_nonblocking(true).is_err() {
                self.stats.accept_errors += 1;
                continue;
            }
            let uid = peer_credentials(&sock).ok().map(|(uid, _)| uid);
            if self.awaiting_line.len() >= self.config.max_pending_lines
                || self.stats.active >= self.config.max_connections
            {
                self.make_room_for_line(stack, uid, now);
            }
            let deadline = now + self.config.connect_line_timeout;
            let origin = Origin::Host { uid };
            if let Some(slot) = self.adopt(sock, kind, Phase::AwaitLine { deadline }, origin) {
                self.awaiting_line.push(slot);
                *self.awaiting_line_by_uid.entry(uid).or_default() += 1;
                self.pump(stack, slot, now);
            }
        }
    }

    fn accept_guests(&mut self, stack: &mut Stack, now: Instant) {
        for listener in self.catch_all.into_iter().flatten() {
            loop {
                match stack.accept(listener) {
                    Ok((h, peer)) => self.bridge_guest(stack, h, peer, now),
                    Err(Error::WouldBlock) => {
                        let _ =
                            stack.register_waker(listener, Interest::Read, &self.listener_waker);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// A guest connection to host port P: connect to `<uds>_P` now, and
    /// answer the guest with RESPONSE or RST accordingly.
    fn bridge_guest(&mut self, stack: &mut Stack, h: SocketHandle, peer: VsockAddr, now: Instant) {
        let kind = match stack.socket_type(h) {
            Ok(SocketType::Stream) => Kind::Stream,
            Ok(SocketType::SeqPacket) => Kind::SeqPacket,
            _ => {
                let _ = stack.refuse(h);
                return;
            }
        };
        if peer.cid != self.config.guest_cid.get() {
            self.stats.wrong_peer += 1;
            tracing::info!(
                peer_cid = peer.cid,
                "refused a connection from a CID that is not the guest's"
            );
            let _ = stack.refuse(h);
            return;
        }
        let Ok(local) = stack.local_addr(h) else {
            let _ = stack.refuse(h);
            return;
        };
        if !self.config.policy.to_host.allows(local.port) {
            self.stats.denied += 1;
            tracing::warn!(
                guest_cid = self.config.guest_cid.get(),
                host_port = local.port,
                guest_port = peer.port,
                "denied: the guest's connection to host port {} (not an allowed host port)",
                local.port
            );
            let _ = stack.refuse(h);
            return;
        }
        if self.stats.active >= self.config.max_connections
            || self.guest_active >= self.config.max_guest_connections
        {
            self.stats.connection_limit += 1;
            tracing::debug!(
                host_port = local.port,
                "refused a guest connection: {} bridged connections are open, {} of them the guest's",
                self.stats.active,
                self.guest_active
            );
            let _ = stack.refuse(h);
            return;
        }
        let connected = unix_socket(kind.unix_type()).and_then(|sock| {
            sock.connect(&SockAddr::unix(self.paths.port(local.port))?)?;
            Ok(sock)
        });
        let sock = match connected {
            Ok(sock) => sock,
            // ENOENT (nobody there), ECONNREFUSED (not listening, or the
            // other socket type), EAGAIN (backlog full): the guest's connect
            // fails at once with connection-reset.
            Err(e) => {
                self.stats.host_refused += 1;
                tracing::info!(
                    host_port = local.port,
                    guest_port = peer.port,
                    "guest connection to host port {} refused: {}: {e}",
                    local.port,
                    self.paths.port(local.port).display()
                );
                let _ = stack.refuse(h);
                return;
            }
        };
        if stack.confirm(h).is_err() {
            self.stats.stack_errors += 1;
            let _ = stack.close(h, now);
            return;
        }
        let phase = Phase::Relay { h, to_guest_done: false, to_host_done: false };
        match self.adopt(sock, kind, phase, Origin::Guest) {
            Some(slot) => {
                self.stats.guest_connections += 1;
                self.stats.established += 1;
                tracing::debug!(
                    host_port = local.port,
                    guest_port = peer.port,
                    "guest connection bridged to a host listener"
                );
                self.pump(stack, slot, now);
            }
            None => {
                let _ = stack.close(h, now);
            }
        }
    }

    /// Gives a Unix socket a slot and registers it; `None` (counted) if the
    /// connection limit is reached or registration failed.
    fn adopt(&mut self, sock: Socket, kind: Kind, phase: Phase, origin: Origin) -> Option<usize> {
        if self.stats.active >= self.config.max_connections {
            self.stats.connection_limit += 1;
            tracing::info!(
                "closed a host connection: {} bridged connections are open already",
                self.config.max_connections
            );
            return None;
        }
        match kind {
            // A whole message (the stack's largest plus the flags byte)
            // must fit the send buffer, or Unix answers EMSGSIZE. The
            // kernel caps this at net.core.wmem_max.
            Kind::SeqPacket => {
                let _ = sock.set_send_buffer_size(2 * self.scratch.len());
            }
            // Grown later, once the program reads (`Conn::note_event`).
            Kind::Stream => {}
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.slots.len() < 2 * self.config.max_connections => {
                let key = self.slots.len();
                let (notify, waker) = KeyWaker::new(&self.wakes, key);
                self.slots.push(Slot { conn: None, origin, notify, waker });
                key
            }
            // Only a caller that never calls `events_handled` gets here:
            // a resting slot is the only one left.
            None => self.resting.pop()?,
        };
        let token = Token(self.first_token + RESERVED_TOKENS + slot);
        let interest = MioInterest::READABLE | MioInterest::WRITABLE;
        if self.registry.register(&mut SourceFd(&sock.as_raw_fd()), token, interest).is_err() {
            self.stats.accept_errors += 1;
            self.free.push(slot);
            return None;
        }
        if let Some(h) = phase.handle() {
            self.by_handle.insert(h, slot);
        }
        let mut conn = Conn::new(sock, kind, phase);
        if kind == Kind::Stream {
            conn.grow_send_buffer_to = self.config.stream_send_buffer;
        }
        self.slots[slot].conn = Some(conn);
        self.slots[slot].origin = origin;
        self.stats.active += 1;
        if origin == Origin::Guest {
            self.guest_active += 1;
        }
        Some(slot)
    }

    /// Guest stream bytes that reached the host stack with nothing queued
    /// before them: written to the Unix socket at once, if it takes them.
    pub(crate) fn guest_stream_bytes(
        &mut self,
        h: SocketHandle,
        data: pier_stack::Payload<'_>,
    ) -> usize {
        let Some(&slot) = self.by_handle.get(&h) else { return 0 };
        let Some(conn) = self.slots.get_mut(slot).and_then(|s| s.conn.as_mut()) else { return 0 };
        let written = conn.write_direct(data);
        self.stats.bytes_from_guest += written as u64;
        written
    }

    /// Reads the host → guest bytes of the streams waiting for a receive
    /// buffer into the buffers `rx` lends, or, when it lends none, into
    /// the host stack as usual.
    pub(crate) fn lend_rx(
        &mut self,
        stack: &mut Stack,
        rx: &mut dyn crate::host_side::RxLender,
        now: Instant,
    ) {
        let mut i = 0;
        while let Some(&slot) = self.awaiting_rx.get(i) {
            self.rx_lent = rx.lends();
            let outcome = self.with_conn(stack, slot, now, |conn, ctx| {
                // A closed connection's slot may hold a new one by now.
                conn.awaiting_rx.then(|| (conn.lend_rx(ctx, rx), conn.awaiting_rx))
            });
            let (verdict, waits) = outcome.flatten().unwrap_or((Verdict::Keep, false));
            if waits {
                i += 1;
            } else {
                self.awaiting_rx.swap_remove(i);
            }
            if verdict == Verdict::Close {
                self.close_slot(stack, slot, now);
            }
        }
        self.rx_lent = rx.lends();
    }

    fn pump(&mut self, stack: &mut Stack, slot: usize, now: Instant) {
        let pumped = self.with_conn(stack, slot, now, |conn, ctx| {
            let was_awaiting_line = matches!(conn.phase, Phase::AwaitLine { .. });
            let verdict = conn.pump(ctx);
            let left_line = was_awaiting_line && !matches!(conn.phase, Phase::AwaitLine { .. });
            (verdict, left_line, conn.phase.handle(), conn.awaiting_rx)
        });
        let Some((verdict, left_line, handle, awaiting_rx)) = pumped else { return };
        if awaiting_rx && !self.awaiting_rx.contains(&slot) {
            self.awaiting_rx.push(slot);
        }
        if left_line {
            self.stop_awaiting_line(slot);
            if let Some(h) = handle {
                self.by_handle.insert(h, slot);
            }
        }
        if verdict == Verdict::Close {
            self.close_slot(stack, slot, now);
        }
    }

    /// Runs `step` on the connection in `slot` with what a pump needs;
    /// `None` for an empty slot.
    fn with_conn<R>(
        &mut self,
        stack: &mut Stack,
        slot: usize,
        now: Instant,
        step: impl FnOnce(&mut Conn, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let Self { slots, scratch, stats, config, rx_lent, .. } = self;
        let Slot { conn, waker, .. } = &mut slots[slot];
        let conn = conn.as_mut()?;
        let mut ctx = Ctx {
            stack,
            now,
            scratch,
            stats,
            waker,
            guest_cid: config.guest_cid.get(),
            policy: &config.policy,
            in_place: *rx_lent,
        };
        Some(step(conn, &mut ctx))
    }

    /// Takes `slot` off the connections waiting for their line, if it is
    /// on it.
    fn stop_awaiting_line(&mut self, slot: usize) {
        let Some(i) = self.awaiting_line.iter().position(|&s| s == slot) else { return };
        self.awaiting_line.swap_remove(i);
        let Origin::Host { uid } = self.slots[slot].origin else { return };
        if let Some(count) = self.awaiting_line_by_uid.get_mut(&uid) {
            *count -= 1;
            if *count == 0 {
                self.awaiting_line_by_uid.remove(&uid);
            }
        }
    }

    /// Room for a connection from `uid` past the line budget or at the
    /// connection cap, by the rule [`BridgeConfig::max_pending_lines`]
    /// gives: from the user crowding others out if there is one, else from
    /// whoever has waited past the grace.
    fn make_room_for_line(&mut self, stack: &mut Stack, uid: Option<u32>, now: Instant) {
        let mine = self.awaiting_line_by_uid.get(&uid).copied().unwrap_or(0);
        let users = self.awaiting_line_by_uid.len() + usize::from(mine == 0);
        let share = self.config.max_pending_lines / users;
        let crowding = self
            .awaiting_line_by_uid
            .iter()
            .filter(|&(&other, &count)| other != uid && count > share && count > mine)
            .max_by_key(|&(_, &count)| count)
            .map(|(&other, &count)| (other, count));
        let Some((other, count)) = crowding else {
            self.evict_longest_waiting_line(stack, now);
            return;
        };
        if let Some((_, slot)) = self.longest_waiting_line(Some(other)) {
            self.stats.line_evictions += 1;
            tracing::debug!(
                crowding_uid = other,
                waiting = count,
                "closed a waiting host connection of a user holding more than its share"
            );
            self.close_slot(stack, slot, now);
        }
    }

    /// The connection that has waited longest for its CONNECT line (the
    /// earliest deadline), of host user `uid` when given (`Some(None)`
    /// is the user the kernel had no credentials for): its deadline and
    /// slot.
    fn longest_waiting_line(&self, uid: Option<Option<u32>>) -> Option<(Instant, usize)> {
        self.awaiting_line
            .iter()
            .filter(|&&slot| uid.is_none_or(|uid| self.slots[slot].origin == Origin::Host { uid }))
            .filter_map(|&slot| match self.slots[slot].conn.as_ref().map(|c| &c.phase) {
                Some(Phase::AwaitLine { deadline }) => Some((*deadline, slot)),
                _ => None,
            })
            .min()
    }

    /// Closes the host connection that has waited longest for its CONNECT
    /// line (the earliest deadline), if it has waited at least the grace.
    fn evict_longest_waiting_line(&mut self, stack: &mut Stack, now: Instant) {
        // Every deadline is its accept time plus the line timeout, so a
        // connection accepted at least the grace ago has
        // `deadline + grace <= now + timeout`.
        let (grace, timeout) = (self.config.line_grace, self.config.connect_line_timeout);
        if let Some((deadline, slot)) = self.longest_waiting_line(None)
            && deadline + grace <= now + timeout
        {
            self.stats.line_evictions += 1;
            tracing::info!(
                "closed a host connection silent for too long to make room for a new one"
            );
            self.close_slot(stack, slot, now);
        }
    }

    fn expire_lines(&mut self, stack: &mut Stack, now: Instant) {
        let mut i = 0;
        while i < self.awaiting_line.len() {
            let slot = self.awaiting_line[i];
            match self.slots[slot].conn.as_ref().map(|c| &c.phase) {
                Some(Phase::AwaitLine { deadline }) if *deadline > now => i += 1,
                Some(Phase::AwaitLine { .. }) => {
                    self.stats.line_timeouts += 1;
                    tracing::info!("host program sent no CONNECT line in time: closing");
                    // Removes `slot` from index i of `awaiting_line`.
                    self.close_slot(stack, slot, now);
                }
                _ => self.stop_awaiting_line(slot),
            }
        }
    }

    /// Closes both sides of a connection. The Unix socket closes now; the
    /// stack socket closes in the background (remaining data, SHUTDOWN,
    /// the peer's RST or the close timer).
    fn close_slot(&mut self, stack: &mut Stack, slot: usize, now: Instant) {
        let Some(conn) = self.slots.get_mut(slot).and_then(|s| s.conn.take()) else { return };
        let _ = self.registry.deregister(&mut SourceFd(&conn.sock.as_raw_fd()));
        if let Some(h) = conn.phase.handle() {
            self.by_handle.remove(&h);
            let _ = if conn.reset_by_host { stack.abort(h, now) } else { stack.close(h, now) };
        }
        tracing::debug!(kind = ?conn.kind, reset = conn.reset_by_host, "bridged connection closed");
        self.stop_awaiting_line(slot);
        self.resting.push(slot);
        self.stats.active -= 1;
        if self.slots[slot].origin == Origin::Guest {
            self.guest_active -= 1;
        }
        self.stats.closed += 1;
        // Its descriptor is free now: a host program waiting in the
        // listener's backlog for one can have it at once.
        if self.accept_retry.is_some() {
            self.accept_retry = Some(now);
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for file in &self.created {
            file.remove();
        }
    }
}

/// Binds and listens on a Unix socket of `kind` at `path`.
fn listen(
    path: PathBuf,
    kind: Kind,
    config: &BridgeConfig,
    created: &mut Vec<OwnedSocketFile>,
) -> io::Result<Socket> {
    claim_socket_path(&path, kind.unix_type())?;
    let sock = unix_socket(kind.unix_type())?;
    sock.bind(&SockAddr::unix(&path)?)?;
    created.push(OwnedSocketFile::new(path));
    sock.listen(config.unix_backlog)?;
    Ok(sock)
}
