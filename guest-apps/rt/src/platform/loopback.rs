//! An in-memory loopback platform for pier-rt's own tests (`cfg(test)`, on
//! the developer's machine): the sockets of one process connect to each
//! other, so the shells, the `Poller` and the async executor run for real
//! against the contract.
//!
//! It keeps the promises the contract and the public docs make (blocking
//! or `WouldBlock`, the half-close, message boundaries, end-of-record and
//! truncation, the reset of SO_LINGER 0, datagram peers, level-triggered
//! readiness) and is no model of a transport beyond them: a connection is
//! established as soon as it is asked for, each direction holds
//! [`BUFFER`] bytes, and nothing is ever in flight, so nothing waits to
//! be sent.
//!
//! All sockets live in one [`World`] behind a mutex, so a test may block
//! in one thread while another makes progress; every change wakes every
//! waiter, which then looks again.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::io::{self, ErrorKind};
use std::marker::PhantomData;
use std::net::Shutdown;
use std::ops::Deref;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::contract::{self, Platform, Wait};
use crate::addr::{VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::kind;
use crate::message::RecvMessage;

/// Bytes one direction of a connection holds: a send waits while the
/// peer holds this much unread, and a message longer than this can never
/// be sent.
pub(crate) const BUFFER: usize = 64 * 1024;

/// The largest datagram, as vsock's.
const MAX_DATAGRAM: usize = 64 * 1024;

/// The first port handed out for `VMADDR_PORT_ANY` and to clients.
const EPHEMERAL: u32 = 49152;

/// How long a blocking call waits with nothing at all changing before it
/// panics: no other thread can then be about to wake it, so the test
/// would hang instead of failing.
const STUCK: Duration = Duration::from_secs(10);

/// The loopback platform.
#[derive(Debug)]
pub(crate) enum Loopback {}

impl Platform for Loopback {
    type Wait = Self;
    type StreamListener = Listener<kind::Stream>;
    type Stream = Conn<kind::Stream>;
    type StreamConnecting = Connecting<kind::Stream>;
    type SeqpacketListener = Listener<kind::Seqpacket>;
    type Seqpacket = Conn<kind::Seqpacket>;
    type SeqpacketConnecting = Connecting<kind::Seqpacket>;
    type Datagram = Datagram;

    fn local_cid() -> io::Result<u32> {
        Ok(VMADDR_CID_LOCAL)
    }
}

/// Whether a connection kind keeps message boundaries.
pub(crate) trait Kind: Debug {
    const MESSAGES: bool;
}

impl Kind for kind::Stream {
    const MESSAGES: bool = false;
}

impl Kind for kind::Seqpacket {
    const MESSAGES: bool = true;
}

/// Which port space a bound socket is in: stream and seqpacket listeners
/// share one, datagram sockets have their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Space {
    Connections,
    Datagrams,
}

#[derive(Debug)]
struct Message {
    data: Vec<u8>,
    end_of_record: bool,
}

#[derive(Debug)]
struct ConnState {
    local: VsockAddr,
    peer: VsockAddr,
    /// The peer's socket, once gone no longer in the world.
    other: u64,
    /// What the peer sent and this side has not read yet.
    rx: VecDeque<Message>,
    rx_bytes: usize,
    /// The peer shut down sending, or closed.
    rx_end: bool,
    /// This side shut down receiving.
    rx_shut: bool,
    /// This side shut down sending.
    tx_shut: bool,
    /// The peer reset the connection.
    reset: bool,
    /// SO_LINGER 0: closing resets the peer.
    abort_on_drop: bool,
}

#[derive(Debug)]
enum Entry {
    Listener { messages: bool, local: VsockAddr, backlog: VecDeque<u64> },
    Conn(ConnState),
    Datagram { local: VsockAddr, peer: Option<VsockAddr>, queue: VecDeque<(Vec<u8>, VsockAddr)> },
}

