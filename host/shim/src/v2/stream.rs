//! 0.2.0 stream sockets: async `connect`, the stream of accepted
//! connections, and the two `stream<u8>`s of a connection.
//!
//! The byte streams are where 0.2.0 should beat 0.1.0. wasmtime hands a
//! producer the component's read buffer and a consumer the component's
//! write buffer directly ([`Destination::as_direct`],
//! [`Source::as_direct`]), so a read copies from the stack's receive ring
//! straight into the component's memory and a write copies from the
//! component's memory straight into the driver's tx buffers: one copy
//! each way, of as many bytes as the component's buffer holds, with no
//! `Vec` per call. The producer takes bytes off the stack only when the
//! component reads, so a component that stops reading stops its peer
//! through credit, and the host holds no more than the socket's buffer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pier_stack::{Error, Interest, Readiness, SocketType};
use tokio::sync::oneshot;
use wasmtime::StoreContextMut;
use wasmtime::component::{
    Destination, FutureReader, HasSelf, Resource, Source, StreamConsumer, StreamProducer,
    StreamReader, StreamResult,
};

use super::conn::{self, AsyncStore, ConnResource, Outcome, Store, conn_resource_methods, get};
use super::resources::StreamSocket;
use super::types::{self, ErrorCode, VsockAddress};
use crate::conn::ConnSocket;
use crate::host::HostState;
use crate::net::{Sock, code};

/// Most bytes one read takes off the stack: one vsock packet's worth, as
/// 0.1.0's `check-write` permits.
const MAX_READ: usize = 64 * 1024;

impl ConnResource for StreamSocket {
    fn conn(&mut self) -> &mut ConnSocket {
        &mut self.conn
    }

    fn accepted(conn: ConnSocket) -> Self {
        Self { conn, sending: false, receiving: false }
    }
}

impl StreamSocket {
    /// The socket's stack socket for a connection's one `send` (or one
    /// `receive`: `pick` chooses the flag), or why there is none.
    fn take_half(&mut self, pick: fn(&mut Self) -> &mut bool) -> Result<Arc<Sock>, ErrorCode> {
        if !self.conn.is_connected() || std::mem::replace(pick(self), true) {
            return Err(ErrorCode::InvalidState);
        }
        Ok(self.conn.sock.clone())
    }
}

impl types::HostStreamSocket for HostState {
    fn create(&mut self) -> Outcome<Resource<StreamSocket>> {
        match ConnSocket::create(&self.vsock, SocketType::Stream) {
            Ok(conn) => Ok(Ok(self.table.push(StreamSocket::accepted(conn))?)),
            Err(e) => Ok(Err(e.into())),
        }
    }

    fn pending_input(&mut self, this: Resource<StreamSocket>) -> Outcome<u64> {
        Ok(get(&mut self.table, &this)?.conn.receive_queued().map_err(Into::into))
    }

    conn_resource_methods!(StreamSocket);
}

impl types::HostStreamSocketWithStore<HostState> for HasSelf<HostState> {
    async fn connect(
        store: &AsyncStore,
        this: Resource<StreamSocket>,
        remote: VsockAddress,
    ) -> Outcome<()> {
        conn::connect(store, &this, remote).await
    }

    fn listen(
        store: Store<'_>,
        this: Resource<StreamSocket>,
    ) -> Outcome<StreamReader<Resource<StreamSocket>>> {
        conn::listen(store, &this)
    }

    fn send(
        mut store: Store<'_>,
        this: Resource<StreamSocket>,
        mut data: StreamReader<u8>,
    ) -> wasmtime::Result<FutureReader<Result<(), ErrorCode>>> {
        match get(&mut store.get().table, &this)?.take_half(|s| &mut s.sending) {
            Ok(sock) => {
                let (done, outcome) = oneshot::channel();
                data.pipe(&mut store, Sending { sock, done: Some(done) })?;
                FutureReader::new(&mut store, ending(outcome))
            }
            Err(e) => {
                data.close(&mut store)?;
                FutureReader::new(&mut store, failed(e))
            }
        }
    }

    fn receive(
        mut store: Store<'_>,
        this: Resource<StreamSocket>,
    ) -> wasmtime::Result<(StreamReader<u8>, FutureReader<Result<(), ErrorCode>>)> {
        match get(&mut store.get().table, &this)?.take_half(|s| &mut s.receiving) {
            Ok(sock) => {
                let (done, outcome) = oneshot::channel();
                Ok((
                    StreamReader::new(&mut store, Receiving { sock, done: Some(done) })?,
                    FutureReader::new(&mut store, ending(outcome))?,
                ))
            }
            Err(e) => Ok((
                StreamReader::new(&mut store, std::iter::empty())?,
                FutureReader::new(&mut store, failed(e))?,
            )),
        }
    }
}

/// The future beside a half that was refused at once.
async fn failed(e: ErrorCode) -> wasmtime::Result<Result<(), ErrorCode>> {
    Ok(Err(e))
}

/// The future beside a byte stream: how it ended. A half dropped without
/// saying (the store went away) ended in order.
async fn ending(
    outcome: oneshot::Receiver<Result<(), ErrorCode>>,
) -> wasmtime::Result<Result<(), ErrorCode>> {
    Ok(outcome.await.unwrap_or(Ok(())))
}

