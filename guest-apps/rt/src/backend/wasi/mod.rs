//! The WASI backend: a thin, blocking-or-not layer over the `vsock:sockets`
//! imports.
//!
//! The WIT interface never blocks; it hands out pollables instead. This
//! layer turns that into std-style calls: an operation that reports
//! `would-block` either returns `WouldBlock` (non-blocking mode) or waits on
//! the matching pollable with `wasi:io/poll` and tries again. Nothing ever
//! spins: every retry follows a wait on a pollable that the host promises
//! to make ready only when the retry can make progress.
//!
//! Resource order matters to the host: streams, receivers, senders and
//! pollables are children of their socket, and dropping a socket before
//! its children traps. Every struct here therefore declares its children
//! before the socket, since Rust drops fields in declaration order.

mod conn;
mod datagram;
mod seqpacket;
mod stream;

pub(crate) use conn::{SeqConnecting, StreamConnecting};
pub(crate) use datagram::Datagram;
pub(crate) use seqpacket::{SeqListener, SeqStream};
pub(crate) use stream::{Listener, Stream};

use std::cell::OnceCell;
use std::io;
use std::mem::ManuallyDrop;
use std::time::Duration;

use wasip2::io::poll::Pollable;

use crate::VsockAddr;

/// The generated bindings. wasi:io and wasi:clocks map onto the `wasip2`
/// crate, so the streams and pollables we get back are the same types std
/// and other WASI crates use.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "vsock:sockets/imports",
        with: {
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
        },
        // Outgoing messages borrow the caller's buffer instead of copying it
        // into a Vec first.
        ownership: Borrowing { duplicate_if_necessary: false },
    });
}

use bindings::vsock::sockets::network::{ErrorCode, Network, VsockAddress, network_error_code};

thread_local! {
    /// One capability handle serves every socket: it carries the host's
    /// grants and no state of its own.
    static NETWORK: Network = bindings::vsock::sockets::instance_network::instance_network();
}

fn with_network<R>(f: impl FnOnce(&Network) -> R) -> R {
    NETWORK.with(f)
}

pub(crate) fn local_cid() -> io::Result<u32> {
    Ok(with_network(|n| n.local_cid()))
}

impl From<VsockAddr> for VsockAddress {
    fn from(a: VsockAddr) -> Self {
        VsockAddress { cid: a.cid, port: a.port }
    }
}

impl From<VsockAddress> for VsockAddr {
    fn from(a: VsockAddress) -> Self {
        VsockAddr::new(a.cid, a.port)
    }
}

/// Maps a WIT error code to the `io::ErrorKind` a std user would expect
/// from the matching Linux errno. The message keeps the WIT name, so logs
/// still show exactly what the host said.
fn error(code: ErrorCode) -> io::Error {
    use io::ErrorKind as K;
    let kind = match code {
        ErrorCode::Unknown => K::Other,
        ErrorCode::AccessDenied => K::PermissionDenied,
        ErrorCode::NotSupported => K::Unsupported,
        ErrorCode::InvalidArgument => K::InvalidInput,
        ErrorCode::OutOfMemory => K::OutOfMemory,
        ErrorCode::Timeout => K::TimedOut,
        ErrorCode::ConcurrencyConflict => K::ResourceBusy,
        ErrorCode::NotInProgress => K::Other,
        ErrorCode::WouldBlock => K::WouldBlock,
        // Every call pier-rt makes in a state where the host can answer
        // invalid-state is a call that needs a connection.
        ErrorCode::InvalidState => K::NotConnected,
        ErrorCode::NewSocketLimit => K::Other,
        ErrorCode::AddressNotBindable => K::AddrNotAvailable,
        ErrorCode::AddressInUse => K::AddrInUse,
        ErrorCode::RemoteUnreachable => K::HostUnreachable,
        ErrorCode::ConnectionRefused => K::ConnectionRefused,
        ErrorCode::ConnectionReset => K::ConnectionReset,
        ErrorCode::ConnectionAborted => K::ConnectionAborted,
        ErrorCode::MessageTooLarge => K::InvalidInput,
    };
    io::Error::new(kind, format!("vsock: {}", code.name()))
}

/// Like `error`, for a send: `invalid-state` there means this side already
/// shut down sending, which std reports as a broken pipe.
fn send_error(code: ErrorCode) -> io::Error {
    match code {
        ErrorCode::InvalidState => {
            io::Error::new(io::ErrorKind::BrokenPipe, "vsock: invalid-state")
        }
        code => error(code),
    }
}