/// Every socket of the process.
#[derive(Debug)]
struct World {
    sockets: BTreeMap<u64, Entry>,
    ports: BTreeMap<(Space, u32), u64>,
    next_id: u64,
    next_port: u32,
    /// Counts changes, so a waiter can tell that nothing changed at all.
    changes: u64,
}

static WORLD: Mutex<World> = Mutex::new(World {
    sockets: BTreeMap::new(),
    ports: BTreeMap::new(),
    next_id: 1,
    next_port: EPHEMERAL,
    changes: 0,
});
static CHANGED: Condvar = Condvar::new();

fn world() -> MutexGuard<'static, World> {
    WORLD.lock().unwrap_or_else(PoisonError::into_inner)
}

fn err(kind: ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("loopback: {what}"))
}

/// Runs `op` on the world, waiting for a change and trying again while it
/// would block, unless `nonblocking`.
fn call<T>(nonblocking: bool, mut op: impl FnMut(&mut World) -> io::Result<T>) -> io::Result<T> {
    let mut world = world();
    loop {
        match op(&mut world) {
            Err(e) if e.kind() == ErrorKind::WouldBlock && !nonblocking => {
                world = wait_for_change(world, None).0;
            }
            result => {
                world.changes += 1;
                CHANGED.notify_all();
                return result;
            }
        }
    }
}

/// Waits until the world changes or `deadline` passes, and says whether
/// it has passed.
fn wait_for_change(
    world: MutexGuard<'static, World>,
    deadline: Option<Instant>,
) -> (MutexGuard<'static, World>, bool) {
    let before = world.changes;
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let (world, waited) = CHANGED
        .wait_timeout(world, left.unwrap_or(STUCK).min(STUCK))
        .unwrap_or_else(PoisonError::into_inner);
    let past = deadline.is_some_and(|d| Instant::now() >= d);
    if waited.timed_out() && !past && world.changes == before {
        panic!("loopback: a blocking call waited {STUCK:?} and nothing changed: it would hang");
    }
    (world, past)
}

