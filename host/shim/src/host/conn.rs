//! The host methods that stream and seqpacket sockets share: the WIT gives
//! both resources the same lifecycle calls (bind, connect, listen, accept,
//! addresses, options, shutdown), which `conn`'s `ConnSocket` implements
//! once for both.

/// The host methods that stream and seqpacket sockets share, each a
/// forward to the resource's `ConnSocket` (its `.0`). Invoked inside
/// `impl wit::Host…Socket for HostState`, with the resource type and the
/// function that pushes a connection's two children (byte streams, or a
/// message receiver and sender) and their types; the methods only one
/// kind has are written beside it.
///
/// A macro because the two traits are generated and unrelated: no generic
/// impl can cover both.
macro_rules! conn_socket_methods {
    ($Socket:ident, $children:ident -> ($A:ty, $B:ty)) => {
        fn start_bind(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            network: ::wasmtime::component::Resource<$crate::network::Network>,
            local_address: $crate::network::VsockAddress,
        ) -> Result<(), $crate::network::VsockError> {
            self.table.get(&network)?;
            Ok(self.table.get_mut(&this)?.0.start_bind(local_address)?)
        }

        fn finish_bind(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.finish_bind()?)
        }

        fn start_connect(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            network: ::wasmtime::component::Resource<$crate::network::Network>,
            remote_address: $crate::network::VsockAddress,
        ) -> Result<(), $crate::network::VsockError> {
            self.table.get(&network)?;
            Ok(self.table.get_mut(&this)?.0.start_connect(remote_address)?)
        }

        fn finish_connect(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<
            (::wasmtime::component::Resource<$A>, ::wasmtime::component::Resource<$B>),
            $crate::network::VsockError,
        > {
            let socket = self.table.get_mut(&this)?;
            socket.0.finish_connect()?;
            let sock = socket.0.sock.clone();
            $children(&mut self.table, &this, &sock)
        }

        fn start_listen(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.start_listen()?)
        }

        fn finish_listen(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.finish_listen()?)
        }

        fn accept(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<
            (
                ::wasmtime::component::Resource<$Socket>,
                ::wasmtime::component::Resource<$A>,
                ::wasmtime::component::Resource<$B>,
            ),
            $crate::network::VsockError,
        > {
            let (conn, _peer) = self.table.get_mut(&this)?.0.accept()?;
            let sock = conn.sock.clone();
            let socket = self.table.push($Socket(conn))?;
            let (a, b) = $children(&mut self.table, &socket, &sock)?;
            Ok((socket, a, b))
        }

        fn local_address(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<$crate::network::VsockAddress, $crate::network::VsockError> {
            Ok(self.table.get(&this)?.0.local_address()?)
        }

        fn remote_address(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<$crate::network::VsockAddress, $crate::network::VsockError> {
            Ok(self.table.get(&this)?.0.remote_address()?)
        }

        fn is_listening(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> ::wasmtime::Result<bool> {
            Ok(self.table.get(&this)?.0.is_listening())
        }

        fn set_listen_backlog_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: u64,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.set_listen_backlog_size(value)?)
        }

        fn buffer_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<u64, $crate::network::VsockError> {
            Ok(self.table.get(&this)?.0.buffer_size()?)
        }

        fn set_buffer_size(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: u64,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.set_buffer_size(value)?)
        }

        fn connect_timeout(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> Result<u64, $crate::network::VsockError> {
            Ok(self.table.get(&this)?.0.connect_timeout()?)
        }

        fn set_connect_timeout(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: u64,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.set_connect_timeout(value)?)
        }

        fn set_linger(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            value: Option<u64>,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.set_linger(value)?)
        }

        fn subscribe(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> ::wasmtime::Result<::wasmtime::component::Resource<::wasmtime_wasi::p2::DynPollable>> {
            ::wasmtime_wasi::p2::subscribe(&mut self.table, this)
        }

        fn shutdown(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
            shutdown_type: $crate::bindings::vsock::sockets::stream_socket::ShutdownType,
        ) -> Result<(), $crate::network::VsockError> {
            Ok(self.table.get_mut(&this)?.0.shutdown(shutdown_type.into())?)
        }

        fn drop(
            &mut self,
            this: ::wasmtime::component::Resource<$Socket>,
        ) -> ::wasmtime::Result<()> {
            // Fails (and traps) while children or pollables are alive;
            // otherwise the last reference to the stack socket goes and
            // closes it.
            self.table.delete(this)?;
            Ok(())
        }
    };
}
pub(crate) use conn_socket_methods;