/// Turns a wasi:io stream failure into an `io::Error`, recovering the vsock
/// error code (a reset, usually) when the host attached one.
fn stream_error(e: wasip2::io::error::Error) -> io::Error {
    match network_error_code(&e) {
        Some(code) => error(code),
        None => io::Error::other(e.to_debug_string()),
    }
}

/// Drives a `finish-*` call to completion, waiting on the socket's pollable
/// while the host reports the operation still in progress.
fn finish<T>(ready: &Pollable, mut op: impl FnMut() -> Result<T, ErrorCode>) -> io::Result<T> {
    loop {
        match op() {
            Err(ErrorCode::WouldBlock) => ready.block(),
            result => return result.map_err(error),
        }
    }
}

/// The one place where a blocking call waits and a non-blocking call gives
/// up.
fn wait(nonblocking: bool, ready: &Pollable) -> io::Result<()> {
    if nonblocking {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    ready.block();
    Ok(())
}

/// Pollables are created on first use and then kept: a pollable is a host
/// resource, and making a new one for every wait would cost a host call
/// and a table slot each time.
fn lazy(cell: &OnceCell<Pollable>, make: impl FnOnce() -> Pollable) -> &Pollable {
    cell.get_or_init(make)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What one `Readiness` stands for in this backend.
#[derive(Debug)]
pub(crate) enum PollRef<'a> {
    /// Wait on this host pollable.
    Pollable(&'a Pollable),
    /// Already ready: the socket holds data it fetched earlier, so waiting
    /// on the host would be wrong.
    Ready,
}

impl PollRef<'_> {
    /// The condition without its borrow, for the async reactor, which
    /// keeps it across turns of the executor; `None` when it holds
    /// already.
    pub(crate) fn raw(&self) -> Option<RawPoll> {
        match self {
            PollRef::Pollable(p) => Some(RawPoll(p.handle())),
            PollRef::Ready => None,
        }
    }
}

/// A pollable's handle, held by the async reactor while a task waits on
/// it. The reactor forgets it before the socket that owns the pollable is
/// dropped (`asynch::reactor::Interest`), so a handle it waits on is
/// always live.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll(u32);

/// The async reactor's wait: blocks in `wasi:io/poll` until one of `keys`
/// is ready or `timeout` passes, and appends the ready ones' indices to
/// `ready`.
pub(crate) fn wait_raw(
    keys: &[RawPoll],
    timeout: Option<Duration>,
    ready: &mut Vec<usize>,
) -> io::Result<()> {
    // SAFETY: every key names a live pollable (see `RawPoll`), and
    // `ManuallyDrop` keeps these borrowed views from dropping it.
    let views: Vec<ManuallyDrop<Pollable>> =
        keys.iter().map(|k| ManuallyDrop::new(unsafe { Pollable::from_handle(k.0) })).collect();
    let mut list: Vec<&Pollable> = views.iter().map(|p| &**p).collect();
    let timer = timeout.map(|t| wasip2::clocks::monotonic_clock::subscribe_duration(nanos(t)));
    if let Some(t) = &timer {
        list.push(t);
    }
    if list.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "poll: nothing to wait for"));
    }
    // Indices past `keys` are the timer.
    ready.extend(
        wasip2::io::poll::poll(&list).into_iter().map(|i| i as usize).filter(|&i| i < keys.len()),
    );
    Ok(())
}

/// Waits until at least one entry is ready or the timeout passes, and
/// returns the indices of the ready entries, in ascending order.
pub(crate) fn poll(entries: &[PollRef<'_>], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    let mut ready = Vec::new();
    let mut list: Vec<&Pollable> = Vec::with_capacity(entries.len() + 1);
    let mut index = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        match entry {
            PollRef::Ready => ready.push(i),
            PollRef::Pollable(p) => {
                list.push(p);
                index.push(i);
            }
        }
    }
    // Something is ready already: still look at the others, without waiting.
    let after = if ready.is_empty() { timeout.map(nanos) } else { Some(0) };
    let timer = after.map(wasip2::clocks::monotonic_clock::subscribe_duration);
    if let Some(t) = &timer {
        list.push(t);
    }
    if list.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "poll: nothing to wait for"));
    }
    for hit in wasip2::io::poll::poll(&list) {
        // Indices past `index` are the timer.
        if let Some(&i) = index.get(hit as usize) {
            ready.push(i);
        }
    }
    ready.sort_unstable();
    Ok(ready)
}