/// How a connection's byte stream ended, for the future beside it.
type Ending = Option<oneshot::Sender<Result<(), ErrorCode>>>;

fn end(done: &mut Ending, outcome: Result<(), ErrorCode>) {
    if let Some(done) = done.take() {
        let _ = done.send(outcome);
    }
}

/// The bytes the peer sends, read straight into the component's buffer.
struct Receiving {
    sock: Arc<Sock>,
    done: Ending,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        end(&mut self.done, Ok(()));
    }
}

impl StreamProducer<HostState> for Receiving {
    type Item = u8;
    /// Unused: every read goes straight into the reader's buffer.
    type Buffer = Option<u8>;

    fn poll_produce<'a>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut store: StoreContextMut<'a, HostState>,
        dst: Destination<'a, Self::Item, Self::Buffer>,
        finish: bool,
    ) -> Poll<wasmtime::Result<StreamResult>> {
        let pending = if finish { Poll::Ready(Ok(StreamResult::Cancelled)) } else { Poll::Pending };
        let this = &mut *self;
        if this.done.is_none() {
            return Poll::Ready(Ok(StreamResult::Dropped));
        }
        if dst.remaining(&mut store) == Some(0) {
            return match this.sock.poll_wait_for(cx, Readiness::READABLE, &[Interest::Read]) {
                Poll::Ready(()) => Poll::Ready(Ok(StreamResult::Completed)),
                Poll::Pending => pending,
            };
        }
        let mut dst = dst.as_direct(store, MAX_READ);
        loop {
            let buf = dst.remaining();
            let result = this.sock.with(|s, h, _| {
                s.recv_with(h, false, |a, b| {
                    let n = buf.len().min(a.len() + b.len());
                    let first = n.min(a.len());
                    buf[..first].copy_from_slice(&a[..first]);
                    buf[first..n].copy_from_slice(&b[..n - first]);
                    Ok::<_, std::convert::Infallible>(n)
                })
            });
            return match result {
                Ok(info) if info.eof => {
                    // Linux reads a peer's RST as end-of-file too; the
                    // future is where 0.2.0 says which end it was.
                    let reset = this.sock.query(|s, h| s.peer_reset(h)).unwrap_or(false);
                    end(
                        &mut this.done,
                        if reset { Err(ErrorCode::ConnectionReset) } else { Ok(()) },
                    );
                    Poll::Ready(Ok(StreamResult::Dropped))
                }
                Ok(info) => {
                    dst.mark_written(info.len);
                    Poll::Ready(Ok(StreamResult::Completed))
                }
                Err(Error::WouldBlock) => {
                    if this
                        .sock
                        .poll_wait_for(cx, Readiness::READABLE, &[Interest::Read])
                        .is_ready()
                        && !this.sock.net.stopping()
                    {
                        continue;
                    }
                    pending
                }
                Err(e) => {
                    end(&mut this.done, Err(receive_error(e)));
                    Poll::Ready(Ok(StreamResult::Dropped))
                }
            };
        }
    }
}

fn receive_error(e: Error) -> ErrorCode {
    match e {
        Error::ConnectionReset => ErrorCode::ConnectionReset,
        e => code(e).into(),
    }
}

/// The bytes the component sends, copied from its buffer straight into
/// the driver's tx buffers as the peer's credit allows. The end of the
/// component's stream is SHUT_WR.
struct Sending {
    sock: Arc<Sock>,
    done: Ending,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.done.is_some() {
            let outcome = self
                .sock
                .with(|s, h, _| s.shutdown(h, pier_stack::Shutdown::Write))
                .map_err(|_| ErrorCode::InvalidState);
            self.sock.note_shutdown(pier_stack::Shutdown::Write);
            end(&mut self.done, outcome);
        }
    }
}

impl StreamConsumer<HostState> for Sending {
    type Item = u8;

    fn poll_consume(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        store: StoreContextMut<HostState>,
        src: Source<Self::Item>,
        finish: bool,
    ) -> Poll<wasmtime::Result<StreamResult>> {
        let pending = if finish { Poll::Ready(Ok(StreamResult::Cancelled)) } else { Poll::Pending };
        let this = &mut *self;
        if this.done.is_none() {
            return Poll::Ready(Ok(StreamResult::Dropped));
        }
        let mut src = src.as_direct(store);
        loop {
            let bytes = src.remaining();
            if bytes.is_empty() {
                return match this.sock.poll_wait_for(cx, Readiness::WRITABLE, &[Interest::Write]) {
                    Poll::Ready(()) => Poll::Ready(Ok(StreamResult::Completed)),
                    Poll::Pending => pending,
                };
            }
            return match this.sock.send_in_place(bytes) {
                Ok(n) => {
                    src.mark_read(n);
                    Poll::Ready(Ok(StreamResult::Completed))
                }
                Err(Error::WouldBlock) => {
                    if this
                        .sock
                        .poll_wait_for(cx, Readiness::WRITABLE, &[Interest::Write])
                        .is_ready()
                        && !this.sock.net.stopping()
                    {
                        continue;
                    }
                    pending
                }
                Err(e) => {
                    let e = match e {
                        Error::ConnectionReset | Error::BrokenPipe => ErrorCode::ConnectionReset,
                        e => code(e).into(),
                    };
                    end(&mut this.done, Err(e));
                    Poll::Ready(Ok(StreamResult::Dropped))
                }
            };
        }
    }
}
