//! The `std::net` items apps name besides vsock: [`Shutdown`], and TCP.
//!
//! On hosted targets these are std's own. On bare metal a pier unikernel
//! has vsock and nothing else, so [`Shutdown`] is a stand-in with std's
//! variants, and the TCP types exist only so that an app with a TCP mode
//! (bench-echo's baseline, probe's wasi:sockets checks) compiles
//! unchanged: binding fails with `Unsupported`, and since no TCP socket
//! can then exist, their methods can never run.

#[cfg(not(target_os = "none"))]
pub use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};

#[cfg(target_os = "none")]
pub use bare::*;

#[cfg(target_os = "none")]
mod bare {
    use core::convert::Infallible;

    pub use core::net::SocketAddr;

    use crate::io::{self, Read, Write};

    /// Like `std::net::Shutdown`: which directions to shut down.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Shutdown {
        /// No more receiving.
        Read,
        /// No more sending: the half-close.
        Write,
        /// Both.
        Both,
    }

    /// What `TcpListener::bind` accepts, as std's `ToSocketAddrs` does
    /// for the forms apps use.
    pub trait ToSocketAddrs {}
    impl ToSocketAddrs for SocketAddr {}
    impl ToSocketAddrs for (&str, u16) {}
    impl ToSocketAddrs for (core::net::IpAddr, u16) {}

    fn no_tcp() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "pier-rt: a unikernel has no TCP, only vsock")
    }

    /// `std::net::TcpListener`'s stand-in: [`bind`](Self::bind) always
    /// fails with `Unsupported`.
    #[derive(Debug)]
    pub struct TcpListener(Infallible);

    impl TcpListener {
        /// Fails: there is no TCP on bare metal.
        pub fn bind(_addr: impl ToSocketAddrs) -> io::Result<Self> {
            Err(no_tcp())
        }

        /// Never runs (no listener can exist).
        pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
            match self.0 {}
        }
    }

    /// `std::net::TcpStream`'s stand-in; none can exist.
    #[derive(Debug)]
    pub struct TcpStream(Infallible);

    impl TcpStream {
        /// Never runs.
        pub fn shutdown(&self, _how: Shutdown) -> io::Result<()> {
            match self.0 {}
        }
    }

    impl Read for TcpStream {
        fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
            match self.0 {}
        }
    }

    impl Write for TcpStream {
        fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
            match self.0 {}
        }
        fn flush(&mut self) -> io::Result<()> {
            match self.0 {}
        }
    }
}