impl World {
    fn add(&mut self, entry: Entry) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.sockets.insert(id, entry);
        id
    }

    fn ephemeral(&mut self, space: Space) -> u32 {
        loop {
            let port = self.next_port;
            self.next_port = if port == u32::MAX - 1 { EPHEMERAL } else { port + 1 };
            if !self.ports.contains_key(&(space, port)) {
                return port;
            }
        }
    }

    /// Claims `addr`'s port in `space` for the socket `id` will be.
    fn bind(&mut self, space: Space, addr: VsockAddr) -> io::Result<VsockAddr> {
        if addr.cid != VMADDR_CID_ANY && addr.cid != VMADDR_CID_LOCAL {
            return Err(err(ErrorKind::AddrNotAvailable, "not this machine's CID"));
        }
        let port = if addr.port == VMADDR_PORT_ANY { self.ephemeral(space) } else { addr.port };
        if self.ports.contains_key(&(space, port)) {
            return Err(err(ErrorKind::AddrInUse, "port in use"));
        }
        Ok(VsockAddr::new(addr.cid, port))
    }

    fn entry(&self, id: u64) -> io::Result<&Entry> {
        self.sockets.get(&id).ok_or_else(|| err(ErrorKind::NotConnected, "socket gone"))
    }

    fn conn(&mut self, id: u64) -> io::Result<&mut ConnState> {
        match self.sockets.get_mut(&id) {
            Some(Entry::Conn(c)) => Ok(c),
            _ => Err(err(ErrorKind::NotConnected, "not a connection")),
        }
    }

    fn connect(&mut self, messages: bool, addr: VsockAddr) -> io::Result<u64> {
        if addr.port == VMADDR_PORT_ANY || addr.cid == VMADDR_CID_ANY {
            return Err(err(ErrorKind::InvalidInput, "connect to an ANY address"));
        }
        if addr.cid != VMADDR_CID_LOCAL {
            return Err(err(ErrorKind::HostUnreachable, "only VMADDR_CID_LOCAL is reachable"));
        }
        let listener = self.ports.get(&(Space::Connections, addr.port)).copied();
        let Some(listener) = listener.filter(|l| {
            matches!(self.sockets.get(l), Some(Entry::Listener { messages: m, .. }) if *m == messages)
        }) else {
            return Err(err(ErrorKind::ConnectionRefused, "nothing listens there"));
        };
        let client_addr = VsockAddr::new(VMADDR_CID_LOCAL, self.ephemeral(Space::Connections));
        let server_addr = VsockAddr::new(VMADDR_CID_LOCAL, addr.port);
        let client = self.add(Entry::Conn(ConnState::new(client_addr, server_addr, 0)));
        let server = self.add(Entry::Conn(ConnState::new(server_addr, client_addr, client)));
        self.conn(client)?.other = server;
        if let Some(Entry::Listener { backlog, .. }) = self.sockets.get_mut(&listener) {
            backlog.push_back(server);
        }
        Ok(client)
    }

    /// The peer of connection `id`, if it is still there.
    fn peer_of(&mut self, id: u64) -> io::Result<Option<&mut ConnState>> {
        let other = self.conn(id)?.other;
        Ok(match self.sockets.get_mut(&other) {
            Some(Entry::Conn(c)) => Some(c),
            _ => None,
        })
    }

    /// Room in the peer's receive queue for `len` bytes (all of them, for
    /// a message), or why not.
    fn room(&mut self, id: u64, len: usize, whole: bool) -> io::Result<usize> {
        let me = self.conn(id)?;
        if me.reset {
            return Err(err(ErrorKind::ConnectionReset, "reset by the peer"));
        }
        if me.tx_shut {
            return Err(err(ErrorKind::BrokenPipe, "sending was shut down"));
        }
        let Some(peer) = self.peer_of(id)?.filter(|p| !p.rx_shut) else {
            return Err(err(ErrorKind::BrokenPipe, "the peer no longer receives"));
        };
        let room = BUFFER - peer.rx_bytes;
        match (whole, room) {
            (_, 0) => Err(ErrorKind::WouldBlock.into()),
            (true, room) if room < len => Err(ErrorKind::WouldBlock.into()),
            (_, room) => Ok(room.min(len)),
        }
    }

    fn deliver(&mut self, id: u64, data: &[u8], end_of_record: bool) -> io::Result<()> {
        let peer = self.peer_of(id)?.expect("room() checked the peer");
        peer.rx_bytes += data.len();
        peer.rx.push_back(Message { data: data.to_vec(), end_of_record });
        Ok(())
    }

    /// The next message (for a stream, up to `max` bytes of it), or the
    /// end (`None`), or `WouldBlock`.
    fn take(&mut self, id: u64, max: Option<usize>) -> io::Result<Option<Message>> {
        let me = self.conn(id)?;
        if me.reset {
            return Err(err(ErrorKind::ConnectionReset, "reset by the peer"));
        }
        let Some(mut message) = me.rx.pop_front() else {
            return if me.rx_end || me.rx_shut {
                Ok(None)
            } else {
                Err(ErrorKind::WouldBlock.into())
            };
        };
        if let Some(max) = max.filter(|&max| max < message.data.len()) {
            let rest = message.data.split_off(max);
            me.rx.push_front(Message { data: rest, end_of_record: message.end_of_record });
        }
        me.rx_bytes -= message.data.len();
        Ok(Some(message))
    }

    /// Forgets socket `id`, as closing it does.
    fn close(&mut self, id: u64) {
        match self.sockets.remove(&id) {
            Some(Entry::Listener { local, backlog, .. }) => {
                self.ports.remove(&(Space::Connections, local.port));
                // Connections never accepted are reset, as Linux does.
                for pending in backlog {
                    if let Ok(c) = self.conn(pending) {
                        c.abort_on_drop = true;
                    }
                    self.close(pending);
                }
            }
            Some(Entry::Conn(me)) => {
                if let Some(Entry::Conn(peer)) = self.sockets.get_mut(&me.other) {
                    if me.abort_on_drop {
                        peer.reset = true;
                    } else {
                        peer.rx_end = true;
                    }
                }
            }
            Some(Entry::Datagram { local, .. }) => {
                self.ports.remove(&(Space::Datagrams, local.port));
            }
            None => {}
        }
    }

    fn holds(&self, raw: RawPoll) -> bool {
        let Some(entry) = self.sockets.get(&raw.id) else {
            return true; // gone: the call says why at once
        };
        match (entry, raw.direction) {
            (_, Direction::Always) => true,
            (Entry::Listener { backlog, .. }, _) => !backlog.is_empty(),
            (Entry::Conn(c), Direction::Read) => {
                !c.rx.is_empty() || c.rx_end || c.rx_shut || c.reset
            }
            (Entry::Conn(c), Direction::Write) => {
                let peer = match self.sockets.get(&c.other) {
                    Some(Entry::Conn(p)) => Some(p),
                    _ => None,
                };
                c.reset || c.tx_shut || peer.is_none_or(|p| p.rx_shut || p.rx_bytes < BUFFER)
            }
            (Entry::Datagram { queue, .. }, Direction::Read) => !queue.is_empty(),
            (Entry::Datagram { .. }, Direction::Write) => true,
        }
    }
}

