//! Stream sockets, with data over real `wasi:io` streams.
//!
//! A connection hands out an [`InputStream`] and an [`OutputStream`] that
//! wasmtime-wasi serves like any other stream, so std's `Read`/`Write` in
//! the component work unchanged. Both hold the stack socket (shared with
//! the socket resource), and both are thin:
//!
//! - `read` is one non-blocking receive straight out of the stack's ring;
//! - `check-write` is the peer's credit ([`Stack::send_space`]) capped at
//!   64 KiB, and `write` hands the bytes to the stack, which accepts all of
//!   them because the credit was already there (straight into the driver's
//!   tx buffers while nothing is queued ahead, `Sock::send_in_place`).
//!   Nothing is buffered here, so `flush` has nothing to do.
//!
//! The one exception is a peer that *shrinks* its buffer between our
//! `check-write` and `write`: the stack then takes fewer bytes than were
//! permitted. The rest is kept (at most one permit's worth) and sent
//! first when credit returns, and `check-write` reports 0 until then,
//! because the WIT promises that every accepted byte is delivered.
//!
//! [`Stack::send_space`]: pier_stack::Stack::send_space

use std::sync::Arc;

use bytes::Bytes;
use pier_stack::{Error, Interest, Readiness, SocketType};
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, InputStream, OutputStream, Pollable, StreamError, StreamResult,
};

use crate::conn::ConnSocket;
use crate::net::{Sock, VsockCtx, code};
use crate::network::{ErrorCode, StreamFailure, VsockError};

/// Most bytes one `check-write` permits: one vsock packet.
pub(crate) const MAX_WRITE: usize = 64 * 1024;

/// The `stream-socket` resource.
pub struct StreamSocket(pub(crate) ConnSocket);

impl StreamSocket {
    pub(crate) fn create(ctx: &VsockCtx) -> Result<Self, ErrorCode> {
        ConnSocket::create(ctx, SocketType::Stream).map(Self)
    }
}

fn failed(code: ErrorCode) -> StreamError {
    StreamError::LastOperationFailed(StreamFailure(code).into())
}

/// The input half of a connection.
struct VsockInput {
    sock: Arc<Sock>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for VsockInput {
    async fn ready(&mut self) {
        self.sock.wait_for(Readiness::READABLE, &[Interest::Read]).await;
    }
}

impl InputStream for VsockInput {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        if size == 0 {
            return Ok(Bytes::new());
        }
        // One allocation per read is the shape of wasmtime-wasi's API: the
        // bytes become the `Vec` it lowers into the component and frees. A
        // reused buffer would only add a copy (a shared `Bytes` cannot
        // become that `Vec` in place).
        let mut data = Vec::new();
        let result = self.sock.with(|s, h, _| {
            s.recv_with(h, false, |a, b| {
                let n = size.min(a.len() + b.len());
                let first = n.min(a.len());
                data.reserve_exact(n);
                data.extend_from_slice(&a[..first]);
                data.extend_from_slice(&b[..n - first]);
                Ok::<_, std::convert::Infallible>(n)
            })
        });
        match result {
            Ok(info) if info.eof => Err(StreamError::Closed),
            Ok(_) => Ok(Bytes::from(data)),
            Err(Error::WouldBlock) => Ok(Bytes::new()),
            Err(Error::ConnectionReset) => Err(failed(ErrorCode::ConnectionReset)),
            Err(e) => Err(failed(code(e))),
        }
    }
}

/// The output half of a connection.
struct VsockOutput {
    sock: Arc<Sock>,
    /// What the last `check-write` permitted and `write` has not used.
    permit: usize,
    /// Permitted bytes the stack could not take (the peer shrank its
    /// buffer); they go out before anything else.
    leftover: Bytes,
}

impl VsockOutput {
    /// Maps a send failure: EPIPE (our shutdown, or a peer that can no
    /// longer receive) closes the stream; a reset is an error the
    /// component can read with `network-error-code`.
    fn error(e: Error) -> StreamError {
        match e {
            Error::BrokenPipe | Error::NotConnected => StreamError::Closed,
            Error::ConnectionReset => failed(ErrorCode::ConnectionReset),
            e => failed(code(e)),
        }
    }

    /// Tries to send the leftover; `Ok(true)` once none is left.
    fn push_leftover(&mut self) -> StreamResult<bool> {
        if self.leftover.is_empty() {
            return Ok(true);
        }
        let leftover = &self.leftover;
        match self.sock.with(|s, h, _| s.send(h, leftover)) {
            Ok(n) => {
                let _ = self.leftover.split_to(n);
                Ok(self.leftover.is_empty())
            }
            Err(Error::WouldBlock) => Ok(false),
            Err(e) => {
                self.leftover.clear();
                Err(Self::error(e))
            }
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for VsockOutput {
    async fn ready(&mut self) {
        if !self.leftover.is_empty() {
            let Self { sock, leftover, .. } = self;
            sock.wait(&[Interest::Write], |s, h| match s.send(h, leftover) {
                Ok(n) => {
                    let _ = leftover.split_to(n);
                    leftover.is_empty()
                }
                Err(Error::WouldBlock) => false,
                // The failure shows in the next check-write.
                Err(_) => true,
            })
            .await;
            // Bytes sent from inside the wait need a driver poll.
            self.sock.with(|_, _, _| ());
            if !self.leftover.is_empty() {
                return;
            }
        }
        self.sock.wait_for(Readiness::WRITABLE, &[Interest::Write]).await;
    }
}

impl OutputStream for VsockOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if bytes.len() > self.permit {
            return Err(StreamError::trap("write exceeds the permit of check-write"));
        }
        self.permit -= bytes.len();
        if bytes.is_empty() {
            return Ok(());
        }
        match self.sock.send_in_place(&bytes) {
            Ok(n) if n == bytes.len() => Ok(()),
            Ok(n) => {
                self.leftover = bytes.slice(n..);
                Ok(())
            }
            Err(Error::WouldBlock) => {
                self.leftover = bytes;
                Ok(())
            }
            Err(e) => Err(Self::error(e)),
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Accepted bytes are already in the stack, which sends them without
        // waiting for credit.
        self.push_leftover().map(|_| ())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if !self.push_leftover()? {
            self.permit = 0;
            return Ok(0);
        }
        let space = self.sock.query(|s, h| s.send_space(h)).map_err(Self::error)?;
        self.permit = space.min(MAX_WRITE);
        Ok(self.permit)
    }
}

/// Pushes a connection's two streams as children of its socket.
pub(crate) fn streams(
    table: &mut wasmtime::component::ResourceTable,
    socket: &Resource<StreamSocket>,
    sock: &Arc<Sock>,
) -> Result<(Resource<DynInputStream>, Resource<DynOutputStream>), VsockError> {
    let input: DynInputStream = Box::new(VsockInput { sock: sock.clone() });
    let output: DynOutputStream =
        Box::new(VsockOutput { sock: sock.clone(), permit: 0, leftover: Bytes::new() });
    let input = table.push_child(input, socket)?;
    let output = table.push_child(output, socket)?;
    Ok((input, output))
}

#[wasmtime_wasi::async_trait]
impl Pollable for StreamSocket {
    async fn ready(&mut self) {
        self.0.ready().await;
    }
}
