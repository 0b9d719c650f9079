//! What one seqpacket receive got. The seqpacket shells return it and
//! every platform builds it, so it lives below both.

/// What [`SeqpacketStream::recv`](crate::SeqpacketStream::recv) got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMessage {
    /// Bytes copied into the buffer. 0 means end-of-file: vsock never
    /// carries empty messages, so a 0-length receive is always the peer
    /// having finished.
    pub len: usize,
    /// The message was longer than the buffer (or than the host's
    /// per-message cap); the rest is discarded (MSG_TRUNC).
    pub truncated: bool,
    /// The sender marked this message as the end of a record (MSG_EOR).
    pub end_of_record: bool,
}
