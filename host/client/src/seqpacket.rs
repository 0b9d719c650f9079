//! vsock seqpacket connections as host programs see them: dialled through
//! `<uds>_seqpacket` ([`HybridSeqpacket`]), or accepted from the guest at
//! a `SOCK_SEQPACKET` listener on `<uds>_<port>`
//! ([`HybridSeqpacketListener`]).
//!
//! Each vsock message is one Unix `SOCK_SEQPACKET` message with a flags
//! byte in front (bit 0: end of record; `pier_hybrid` defines it), because
//! Linux's Unix seqpacket sockets drop `MSG_EOR`, and because the byte
//! tells an empty message from end-of-file. This module adds and strips
//! that byte with vectored calls, so callers never copy their messages to
//! make room for it.

use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use pier_hybrid::{
    MAX_OK_LINE, SEQPACKET_FLAGS_LEN, connect_line, decode_seqpacket_flags, listener_path,
    seqpacket_flags, seqpacket_path,
};
use socket2::{Domain, MaybeUninitSlice, SockAddr, Socket, Type};

use crate::handshake::{self, at};
use crate::listen::SocketFile;
use crate::stream::{nonzero, uninit};

/// The largest vsock message a guest with the default socket buffer
/// (256 KiB) sends or accepts: a receive buffer this big never truncates.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// Send buffer asked for at connect: the kernel refuses (`EMSGSIZE`) a
/// seqpacket message larger than the socket's send buffer, and the
/// default (about 208 KiB) is smaller than [`MAX_MESSAGE`] plus its flags
/// byte. Linux doubles what it is given, up to twice `wmem_max`.
pub(crate) const SEND_BUFFER: usize = 2 * MAX_MESSAGE;

/// A vsock seqpacket connection to (or from) a guest.
///
/// [`send`](Self::send) and [`recv`](Self::recv) move one message each,
/// with its end-of-record mark beside it rather than in the bytes.
#[derive(Debug)]
pub struct HybridSeqpacket {
    socket: Socket,
    local_port: u32,
}

impl HybridSeqpacket {
    /// Connects to guest port `port` through `<uds>_seqpacket` (the path
    /// is derived from `uds`, the stream socket's path, as for every
    /// other type).
    pub fn connect(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        Self::dial(uds.as_ref(), port, None)
    }

    /// [`Self::connect`], giving up with `TimedOut` after `timeout`.
    pub fn connect_timeout(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> io::Result<Self> {
        Self::dial(uds.as_ref(), port, Some(timeout))
    }

    fn dial(uds: &Path, port: u32, timeout: Option<Duration>) -> io::Result<Self> {
        let path = seqpacket_path(uds);
        let deadline = timeout.map(|t| Instant::now() + t);
        let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        let _ = socket.set_send_buffer_size(SEND_BUFFER);
        if let Some(timeout) = timeout {
            socket.set_write_timeout(Some(nonzero(timeout)))?;
        }
        let addr = SockAddr::unix(&path).map_err(|e| at(&path, e))?;
        let expired = || handshake::timed_out(&path, port, timeout.unwrap_or_default());
        socket.connect(&addr).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => expired(),
            _ => at(&path, e),
        })?;
        let request = socket.send(connect_line(port).as_bytes());
        handshake::sent(request, &path, port, timeout)?;
        let mut answer = [0u8; MAX_OK_LINE];
        let n = loop {
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(expired());
                }
                socket.set_read_timeout(Some(left))?;
            }
            match socket.recv(uninit(&mut answer)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    handshake::classify_read_error(&path, port, timeout, e)?;
                    break 0;
                }
            }
        };
        let local_port = handshake::answer(&path, port, &answer[..n])?;
        socket.set_read_timeout(None)?;
        socket.set_write_timeout(None)?;
        Ok(Self { socket, local_port })
    }

    /// Sends one vsock message; `eor` marks it as the end of a record.
    /// The message must fit the guest's socket buffer ([`MAX_MESSAGE`] by
    /// default), or the backend resets the connection.
    pub fn send(&self, message: &[u8], eor: bool) -> io::Result<()> {
        let flags = [seqpacket_flags(eor)];
        let sent = self.socket.send_vectored(&[IoSlice::new(&flags), IoSlice::new(message)])?;
        debug_assert_eq!(
            sent,
            SEQPACKET_FLAGS_LEN + message.len(),
            "seqpacket sends are all or nothing"
        );
        Ok(())
    }

    /// Receives one vsock message into `buf`: its length, and whether it
    /// ends a record. End-of-file is `(0, false)` (vsock never carries an
    /// empty message, so nothing else reads as that).
    ///
    /// A message larger than `buf` is an `InvalidInput` error (its bytes
    /// are lost, as Unix seqpacket drops what does not fit): receive into
    /// [`MAX_MESSAGE`] bytes to never see it. Unknown flag bits from the
    /// backend are `InvalidData`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        let mut flags = [0u8];
        let len = buf.len();
        let mut parts =
            [MaybeUninitSlice::new(uninit(&mut flags)), MaybeUninitSlice::new(uninit(buf))];
        let (n, recv_flags) = self.socket.recv_vectored(&mut parts)?;
        decode(n, flags[0], recv_flags.is_truncated(), len)
    }

    /// The host-side port: the one the backend named in its `OK` answer,
    /// or for an accepted connection the host port the guest dialled.
    pub fn local_port(&self) -> u32 {
        self.local_port
    }

    /// Half- or fully closes the connection; `Shutdown::Write` reaches the
    /// guest as end-of-file while its messages keep coming.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket.shutdown(how)
    }

    /// A receive that times out fails with `WouldBlock`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }

    /// Bounds how long [`Self::send`] waits for room.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_write_timeout(timeout)
    }

    /// For event loops that poll the descriptor themselves.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.socket.set_nonblocking(nonblocking)
    }

    /// A second handle on the same connection, for a sender and a
    /// receiver on two threads.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { socket: self.socket.try_clone()?, local_port: self.local_port })
    }

    /// The bare socket (std has no seqpacket type, so a descriptor): the
    /// messages on it carry the flags byte from here on.
    pub fn into_fd(self) -> OwnedFd {
        self.socket.into()
    }
}

