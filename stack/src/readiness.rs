//! Readiness, wakers, and the deferred wake list.
//!
//! A socket's [`Readiness`] says which calls would make progress now, as
//! Linux's `vsock_poll` reports it. Tasks waiting on a socket park a
//! [`core::task::Waker`] in one of two slots, one for read interest and one
//! for write interest.
//!
//! Wakeups are never delivered while the stack is being worked on. While a
//! batch of packets is processed the stack only *records* which sockets
//! became readable or writable; the caller gets the wakers back in a
//! [`WakeList`] and wakes them after it has released whatever lock guards the
//! stack. A woken task can then run at once instead of blocking on that lock,
//! as in Linux's virtio transport, which defers its readiness callbacks until
//! a receive batch has released the socket lock
//! (`docs/linux-behaviours.md#deferred-wakeups`). Each socket is woken at
//! most once per kind per batch, and write-space wakes come before
//! data-ready wakes.
//!
//! A socket can instead carry a [`ReadinessHook`] (a tracer, an interceptor).
//! Such a socket declines batching and its hook runs for every packet, inside
//! the batch, the way Linux falls back to per-packet delivery when a
//! socket's callbacks have been replaced.

use alloc::vec::Vec;
use core::fmt;
use core::task::Waker;

/// What a socket is ready for, as a set of flags.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Readiness(u8);

impl Readiness {
    /// Ready for nothing: every call would block.
    pub const EMPTY: Self = Self(0);
    /// A receive (or accept, on a listener) would not block.
    pub const READABLE: Self = Self(1);
    /// A send would not block (POLLOUT): the peer has room, or the socket
    /// is closed and not shut for sending. As in Linux, not after SHUT_WR,
    /// where a send fails at once: `Stack::unblocked` counts that too.
    pub const WRITABLE: Self = Self(2);
    /// The peer will send no more (POLLRDHUP).
    pub const READ_CLOSED: Self = Self(4);
    /// Both directions are finished (POLLHUP).
    pub const HANGUP: Self = Self(8);
    /// An error is pending (POLLERR).
    pub const ERROR: Self = Self(16);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// Whether any flag of `other` is set, as `poll(2)` checks its events.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The flags as bits, for adapters that map them to their own events.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl core::ops::BitOr for Readiness {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for Readiness {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(Readiness, &str); 5] = [
            (Readiness::READABLE, "READABLE"),
            (Readiness::WRITABLE, "WRITABLE"),
            (Readiness::READ_CLOSED, "READ_CLOSED"),
            (Readiness::HANGUP, "HANGUP"),
            (Readiness::ERROR, "ERROR"),
        ];
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("EMPTY")?;
        }
        Ok(())
    }
}

/// Which waker slot a task parks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Woken when the socket may have become readable (or a listener has a
    /// connection to accept).
    Read,
    /// Woken when the socket may have become writable.
    Write,
}

/// One parked waker. Registering the same task again does not clone.
#[derive(Default)]
pub(crate) struct WakerSlot(Option<Waker>);

impl WakerSlot {
    pub fn register(&mut self, waker: &Waker) {
        match &self.0 {
            Some(existing) if existing.will_wake(waker) => {}
            _ => self.0 = Some(waker.clone()),
        }
    }
    pub fn take(&mut self) -> Option<Waker> {
        self.0.take()
    }
}

/// Wakers handed back to the caller, to be woken once it holds no lock.
///
/// The list keeps its capacity between batches, so steady-state operation
/// allocates nothing.
#[derive(Default)]
pub struct WakeList {
    write_space: Vec<Waker>,
    data_ready: Vec<Waker>,
}

impl fmt::Debug for WakeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeList")
            .field("write_space", &self.write_space.len())
            .field("data_ready", &self.data_ready.len())
            .finish()
    }
}

impl WakeList {
    /// An empty list; keep it and reuse it, so waking allocates nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many wakers wait to be woken.
    pub fn len(&self) -> usize {
        self.write_space.len() + self.data_ready.len()
    }

    /// Whether there is nothing to wake.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn push_write_space(&mut self, waker: Waker) {
        self.write_space.push(waker);
    }

    pub(crate) fn push_data_ready(&mut self, waker: Waker) {
        self.data_ready.push(waker);
    }

    /// Wakes every waker: all write-space wakes first, then all data-ready
    /// wakes, so a task that both reads and writes sees the credit it got
    /// before it sees the data.
    ///
    /// Most batches wake nobody, and this runs after every one of them,
    /// so an empty list returns before setting up a drain.
    #[inline]
    pub fn wake_all(&mut self) {
        if !self.write_space.is_empty() {
            for waker in self.write_space.drain(..) {
                waker.wake();
            }
        }
        if !self.data_ready.is_empty() {
            for waker in self.data_ready.drain(..) {
                waker.wake();
            }
        }
    }
}

/// The kind of readiness change a hook is told about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadinessEvent {
    /// The socket may have become readable.
    DataReady,
    /// The socket may have become writable.
    WriteSpace,
}

/// A replacement for a socket's native notification path.
///
/// It runs synchronously, once per packet that changes readiness, while the
/// stack is borrowed; it must not call back into the stack.
pub trait ReadinessHook: Send {
    /// `socket` may have become ready for `event`.
    fn notify(&mut self, socket: crate::SocketHandle, event: ReadinessEvent);
}
