//! The endpoint: [`Stack`] owns the socket table and routes packets,
//! time and socket calls to the sockets; what a socket does with them is
//! the socket's business (`crate::socket`), and the endpoint carries out
//! what the socket asks of it, as quinn-proto's `Endpoint` does for its
//! `Connection`s.
//!
//! [`Stack`] is sans-IO. It is driven by three kinds of input and produces
//! three kinds of output, and does nothing on its own:
//!
//! | in | out |
//! |---|---|
//! | received packets ([`Stack::rx_batch`]) | packets to send ([`Stack::dispatch`] into a [`TxSink`]) |
//! | the time ([`Stack::handle_timeout`]) | the next deadline ([`Stack::poll_at`]) |
//! | socket calls (`bind`, `send`, ...) | wakers to wake ([`WakeList`]) |
//!
//! A driver's loop is: feed the packets the device returned as one batch,
//! dispatch, wake the returned wakers after dropping any lock, and sleep
//! until the device interrupts or `poll_at` passes.
//!
//! `impl Stack` is split by concern, one file each:
//!
//! - `endpoint.rs`: the socket table, `socket`, `bind` and ports,
//!   `listen`/`accept`, the catch-all listener, `close` and freeing.
//! - `table.rs` (no `impl Stack`): what the tables hold, a socket's row
//!   and the connection key.
//! - `receive.rs`: receive batches, decoding, and routing a packet to its
//!   connection, listener or datagram socket.
//! - `connection.rs`: stream and seqpacket calls (`connect`,
//!   `send_message`, `shutdown`, ...), and `apply`, which carries out the
//!   `Outcome` the connection state machine returns.
//! - `datagram.rs`: `send_to`, and delivering a received datagram.
//! - `transmit.rs`: `dispatch`: RSTs owed, then each socket's next packet.
//! - `timers.rs`: connect and close deadlines, transport reset.
//! - `wakes.rs`: recorded readiness changes and the wakers they release.
//! - `options.rs`: socket options and queries.
//!
//! This file holds the [`Stack`] itself and the calls every socket type
//! answers (`send`, `recv`, `peek`), which pass each call on to its type.

mod connection;
mod datagram;
mod endpoint;
mod options;
mod receive;
mod table;
mod timers;
mod transmit;
mod wakes;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

use hashbrown::HashMap;
use slotmap::SlotMap;

use crate::addr::{LAST_RESERVED_PORT, VMADDR_PORT_ANY};
use crate::config::{Config, Features};
use crate::copy::copy_bytes;
use crate::error::{Error, Result};
use crate::socket::{HeldBuffers, RecvInfo, Socket, SocketHandle};
use crate::stats::{RstReason, Stats};
use crate::wire::{MAX_PAYLOAD, RawHeader};

pub use connection::{InPlace, Shutdown};
pub use receive::RxBatch;
pub use transmit::{SinkFull, TxSink};

#[cfg(doc)]
use crate::readiness::WakeList;
use table::{ConnKey, Entry};

/// The vsock protocol core for one CID: the socket table, and the router
/// between the transport, the clock and the application (see the module
/// documentation for how a driver runs it).
///
/// Every socket call takes a [`SocketHandle`] from [`Stack::socket`] or
/// [`Stack::accept`], and fails with [`Error::BadHandle`] (EBADF) once the
/// handle is closed. No call blocks: where Linux would sleep, it returns
/// [`Error::WouldBlock`] (EAGAIN), and the caller waits for the socket's
/// readiness ([`Stack::register_waker`]).
pub struct Stack {
    config: Config,
    local_cid: u32,
    sockets: SlotMap<SocketHandle, Entry>,
    /// Established (and connecting) stream and seqpacket sockets by 4-tuple.
    connected: HashMap<ConnKey, SocketHandle>,
    /// Stream and seqpacket ports (one table, as in Linux).
    bound: HashMap<u32, SocketHandle>,
    /// Datagram ports: a space of their own (datagram RFC).
    dgram_bound: HashMap<u32, SocketHandle>,
    /// Catch-all listeners, for stream and for seqpacket.
    catch_all: [Option<SocketHandle>; 2],
    /// Sockets with something to send, served round robin.
    tx_queue: VecDeque<SocketHandle>,
    /// RSTs owed to connections that have no socket (or no longer have
    /// one); bounded, so a flood of bad packets cannot grow memory.
    replies: VecDeque<(RawHeader, RstReason)>,
    /// Sockets with a connect or close deadline. Entries go stale when the
    /// deadline is cleared; they are dropped when next examined.
    timers: Vec<SocketHandle>,
    /// Sockets with a recorded, undelivered readiness change.
    wake_pending: Vec<SocketHandle>,
    next_ephemeral: u32,
    /// Largest payload `dispatch` puts in one packet: 64 KiB, or less when
    /// the device's receive buffers are smaller.
    max_payload: usize,
    /// Reused buffer for payloads delivered inside the stack, and for the
    /// rare datagram that wraps around its ring.
    scratch: Vec<u8>,
    /// The driver's receive buffers, when it lends them
    /// ([`Stack::set_held_buffers`]).
    held_buffers: Option<Box<dyn HeldBuffers + Send>>,
    /// Lent buffers the stack no longer holds, for the driver to take back.
    released: Vec<u16>,
    stats: Stats,
}