impl ConnState {
    fn new(local: VsockAddr, peer: VsockAddr, other: u64) -> Self {
        Self {
            local,
            peer,
            other,
            rx: VecDeque::new(),
            rx_bytes: 0,
            rx_end: false,
            rx_shut: false,
            tx_shut: false,
            reset: false,
            abort_on_drop: false,
        }
    }
}

/// One socket of the world, closed when dropped.
#[derive(Debug)]
pub(crate) struct Handle {
    id: u64,
    nonblocking: Cell<bool>,
}

impl Handle {
    fn new(id: u64) -> Self {
        Self { id, nonblocking: Cell::new(false) }
    }

    fn call<T>(&self, op: impl FnMut(&mut World) -> io::Result<T>) -> io::Result<T> {
        call(self.nonblocking.get(), op)
    }

    fn now<T>(&self, op: impl FnOnce(&mut World) -> io::Result<T>) -> io::Result<T> {
        let mut op = Some(op);
        call(true, |w| op.take().expect("a non-blocking call runs once")(w))
    }

    fn ready(&self, direction: Direction) -> PollRef<'_> {
        PollRef { raw: RawPoll { id: self.id, direction }, _socket: PhantomData }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.now(|w| {
            w.close(self.id);
            Ok(())
        });
    }
}

impl<T: Deref<Target = Handle> + Debug> contract::Socket<Loopback> for T {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.now(|w| match w.entry(self.id)? {
            Entry::Listener { local, .. } | Entry::Datagram { local, .. } => Ok(*local),
            Entry::Conn(c) => Ok(c.local),
        })
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        self.ready(Direction::Read)
    }
}

/// A listener for connections of kind `K`.
#[derive(Debug)]
pub(crate) struct Listener<K> {
    handle: Handle,
    _kind: PhantomData<K>,
}

impl<K> Deref for Listener<K> {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl<K: Kind> contract::Listener<Loopback> for Listener<K> {
    type Conn = Conn<K>;

    fn bind(addr: VsockAddr) -> io::Result<Self> {
        let id = call(true, |w| {
            let local = w.bind(Space::Connections, addr)?;
            let id =
                w.add(Entry::Listener { messages: K::MESSAGES, local, backlog: VecDeque::new() });
            w.ports.insert((Space::Connections, local.port), id);
            Ok(id)
        })?;
        Ok(Self { handle: Handle::new(id), _kind: PhantomData })
    }

    fn accept(&self) -> io::Result<(Conn<K>, VsockAddr)> {
        let (id, peer) = self.call(|w| {
            let Some(Entry::Listener { backlog, .. }) = w.sockets.get_mut(&self.id) else {
                return Err(err(ErrorKind::NotConnected, "not a listener"));
            };
            let id = backlog.pop_front().ok_or(ErrorKind::WouldBlock)?;
            Ok((id, w.conn(id)?.peer))
        })?;
        Ok((Conn::new(id), peer))
    }
}

/// A connected socket of kind `K`.
#[derive(Debug)]
pub(crate) struct Conn<K> {
    handle: Handle,
    _kind: PhantomData<K>,
}

impl<K> Conn<K> {
    fn new(id: u64) -> Self {
        Self { handle: Handle::new(id), _kind: PhantomData }
    }

