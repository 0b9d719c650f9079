//! The stand-in for targets without a platform, so that apps and the SDK
//! still compile (and their docs build) on the developer's own machine.
//! Every constructor fails with `Unsupported`, so no socket can ever
//! exist: every socket type is a [`Never`], and its methods are
//! `match self.0 {}`.

use std::convert::Infallible;
use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::net::Shutdown;
use std::time::Duration;

use super::contract::{self, Platform, Wait};
use crate::addr::VsockAddr;
use crate::kind::{Seqpacket, Stream};
use crate::message::RecvMessage;

/// The platform of a target pier-rt has none for.
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
/// as a real platform's socket types do.
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

impl Platform for Unsupported {
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

/// No condition can exist, so a wait has only its timeout to wait out.
impl Wait for Unsupported {
    type PollRef<'a> = Infallible;
    type RawPoll = Infallible;

    fn raw(ready: &Infallible) -> Option<Infallible> {
        match *ready {}
    }

    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<Infallible>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        for i in 0..count {
            match condition(i) {
                Some(never) => match never {},
                None => ready.push(i),
            }
        }
        if let (0, Some(t)) = (count, timeout) {
            std::thread::sleep(t);
        }
        Ok(())
    }
}

/// Methods whose receiver cannot exist: each body is `match self.0 {}`.
macro_rules! never {
    ($(fn $name:ident(&self $(, $arg:ty)*) -> $ret:ty;)*) => {
        $(fn $name(&self $(, _: $arg)*) -> $ret { match self.0 {} })*
    };
}

impl<R: Debug> contract::Socket<Unsupported> for Never<R> {
    never! {
        fn local_addr(&self) -> io::Result<VsockAddr>;
        fn set_nonblocking(&self, bool) -> io::Result<()>;
        fn readable(&self) -> Infallible;
    }
}

impl<K: Debug> contract::Listener<Unsupported> for Never<(Listens, K)> {
    type Conn = Never<K>;
    fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    never! {
        fn accept(&self) -> io::Result<(Never<K>, VsockAddr)>;
    }
}

impl<K: Debug> contract::Connecting<Unsupported> for Never<(Connects, K)> {
    type Conn = Never<K>;
    fn start(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    fn finish(&mut self) -> io::Result<Never<K>> {
        match self.0 {}
    }
    never! {
        fn ready(&self) -> Infallible;
    }
}

impl<K: Debug> contract::Connection<Unsupported> for Never<K> {
    fn connect(_addr: VsockAddr, _timeout: Option<Duration>) -> io::Result<Self> {
        unsupported()
    }
    never! {
        fn peer_addr(&self) -> io::Result<VsockAddr>;
        fn shutdown(&self, Shutdown) -> io::Result<()>;
        fn set_linger(&self, Option<Duration>) -> io::Result<()>;
        fn writable(&self) -> Infallible;
    }
}

impl contract::ByteStream<Unsupported> for Never<Stream> {
    never! {
        fn read(&self, &mut [u8]) -> io::Result<usize>;
        fn write(&self, &[u8]) -> io::Result<usize>;
        fn flush(&self) -> io::Result<()>;
        fn recv_queued(&self) -> io::Result<usize>;
        fn send_queued(&self) -> io::Result<usize>;
    }
}

impl contract::MessageStream<Unsupported> for Never<Seqpacket> {
    never! {
        fn send(&self, &[u8], bool) -> io::Result<usize>;
        fn recv(&self, &mut [u8]) -> io::Result<RecvMessage>;
        fn recv_queued(&self) -> io::Result<usize>;
    }
}

impl contract::Datagram<Unsupported> for Never<Datagrams> {
    fn bind(_addr: VsockAddr) -> io::Result<Self> {
        unsupported()
    }
    fn connect(&mut self, _peer: VsockAddr) -> io::Result<()> {
        match self.0 {}
    }
    never! {
        fn send_to(&self, &[u8], VsockAddr) -> io::Result<usize>;
        fn send(&self, &[u8]) -> io::Result<usize>;
        fn recv_from(&self, &mut [u8]) -> io::Result<(usize, VsockAddr)>;
        fn recv(&self, &mut [u8]) -> io::Result<usize>;
        fn peer_addr(&self) -> io::Result<VsockAddr>;
        fn recv_queued(&self) -> io::Result<usize>;
        fn writable(&self) -> Infallible;
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use crate::addr::{VMADDR_CID_LOCAL, VsockAddr};
    use crate::platform::contract::{
        Connecting as _, Connection as _, Datagram as _, Listener as _, Platform, Wait,
    };
    use crate::platform::unsupported::Unsupported;

    fn assert_unsupported<T>(result: io::Result<T>) {
        match result {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}"),
            Ok(_) => panic!("a socket came into being on a target without a platform"),
        }
    }

    #[test]
    fn every_way_to_a_socket_fails_with_unsupported() {
        let addr = VsockAddr::new(VMADDR_CID_LOCAL, 1234);
        type B = Unsupported;
        assert_unsupported(<B as Platform>::local_cid());
        assert_unsupported(<B as Platform>::StreamListener::bind(addr));
        assert_unsupported(<B as Platform>::Stream::connect(addr, None));
        assert_unsupported(<B as Platform>::StreamConnecting::start(addr, None));
        assert_unsupported(<B as Platform>::SeqpacketListener::bind(addr));
        assert_unsupported(<B as Platform>::Seqpacket::connect(addr, None));
        assert_unsupported(<B as Platform>::SeqpacketConnecting::start(addr, None));
        assert_unsupported(<B as Platform>::Datagram::bind(addr));
    }

    #[test]
    fn a_wait_with_a_timeout_returns_nothing_ready() {
        let mut ready = vec![];
        Unsupported::wait_any(0, |_| None, Some(Duration::from_millis(1)), &mut ready).unwrap();
        assert!(ready.is_empty());
    }
}
