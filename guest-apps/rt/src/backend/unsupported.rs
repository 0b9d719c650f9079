//! The stand-in for targets without a backend, so that apps and the SDK
//! still compile (and their docs build) on the developer's own machine.
//! Every constructor fails with `Unsupported`, so no socket can ever
//! exist: every socket type is a [`Never`], and its methods are
//! `match self.0 {}`.

use std::convert::Infallible;
use std::io;
use std::marker::PhantomData;
use std::net::Shutdown;
use std::time::Duration;

use super::contract::{self, Backend, Wait};
use crate::addr::VsockAddr;
use crate::kind::{Seqpacket, Stream};
use crate::message::RecvMessage;

/// The backend of a target pier-rt has none for.
#[derive(Debug)]
pub(crate) enum Unsupported {}

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "pier-rt: vsock sockets are only implemented for wasm32-wasip2 and x86_64-unknown-none",
    ))
}

/// A socket that cannot exist, in the role `R`: a connection kind for a
/// connection, `(Listens, kind)`, `(Connects, kind)`, or [`Datagrams`].
/// Each role is its own type, so each implements only its role's traits,
/// as a real backend's socket types do.
#[derive(Debug)]
pub(crate) struct Never<R>(Infallible, PhantomData<R>);

/// The role of a listener.
#[derive(Debug)]
pub(crate) enum Listens {}
/// The role of a connect under way.
#[derive(Debug)]
pub(crate) enum Connects {}
/// The role of a datagram socket.
#[derive(Debug)]
pub(crate) enum Datagrams {}

impl Backend for Unsupported {
    type Wait = Self;
    type StreamListener = Never<(Listens, Stream)>;
    type Stream = Never<Stream>;
    type StreamConnecting = Never<(Connects, Stream)>;
    type SeqpacketListener = Never<(Listens, Seqpacket)>;
    type Seqpacket = Never<Seqpacket>;
    type SeqpacketConnecting = Never<(Connects, Seqpacket)>;
    type Datagram = Never<Datagrams>;

    fn local_cid() -> io::Result<u32> {
        unsupported()
    }
}

/// No condition can exist, so a wait has only its timeout to wait for.
impl Wait for Unsupported {
    type PollRef<'a> = Infallible;
    type RawPoll = Infallible;

    fn raw(ready: &Infallible) -> Option<Infallible> {
        match *ready {}
    }

    fn poll(entries: &[Infallible], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
        if let Some(&entry) = entries.first() {
            match entry {}
        }
        match timeout {
            Some(t) => {
                std::thread::sleep(t);
                Ok(Vec::new())
            }
            None => Err(io::Error::new(io::ErrorKind::InvalidInput, "poll: nothing to wait for")),
        }
    }

    fn wait_raw(
        keys: &[Infallible],
        timeout: Option<Duration>,
        _ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        Self::poll(keys, timeout).map(drop)
    }
}

impl<R: std::fmt::Debug> contract::Socket<Unsupported> for Never<R> {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        match self.0 {}
    }
    fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        match self.0 {}
    }
    fn readable(&self) -> Infallible {
        match self.0 {}
    }
}

impl<K: std::fmt::Debug> contract::Listener<Unsupported> for Never<(Listens, K)> {
    type Conn = Never<K>;
    fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    fn accept(&self) -> io::Result<(Never<K>, VsockAddr)> {
        match self.0 {}
    }
}

impl<K: std::fmt::Debug> contract::Connecting<Unsupported> for Never<(Connects, K)> {
    type Conn = Never<K>;
    fn start(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    fn finish(&mut self) -> io::Result<Never<K>> {
        match self.0 {}
    }
    fn ready(&self) -> Infallible {
        match self.0 {}
    }
}

impl<K: std::fmt::Debug> contract::Connection<Unsupported> for Never<K> {
    fn connect(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    fn peer_addr(&self) -> io::Result<VsockAddr> {
        match self.0 {}
    }
    fn shutdown(&self, _how: Shutdown) -> io::Result<()> {
        match self.0 {}
    }
    fn set_linger(&self, _linger: Option<Duration>) -> io::Result<()> {
        match self.0 {}
    }
    fn writable(&self) -> Infallible {
        match self.0 {}
    }
}

impl contract::ByteStream<Unsupported> for Never<Stream> {
    fn read(&self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
    fn write(&self, _buf: &[u8]) -> io::Result<usize> {
        match self.0 {}
    }
    fn flush(&self) -> io::Result<()> {
        match self.0 {}
    }
    fn recv_queued(&self) -> io::Result<usize> {
        match self.0 {}
    }
    fn send_queued(&self) -> io::Result<usize> {
        match self.0 {}
    }
}

impl contract::MessageStream<Unsupported> for Never<Seqpacket> {
    fn send(&self, _data: &[u8], _end_of_record: bool) -> io::Result<usize> {
        match self.0 {}
    }
    fn recv(&self, _buf: &mut [u8]) -> io::Result<RecvMessage> {
        match self.0 {}
    }
    fn recv_queued(&self) -> io::Result<usize> {
        match self.0 {}
    }
}

impl contract::Datagram<Unsupported> for Never<Datagrams> {
    fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    fn connect(&mut self, _peer: VsockAddr) -> io::Result<()> {
        match self.0 {}
    }
    fn send_to(&self, _buf: &[u8], _to: VsockAddr) -> io::Result<usize> {
        match self.0 {}
    }
    fn send(&self, _buf: &[u8]) -> io::Result<usize> {
        match self.0 {}
    }
    fn recv_from(&self, _buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        match self.0 {}
    }
    fn recv(&self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
    fn peer_addr(&self) -> io::Result<VsockAddr> {
        match self.0 {}
    }
    fn recv_queued(&self) -> io::Result<usize> {
        match self.0 {}
    }
    fn writable(&self) -> Infallible {
        match self.0 {}
    }
}
