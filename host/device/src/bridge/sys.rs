//! The few socket calls the bridge makes that `socket2` does not wrap the
//! way the relay needs them, and the Unix socket names it uses.
//!
//! Everything here is non-blocking and never raises `SIGPIPE`: the bridge
//! runs inside someone else's event loop (a VMM, the Wasm shim), and a host
//! program that hangs up must cost that loop an `EPIPE`, not the process.

use std::ffi::OsStr;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pier_hybrid::paths;
use socket2::{Domain, SockAddr, Socket, Type};

use crate::queues::GuestPayload;

/// Flags for every send: never block, never raise `SIGPIPE`.
pub(crate) const SEND_FLAGS: libc::c_int = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;

/// `recv(2)` into an initialised buffer, retrying on `EINTR`.
///
/// With `MSG_TRUNC` on a datagram or seqpacket socket the return value is
/// the message's real length, which may exceed `buf.len()`.
pub(crate) fn recv(sock: &Socket, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    retry_on_eintr(|| {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // duration of the call, and the kernel writes at most that many.
        unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags | libc::MSG_DONTWAIT,
            )
        }
    })
}

/// Makes the system call `call` until it is not interrupted (`EINTR`),
/// and turns its return value into a count or the error `errno` holds.
fn retry_on_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `readv(2)` into two buffers in order, non-blocking (the bridge's
/// sockets are), retrying on `EINTR`. 0 is end-of-file.
pub(crate) fn recv_parts(sock: &Socket, a: &mut [u8], b: &mut [u8]) -> io::Result<usize> {
    let mut slices = [io::IoSliceMut::new(a), io::IoSliceMut::new(b)];
    loop {
        match io::Read::read_vectored(&mut &*sock, &mut slices) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// `readv(2)` into memory the caller holds only as `iovec`s (a guest's
/// receive buffer, see `RxPayload`), non-blocking (the bridge's sockets
/// are), retrying on `EINTR`. 0 is end-of-file.
///
/// # Safety
///
/// Every iovec must describe memory that is mapped and writable for its
/// length until the call returns, and that no Rust reference covers.
pub(crate) unsafe fn recv_into_iovecs(sock: &Socket, iovecs: &[libc::iovec]) -> io::Result<usize> {
    let count = libc::c_int::try_from(iovecs.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: the caller's contract; the kernel writes at most the
    // iovecs' lengths.
    retry_on_eintr(|| unsafe { libc::readv(sock.as_raw_fd(), iovecs.as_ptr(), count) })
}

/// `sendmsg(2)` of up to three pieces as one write (one message on a
/// seqpacket or datagram socket), retrying on `EINTR`.
pub(crate) fn send_parts(sock: &Socket, parts: &[&[u8]]) -> io::Result<usize> {
    let slices: [IoSlice<'_>; 3] = [
        IoSlice::new(parts.first().copied().unwrap_or_default()),
        IoSlice::new(parts.get(1).copied().unwrap_or_default()),
        IoSlice::new(parts.get(2).copied().unwrap_or_default()),
    ];
    let count = parts.len().min(3);
    loop {
        match sock.send_vectored_with_flags(&slices[..count], SEND_FLAGS) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Sends the guest bytes of `range` of `payload` from where they lie in
/// guest memory (the kernel copies them into the socket; no reference to
/// them is made), retrying on `EINTR`. A range outside the payload sends
/// nothing.
pub(crate) fn send_guest_bytes(
    sock: &Socket,
    payload: &GuestPayload,
    range: std::ops::Range<usize>,
) -> io::Result<usize> {
    let Some(mut iov) = payload.iovec(range) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: `iov` points at guest memory that `payload` keeps mapped and
    // readable for its length while `payload` is borrowed; the kernel only
    // reads it.
    retry_on_eintr(|| unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, SEND_FLAGS) })
}

/// Like [`send_parts`], to a named Unix datagram socket.
pub(crate) fn send_parts_to(sock: &Socket, parts: &[&[u8]], to: &SockAddr) -> io::Result<usize> {
    let slices: [IoSlice<'_>; 2] = [
        IoSlice::new(parts.first().copied().unwrap_or_default()),
        IoSlice::new(parts.get(1).copied().unwrap_or_default()),
    ];
    let count = parts.len().min(2);
    loop {
        match sock.send_to_vectored_with_flags(&slices[..count], to, SEND_FLAGS) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The effective uid and the pid of the process on the other end of a
/// Unix connection, as the kernel recorded them at `connect`
/// (`SO_PEERCRED`): the one thing about a local peer it cannot forge, so
/// what a budget or a permission shared between local users is keyed by.
pub fn peer_credentials(sock: &impl AsRawFd) -> io::Result<(u32, i32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds the
    // size of `cred`, so the kernel writes at most that many bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.uid, cred.pid))
}

/// A non-blocking, close-on-exec Unix socket of type `ty`.
pub(crate) fn unix_socket(ty: Type) -> io::Result<Socket> {
    let sock = Socket::new(Domain::UNIX, ty, None)?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Whether an error means "try again when the socket is ready".
pub(crate) fn would_block(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::WouldBlock
}

/// The longest `sun_path` Linux accepts, without its terminating NUL.
pub(crate) const MAX_SUN_PATH: usize = 107;

/// The host-side names the bridge uses, all derived from one base path
/// (`pier_hybrid::paths` names them).
#[derive(Debug)]
pub(crate) struct Paths {
    base: PathBuf,
    /// Reused buffer for `<uds>_dgram_<port>`, so forwarding a datagram
    /// allocates nothing.
    dgram_name: Vec<u8>,
}

impl Paths {
    pub(crate) fn new(base: PathBuf) -> io::Result<Self> {
        // The longest name the bridge ever builds: `<uds>_dgram_4294967295`.
        let longest = base.as_os_str().len() + paths::MAX_SUFFIX_LEN;
        if base.as_os_str().is_empty() || longest > MAX_SUN_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "hybrid vsock path {} is too long: `<path>_dgram_<port>` must fit \
                     the {MAX_SUN_PATH} bytes of a Unix socket address",
                    base.display()
                ),
            ));
        }
        let dgram_name = Vec::with_capacity(longest);
        Ok(Self { base, dgram_name })
    }

    /// `<uds>`: the stream listener host programs connect to.
    pub(crate) fn stream_listener(&self) -> &Path {
        &self.base
    }

    /// `<uds>_seqpacket`: the seqpacket listener.
    pub(crate) fn seqpacket_listener(&self) -> PathBuf {
        paths::seqpacket_path(&self.base)
    }

    /// `<uds>_dgram`: the bridge's datagram socket.
    pub(crate) fn datagram_socket(&self) -> PathBuf {
        paths::datagram_path(&self.base)
    }

    /// `<uds>_<port>`: where a guest's connection to host port `port` goes.
    pub(crate) fn port(&self, port: u32) -> PathBuf {
        paths::listener_path(&self.base, port)
    }

    /// `<uds>_dgram_<port>` as a socket address, built without allocating.
    pub(crate) fn datagram_receiver(&mut self, port: u32) -> io::Result<SockAddr> {
        self.dgram_name.clear();
        self.dgram_name.extend_from_slice(self.base.as_os_str().as_bytes());
        self.dgram_name.extend_from_slice(paths::datagram_receiver_suffix(port).as_bytes());
        SockAddr::unix(OsStr::from_bytes(&self.dgram_name))
    }
}

/// Makes `path` free for a socket of type `ty` to bind: a socket file
/// nobody answers on (a crashed process left it) is removed; one a live
/// process answers on is **in use**, and the bridge refuses to start
/// rather than take the name from under it (two bridges on one path would
/// leave the first unreachable). Anything but a socket is never touched.
///
/// Whether anybody answers is asked the only way Unix sockets allow: a
/// non-blocking `connect` of the same type. `ECONNREFUSED` means nobody is
/// bound (stale); success, `EAGAIN` (a full backlog) or any other answer
/// means a live socket. A live pier that is asked sees a connection that
/// closes at once, which it counts and forgets.
pub(crate) fn claim_socket_path(path: &Path, ty: Type) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a Unix socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    let probe = unix_socket(ty)?;
    match probe.connect(&SockAddr::unix(path)?) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is in use: a running process answers on it (another pier on the same --uds?)",
                path.display()
            ),
        )),
    }
}

