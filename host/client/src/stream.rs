//! vsock stream connections as host programs see them: dialled through
//! `<uds>` with the `CONNECT`/`OK` exchange ([`HybridStream`]), or
//! accepted from the guest at `<uds>_<port>` ([`HybridListener`]). After
//! the exchange the Unix stream *is* the vsock connection, so the type is
//! a thin wrapper that remembers the port and otherwise behaves like
//! `UnixStream`.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use pier_hybrid::{MAX_OK_LINE, connect_line, listener_path};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use crate::handshake::{self, at};
use crate::listen::SocketFile;

/// A vsock stream connection to a guest, over the backend's hybrid Unix
/// socket.
///
/// Reads and writes go straight to the Unix stream (no buffering here),
/// and everything the protocol promises carries over: `shutdown(Write)` is
/// a half-close the guest reads as end-of-file, and dropping it with
/// unread bytes resets the guest's connection (`docs/host-sockets.md`).
#[derive(Debug)]
pub struct HybridStream {
    inner: UnixStream,
    local_port: u32,
}

impl HybridStream {
    /// Connects to guest port `port` through the backend's socket `uds`.
    ///
    /// Without a timeout this waits as long as the backend does (pier
    /// answers or closes within about 2 seconds; other backends may not
    /// answer at all before the guest's driver is up: use
    /// [`Self::connect_timeout`] for those).
    pub fn connect(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let uds = uds.as_ref();
        let inner = UnixStream::connect(uds).map_err(|e| at(uds, e))?;
        Self::handshake(inner, uds, port, None)
    }

    /// [`Self::connect`], giving up with `TimedOut` when the whole exchange
    /// (the connect, the request, the answer) takes longer than `timeout`.
    /// The timeouts are cleared again on success.
    pub fn connect_timeout(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> io::Result<Self> {
        let uds = uds.as_ref();
        let deadline = Instant::now() + timeout;
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        // A Unix connect waits only while the listener's backlog is full,
        // bounded by the send timeout (poll-based connect timeouts do not
        // work for Unix sockets: they report a full backlog as success).
        socket.set_write_timeout(Some(nonzero(timeout)))?;
        let addr = SockAddr::unix(uds).map_err(|e| at(uds, e))?;
        socket.connect(&addr).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => handshake::timed_out(uds, port, timeout),
            _ => at(uds, e),
        })?;
        let inner = UnixStream::from(OwnedFd::from(socket));
        let stream = Self::handshake(inner, uds, port, Some(deadline))?;
        stream.inner.set_read_timeout(None)?;
        stream.inner.set_write_timeout(None)?;
        Ok(stream)
    }

    /// Sends `CONNECT` on a connected Unix stream and reads the answer,
    /// taking nothing after its newline: bytes the guest sends at once
    /// stay in the socket for the caller.
    fn handshake(
        inner: UnixStream,
        uds: &Path,
        port: u32,
        deadline: Option<Instant>,
    ) -> io::Result<Self> {
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if let Some(left) = timeout {
            inner.set_write_timeout(Some(nonzero(left)))?;
        }
        let request = (&inner).write_all(connect_line(port).as_bytes());
        handshake::sent(request, uds, port, timeout)?;
        let line = read_line(&inner, uds, port, deadline, timeout)?;
        let local_port = handshake::answer(uds, port, &line)?;
        Ok(Self { inner, local_port })
    }

    /// A connection the guest made, accepted by a [`HybridListener`]: no
    /// exchange happens on those, the port is the host port the guest
    /// dialled.
    fn accepted(inner: UnixStream, local_port: u32) -> Self {
        Self { inner, local_port }
    }

    /// The host-side port of the connection: what the backend named in
    /// its `OK` answer (pier: the port it chose, which captures and logs
    /// show; vhost-device-vsock: the guest port), or for an accepted
    /// connection the host port the guest dialled.
    pub fn local_port(&self) -> u32 {
        self.local_port
    }

    /// Half- or fully closes the connection; `Shutdown::Write` reaches the
    /// guest as end-of-file while its answer keeps coming.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.shutdown(how)
    }

    /// See [`UnixStream::set_read_timeout`]; a read that times out fails
    /// with `WouldBlock`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }

    /// See [`UnixStream::set_write_timeout`].
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.set_write_timeout(timeout)
    }

    /// See [`UnixStream::read_timeout`].
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        self.inner.read_timeout()
    }

    /// See [`UnixStream::write_timeout`].
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        self.inner.write_timeout()
    }

    /// See [`UnixStream::set_nonblocking`]: for event loops that poll the
    /// descriptor themselves.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// A second handle on the same connection, for a reader and a writer
    /// on two threads.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { inner: self.inner.try_clone()?, local_port: self.local_port })
    }

    /// The Unix stream, for what this type does not wrap (socket options).
    pub fn get_ref(&self) -> &UnixStream {
        &self.inner
    }

    /// The bare Unix stream: after the exchange it is the connection, so
    /// nothing is lost by dropping the wrapper.
    pub fn into_inner(self) -> UnixStream {
        self.inner
    }
}

