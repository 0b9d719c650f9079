//! Async seqpacket sockets: the listener, connect and halves are
//! `conn`'s, shared with streams; here are the message futures, one
//! message per `send` and per `recv` as with the blocking type.

use core::future::poll_fn;

use super::conn::{self, Shared};
use crate::io;
use crate::kind::Seqpacket;
use crate::message::RecvMessage;

/// A listening seqpacket socket whose `accept` is a future.
pub type SeqpacketListener = conn::Listener<Seqpacket>;

/// The [`Stream`](futures_core::Stream) of
/// [`SeqpacketListener::incoming`]; it never ends.
pub type SeqpacketIncoming<'a> = conn::Incoming<'a, Seqpacket>;

/// A connected seqpacket socket with message futures. `send` and `recv`
/// take `&self`, so one task may wait for both at once.
pub type SeqpacketStream = conn::Connection<Seqpacket>;

/// The receiving half of [`SeqpacketStream::into_split`].
pub type SeqpacketReadHalf = conn::ReadHalf<Seqpacket>;

/// The sending half of [`SeqpacketStream::into_split`]. Dropping it shuts
/// down sending; the connection closes once both halves are gone.
pub type SeqpacketWriteHalf = conn::WriteHalf<Seqpacket>;

impl Shared<Seqpacket> {
    async fn send(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        poll_fn(|cx| {
            self.writes.poll_io(
                cx,
                || self.inner.writable().raw(),
                || self.inner.send_eor(data, eor),
            )
        })
        .await
    }

    async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        poll_fn(|cx| {
            self.reads.poll_io(cx, || self.inner.readable().raw(), || self.inner.recv(buf))
        })
        .await
    }
}

impl SeqpacketStream {
    /// Sends `data` as one message once the peer has room for it; see
    /// [`crate::SeqpacketStream::send`].
    pub async fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.shared.send(data, false).await
    }

    /// Sends one message, marked end-of-record when `eor` is set.
    pub async fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.shared.send(data, eor).await
    }

    /// Receives one message; a `len` of 0 is end-of-file. See
    /// [`crate::SeqpacketStream::recv`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.shared.recv(buf).await
    }
}

impl SeqpacketReadHalf {
    /// Receives one message; see [`SeqpacketStream::recv`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<RecvMessage> {
        self.shared.recv(buf).await
    }
}

impl SeqpacketWriteHalf {
    /// Sends one message; see [`SeqpacketStream::send`].
    pub async fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.shared.send(data, false).await
    }

    /// Sends one message, marked end-of-record when `eor` is set.
    pub async fn send_eor(&self, data: &[u8], eor: bool) -> io::Result<usize> {
        self.shared.send(data, eor).await
    }
}
