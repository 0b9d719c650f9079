//! The same hybrid vsock types for tokio programs (the `tokio` feature):
//! same names, same paths, same framings, same errors as the blocking
//! ones at the crate root, with `async` calls on tokio's Unix sockets
//! (`AsyncFd` for seqpacket, which tokio has no type for).
//!
//! The blocking types would tie up a runtime thread per call; these wait
//! on readiness instead. What each type is for is documented on its
//! blocking twin.

use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use ::tokio::net::{UnixDatagram, UnixListener, UnixStream};
use pier_hybrid::{
    DATAGRAM_HEADER_LEN, MAX_OK_LINE, connect_line, listener_path, seqpacket_flags, seqpacket_path,
};
use socket2::{Domain, MaybeUninitSlice, SockAddr, SockRef, Socket, Type};

use crate::datagram::{self, Endpoint};
use crate::handshake::{self, at};
use crate::listen::SocketFile;
use crate::seqpacket;
use crate::stream::uninit;

/// Hands a socket to tokio's reactor.
fn register(socket: Socket) -> io::Result<AsyncFd<Socket>> {
    // SAFETY: the `Socket` owns its descriptor: it stays open, and the
    // same, until the `AsyncFd` drops the `Socket` with it.
    Ok(unsafe { AsyncFd::register(socket) }?)
}

/// Runs `exchange` for at most `timeout`, reporting the end of the time
/// as every blocking type does.
async fn within<T>(
    path: &Path,
    port: u32,
    timeout: Duration,
    exchange: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match ::tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(handshake::timed_out(path, port, timeout)),
    }
}

/// The async [`crate::HybridStream`]: a tokio `UnixStream` after the
/// `CONNECT`/`OK` exchange, with `AsyncRead` and `AsyncWrite`.
#[derive(Debug)]
pub struct HybridStream {
    inner: UnixStream,
    local_port: u32,
}

impl HybridStream {
    /// Connects to guest port `port` through `uds`; see
    /// [`crate::HybridStream::connect`].
    pub async fn connect(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let uds = uds.as_ref();
        let mut inner = UnixStream::connect(uds).await.map_err(|e| at(uds, e))?;
        let request = inner.write_all(connect_line(port).as_bytes()).await;
        handshake::sent(request, uds, port, None)?;
        // One byte at a time, so nothing after the newline is taken.
        let mut line = Vec::with_capacity(16);
        let mut byte = [0u8];
        while !line.ends_with(b"\n") {
            if line.len() == MAX_OK_LINE {
                return Err(handshake::garbage(uds, port, &line));
            }
            match inner.read(&mut byte).await {
                Ok(0) if line.is_empty() => break,
                Ok(0) => return Err(handshake::garbage(uds, port, &line)),
                Ok(_) => line.push(byte[0]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    handshake::classify_read_error(uds, port, None, e)?;
                    break;
                }
            }
        }
        let local_port = handshake::answer(uds, port, &line)?;
        Ok(Self { inner, local_port })
    }

    /// [`Self::connect`], giving up with `TimedOut` after `timeout`.
    pub async fn connect_timeout(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> io::Result<Self> {
        let uds = uds.as_ref();
        within(uds, port, timeout, Self::connect(uds, port)).await
    }

    /// See [`crate::HybridStream::local_port`].
    pub fn local_port(&self) -> u32 {
        self.local_port
    }

    /// The tokio stream, for what this type does not wrap (`split`,
    /// readiness).
    pub fn get_ref(&self) -> &UnixStream {
        &self.inner
    }

    /// The bare tokio stream: after the exchange it is the connection.
    pub fn into_inner(self) -> UnixStream {
        self.inner
    }
}

impl AsyncRead for HybridStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HybridStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    /// Half-closes: the guest reads end-of-file, its answer keeps coming.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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

/// The async [`crate::HybridListener`]: the guest's stream connections to
/// one host port.
#[derive(Debug)]
pub struct HybridListener {
    inner: UnixListener,
    file: SocketFile,
    port: u32,
}

impl HybridListener {
    /// Listens at `<uds>_<port>`; see [`crate::HybridListener::bind`].
    /// Must be called inside a tokio runtime.
    pub fn bind(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let path = listener_path(uds, port);
        let (inner, file) =
            SocketFile::bind(&path, Type::STREAM, |p: &Path| UnixListener::bind(p))?;
        Ok(Self { inner, file, port })
    }

    /// Waits for the guest's next connection.
    pub async fn accept(&self) -> io::Result<HybridStream> {
        let (inner, _) = self.inner.accept().await?;
        Ok(HybridStream { inner, local_port: self.port })
    }

    /// The host port this listener serves.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// The socket file, `<uds>_<port>`.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// The async [`crate::HybridSeqpacket`]: one vsock message per call, the
/// flags byte hidden.
#[derive(Debug)]
pub struct HybridSeqpacket {
    fd: AsyncFd<Socket>,
    local_port: u32,
}

impl HybridSeqpacket {
    /// Connects to guest port `port` through `<uds>_seqpacket`; see
    /// [`crate::HybridSeqpacket::connect`].
    pub async fn connect(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let path = seqpacket_path(uds);
        let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        socket.set_nonblocking(true)?;
        let _ = socket.set_send_buffer_size(seqpacket::SEND_BUFFER);
        let addr = SockAddr::unix(&path).map_err(|e| at(&path, e))?;
        // A Unix connect completes at once; only a full backlog makes it
        // fail with `WouldBlock` (as tokio's own `UnixStream::connect`).
        socket.connect(&addr).map_err(|e| at(&path, e))?;
        let fd = register(socket)?;
        let request = connect_line(port);
        let sent = fd.async_io(Interest::WRITABLE, |s| s.send(request.as_bytes())).await;
        handshake::sent(sent, &path, port, None)?;
        let mut answer = [0u8; MAX_OK_LINE];
        let n = match fd.async_io(Interest::READABLE, |s| s.recv(uninit(&mut answer))).await {
            Ok(n) => n,
            Err(e) => {
                handshake::classify_read_error(&path, port, None, e)?;
                0
            }
        };
        let local_port = handshake::answer(&path, port, &answer[..n])?;
        Ok(Self { fd, local_port })
    }

