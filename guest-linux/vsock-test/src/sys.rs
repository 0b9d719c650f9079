//! The few libc calls the program makes, each checked: `AF_VSOCK` sockets
//! as `OwnedFd`s, failures as `io::Error`s, and errno names for the
//! replies on the control port.
//!
//! std has no vsock sockets, so this is the only place with `unsafe`. Every
//! call retries on `EINTR`, so no caller has to.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use libc::{c_int, c_void, sockaddr, sockaddr_vm, socklen_t};

/// The host's CID (`VMADDR_CID_HOST`): where guest-to-host connections go.
pub const HOST_CID: u32 = libc::VMADDR_CID_HOST;

fn check(ret: c_int) -> io::Result<c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn check_size(ret: isize) -> io::Result<usize> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret as usize) }
}

/// Runs `f` again for as long as it fails with `EINTR`.
fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn address(cid: u32, port: u32) -> sockaddr_vm {
    // SAFETY: sockaddr_vm is plain old data; all zeroes is a valid value.
    let mut addr: sockaddr_vm = unsafe { zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = cid;
    addr.svm_port = port;
    addr
}

/// A new `AF_VSOCK` socket of type `ty` (`SOCK_STREAM`, `SOCK_SEQPACKET`,
/// `SOCK_DGRAM`).
pub fn socket(ty: c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
    let fd = check(unsafe { libc::socket(libc::AF_VSOCK, ty | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket() and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `fd` to `(any CID, port)`.
pub fn bind(fd: &OwnedFd, port: u32) -> io::Result<()> {
    let addr = address(libc::VMADDR_CID_ANY, port);
    // SAFETY: addr is a valid sockaddr_vm of the length passed.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast::<sockaddr>(),
            size_of::<sockaddr_vm>() as socklen_t,
        )
    })
    .map(drop)
}

/// A socket of type `ty` listening on `port`.
pub fn listen(ty: c_int, port: u32, backlog: c_int) -> io::Result<OwnedFd> {
    let fd = socket(ty)?;
    bind(&fd, port)?;
    // SAFETY: plain syscall on a descriptor we own.
    check(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

/// The next connection on a listener, with the peer's CID and port.
pub fn accept(listener: &OwnedFd) -> io::Result<(OwnedFd, u32, u32)> {
    retry(|| {
        // SAFETY: peer is a valid buffer of the length passed in len.
        let mut peer: sockaddr_vm = unsafe { zeroed() };
        let mut len = size_of::<sockaddr_vm>() as socklen_t;
        let fd = check(unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                (&raw mut peer).cast::<sockaddr>(),
                &mut len,
                libc::SOCK_CLOEXEC,
            )
        })?;
        // SAFETY: fd was just returned by accept4() and nothing else owns it.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, peer.svm_cid, peer.svm_port))
    })
}

/// `VMADDR_FLAG_TO_HOST`, in `svm_flags` (the first byte libc calls
/// `svm_zero`): send this connection to the host's transport even though
/// the CID is another guest's. A vhost-user backend routes sibling CIDs
/// itself; without the flag a guest that also had a host-side transport
/// loaded would keep the connection local.
const VMADDR_FLAG_TO_HOST: u8 = 0x01;

/// A socket of type `ty` connected to `(cid, port)`; to another guest's
/// CID (above 2) through the host.
pub fn connect(ty: c_int, cid: u32, port: u32) -> io::Result<OwnedFd> {
    let fd = socket(ty)?;
    let mut addr = address(cid, port);
    if cid > HOST_CID {
        addr.svm_zero[0] = VMADDR_FLAG_TO_HOST;
    }
    // SAFETY: addr is a valid sockaddr_vm of the length passed. A connect
    // interrupted by a signal goes on in the background, so it is not
    // retried (no signal handlers are installed anyway).
    check(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast::<sockaddr>(),
            size_of::<sockaddr_vm>() as socklen_t,
        )
    })?;
    Ok(fd)
}

/// Sends one datagram to `(cid, port)`.
pub fn send_to(fd: &OwnedFd, cid: u32, port: u32, data: &[u8]) -> io::Result<usize> {
    let addr = address(cid, port);
    retry(|| {
        // SAFETY: data and addr are valid for the lengths passed.
        check_size(unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                data.as_ptr().cast::<c_void>(),
                data.len(),
                0,
                (&raw const addr).cast::<sockaddr>(),
                size_of::<sockaddr_vm>() as socklen_t,
            )
        })
    })
}