impl core::fmt::Debug for Stack {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Stack")
            .field("local_cid", &self.local_cid)
            .field("sockets", &self.sockets.len())
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// A stack with no sockets, at `config.local_cid`. The first ephemeral
    /// port comes from `config.ephemeral_seed`, so a run can be repeated.
    pub fn new(config: Config) -> Self {
        let span = VMADDR_PORT_ANY - LAST_RESERVED_PORT - 1;
        let next_ephemeral = LAST_RESERVED_PORT + 1 + config.ephemeral_seed % span;
        Self {
            local_cid: config.local_cid,
            config,
            sockets: SlotMap::with_key(),
            connected: HashMap::new(),
            bound: HashMap::new(),
            dgram_bound: HashMap::new(),
            catch_all: [None, None],
            tx_queue: VecDeque::new(),
            replies: VecDeque::new(),
            timers: Vec::new(),
            wake_pending: Vec::new(),
            next_ephemeral,
            max_payload: MAX_PAYLOAD,
            scratch: Vec::new(),
            held_buffers: None,
            released: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Lends the stack the driver's receive buffers, so that stream
    /// payloads can stay where they arrived until the application reads
    /// them ([`RxBatch::receive_held`]) instead of being copied into the
    /// socket's buffer: one copy per byte fewer on the thread that runs
    /// the driver, and the application's receive copies from the buffer
    /// itself. Call it once, before the first batch.
    ///
    /// A held buffer is out of the device's ring until its bytes are read
    /// (or the socket closes), so the driver decides how many it offers:
    /// when it has none to spare it uses [`RxBatch::receive`], and the
    /// payload is copied as usual. Credit does not change: held bytes count
    /// as queued until the application reads them.
    pub fn set_held_buffers(&mut self, buffers: Box<dyn HeldBuffers + Send>) {
        self.held_buffers = Some(buffers);
    }

    /// Takes back the loan of [`Self::set_held_buffers`], for a driver that
    /// is about to go (its guest restarts it): every payload held in its
    /// buffers is copied into its socket's buffer, so received bytes stay
    /// readable, and the buffers are forgotten, released or not. Call it
    /// while the old driver's buffers are still there; the new driver
    /// lends its own with [`Self::set_held_buffers`]. Held bytes already
    /// counted as queued, so credit does not change.
    pub fn take_back_held_buffers(&mut self) {
        let Some(buffers) = self.held_buffers.take() else { return };
        for entry in self.sockets.values_mut() {
            if let Some(c) = entry.socket.as_connection_mut() {
                c.conn.rx.copy_out_held(&*buffers);
            }
        }
        self.released.clear();
    }

    /// The held buffers the stack is done with (read to the end, or their
    /// socket closed): the driver may post them again.
    pub fn take_released_buffers(&mut self) -> impl Iterator<Item = u16> + '_ {
        self.released.drain(..)
    }

    /// This stack's CID: the source of the packets it sends and the
    /// destination of those it accepts. Only [`Stack::transport_reset`]
    /// changes it.
    pub fn local_cid(&self) -> u32 {
        self.local_cid
    }

    /// The settings the stack runs with: those it was made with, and the
    /// features of the last [`Stack::set_features`].
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes the socket types the transport carries, for a transport
    /// whose peer negotiated anew (a virtio device after its driver reset
    /// and set up again). Call it on a stack without connections of the
    /// types it removes, for example right after [`Stack::transport_reset`]:
    /// packets of a removed type are refused from then on (RST, or dropped
    /// and counted for datagrams), as at creation.
    pub fn set_features(&mut self, features: Features) {
        self.config.features = features;
    }

    /// The counters, for explaining a stuck or reset connection without a
    /// trace: every drop has a [`DropReason`](crate::DropReason) and every RST
    /// an [`RstReason`].
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sockets alive, including unaccepted and closing ones.
    pub fn socket_count(&self) -> usize {
        self.sockets.len()
    }

    /// Bytes of buffer storage all sockets hold.
    pub fn buffered_bytes(&self) -> usize {
        self.sockets.values().map(|e| e.socket.buffered_bytes()).sum()
    }

    /// Bytes applications handed to any socket that have not left yet
    /// (stream and seqpacket bytes waiting for credit or the transport,
    /// queued datagrams). A runtime about to end its whole machine waits
    /// for this to reach 0, as Linux keeps sending after a process exits.
    pub fn unsent_bytes(&self) -> usize {
        self.sockets.values().map(|e| e.socket.unsent_bytes()).sum()
    }

    /// Sends on any socket, as `send(2)`: stream bytes, one whole seqpacket
    /// message, or one datagram to the destination `connect` set. Returns
    /// how many bytes were taken; a stream takes at most what the peer's
    /// credit allows beyond what is already queued, so accepted bytes can
    /// always go out without waiting.
    ///
    /// Fails with the connection's pending error once (ECONNRESET when we
    /// reset it or the transport was reset), [`Error::BrokenPipe`] (EPIPE)
    /// after our SHUT_WR, the peer's SHUT_RD or the end of the connection,
    /// [`Error::NotConnected`] (ENOTCONN) before it is established, and
    /// [`Error::WouldBlock`] (EAGAIN) while the peer has no room. A
    /// seqpacket message fails as in [`Stack::send_message`], a datagram as
    /// in [`Stack::send_to`], and a datagram socket without a destination
    /// with [`Error::InvalidArgument`] (EINVAL, as in Linux).
    pub fn send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize> {
        match self.app(h)? {
            Socket::Datagram(d) => {
                // Linux answers EINVAL, not EDESTADDRREQ, for a datagram with nowhere to go.
                let to = d.peer.ok_or(Error::InvalidArgument)?;
                self.send_to(h, data, to)?;
                Ok(data.len())
            }
            Socket::Connection(c) if c.is_seqpacket() => {
                self.send_message(h, data, false)?;
                Ok(data.len())
            }
            Socket::Connection(_) => self.send_stream(h, data),
        }
    }

    /// Receives into `buf`, as `recv(2)` and `recvfrom(2)`: stream bytes, or
    /// one whole message or datagram (the rest of a longer one is discarded
    /// and [`RecvInfo::truncated`] says so). The end of the stream is `Ok`
    /// with [`RecvInfo::eof`].
    ///
    /// Fails with [`Error::NotConnected`] (ENOTCONN) on a stream or seqpacket
    /// socket that is not connected, [`Error::WouldBlock`] (EAGAIN) while
    /// nothing is queued, and the connection's error once its queue is read
    /// (ECONNRESET when we reset it).
    pub fn recv(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<RecvInfo> {
        self.recv_with(h, false, |a, b| Ok::<_, core::convert::Infallible>(copy_out(a, b, buf)))
    }

    /// Like [`Stack::recv`], but leaves the data queued (MSG_PEEK).
    pub fn peek(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<RecvInfo> {
        self.recv_with(h, true, |a, b| Ok::<_, core::convert::Infallible>(copy_out(a, b, buf)))
    }

    /// Receives by lending the queued bytes to `copy`, which returns how many
    /// it took. This is how adapters copy straight into their own memory.
    ///
    /// For a stream, `copy` sees everything queued, or, when payloads are
    /// held in the driver's buffers ([`Stack::set_held_buffers`]), the
    /// first two of them (a short read, as a stream may return). For seqpacket and
    /// datagrams it sees exactly one message; the message is consumed whole
    /// and reported truncated if `copy` took less. `peek` leaves the data
    /// queued (MSG_PEEK). Fails as [`Stack::recv`] does, and with
    /// [`Error::Fault`] (EFAULT) if `copy` fails: a stream consumes nothing,
    /// a message is dropped, as in Linux.
    pub fn recv_with<E>(
        &mut self,
        h: SocketHandle,
        peek: bool,
        copy: impl FnOnce(&[u8], &[u8]) -> core::result::Result<usize, E>,
    ) -> Result<RecvInfo> {
        let held = self.held_buffers.as_deref().map(|b| b as &dyn HeldBuffers);
        let socket = match self.sockets.get_mut(h) {
            Some(e) if e.app_owned => &mut e.socket,
            _ => return Err(Error::BadHandle),
        };
        let (received, credit_owed) = match socket {
            Socket::Datagram(d) => (d.recv_with(peek, copy), false),
            Socket::Connection(c) => c.recv_with(peek, held, &mut self.released, copy),
        };
        if credit_owed {
            self.enqueue_tx(h);
        }
        received
    }
}

/// Copies the two pieces of queued bytes into `buf`, as far as it holds.
/// The second piece is empty unless the bytes wrap around their ring, so
/// it costs a copy only then.
fn copy_out(a: &[u8], b: &[u8], buf: &mut [u8]) -> usize {
    let first = a.len().min(buf.len());
    copy_bytes(&mut buf[..first], &a[..first]);
    let second = b.len().min(buf.len() - first);
    if second > 0 {
        copy_bytes(&mut buf[first..first + second], &b[..second]);
    }
    first + second
}
