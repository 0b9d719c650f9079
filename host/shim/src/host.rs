//! One component instance: its store data, the linker every instance
//! shares, and the thread that runs `wasi:cli/run`. The `network`
//! interface's host traits are here; each socket interface's are in the
//! submodule of its name, which forwards to the socket types.
//!
//! A component gets wasmtime-wasi's whole `wasi:cli/command` world (std
//! needs it) plus the `vsock:sockets` imports. Its WASI context is narrow
//! on purpose: the args, environment variables and directories the host
//! gave it (none by default), inherited stdio (or the files the host gave
//! for it), and no IP networking unless the host asked for loopback TCP
//! (`wasi_tcp`), which exists for benchmark baselines.

mod conn;
mod datagram;
mod seqpacket;
mod stream;

use std::io::Write as _;
use std::net::SocketAddr;

use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::error::Context as _;
use wasmtime::{Engine, Store};
use wasmtime_wasi::cli::{InputFile, OutputFile};
use wasmtime_wasi::p2::bindings::sync::{Command, CommandPre};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::vsock::sockets;
use crate::config::{ComponentStdio, Preopen, STOPPED_EXIT_CODE};
use crate::memory_limit::{MemoryLimit, OUT_OF_MEMORY_EXIT_CODE, OutOfMemory};
use crate::net::VsockCtx;
use crate::network::vsock::sockets::network;
use crate::network::{ErrorCode, Network, StreamFailure, VsockError};

/// The store data of one component instance.
pub(crate) struct HostState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) vsock: VsockCtx,
    memory: MemoryLimit,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The linker for every component of a shim: wasmtime-wasi's sync p2
/// bindings, then each `vsock:sockets` interface.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    let l = &mut linker;
    network::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::instance_network::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::stream_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::stream_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::seqpacket_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::seqpacket_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::datagram_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::datagram_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    Ok(linker)
}

/// Loopback-only TCP for `wasi:sockets`: binding the wildcard address is
/// allowed only for an implicit bind (port 0, before a connect); listening,
/// accepting and connecting need loopback addresses. UDP stays off.
fn loopback_only(addr: SocketAddr, usage: SocketAddrUse) -> bool {
    match usage {
        SocketAddrUse::TcpBind => {
            addr.ip().is_loopback() || (addr.ip().is_unspecified() && addr.port() == 0)
        }
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept | SocketAddrUse::TcpConnect => {
            addr.ip().is_loopback()
        }
        SocketAddrUse::UdpBind | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => false,
    }
}

/// Everything one component thread needs.
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) pre: CommandPre<HostState>,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) dirs: Vec<Preopen>,
    pub(crate) stdio: ComponentStdio,
    pub(crate) vsock: VsockCtx,
    pub(crate) wasi_tcp: bool,
    pub(crate) memory_limit: Option<u64>,
}

impl Instance {
    /// Runs `wasi:cli/run` to the end and returns the exit code: the one
    /// the component passed to `exit`, 0 or 1 for `run`'s result,
    /// [`STOPPED_EXIT_CODE`] when the shim stopped it,
    /// [`OUT_OF_MEMORY_EXIT_CODE`] when it grew past its memory limit, and
    /// 134 (128 + SIGABRT, as the wasmtime CLI reports it) for any other
    /// trap. Both of the last are also printed to stderr.
    pub(crate) fn run(self) -> i32 {
        match self.try_run() {
            Ok(code) => code,
            Err(e) => {
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    return exit.0;
                }
                if e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
                    tracing::debug!(component = %self.name, "stopped");
                    return STOPPED_EXIT_CODE;
                }
                if let Some(oom) = e.downcast_ref::<OutOfMemory>() {
                    self.report(format_args!("{oom}"));
                    return OUT_OF_MEMORY_EXIT_CODE;
                }
                self.report(format_args!("{e:?}"));
                134
            }
        }
    }

    fn try_run(&self) -> wasmtime::Result<i32> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.inherit_stdio().arg(&self.name).args(&self.args).envs(&self.env);
        self.redirect_stdio(&mut wasi).context("opening the standard streams")?;
        for dir in &self.dirs {
            let perms = if dir.read_only {
                wasmtime_wasi::FsPerms::ReadOnly
            } else {
                wasmtime_wasi::FsPerms::ReadWrite
            };
            wasi.preopened_dir(&dir.host, &dir.guest, perms)
                .with_context(|| format!("preopening {}", dir.host.display()))?;
        }
        if self.wasi_tcp {
            wasi.allow_tcp(true).socket_addr_check(|addr, usage| {
                Box::pin(async move { loopback_only(addr, usage) })
            });
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            vsock: self.vsock.clone(),
            memory: MemoryLimit::new(self.memory_limit),
        };
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|state| &mut state.memory);
        // Any epoch increment (only `Stopper::stop` makes one) traps.
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        let command: Command = self.pre.instantiate(&mut store).context("instantiating")?;
        let result = command.wasi_cli_run().call_run(&mut store)?;
        Ok(if result.is_ok() { 0 } else { 1 })
    }
}

impl Instance {
    /// Says why the component ended where its own stderr goes: the file
    /// the host gave it (containerd's pipe, so `kubectl logs` shows the
    /// reason beside the component's last words), else the host's stderr.
    fn report(&self, why: std::fmt::Arguments<'_>) {
        let line = format!("pier: component {}: {why}\n", self.name);
        match &self.stdio.stderr {
            Some(file) => {
                let _ = (&**file).write_all(line.as_bytes());
            }
            None => eprint!("{line}"),
        }
    }

    /// Points the streams the host gave files for at those files; each
    /// gets its own descriptor, as wasmtime-wasi's file streams own theirs.
    fn redirect_stdio(&self, wasi: &mut WasiCtxBuilder) -> std::io::Result<()> {
        let stdio = &self.stdio;
        if let Some(file) = &stdio.stdin {
            wasi.stdin(InputFile::new(file.try_clone()?));
        }
        if let Some(file) = &stdio.stdout {
            wasi.stdout(OutputFile::new(file.try_clone()?));
        }
        if let Some(file) = &stdio.stderr {
            wasi.stderr(OutputFile::new(file.try_clone()?));
        }
        Ok(())
    }
}

impl network::Host for HostState {
    fn convert_error_code(&mut self, error: VsockError) -> wasmtime::Result<ErrorCode> {
        match error {
            VsockError::Code(code) => Ok(code),
            VsockError::Trap(e) => Err(e),
        }
    }

    fn network_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        let err = self.table.get(&err)?;
        Ok(err.downcast_ref::<StreamFailure>().map(|f| f.0))
    }
}

impl network::HostNetwork for HostState {
    fn local_cid(&mut self, this: Resource<Network>) -> wasmtime::Result<u32> {
        self.table.get(&this)?;
        Ok(self.vsock.net.local_cid())
    }

    fn drop(&mut self, this: Resource<Network>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl sockets::instance_network::Host for HostState {
    fn instance_network(&mut self) -> wasmtime::Result<Resource<Network>> {
        Ok(self.table.push(Network)?)
    }
}
