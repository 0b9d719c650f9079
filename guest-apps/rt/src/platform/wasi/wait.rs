//! Waiting, over `wasi:io/poll`. The WIT interface never blocks; it hands
//! out pollables instead. An operation that reports `would-block` either
//! returns `WouldBlock` (non-blocking mode) or waits on the matching
//! pollable and tries again. Nothing ever spins: every retry follows a
//! wait on a pollable that the host promises to make ready only when the
//! retry can make progress.
//!
//! [`WasiPoll`] is this platform's readiness for the contract: the
//! `Poller`'s and the async reactor's waits over pollables.

use std::cell::OnceCell;
use std::io;
use std::mem::ManuallyDrop;
use std::time::Duration;

use wasip2::io::poll::Pollable;

use super::bindings::vsock::sockets::network::ErrorCode;
use super::network::{error, nanos, send_error};
use crate::platform::contract::Wait;

/// Drives a `finish-*` call to completion, waiting on the socket's pollable
/// while the host reports the operation still in progress.
pub(super) fn finish<T>(
    ready: &Pollable,
    mut op: impl FnMut() -> Result<T, ErrorCode>,
) -> io::Result<T> {
    loop {
        match op() {
            Err(ErrorCode::WouldBlock) => ready.block(),
            result => return result.map_err(error),
        }
    }
}

/// The one place where a blocking call waits and a non-blocking call gives
/// up.
pub(super) fn wait(nonblocking: bool, ready: &Pollable) -> io::Result<()> {
    if nonblocking {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    ready.block();
    Ok(())
}

/// Sends one message (a seqpacket message or a datagram) whole, once the
/// sender has room: `check` asks for room, `send` sends, and each says 0
/// while there is none. Waits on `ready` meanwhile, unless non-blocking.
pub(super) fn send_whole(
    nonblocking: bool,
    ready: &Pollable,
    check: impl Fn() -> Result<u64, ErrorCode>,
    send: impl Fn() -> Result<u64, ErrorCode>,
) -> io::Result<()> {
    loop {
        match check().and_then(|room| if room == 0 { Ok(0) } else { send() }) {
            Ok(0) => wait(nonblocking, ready)?,
            Ok(_) => return Ok(()),
            Err(e) => return Err(send_error(e)),
        }
    }
}

/// Pollables are created on first use and then kept: a pollable is a host
/// resource, and making a new one for every wait would cost a host call
/// and a table slot each time.
pub(super) fn lazy(cell: &OnceCell<Pollable>, make: impl FnOnce() -> Pollable) -> &Pollable {
    cell.get_or_init(make)
}

/// What one `Readiness` stands for in this platform.
#[derive(Debug)]
pub(crate) enum PollRef<'a> {
    /// Wait on this host pollable.
    Pollable(&'a Pollable),
    /// Already ready: the socket holds data it fetched earlier, so waiting
    /// on the host would be wrong.
    Ready,
}

/// A pollable's handle, without the borrow of its socket. The `Poller`
/// holds the borrow (its entries borrow their sockets) while it waits on
/// one, and the async reactor forgets one before the socket that owns the
/// pollable is dropped (`asynch::reactor::Interest`), so a handle waited
/// on is always live.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoll(u32);

/// The WASI platform's readiness: host pollables.
#[derive(Debug)]
pub(crate) enum WasiPoll {}

impl Wait for WasiPoll {
    type PollRef<'a> = PollRef<'a>;
    type RawPoll = RawPoll;

    fn raw(ready: &PollRef<'_>) -> Option<RawPoll> {
        match ready {
            PollRef::Pollable(p) => Some(RawPoll(p.handle())),
            PollRef::Ready => None,
        }
    }

    /// One `wasi:io/poll::poll` over the conditions' pollables and, for a
    /// timeout, a timer.
    fn wait_any(
        count: usize,
        condition: impl Fn(usize) -> Option<RawPoll>,
        timeout: Option<Duration>,
        ready: &mut Vec<usize>,
    ) -> io::Result<()> {
        let start = ready.len();
        let mut views = Vec::with_capacity(count);
        let mut index = Vec::with_capacity(count);
        for i in 0..count {
            match condition(i) {
                // SAFETY: the handle names a live pollable (see `RawPoll`),
                // and `ManuallyDrop` keeps this borrowed view from dropping it.
                Some(RawPoll(handle)) => {
                    views.push(ManuallyDrop::new(unsafe { Pollable::from_handle(handle) }));
                    index.push(i);
                }
                None => ready.push(i),
            }
        }
        let mut list: Vec<&Pollable> = views.iter().map(|p| &**p).collect();
        // Something holds already: still look at the others, without
        // waiting.
        let after = if ready.len() > start { Some(0) } else { timeout.map(nanos) };
        let timer = after.map(wasip2::clocks::monotonic_clock::subscribe_duration);
        if let Some(t) = &timer {
            list.push(t);
        }
        for hit in wasip2::io::poll::poll(&list) {
            // Indices past `index` are the timer.
            if let Some(&i) = index.get(hit as usize) {
                ready.push(i);
            }
        }
        ready[start..].sort_unstable();
        Ok(())
    }
}