    /// Bytes queued for a receive; with `end_counts`, 1 at the end.
    fn queued(&self, end_counts: bool) -> io::Result<usize> {
        self.now(|w| {
            let me = w.conn(self.id)?;
            let at_end = me.rx.is_empty() && me.rx_end;
            Ok(if end_counts && at_end { 1 } else { me.rx_bytes })
        })
    }
}

impl<K> Deref for Conn<K> {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl<K: Kind> contract::Connection<Loopback> for Conn<K> {
    fn connect(addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        call(true, |w| w.connect(K::MESSAGES, addr)).map(Self::new)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.now(|w| Ok(w.conn(self.id)?.peer))
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.now(|w| {
            let me = w.conn(self.id)?;
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                me.rx_shut = true;
                me.rx.clear();
                me.rx_bytes = 0;
            }
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                me.tx_shut = true;
                if let Some(peer) = w.peer_of(self.id)? {
                    peer.rx_end = true;
                }
            }
            Ok(())
        })
    }

    fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let abort = match linger {
            None => false,
            Some(d) if d.is_zero() => true,
            Some(_) => return Err(err(ErrorKind::Unsupported, "a linger timeout")),
        };
        self.now(|w| {
            w.conn(self.id)?.abort_on_drop = abort;
            Ok(())
        })
    }

    fn writable(&self) -> PollRef<'_> {
        self.ready(Direction::Write)
    }
}

impl contract::ByteStream<Loopback> for Conn<kind::Stream> {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let message = self.call(|w| w.take(self.id, Some(buf.len())))?;
        let data = message.map(|m| m.data).unwrap_or_default();
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.call(|w| {
            let n = w.room(self.id, buf.len(), false)?;
            w.deliver(self.id, &buf[..n], false)?;
            Ok(n)
        })
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.queued(true)
    }

    fn send_queued(&self) -> io::Result<usize> {
        Ok(0)
    }
}

impl contract::MessageStream<Loopback> for Conn<kind::Seqpacket> {
    fn send(&self, data: &[u8], end_of_record: bool) -> io::Result<usize> {
        if data.len() > BUFFER {
            return Err(err(ErrorKind::InvalidInput, "message too long"));
        }
        if data.is_empty() {
            return Ok(0);
        }
        self.call(|w| {
            w.room(self.id, data.len(), true)?;
            w.deliver(self.id, data, end_of_record)
        })?;
        Ok(data.len())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        let Some(message) = self.call(|w| w.take(self.id, None))? else {
            return Ok(RecvMessage::default());
        };
        let len = message.data.len().min(buf.len());
        buf[..len].copy_from_slice(&message.data[..len]);
        Ok(RecvMessage {
            len,
            truncated: len < message.data.len(),
            end_of_record: message.end_of_record,
        })
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.queued(false)
    }
}

/// A connect under way. The loopback connects at once, so `finish`
/// never waits; it hands the connection over once.
#[derive(Debug)]
pub(crate) struct Connecting<K> {
    conn: Option<Conn<K>>,
}

impl<K: Kind> contract::Connecting<Loopback> for Connecting<K> {
    type Conn = Conn<K>;

    fn start(addr: VsockAddr, timeout: Option<Duration>) -> io::Result<Self> {
        contract::Connection::connect(addr, timeout).map(|conn| Self { conn: Some(conn) })
    }

    fn finish(&mut self) -> io::Result<Conn<K>> {
        self.conn.take().ok_or_else(|| ErrorKind::NotConnected.into())
    }

    fn ready(&self) -> PollRef<'_> {
        PollRef { raw: RawPoll { id: 0, direction: Direction::Always }, _socket: PhantomData }
    }
}

