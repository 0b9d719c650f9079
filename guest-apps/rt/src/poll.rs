//! Waiting on many sockets at once. A WASI component has one thread, so a
//! server that talks to several peers must wait for whichever is ready
//! first instead of blocking in one `read`. This is poll(2) for pier
//! sockets: the app lists what it waits for, each with its own token, and
//! gets back the tokens that are ready.
//!
//! The borrow checker does the bookkeeping a reactor would otherwise need:
//! a [`Readiness`] borrows its socket, so a socket cannot be dropped while
//! it is being waited on, and the borrows end as soon as the poller is no
//! longer used, leaving the app free to read, write and drop sockets
//! between waits.

use alloc::vec::Vec;
use core::time::Duration;

use crate::io;
use crate::platform::contract::Wait as _;
use crate::platform::{PollRef, RawPoll, Waiting};

/// One condition to wait for, borrowed from a socket: get it from a
/// socket's `readable()` or `writable()`.
///
/// Readiness is level-triggered: it stays ready while the condition holds,
/// so an app that did not read everything is told again on the next wait.
#[derive(Debug)]
pub struct Readiness<'a>(pub(crate) PollRef<'a>);

impl Readiness<'_> {
    /// The condition without its borrow, for the async reactor; `None`
    /// when it holds already.
    pub(crate) fn raw(&self) -> Option<RawPoll> {
        Waiting::raw(&self.0)
    }
}

/// Waits on many [`Readiness`] conditions at once.
///
/// Build one per wait, [`add`](Self::add) what you wait for, and
/// [`wait`](Self::wait):
///
/// ```no_run
/// use pier_rt::{Poller, VsockAddr, VsockAddrExt, VsockListener, VsockStream};
///
/// let listener = VsockListener::bind(VsockAddr::any_cid(1234))?;
/// listener.set_nonblocking(true)?;
/// let mut conns: Vec<VsockStream> = Vec::new();
/// loop {
///     let mut poller = Poller::new();
///     poller.add(listener.readable(), usize::MAX);
///     for (i, c) in conns.iter().enumerate() {
///         poller.add(c.readable(), i);
///     }
///     let ready = poller.wait(None)?;
///     // `poller` is no longer used, so `conns` may change here.
///     for token in ready {
///         if token == usize::MAX {
///             let (c, _) = listener.accept()?;
///             c.set_nonblocking(true)?;
///             conns.push(c);
///         } else {
///             // read from conns[token] until WouldBlock ...
///         }
///     }
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Poller<'a> {
    entries: Vec<PollRef<'a>>,
    tokens: Vec<usize>,
}

impl<'a> Poller<'a> {
    /// An empty poller.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty poller with room for `n` entries.
    pub fn with_capacity(n: usize) -> Self {
        Self { entries: Vec::with_capacity(n), tokens: Vec::with_capacity(n) }
    }

    /// Adds a condition; `token` is what [`wait`](Self::wait) reports when
    /// it is ready. Tokens need not be unique.
    pub fn add(&mut self, readiness: Readiness<'a>, token: usize) {
        self.entries.push(readiness.0);
        self.tokens.push(token);
    }

    /// How many conditions were added.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Blocks until at least one condition is ready, or `timeout` passes,
    /// and returns the tokens of the ready ones, in the order they were
    /// added. A timeout returns an empty list; `Some(Duration::ZERO)` only
    /// looks. Without a timeout, an empty poller is an `InvalidInput`
    /// error, since it would wait forever.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<usize>> {
        if self.entries.is_empty() && timeout.is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "poll: nothing to wait for"));
        }
        let mut ready = Vec::new();
        Waiting::wait_any(
            self.entries.len(),
            |i| Waiting::raw(&self.entries[i]),
            timeout,
            &mut ready,
        )?;
        for entry in &mut ready {
            *entry = self.tokens[*entry];
        }
        Ok(ready)
    }
}
