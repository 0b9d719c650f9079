//! The host side of `datagram-socket` and `datagram-create-socket`:
//! forwards to [`DatagramSocket`] and its stream pair.

use wasmtime::component::Resource;
use wasmtime_wasi::p2::DynPollable;

use super::HostState;
use crate::bindings::vsock::sockets::datagram_create_socket;
use crate::bindings::vsock::sockets::datagram_socket::{
    self as wit, DatagramBatch, IncomingDatagram, OutgoingDatagram,
};
use crate::datagram::{DatagramSocket, IncomingDatagramStream, OutgoingDatagramStream};
use crate::network::{Network, VsockAddress, VsockError};

impl datagram_create_socket::Host for HostState {
    fn create_datagram_socket(&mut self) -> Result<Resource<DatagramSocket>, VsockError> {
        let socket = DatagramSocket::create(&self.vsock)?;
        Ok(self.table.push(socket)?)
    }
}

impl wit::Host for HostState {}

impl wit::HostDatagramSocket for HostState {
    fn start_bind(
        &mut self,
        this: Resource<DatagramSocket>,
        network: Resource<Network>,
        local_address: VsockAddress,
    ) -> Result<(), VsockError> {
        self.table.get(&network)?;
        Ok(self.table.get_mut(&this)?.start_bind(local_address)?)
    }

    fn finish_bind(&mut self, this: Resource<DatagramSocket>) -> Result<(), VsockError> {
        Ok(self.table.get_mut(&this)?.finish_bind()?)
    }

    fn stream(
        &mut self,
        this: Resource<DatagramSocket>,
        remote_address: Option<VsockAddress>,
    ) -> Result<(Resource<IncomingDatagramStream>, Resource<OutgoingDatagramStream>), VsockError>
    {
        let (rx, tx) = self.table.get_mut(&this)?.stream(remote_address)?;
        let rx = self.table.push_child(rx, &this)?;
        let tx = self.table.push_child(tx, &this)?;
        Ok((rx, tx))
    }

    fn local_address(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> Result<VsockAddress, VsockError> {
        Ok(self.table.get(&this)?.local_address()?)
    }

    fn remote_address(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> Result<VsockAddress, VsockError> {
        Ok(self.table.get(&this)?.remote_address()?)
    }

    fn subscribe(
        &mut self,
        this: Resource<DatagramSocket>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<DatagramSocket>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl wit::HostIncomingDatagramStream for HostState {
    fn receive(
        &mut self,
        this: Resource<IncomingDatagramStream>,
        max_results: u64,
    ) -> Result<DatagramBatch, VsockError> {
        let rx = self.table.get_mut(&this)?;
        let (datagrams, inq) = rx.receive(max_results, |data, from| IncomingDatagram {
            data,
            remote_address: from.into(),
        })?;
        Ok(DatagramBatch { datagrams, inq })
    }

    fn subscribe(
        &mut self,
        this: Resource<IncomingDatagramStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<IncomingDatagramStream>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl wit::HostOutgoingDatagramStream for HostState {
    fn check_send(&mut self, this: Resource<OutgoingDatagramStream>) -> Result<u64, VsockError> {
        Ok(self.table.get_mut(&this)?.check_send()?)
    }

    fn send(
        &mut self,
        this: Resource<OutgoingDatagramStream>,
        datagrams: Vec<OutgoingDatagram>,
    ) -> Result<u64, VsockError> {
        self.table.get_mut(&this)?.send(datagrams, |d| (d.data, d.remote_address))
    }

    fn subscribe(
        &mut self,
        this: Resource<OutgoingDatagramStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    fn drop(&mut self, this: Resource<OutgoingDatagramStream>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}
