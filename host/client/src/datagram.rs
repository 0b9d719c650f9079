//! vsock datagrams as host programs see them ([`HybridDatagram`]).
//!
//! One Unix `SOCK_DGRAM` datagram is one vsock datagram with an 8-byte
//! header in front: the guest port, then the host port, both `u32`
//! little-endian. A host program binds `<uds>_dgram_<port>` to receive the
//! guest's datagrams to host port `port`, and sends its own to the
//! backend's `<uds>_dgram`. This module writes and strips the header
//! (`pier_hybrid`'s) with vectored calls, so payloads are never copied to
//! make room for it.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pier_hybrid::{
    DATAGRAM_HEADER_LEN, datagram_path, datagram_receiver_path, decode_datagram_ports,
    encode_datagram_header,
};
use socket2::{MaybeUninitSlice, SockAddr, SockRef, Type};

use crate::handshake::at;
use crate::listen::SocketFile;
use crate::stream::uninit;

/// The largest payload the backend passes on (64 KiB, the vsock datagram
/// proposal's limit); larger ones are dropped without a word, so
/// [`HybridDatagram::send_to`] refuses them instead.
pub const MAX_DATAGRAM: usize = 64 * 1024;

/// A host datagram socket at one host port, for datagrams to and from any
/// port of one guest.
///
/// Datagrams are unreliable here as in vsock: the backend drops what the
/// guest has no socket or no room for, and this socket's kernel queue
/// holds only `net.unix.max_dgram_qlen` datagrams (10 by default), so a
/// program expecting bursts should receive on its own thread. The socket
/// file is removed when this is dropped.
#[derive(Debug)]
pub struct HybridDatagram {
    socket: UnixDatagram,
    endpoint: Endpoint,
}

/// What both datagram types (blocking and tokio) keep beside their
/// socket, and the checks they share.
#[derive(Debug)]
pub(crate) struct Endpoint {
    file: SocketFile,
    backend: SockAddr,
    backend_path: PathBuf,
    local_port: u32,
}

impl Endpoint {
    /// Binds `<uds>_dgram_<local_port>` with `bind`, and notes where the
    /// backend's `<uds>_dgram` is.
    pub(crate) fn bind<T>(
        uds: &Path,
        local_port: u32,
        bind: impl FnMut(&Path) -> io::Result<T>,
    ) -> io::Result<(T, Self)> {
        let path = datagram_receiver_path(uds, local_port);
        let (socket, file) = SocketFile::bind(&path, Type::DGRAM, bind)?;
        let backend_path = datagram_path(uds);
        let backend = SockAddr::unix(&backend_path).map_err(|e| at(&backend_path, e))?;
        Ok((socket, Self { file, backend, backend_path, local_port }))
    }

    /// The header for `payload` to `guest_port`, or `InvalidInput` for a
    /// payload the backend would drop for its size.
    pub(crate) fn header(
        &self,
        guest_port: u32,
        payload: &[u8],
    ) -> io::Result<[u8; DATAGRAM_HEADER_LEN]> {
        if payload.len() > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a {}-byte datagram is over the {MAX_DATAGRAM}-byte limit the backend \
                     passes on",
                    payload.len()
                ),
            ));
        }
        Ok(encode_datagram_header(guest_port, self.local_port))
    }

    pub(crate) fn backend(&self) -> &SockAddr {
        &self.backend
    }

    /// The payload bytes a send moved, or its error naming the backend's
    /// path when nobody is bound there.
    pub(crate) fn sent(&self, result: io::Result<usize>) -> io::Result<usize> {
        match result {
            Ok(n) => Ok(n.saturating_sub(DATAGRAM_HEADER_LEN)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Err(at(&self.backend_path, e))
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn local_port(&self) -> u32 {
        self.local_port
    }

    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }
}

impl HybridDatagram {
    /// Binds host port `local_port` at `<uds>_dgram_<local_port>` (a stale
    /// socket file there is replaced). Datagrams sent from it carry
    /// `local_port` as their source, so the guest's answers come back to
    /// it.
    pub fn bind(uds: impl AsRef<Path>, local_port: u32) -> io::Result<Self> {
        let bind = |p: &Path| UnixDatagram::bind(p);
        let (socket, endpoint) = Endpoint::bind(uds.as_ref(), local_port, bind)?;
        Ok(Self { socket, endpoint })
    }

    /// Sends `payload` to the guest's datagram socket at `guest_port`,
    /// from [`Self::local_port`]. Fails with `NotFound` (naming the path)
    /// when the backend's `<uds>_dgram` is not there, and with
    /// `InvalidInput` for a payload over [`MAX_DATAGRAM`]. Success means
    /// the backend has it, not that the guest will.
    pub fn send_to(&self, guest_port: u32, payload: &[u8]) -> io::Result<usize> {
        let header = self.endpoint.header(guest_port, payload)?;
        let parts = [IoSlice::new(&header), IoSlice::new(payload)];
        let sent = SockRef::from(&self.socket).send_to_vectored(&parts, self.endpoint.backend());
        self.endpoint.sent(sent)
    }

    /// Receives one datagram the guest sent to this host port: the
    /// payload's length, and the guest port it came from.
    ///
    /// A datagram larger than `buf` is an `InvalidInput` error (its bytes
    /// are lost): receive into [`MAX_DATAGRAM`] bytes to never see it. One
    /// shorter than the header (not from the backend) is `InvalidData`.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, u32)> {
        let mut header = [0u8; DATAGRAM_HEADER_LEN];
        let room = buf.len();
        let mut parts =
            [MaybeUninitSlice::new(uninit(&mut header)), MaybeUninitSlice::new(uninit(buf))];
        let (n, flags) = SockRef::from(&self.socket).recv_vectored(&mut parts)?;
        decode(n, &header, flags.is_truncated(), room)
    }

    /// The host port this socket is bound to.
    pub fn local_port(&self) -> u32 {
        self.endpoint.local_port()
    }

    /// The socket file, `<uds>_dgram_<port>`.
    pub fn path(&self) -> &Path {
        self.endpoint.path()
    }

    /// A receive that times out fails with `WouldBlock`: datagrams can be
    /// lost, so a program waiting for an answer wants one.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }

    /// Bounds how long [`Self::send_to`] waits: the backend takes
    /// datagrams only as fast as the guest has room, so a fast sender
    /// blocks.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_write_timeout(timeout)
    }

    /// For event loops that poll the descriptor themselves.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.socket.set_nonblocking(nonblocking)
    }
}

/// The outcome of one receive of `n` bytes (header included).
pub(crate) fn decode(
    n: usize,
    header: &[u8; DATAGRAM_HEADER_LEN],
    truncated: bool,
    room: usize,
) -> io::Result<(usize, u32)> {
    if n < DATAGRAM_HEADER_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a {n}-byte datagram, shorter than the {DATAGRAM_HEADER_LEN}-byte ports header"
            ),
        ));
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a datagram did not fit the {room}-byte buffer and was cut short"),
        ));
    }
    let (guest_port, _) = decode_datagram_ports(header);
    Ok((n - DATAGRAM_HEADER_LEN, guest_port))
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
