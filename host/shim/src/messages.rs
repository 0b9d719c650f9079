//! The message half that seqpacket and datagram resources share: batched
//! receive, and the send protocol of `check-send` / `send`.
//!
//! A seqpacket message and a datagram differ in what travels with the
//! bytes (an end-of-record mark, a destination) and in how a failure reads
//! to the component, not in how they move: both are taken off the stack
//! whole, many per host call, and both are sent under the udp permit rule.
//! Keeping that protocol here means its promises (a permitted message is
//! accepted, an accepted message is delivered even if its sender goes, a
//! pollable only fires when `check-send` would say more than 0) are kept
//! in one place.
//!
//! The permit rule: `check-send` permits [`SEND_PERMIT`] messages, and
//! `send` accepts every permitted message. One that does not fit the
//! socket's send space right now is still accepted: the [`Sender`] holds
//! it (at most one, so memory stays bounded by one message) and
//! `check-send` answers 0 until the credit lets it out. A component
//! therefore never retries a large message in a loop, and never waits on a
//! pollable that cannot fire: the held message is retried on every credit
//! update. A held message outlives its sender: dropped (or the component
//! gone), the sender hands it to a background task that sends it when
//! credit returns.

use std::sync::Arc;

use pier_stack::{Error, RecvInfo, SocketHandle, Stack};
use wasmtime_wasi::p2::Pollable;

use crate::net::Sock;
use crate::network::{ErrorCode, VsockError};

/// Most messages one `receive` returns, whatever the component asks.
const MAX_BATCH: usize = 256;
/// `receive` stops adding messages once a batch holds this many bytes.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Messages one `check-send` permits.
const SEND_PERMIT: u64 = 64;

/// What one [`receive`] took off a socket.
pub(crate) struct Batch<T> {
    pub(crate) items: Vec<T>,
    /// Bytes of whole messages still queued after the batch (the inq hint).
    pub(crate) inq: u64,
    /// The receive reached end-of-file (only a connection has one).
    pub(crate) eof: bool,
    /// The error that ended the batch. The stack hands each error out only
    /// once, so a caller that already has items must keep it for later or
    /// decide it does not matter.
    pub(crate) error: Option<Error>,
}

