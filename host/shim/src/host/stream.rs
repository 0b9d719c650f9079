//! The host side of `stream-socket` and `stream-create-socket`: forwards
//! to [`StreamSocket`].

use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream};

use super::HostState;
use super::conn::conn_socket_methods;
use crate::bindings::vsock::sockets::stream_create_socket;
use crate::bindings::vsock::sockets::stream_socket as wit;
use crate::network::VsockError;
use crate::stream::{StreamSocket, streams};

impl stream_create_socket::Host for HostState {
    fn create_stream_socket(&mut self) -> Result<Resource<StreamSocket>, VsockError> {
        let socket = StreamSocket::create(&self.vsock)?;
        Ok(self.table.push(socket)?)
    }
}

impl wit::Host for HostState {}

impl wit::HostStreamSocket for HostState {
    conn_socket_methods!(StreamSocket, streams -> (DynInputStream, DynOutputStream));

    fn receive_queued(&mut self, this: Resource<StreamSocket>) -> Result<u64, VsockError> {
        Ok(self.table.get(&this)?.0.receive_queued()?)
    }

    fn send_queued(&mut self, this: Resource<StreamSocket>) -> Result<u64, VsockError> {
        Ok(self.table.get(&this)?.0.send_queued()?)
    }
}