    /// [`Self::connect`], giving up with `TimedOut` after `timeout`.
    pub async fn connect_timeout(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> io::Result<Self> {
        let uds = uds.as_ref();
        within(&seqpacket_path(uds), port, timeout, Self::connect(uds, port)).await
    }

    /// Sends one vsock message; see [`crate::HybridSeqpacket::send`].
    pub async fn send(&self, message: &[u8], eor: bool) -> io::Result<()> {
        let flags = [seqpacket_flags(eor)];
        let parts = [IoSlice::new(&flags), IoSlice::new(message)];
        self.fd.async_io(Interest::WRITABLE, |s| s.send_vectored(&parts)).await?;
        Ok(())
    }

    /// Receives one vsock message: its length and end-of-record mark,
    /// `(0, false)` at end-of-file; see [`crate::HybridSeqpacket::recv`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        let room = buf.len();
        let mut flags = [0u8];
        let (n, recv_flags) = self
            .fd
            .async_io(Interest::READABLE, |s| {
                let mut parts =
                    [MaybeUninitSlice::new(uninit(&mut flags)), MaybeUninitSlice::new(uninit(buf))];
                s.recv_vectored(&mut parts)
            })
            .await?;
        seqpacket::decode(n, flags[0], recv_flags.is_truncated(), room)
    }

    /// See [`crate::HybridSeqpacket::local_port`].
    pub fn local_port(&self) -> u32 {
        self.local_port
    }

    /// Half- or fully closes the connection.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.fd.get_ref().shutdown(how)
    }
}

impl AsFd for HybridSeqpacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

impl AsRawFd for HybridSeqpacket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The async [`crate::HybridSeqpacketListener`].
#[derive(Debug)]
pub struct HybridSeqpacketListener {
    fd: AsyncFd<Socket>,
    file: SocketFile,
    port: u32,
}

impl HybridSeqpacketListener {
    /// Listens at `<uds>_<port>` for the guest's seqpacket connections.
    /// Must be called inside a tokio runtime.
    pub fn bind(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let (socket, file) = seqpacket::bind_listener(uds.as_ref(), port, true)?;
        Ok(Self { fd: register(socket)?, file, port })
    }

    /// Waits for the guest's next connection.
    pub async fn accept(&self) -> io::Result<HybridSeqpacket> {
        let (socket, _) = self.fd.async_io(Interest::READABLE, |s| s.accept()).await?;
        socket.set_nonblocking(true)?;
        let _ = socket.set_send_buffer_size(seqpacket::SEND_BUFFER);
        Ok(HybridSeqpacket { fd: register(socket)?, local_port: self.port })
    }

    /// The host port this listener serves.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// The socket file, `<uds>_<port>`.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// The async [`crate::HybridDatagram`]: the 8-byte ports header hidden.
#[derive(Debug)]
pub struct HybridDatagram {
    socket: UnixDatagram,
    endpoint: Endpoint,
}

impl HybridDatagram {
    /// Binds host port `local_port` at `<uds>_dgram_<local_port>`; see
    /// [`crate::HybridDatagram::bind`]. Must be called inside a tokio
    /// runtime.
    pub fn bind(uds: impl AsRef<Path>, local_port: u32) -> io::Result<Self> {
        let bind = |p: &Path| UnixDatagram::bind(p);
        let (socket, endpoint) = Endpoint::bind(uds.as_ref(), local_port, bind)?;
        Ok(Self { socket, endpoint })
    }

    /// Sends `payload` to the guest's port `guest_port`; see
    /// [`crate::HybridDatagram::send_to`].
    pub async fn send_to(&self, guest_port: u32, payload: &[u8]) -> io::Result<usize> {
        let header = self.endpoint.header(guest_port, payload)?;
        let parts = [IoSlice::new(&header), IoSlice::new(payload)];
        let sent = self
            .socket
            .async_io(Interest::WRITABLE, || {
                SockRef::from(&self.socket).send_to_vectored(&parts, self.endpoint.backend())
            })
            .await;
        self.endpoint.sent(sent)
    }

    /// Receives one datagram: the payload's length and the guest port it
    /// came from; see [`crate::HybridDatagram::recv_from`].
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, u32)> {
        let room = buf.len();
        let mut header = [0u8; DATAGRAM_HEADER_LEN];
        let (n, flags) = self
            .socket
            .async_io(Interest::READABLE, || {
                let mut parts = [
                    MaybeUninitSlice::new(uninit(&mut header)),
                    MaybeUninitSlice::new(uninit(buf)),
                ];
                SockRef::from(&self.socket).recv_vectored(&mut parts)
            })
            .await?;
        datagram::decode(n, &header, flags.is_truncated(), room)
    }

    /// The host port this socket is bound to.
    pub fn local_port(&self) -> u32 {
        self.endpoint.local_port()
    }

    /// The socket file, `<uds>_dgram_<port>`.
    pub fn path(&self) -> &Path {
        self.endpoint.path()
    }
}

impl AsFd for HybridDatagram {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for HybridDatagram {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}