/// Reads the answer line without reading past its newline: peeks at what
/// has arrived and consumes only the line's bytes (two system calls for a
/// whole answer rather than one per byte). An empty result means the
/// backend closed (or reset) the connection before saying anything.
fn read_line(
    stream: &UnixStream,
    uds: &Path,
    port: u32,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
) -> io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(16);
    let mut buf = [0u8; MAX_OK_LINE];
    loop {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(handshake::timed_out(uds, port, timeout.unwrap_or_default()));
            }
            stream.set_read_timeout(Some(left))?;
        }
        let room = MAX_OK_LINE - line.len();
        if room == 0 {
            return Err(handshake::garbage(uds, port, &line));
        }
        let seen = match SockRef::from(stream).peek(uninit(&mut buf[..room])) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                handshake::classify_read_error(uds, port, timeout, e)?;
                0
            }
        };
        if seen == 0 {
            // A line cut off by the close is as wrong as a bad one.
            return if line.is_empty() {
                Ok(line)
            } else {
                Err(handshake::garbage(uds, port, &line))
            };
        }
        let take = buf[..seen].iter().position(|&b| b == b'\n').map_or(seen, |i| i + 1);
        let mut reader = stream;
        reader.read_exact(&mut buf[..take])?;
        line.extend_from_slice(&buf[..take]);
        if line.ends_with(b"\n") {
            return Ok(line);
        }
    }
}

/// `buf` as the uninitialised-memory view socket2's receive calls take.
pub(crate) fn uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and socket2's
    // receive functions promise to write only initialised bytes through
    // it (see `Socket::recv_vectored`), so `buf` stays initialised.
    unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) }
}

/// Socket timeouts of zero mean "none"; the smallest real one instead.
pub(crate) fn nonzero(timeout: Duration) -> Duration {
    timeout.max(Duration::from_micros(1))
}

impl Read for HybridStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.inner.read_vectored(bufs)
    }
}

impl Read for &HybridStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.inner).read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&self.inner).read_vectored(bufs)
    }
}

impl Write for HybridStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.inner.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &HybridStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&self.inner).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.inner).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for HybridStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for HybridStream {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl From<HybridStream> for UnixStream {
    fn from(stream: HybridStream) -> Self {
        stream.inner
    }
}

impl From<HybridStream> for OwnedFd {
    fn from(stream: HybridStream) -> Self {
        stream.inner.into()
    }
}

/// Accepts the guest's vsock stream connections to one host port.
///
/// The backend connects to `<uds>_<port>` whenever the guest dials
/// `(CID 2, port)`, with no exchange: the accepted stream is the
/// connection. If nothing listens there, the guest's connect fails at
/// once with a reset, so bind before the guest dials. The socket file is
/// removed when the listener is dropped.
#[derive(Debug)]
pub struct HybridListener {
    inner: UnixListener,
    file: SocketFile,
    port: u32,
}

impl HybridListener {
    /// Listens at `<uds>_<port>` for the guest's connections to host port
    /// `port`. A stale socket file there (a crashed program's) is
    /// replaced; one a live program answers on fails with `AddrInUse`.
    pub fn bind(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let path = listener_path(uds, port);
        let (inner, file) =
            SocketFile::bind(&path, Type::STREAM, |p: &Path| UnixListener::bind(p))?;
        Ok(Self { inner, file, port })
    }

    /// Waits for the guest's next connection.
    pub fn accept(&self) -> io::Result<HybridStream> {
        let (stream, _) = self.inner.accept()?;
        Ok(HybridStream::accepted(stream, self.port))
    }

    /// The guest's connections, one after another, for a `for` loop.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The host port this listener serves.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// The socket file, `<uds>_<port>`.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// See [`UnixListener::set_nonblocking`].
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner.set_nonblocking(nonblocking)
    }

    /// The bare listener; its socket file then stays when it goes (the
    /// caller owns the name from here on).
    pub fn into_inner(self) -> UnixListener {
        self.file.keep();
        self.inner
    }
}

impl AsFd for HybridListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for HybridListener {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

/// The iterator of [`HybridListener::incoming`]; never ends.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a HybridListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<HybridStream>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept())
    }
}