/// A `SOCK_SEQPACKET` listener at `<uds>_<port>`, for both listener
/// types (tokio's wants it non-blocking).
pub(crate) fn bind_listener(
    uds: &Path,
    port: u32,
    nonblocking: bool,
) -> io::Result<(Socket, SocketFile)> {
    let bind = |path: &Path| {
        let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        socket.set_nonblocking(nonblocking)?;
        socket.bind(&SockAddr::unix(path)?)?;
        socket.listen(128)?;
        Ok(socket)
    };
    SocketFile::bind(&listener_path(uds, port), Type::SEQPACKET, bind)
}

/// The outcome of one framed receive of `n` bytes (flags byte included).
pub(crate) fn decode(
    n: usize,
    flags: u8,
    truncated: bool,
    room: usize,
) -> io::Result<(usize, bool)> {
    if n == 0 {
        return Ok((0, false));
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a seqpacket message did not fit the {room}-byte buffer and was cut short"),
        ));
    }
    match decode_seqpacket_flags(flags) {
        Ok(eor) => Ok((n - SEQPACKET_FLAGS_LEN, eor)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a seqpacket message with unknown flags {flags:#04x}"),
        )),
    }
}

impl AsFd for HybridSeqpacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for HybridSeqpacket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl From<HybridSeqpacket> for OwnedFd {
    fn from(conn: HybridSeqpacket) -> Self {
        conn.into_fd()
    }
}

/// Accepts the guest's vsock seqpacket connections to one host port.
///
/// vsock stream and seqpacket share one port space, so a port is served
/// by one type: the backend connects to `<uds>_<port>` with the guest's
/// socket type, and a listener of the other type makes the guest's
/// connect fail with a reset. The socket file is removed when the
/// listener is dropped.
#[derive(Debug)]
pub struct HybridSeqpacketListener {
    socket: Socket,
    file: SocketFile,
    port: u32,
}

impl HybridSeqpacketListener {
    /// Listens at `<uds>_<port>` for the guest's seqpacket connections to
    /// host port `port` (a stale socket file there is replaced).
    pub fn bind(uds: impl AsRef<Path>, port: u32) -> io::Result<Self> {
        let (socket, file) = bind_listener(uds.as_ref(), port, false)?;
        Ok(Self { socket, file, port })
    }

    /// Waits for the guest's next connection.
    pub fn accept(&self) -> io::Result<HybridSeqpacket> {
        let (socket, _) = self.socket.accept()?;
        let _ = socket.set_send_buffer_size(SEND_BUFFER);
        Ok(HybridSeqpacket { socket, local_port: self.port })
    }

    /// The guest's connections, one after another; never ends.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<HybridSeqpacket>> + '_ {
        std::iter::repeat_with(|| self.accept())
    }

    /// The host port this listener serves.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// The socket file, `<uds>_<port>`.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// For event loops that poll the descriptor themselves.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.socket.set_nonblocking(nonblocking)
    }
}

impl AsFd for HybridSeqpacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for HybridSeqpacketListener {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}
