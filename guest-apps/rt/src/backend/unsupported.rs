//! The stand-in for targets without a backend yet, so that apps and the SDK
//! still compile (and their tests and docs build) on the developer's own
//! machine. Every constructor fails with `Unsupported`; since no socket can
//! ever exist, the socket types are uninhabited and their methods are
//! `match *self {}`.

use std::convert::Infallible;
use std::io;
use std::marker::PhantomData;
use std::net::Shutdown;
use std::time::Duration;

use crate::{RecvMessage, VsockAddr};

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "pier-rt: vsock sockets are only implemented for wasm32-wasip2 so far",
    ))
}

pub(crate) fn local_cid() -> io::Result<u32> {
    unsupported()
}

#[derive(Debug)]
pub(crate) enum PollRef<'a> {
    #[allow(dead_code)]
    Never(Infallible, PhantomData<&'a ()>),
}

impl PollRef<'_> {
    pub(crate) fn raw(&self) -> Option<RawPoll> {
        match *self {
            PollRef::Never(never, _) => match never {},
        }
    }
}

/// No condition can exist here, so the reactor never holds one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawPoll {}

pub(crate) fn wait_raw(
    keys: &[RawPoll],
    timeout: Option<Duration>,
    _ready: &mut Vec<usize>,
) -> io::Result<()> {
    if let Some(&key) = keys.first() {
        match key {}
    }
    poll(&[], timeout).map(drop)
}

pub(crate) fn poll(entries: &[PollRef<'_>], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    if let Some(PollRef::Never(never, _)) = entries.first() {
        match *never {}
    }
    match timeout {
        Some(t) => {
            std::thread::sleep(t);
            Ok(Vec::new())
        }
        None => Err(io::Error::new(io::ErrorKind::InvalidInput, "poll: nothing to wait for")),
    }
}

/// A stream or seqpacket listener, by the connections it would accept:
/// the two cannot differ when neither can exist.
#[derive(Debug)]
pub(crate) struct ConnListener<C>(Infallible, PhantomData<C>);

pub(crate) type Listener = ConnListener<Stream>;
pub(crate) type SeqListener = ConnListener<SeqStream>;

impl<C> ConnListener<C> {
    pub(crate) fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    pub(crate) fn accept(&self) -> io::Result<(C, VsockAddr)> {
        match self.0 {}
    }
    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        match self.0 {}
    }
    pub(crate) fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        match self.0 {}
    }
    pub(crate) fn readable(&self) -> PollRef<'_> {
        match self.0 {}
    }
}

/// A connect under way; none can start here.
#[derive(Debug)]
pub(crate) struct Connecting<C>(Infallible, PhantomData<C>);

pub(crate) type StreamConnecting = Connecting<Stream>;
pub(crate) type SeqConnecting = Connecting<SeqStream>;

impl<C> Connecting<C> {
    pub(crate) fn start(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    pub(crate) fn finish(&mut self) -> io::Result<C> {
        match self.0 {}
    }
    pub(crate) fn ready(&self) -> PollRef<'_> {
        match self.0 {}
    }
}

#[derive(Debug)]
pub(crate) enum Stream {}

impl Stream {
    pub(crate) fn connect(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    pub(crate) fn read(&self, _buf: &mut [u8]) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn write(&self, _buf: &[u8]) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn flush(&self) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn shutdown(&self, _how: Shutdown) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn set_linger(&self, _linger: Option<Duration>) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn send_queued(&self) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn readable(&self) -> PollRef<'_> {
        match *self {}
    }
    pub(crate) fn writable(&self) -> PollRef<'_> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) enum SeqStream {}

impl SeqStream {
    pub(crate) fn connect(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    pub(crate) fn send(&self, _data: &[u8], _end_of_record: bool) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn recv(&self, _buf: &mut [u8]) -> io::Result<RecvMessage> {
        match *self {}
    }
    pub(crate) fn shutdown(&self, _how: Shutdown) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn set_linger(&self, _linger: Option<Duration>) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn readable(&self) -> PollRef<'_> {
        match *self {}
    }
    pub(crate) fn writable(&self) -> PollRef<'_> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) enum Datagram {}

impl Datagram {
    pub(crate) fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    pub(crate) fn connect(&mut self, _peer: VsockAddr) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn send_to(&self, _buf: &[u8], _to: VsockAddr) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn send(&self, _buf: &[u8]) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn recv_from(&self, _buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        match *self {}
    }
    pub(crate) fn recv(&self, _buf: &mut [u8]) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        match *self {}
    }
    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        match *self {}
    }
    pub(crate) fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn readable(&self) -> PollRef<'_> {
        match *self {}
    }
    pub(crate) fn writable(&self) -> PollRef<'_> {
        match *self {}
    }
}
