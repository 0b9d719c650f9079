//! What receiving hands the application: a [`RecvInfo`] beside the bytes
//! of each receive call, or, for a [`DirectReceive`] tap, the bytes
//! themselves as they arrive.

use super::SocketHandle;
use crate::addr::VsockAddr;
use crate::payload::Payload;

/// What one receive returned, beside the bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes copied to the caller.
    pub len: usize,
    /// Full size of the message or datagram; for streams, equal to `len`.
    pub message_len: usize,
    /// The message or datagram was longer than the buffer (MSG_TRUNC).
    pub truncated: bool,
    /// The message ended a record (MSG_EOR).
    pub end_of_record: bool,
    /// The peer has finished and nothing is left: this receive is the EOF.
    pub eof: bool,
    /// Bytes still queued after this receive (msg_inq). For a stream whose
    /// peer has finished, an empty queue reports 1 rather than 0, so that a
    /// caller that stops on 0 still makes the receive that sees EOF, as
    /// Linux's vsock does after TCP's `tcp_inq_hint`
    /// (`docs/linux-behaviours.md#inq-hint`).
    pub inq: usize,
    /// The sender: the connected peer, or the datagram's source.
    pub from: Option<VsockAddr>,
}

/// Takes a stream connection's incoming bytes straight out of the packet,
/// before they are copied into the socket's receive buffer.
///
/// For a transport that only relays a connection elsewhere (the host
/// bridge writes its bytes to a Unix socket), the buffer is a detour: a
/// copy in, and a copy out when the relay reads. With a tap, the stack
/// offers the payload first whenever the receive buffer is empty (so order
/// is kept); what the tap takes counts as received and read at once
/// (`fwd_cnt` moves, credit flows back as after a `recv`), and the rest is
/// buffered as usual. Readiness fires only for what was buffered.
pub trait DirectReceive {
    /// Bytes that arrived on stream socket `socket`; returns how many
    /// leading bytes it took (0 when it cannot take any now).
    fn deliver(&mut self, socket: SocketHandle, data: Payload<'_>) -> usize;
}
