//! What 0.2.0's stream and seqpacket sockets share: the lifecycle of
//! [`ConnSocket`] in one-call form (bind, an awaited connect, a listener
//! that is a stream of connections), and the sync methods both resources
//! have.
//!
//! 0.1.0's two-phase calls map onto 0.2.0's one-call forms directly:
//! `bind` is `start-bind` then `finish-bind`, `listen` the same, and
//! `connect` is `start-connect`, a wait on the socket's readiness (what
//! 0.1.0's pollable waits for), then `finish-connect`.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use wasmtime::StoreContextMut;
use wasmtime::component::{
    Access, Accessor, Destination, HasSelf, Resource, ResourceTable, StreamProducer, StreamReader,
    StreamResult,
};

use super::types::{ErrorCode, VsockAddress};
use crate::conn::ConnSocket;
use crate::host::HostState;
use crate::network::ErrorCode as V1ErrorCode;

/// A result the component sees, inside a possible trap.
pub(crate) type Outcome<T> = wasmtime::Result<Result<T, ErrorCode>>;

pub(crate) type Store<'a> = Access<'a, HostState, HasSelf<HostState>>;
pub(crate) type AsyncStore = Accessor<HostState, HasSelf<HostState>>;

/// The interface's one free function.
impl super::types::Host for HostState {
    fn local_cid(&mut self) -> wasmtime::Result<u32> {
        Ok(self.vsock.net.local_cid())
    }
}

/// A 0.2.0 resource that stands on a [`ConnSocket`].
pub(crate) trait ConnResource: Send + Sized + 'static {
    fn conn(&mut self) -> &mut ConnSocket;
    /// The resource for a connection a listener took.
    fn accepted(conn: ConnSocket) -> Self;
}

pub(crate) fn get<'a, S: ConnResource>(
    table: &'a mut ResourceTable,
    this: &Resource<S>,
) -> wasmtime::Result<&'a mut S> {
    Ok(table.get_mut(this)?)
}

pub(crate) fn bind<S: ConnResource>(
    table: &mut ResourceTable,
    this: &Resource<S>,
    local: VsockAddress,
) -> Outcome<()> {
    let conn = get(table, this)?.conn();
    Ok(conn.start_bind(local.into()).and_then(|()| conn.finish_bind()).map_err(Into::into))
}

/// Connects, and returns once the peer answered or the connect failed.
pub(crate) async fn connect<S: ConnResource>(
    store: &AsyncStore,
    this: &Resource<S>,
    remote: VsockAddress,
) -> Outcome<()> {
    let started = store.with(|mut s| {
        get(&mut s.get().table, this).map(|r| r.conn().start_connect(remote.into()))
    })?;
    if let Err(e) = started {
        return Ok(Err(e.into()));
    }
    std::future::poll_fn(|cx| {
        store.with(|mut s| {
            let conn = get(&mut s.get().table, this)?.conn();
            if conn.poll_ready(cx).is_pending() {
                return Poll::Pending;
            }
            match conn.finish_connect() {
                // Readiness without an outcome: only a stopping shim ends
                // the wait so, and the component stops at its next
                // instruction.
                Err(V1ErrorCode::WouldBlock) => Poll::Ready(Ok(Err(ErrorCode::Unknown))),
                outcome => Poll::Ready(Ok(outcome.map_err(Into::into))),
            }
        })
    })
    .await
}

/// Listens, and returns the stream of accepted connections.
pub(crate) fn listen<S: ConnResource>(
    mut store: Store<'_>,
    this: &Resource<S>,
) -> Outcome<StreamReader<Resource<S>>> {
    let conn = get(&mut store.get().table, this)?.conn();
    if let Err(e) = conn.start_listen().and_then(|()| conn.finish_listen()) {
        return Ok(Err(e.into()));
    }
    let acceptor = conn.acceptor().expect("a socket that just listened is listening");
    Ok(Ok(StreamReader::new(&mut store, Accepted::<S> { acceptor, kind: PhantomData })?))
}