/// A datagram socket.
#[derive(Debug)]
pub(crate) struct Datagram {
    handle: Handle,
}

impl Deref for Datagram {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl contract::Datagram<Loopback> for Datagram {
    fn bind(addr: VsockAddr) -> io::Result<Self> {
        let id = call(true, |w| {
            let local = w.bind(Space::Datagrams, addr)?;
            let id = w.add(Entry::Datagram { local, peer: None, queue: VecDeque::new() });
            w.ports.insert((Space::Datagrams, local.port), id);
            Ok(id)
        })?;
        Ok(Self { handle: Handle::new(id) })
    }

    fn connect(&mut self, to: VsockAddr) -> io::Result<()> {
        self.now(|w| match w.sockets.get_mut(&self.id) {
            Some(Entry::Datagram { peer, queue, .. }) => {
                *peer = Some(to);
                queue.clear();
                Ok(())
            }
            _ => Err(err(ErrorKind::NotConnected, "not a datagram socket")),
        })
    }

    fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        if buf.len() > MAX_DATAGRAM {
            return Err(err(ErrorKind::InvalidInput, "datagram too long"));
        }
        self.call(|w| {
            let &Entry::Datagram { local, peer, .. } = w.entry(self.id)? else {
                return Err(err(ErrorKind::NotConnected, "not a datagram socket"));
            };
            if peer.is_some_and(|p| p != to) {
                return Err(err(ErrorKind::InvalidInput, "not the connected peer"));
            }
            let from = VsockAddr::new(VMADDR_CID_LOCAL, local.port);
            let target = w.ports.get(&(Space::Datagrams, to.port)).copied();
            // Best effort: a datagram nobody takes is dropped.
            if let Some(Entry::Datagram { peer, queue, .. }) =
                target.and_then(|t| w.sockets.get_mut(&t))
                && peer.is_none_or(|p| p == from)
            {
                queue.push_back((buf.to_vec(), from));
            }
            Ok(buf.len())
        })
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_to(buf, self.peer_addr()?)
    }

    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        let (data, from) = self.call(|w| match w.sockets.get_mut(&self.id) {
            Some(Entry::Datagram { queue, .. }) => {
                queue.pop_front().ok_or_else(|| ErrorKind::WouldBlock.into())
            }
            _ => Err(err(ErrorKind::NotConnected, "not a datagram socket")),
        })?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok((n, from))
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.now(|w| match w.entry(self.id)? {
            Entry::Datagram { peer: Some(peer), .. } => Ok(*peer),
            _ => Err(ErrorKind::NotConnected.into()),
        })
    }

    fn recv_queued(&self) -> io::Result<usize> {
        self.now(|w| match w.entry(self.id)? {
            Entry::Datagram { queue, .. } => Ok(queue.iter().map(|(d, _)| d.len()).sum()),
            _ => Err(err(ErrorKind::NotConnected, "not a datagram socket")),
        })
    }

    fn writable(&self) -> PollRef<'_> {
        self.ready(Direction::Write)
    }
}

#[derive(Clone, Copy, Debug)]
enum Direction {
    Read,
    Write,
    /// Ready whatever the world holds.
    Always,
}

/// One condition a `Poller` waits for; it borrows its socket.
#[derive(Debug)]
pub(crate) struct PollRef<'a> {
    raw: RawPoll,
    _socket: PhantomData<&'a Handle>,
}

/// A condition without its borrow.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll {
    id: u64,
    direction: Direction,
}

impl Wait for Loopback {
    type PollRef<'a> = PollRef<'a>;
    type RawPoll = RawPoll;

    fn raw(ready: &PollRef<'_>) -> Option<RawPoll> {
        Some(ready.raw)
    }

    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<RawPoll>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let start = ready.len();
        let mut world = world();
        loop {
            ready.extend((0..count).filter(|&i| condition(i).is_none_or(|c| world.holds(c))));
            if ready.len() > start {
                return Ok(());
            }
            let past;
            (world, past) = wait_for_change(world, deadline);
            if past {
                return Ok(());
            }
        }
    }
}