/// Takes up to `max_results` whole messages off a socket in one go, the
/// batch that one `receive` call returns. `keep` turns each message into
/// what the component gets, or drops it (a datagram the component may not
/// hear); dropped messages count toward neither limit.
pub(crate) fn receive<T>(
    s: &mut Stack,
    h: SocketHandle,
    max_results: u64,
    mut keep: impl FnMut(Vec<u8>, RecvInfo) -> Option<T>,
) -> Batch<T> {
    let max = usize::try_from(max_results).unwrap_or(usize::MAX).min(MAX_BATCH);
    let mut items = Vec::new();
    let mut bytes = 0;
    let mut eof = false;
    let mut error = None;
    while items.len() < max && bytes < MAX_BATCH_BYTES {
        // One allocation per message, sized exactly: it becomes the list
        // element wasmtime lowers into the component.
        let mut data = Vec::new();
        let received = s.recv_with(h, false, |a, b| {
            data.reserve_exact(a.len() + b.len());
            data.extend_from_slice(a);
            data.extend_from_slice(b);
            Ok::<_, std::convert::Infallible>(data.len())
        });
        match received {
            Ok(info) if info.eof => {
                eof = true;
                break;
            }
            Ok(info) => {
                let len = data.len();
                if let Some(item) = keep(data, info) {
                    bytes += len;
                    items.push(item);
                }
            }
            Err(Error::WouldBlock) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let inq = s.recv_queued(h).unwrap_or(0) as u64;
    Batch { items, inq, eof, error }
}

/// One message as the stack takes it: the bytes and whatever the socket
/// kind sends with them. Implemented by each kind of [`Sender`].
pub(crate) trait Outgoing: Send + Sync + 'static {
    /// The trap for a `send` of more messages than `check-send` permitted;
    /// it names the resource, so the component's author knows which.
    const OVER_PERMIT: &'static str;

    /// Queues the message, or says `WouldBlock` while there is no room.
    fn send(&self, s: &mut Stack, h: SocketHandle) -> Result<(), Error>;

    /// What a failed send means to the component. The sender's socket is
    /// there because the same errno can be ours or the peer's.
    fn error(sock: &Sock, e: Error) -> ErrorCode;

    /// Lets `check-send` fail when a send would, without sending anything,
    /// so that a component learns of a dead connection before it hands
    /// over a message.
    fn probe(_sock: &Sock) -> Result<(), Error> {
        Ok(())
    }
}

/// The sending side of a seqpacket connection or a datagram stream pair:
/// the permit, the held message and the failure it left.
pub(crate) struct Sender<M: Outgoing> {
    sock: Arc<Sock>,
    /// Messages the last `check-send` permitted and `send` has not used.
    permit: u64,
    /// A permitted message that did not fit yet.
    held: Option<M>,
    /// The failure of a held message, for the next call.
    pending_error: Option<ErrorCode>,
}

impl<M: Outgoing> Sender<M> {
    pub(crate) fn new(sock: Arc<Sock>) -> Self {
        Self { sock, permit: 0, held: None, pending_error: None }
    }

    /// Tries to send the held message; `Ok(true)` when none is held.
    fn flush_held(&mut self) -> Result<bool, ErrorCode> {
        let Some(held) = &self.held else { return Ok(true) };
        match self.sock.with(|s, h, _| held.send(s, h)) {
            Ok(()) => {
                self.held = None;
                Ok(true)
            }
            Err(Error::WouldBlock) => Ok(false),
            Err(e) => {
                self.held = None;
                Err(M::error(&self.sock, e))
            }
        }
    }

    /// `check-send`: how many messages the next `send` may take.
    pub(crate) fn check_send(&mut self) -> Result<u64, ErrorCode> {
        self.permit = 0;
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        if !self.flush_held()? {
            return Ok(0);
        }
        M::probe(&self.sock).map_err(|e| M::error(&self.sock, e))?;
        self.permit = SEND_PERMIT;
        Ok(SEND_PERMIT)
    }

    /// `send`: sends `items` in order until the first failure and returns
    /// how many were accepted. `prepare` turns what the component passed
    /// into a message, or fails it before it reaches the stack.
    pub(crate) fn send<I>(
        &mut self,
        items: Vec<I>,
        mut prepare: impl FnMut(I) -> Result<M, ErrorCode>,
    ) -> Result<u64, VsockError> {
        let count = items.len() as u64;
        if count > self.permit {
            return Err(VsockError::trap(M::OVER_PERMIT));
        }
        self.permit -= count;
        let mut accepted = 0u64;
        let mut failure = None;
        let mut held = None;
        let sock = &self.sock;
        sock.with(|s, h, _| {
            for item in items {
                let message = match prepare(item) {
                    Ok(message) => message,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                };
                match message.send(s, h) {
                    Ok(()) => accepted += 1,
                    Err(Error::WouldBlock) => {
                        // Permitted, so accepted: held until credit allows.
                        held = Some(message);
                        accepted += 1;
                        break;
                    }
                    Err(e) => {
                        failure = Some(M::error(sock, e));
                        break;
                    }
                }
            }
        });
        if held.is_some() {
            self.held = held;
            self.permit = 0;
        }
        match failure {
            // The failure, if it persists, reaches the next call.
            Some(e) if accepted == 0 => Err(e.into()),
            _ => Ok(accepted),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl<M: Outgoing> Pollable for Sender<M> {
    /// Ready when `check-send` would permit again: the held message went
    /// out or failed (the failure waits for that call).
    async fn ready(&mut self) {
        let Some(held) = &self.held else { return };
        match self.sock.send_when_ready(|s, h| held.send(s, h)).await {
            Some(Ok(())) => self.held = None,
            Some(Err(e)) => {
                self.held = None;
                self.pending_error = Some(M::error(&self.sock, e));
            }
            // The shim stops; the message stays held.
            None => {}
        }
    }
}

impl<M: Outgoing> Drop for Sender<M> {
    /// A held message was accepted, so it is not lost with its sender.
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        let sock = self.sock.clone();
        self.sock.net.finish_in_background(async move {
            sock.send_when_ready(|s, h| held.send(s, h)).await;
        });
    }
}