/// One `read`: 0 is end-of-file.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    retry(|| check_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast::<c_void>(), buf.len()) }))
}

/// Writes all of `buf`; on failure, the error and how much went out first.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> Result<(), (io::Error, usize)> {
    let total = buf.len();
    while !buf.is_empty() {
        // SAFETY: buf is valid for reads of its length.
        let n = retry(|| {
            check_size(unsafe { libc::write(fd, buf.as_ptr().cast::<c_void>(), buf.len()) })
        })
        .map_err(|e| (e, total - buf.len()))?;
        if n == 0 {
            return Err((io::Error::from(io::ErrorKind::WriteZero), total - buf.len()));
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// `shutdown(how)`: `SHUT_WR` for a half-close.
pub fn shutdown(fd: RawFd, how: c_int) -> io::Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::shutdown(fd, how) }).map(drop)
}

/// One message: its length and the `msg_flags` the kernel reported
/// (`MSG_EOR`, `MSG_TRUNC`). Length 0 without flags is end-of-file.
pub fn recv_msg(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, c_int)> {
    retry(|| {
        let mut iov =
            libc::iovec { iov_base: buf.as_mut_ptr().cast::<c_void>(), iov_len: buf.len() };
        // SAFETY: msghdr is plain old data; all zeroes is a valid value.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        // SAFETY: msg points at one iovec that describes buf.
        let n = check_size(unsafe { libc::recvmsg(fd, &mut msg, 0) })?;
        Ok((n, msg.msg_flags))
    })
}

/// Sends `buf` as one message, with `MSG_EOR` when `eor`.
pub fn send_msg(fd: RawFd, buf: &[u8], eor: bool) -> io::Result<usize> {
    let flags = if eor { libc::MSG_EOR } else { 0 };
    // SAFETY: buf is valid for reads of its length.
    retry(|| check_size(unsafe { libc::send(fd, buf.as_ptr().cast::<c_void>(), buf.len(), flags) }))
}

/// The socket's pending error (`SO_ERROR`), 0 for none.
pub fn so_error(fd: RawFd) -> io::Result<c_int> {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: value is a c_int of the length passed.
    check(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut value).cast::<c_void>(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// Bounds every blocking read and write on `fd`, so a peer that stops
/// answering ends a command with `EAGAIN` instead of wedging its thread.
pub fn set_timeouts(fd: RawFd, timeout: Duration) -> io::Result<()> {
    // SAFETY: timeval is plain old data; all zeroes is a valid value.
    let mut tv: libc::timeval = unsafe { zeroed() };
    // `as _`: the field types differ between libc flavours (and musl's are
    // changing width); the values fit either.
    tv.tv_sec = timeout.as_secs() as _;
    tv.tv_usec = timeout.subsec_micros() as _;
    for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a timeval of the length passed.
        check(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&raw const tv).cast::<c_void>(),
                size_of::<libc::timeval>() as socklen_t,
            )
        })?;
    }
    Ok(())
}

/// The errno's name (`ECONNRESET`), or `E<number>` for one not listed: the
/// host tests compare names, which read better in a failure than numbers.
pub fn errno_name(error: &io::Error) -> String {
    let Some(code) = error.raw_os_error() else {
        return match error.kind() {
            io::ErrorKind::WriteZero => "EWRITEZERO".to_owned(),
            _ => "EOTHER".to_owned(),
        };
    };
    let name = match code {
        libc::EPERM => "EPERM",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::EPIPE => "EPIPE",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTOTYPE => "EPROTOTYPE",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ESOCKTNOSUPPORT => "ESOCKTNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::ESHUTDOWN => "ESHUTDOWN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EPROTO => "EPROTO",
        _ => return format!("E{code}"),
    };
    name.to_owned()
}

/// Restarts the machine now, as `reboot -f` does: the kernel resets the
/// CPU without stopping anything first, so every connection simply stops,
/// and the VMM boots the guest again. Returns only if the kernel refused.
pub fn restart_machine() {
    // SAFETY: reboot takes a command constant; with RESTART it does not
    // return unless it failed.
    let rc = unsafe { libc::reboot(libc::LINUX_REBOOT_CMD_RESTART) };
    crate::console::log(&format!("reboot failed ({rc}): {}", io::Error::last_os_error()));
}