/// A socket file this process created: removed on request only while the
/// file at the path is still the one it made (same device and inode), so
/// a process never deletes another's socket that took the name since.
#[derive(Debug)]
pub(crate) struct OwnedSocketFile {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl OwnedSocketFile {
    /// Records the file just bound at `path`.
    pub(crate) fn new(path: PathBuf) -> Self {
        let identity = file_identity(&path);
        Self { path, identity }
    }

    /// Removes the file if it is still ours.
    pub(crate) fn remove(&self) {
        if self.identity.is_some() && file_identity(&self.path) == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_receiver_names() {
        let mut paths = Paths::new(PathBuf::from("/run/v.sock")).unwrap();
        for (port, want) in [
            (0, "/run/v.sock_dgram_0"),
            (7, "/run/v.sock_dgram_7"),
            (52_000, "/run/v.sock_dgram_52000"),
            (u32::MAX, "/run/v.sock_dgram_4294967295"),
        ] {
            let addr = paths.datagram_receiver(port).unwrap();
            assert_eq!(addr.as_pathname().unwrap(), Path::new(want));
        }
        assert_eq!(paths.port(1234), PathBuf::from("/run/v.sock_1234"));
        assert_eq!(paths.seqpacket_listener(), PathBuf::from("/run/v.sock_seqpacket"));
        assert_eq!(paths.datagram_socket(), PathBuf::from("/run/v.sock_dgram"));
    }

    #[test]
    fn overlong_base_is_refused() {
        let base = PathBuf::from(format!("/{}", "x".repeat(100)));
        assert_eq!(Paths::new(base).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert!(Paths::new(PathBuf::new()).is_err());
    }
}