/// The stream of a listener's accepted connections. It holds the
/// listening socket too, so the listener lives as long as either the
/// resource or this stream does.
struct Accepted<S> {
    acceptor: ConnSocket,
    kind: PhantomData<fn() -> S>,
}

impl<S: ConnResource> StreamProducer<HostState> for Accepted<S> {
    type Item = Resource<S>;
    type Buffer = Option<Self::Item>;

    fn poll_produce<'a>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut store: StoreContextMut<'a, HostState>,
        mut dst: Destination<'a, Self::Item, Self::Buffer>,
        finish: bool,
    ) -> Poll<wasmtime::Result<StreamResult>> {
        let pending = if finish { Poll::Ready(Ok(StreamResult::Cancelled)) } else { Poll::Pending };
        if dst.remaining(&mut store) == Some(0) {
            return match self.acceptor.poll_ready(cx) {
                Poll::Ready(()) => Poll::Ready(Ok(StreamResult::Completed)),
                Poll::Pending => pending,
            };
        }
        loop {
            match self.acceptor.accept() {
                Ok((conn, _peer)) => {
                    let socket = store.data_mut().table.push(S::accepted(conn))?;
                    dst.set_buffer(Some(socket));
                    return Poll::Ready(Ok(StreamResult::Completed));
                }
                // Nothing waiting, or the one waiting was refused at the
                // component's socket limit (its peer sees a reset, as a
                // full backlog gives in Linux): wait for the next.
                Err(V1ErrorCode::WouldBlock | V1ErrorCode::NewSocketLimit) => {
                    if self.acceptor.poll_ready(cx).is_pending() {
                        return pending;
                    }
                    if self.acceptor.ctx.net.stopping() {
                        return Poll::Ready(Ok(StreamResult::Dropped));
                    }
                }
                Err(e) => {
                    tracing::debug!("a listener's stream ends: {e:?}");
                    return Poll::Ready(Ok(StreamResult::Dropped));
                }
            }
        }
    }
}

/// The sync methods both connection resources have, each a forward to
/// the resource's [`ConnSocket`]. A macro because the two host traits are
/// generated and unrelated: no generic impl can cover both.
macro_rules! conn_resource_methods {
    ($Socket:ty) => {
        fn bind(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            local: $crate::v2::types::VsockAddress,
        ) -> $crate::v2::conn::Outcome<()> {
            $crate::v2::conn::bind(&mut self.table, &this, local)
        }

        fn shutdown(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            how: $crate::v2::types::ShutdownType,
        ) -> $crate::v2::conn::Outcome<()> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.shutdown(how.into()).map_err(Into::into))
        }

        fn get_local_address(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> $crate::v2::conn::Outcome<$crate::v2::types::VsockAddress> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.local_address().map(Into::into).map_err(Into::into))
        }

        fn get_remote_address(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> $crate::v2::conn::Outcome<$crate::v2::types::VsockAddress> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.remote_address().map(Into::into).map_err(Into::into))
        }

        fn get_is_listening(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> ::wasmtime::Result<bool> {
            Ok($crate::v2::conn::get(&mut self.table, &this)?.conn().is_listening())
        }

        fn set_listen_backlog_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: u64,
        ) -> $crate::v2::conn::Outcome<()> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.set_listen_backlog_size(value).map_err(Into::into))
        }

        fn get_buffer_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> $crate::v2::conn::Outcome<u64> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.buffer_size().map_err(Into::into))
        }

        fn set_buffer_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: u64,
        ) -> $crate::v2::conn::Outcome<()> {
            let conn = $crate::v2::conn::get(&mut self.table, &this)?.conn();
            Ok(conn.set_buffer_size(value).map_err(Into::into))
        }

        fn drop(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> ::wasmtime::Result<()> {
            // The last reference to the stack socket goes (unless a stream
            // still holds it) and closes it in order.
            self.table.delete(this)?;
            Ok(())
        }
    };
}
pub(crate) use conn_resource_methods;
