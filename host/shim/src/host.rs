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

use wasmtime::component::{HasSelf, InstancePre, Linker, Resource, ResourceTable, TypedFunc};
use wasmtime::error::Context as _;
use wasmtime::{Engine, Store};
use wasmtime_wasi::cli::{InputFile, OutputFile};
use wasmtime_wasi::p2::bindings::sync::{Command, CommandPre};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::vsock::sockets;
use crate::config::{ComponentStdio, Preopen, STOPPED_EXIT_CODE};
use crate::line_stderr::LineStderr;
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

/// The linker for components that export `wasi:cli/run@0.2`:
/// wasmtime-wasi's sync p2 bindings, then each `vsock:sockets@0.1.0`
/// interface.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    add_vsock_0_1_0(&mut linker)?;
    Ok(linker)
}

/// The linker for components that export `wasi:cli/run@0.3.0`, which run
/// in wasmtime's concurrent event loop: there a host call that waits must
/// be a future (the sync bindings block their thread in a nested
/// runtime), so wasmtime-wasi's p2 bindings are its async ones. Both
/// `vsock:sockets` packages are there, so a component may use either.
pub(crate) fn async_linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    // WASI 0.3's own interfaces, for components built for it: pier-rt's
    // 0.2.0 backend waits on `wasi:clocks/monotonic-clock@0.3.0` for its
    // timeouts. They share the 0.2 context, so its rules (loopback-only
    // TCP, no UDP) hold for 0.3's sockets too.
    wasmtime_wasi::p3::add_to_linker(&mut linker)?;
    add_vsock_0_1_0(&mut linker)?;
    crate::v2::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    Ok(linker)
}

fn add_vsock_0_1_0(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    network::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::instance_network::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::stream_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::stream_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::seqpacket_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::seqpacket_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::datagram_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    sockets::datagram_create_socket::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    Ok(())
}

/// The export a WASI 0.3 command runs: an `async func`, so the component
/// may await its async imports before it returns.
pub(crate) const ASYNC_RUN: &str = "wasi:cli/run@0.3.0";

/// What each linker above offers, for the error a component whose
/// imports it cannot satisfy gets: wasmtime names the import it lacks,
/// this says which world would have it.
pub(crate) const SERVED_IMPORTS: &str = "a component exporting wasi:cli/run@0.2 can \
     import WASI 0.2 and vsock:sockets@0.1.0; one exporting wasi:cli/run@0.3.0 can also import \
     WASI 0.3 and vsock:sockets@0.2.0";

/// How a component's `run` is called.
pub(crate) enum Entry {
    /// `wasi:cli/run@0.2`: a plain call on the component's thread.
    Sync(CommandPre<HostState>),
    /// `wasi:cli/run@0.3.0`: a concurrent call in wasmtime's event loop,
    /// driven by wasmtime-wasi's runtime on the component's thread.
    Async(InstancePre<HostState>),
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
    pub(crate) entry: Entry,
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
        let engine = match &self.entry {
            Entry::Sync(pre) => pre.engine(),
            Entry::Async(pre) => pre.engine(),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.memory);
        // Any epoch increment (only `Stopper::stop` makes one) traps.
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        let result = match &self.entry {
            Entry::Sync(pre) => {
                let command: Command = pre.instantiate(&mut store).context("instantiating")?;
                command.wasi_cli_run().call_run(&mut store)?
            }
            Entry::Async(pre) => wasmtime_wasi::runtime::in_tokio(run_async(pre, &mut store))?,
        };
        Ok(if result.is_ok() { 0 } else { 1 })
    }
}

/// Instantiates a WASI 0.3 command and awaits its `run`.
async fn run_async(
    pre: &InstancePre<HostState>,
    store: &mut Store<HostState>,
) -> wasmtime::Result<Result<(), ()>> {
    let instance = pre.instantiate_async(&mut *store).await.context("instantiating")?;
    let run = instance
        .get_export_index(&mut *store, None, ASYNC_RUN)
        .and_then(|iface| instance.get_export_index(&mut *store, Some(&iface), "run"))
        .ok_or_else(|| wasmtime::format_err!("{ASYNC_RUN} has no `run`"))?;
    let run: TypedFunc<(), (Result<(), ()>,)> = instance.get_typed_func(&mut *store, run)?;
    let (result,) = store.run_concurrent(async |a| run.call_concurrent(a, ()).await).await??;
    Ok(result)
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
    /// Stderr, whichever it is, goes out a line at a time
    /// ([`crate::line_stderr`]).
    fn redirect_stdio(&self, wasi: &mut WasiCtxBuilder) -> std::io::Result<()> {
        let stdio = &self.stdio;
        if let Some(file) = &stdio.stdin {
            wasi.stdin(InputFile::new(file.try_clone()?));
        }
        if let Some(file) = &stdio.stdout {
            wasi.stdout(OutputFile::new(file.try_clone()?));
        }
        // Whole lines, so that none is cut by another writer's.
        wasi.stderr(match &stdio.stderr {
            Some(file) => LineStderr::file(file.try_clone()?),
            None => LineStderr::host(),
        });
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
