//! Seqpacket sockets. std has no seqpacket type, so the shape follows the
//! stream types (listener, accept, connect; those are `conn`'s, shared
//! with streams) and the calls follow the socket API: one `send` is one
//! message, one `recv` is one message, and the end-of-record mark and
//! truncation are reported the way `recvmsg(2)` reports MSG_EOR and
//! MSG_TRUNC.

use crate::conn::{self, Connection};
use crate::io;
use crate::kind::Seqpacket;
use crate::message::RecvMessage;
use crate::platform::contract::MessageStream as _;

/// A listening seqpacket socket.
pub type SeqpacketListener = conn::Listener<Seqpacket>;

/// The iterator returned by [`SeqpacketListener::incoming`]. It never
/// returns `None`.
pub type SeqpacketIncoming<'a> = conn::Incoming<'a, Seqpacket>;

/// A connected seqpacket socket: reliable, ordered messages.
///
/// Dropping it closes the connection; messages already sent are still
/// delivered.
pub type SeqpacketStream = Connection<Seqpacket>;

impl SeqpacketStream {
    /// Sends `data` as one message and returns its length.
    ///
    /// The message goes whole or not at all. It blocks until the message is
    /// accepted, unless non-blocking. A message larger than the connection
    /// can ever carry (the smaller of the two sides' buffer sizes, 256 KiB
    /// by default) fails with `InvalidInput` (EMSGSIZE). An empty message is
    /// accepted but, as in Linux, not transmitted.
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.inner.send(data, false)
    }

    /// Sends `data` as one message, marking it as the end of a record when
    /// `eor` is set (MSG_EOR).
    pub fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.inner.send(data, eor)
    }

    /// Receives one message into `buf`.
    ///
    /// Blocks until a message arrives, unless non-blocking. A message
    /// longer than `buf` fills it, the rest is discarded and `truncated` is
    /// set. A `len` of 0 is end-of-file.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.inner.recv(buf)
    }

    /// Bytes of messages queued for `recv` (msg_inq), as of the last time
    /// messages were fetched from the transport. 0 means a `recv` would
    /// most likely wait. A hint; use [`readable`](Self::readable) to wait.
    pub fn recv_queued(&self) -> io::Result<usize> {
        self.inner.recv_queued()
    }
}
