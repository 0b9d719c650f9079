//! `pier`: run WASI components with vsock sockets, and reach them from the
//! host.
//!
//! - `pier run APP.wasm` starts a shim (one vsock endpoint, CID 3 by
//!   default) with one component, or several from a config file, and
//!   exits with the component's exit code. Host programs reach it through
//!   the hybrid vsock Unix socket it prints.
//! - `pier boot IMAGE` boots an app built as a unikernel image in pier's
//!   KVM hypervisor (pier-vmm), console on stdout, behind the same hybrid
//!   vsock socket, and exits with the guest's exit code.
//! - `pier pool` keeps VMs prepared (in worker processes of its own) for
//!   `pier boot --pool`, which then skips making the VM.
//! - `pier vhost-user --vm SPEC` serves the vsock devices of VMs another
//!   VMM (QEMU) runs.
//! - `pier connect UDS PORT` is the host-side client: it does the
//!   Firecracker `CONNECT` handshake and then joins stdin and stdout to
//!   the connection, like socat, with half-close.
//!
//! Besides logs, the serving commands print the lines that say where
//! their socket is, errors, and on request their counters (`--stats` at
//! exit, SIGUSR1 at any time) and a packet capture's summary (`--pcap`).
//!
//! This file holds the command line's definition and the dispatch to the
//! commands. The modules:
//!
//! - `run`: `pier run`, its options and the supervision of the shim;
//! - `config`: the `--config` file of several components for `pier run`;
//! - `boot`: `pier boot`;
//! - `pool`: `pier pool`, its workers, and `pier boot --pool`'s side;
//! - `vhost_user`: `pier vhost-user`;
//! - `connect`: `pier connect`;
//! - `trace`: `pier trace`, a ring trace read back as text or a page;
//! - `lifecycle`: what the serving commands share from start to exit: the
//!   default socket path and its announcement, the signals (stop,
//!   SIGUSR1 counters), `--pcap`, `--ring-trace` and `--stats` at exit, 128 + the signal's
//!   number as the exit code;
//! - `trailing`: the app's arguments after the component or image
//!   (`pier run echo.wasm --port 1234`), rewritten before clap parses;
//! - `logging`: stderr logs, `-v`, `-q` and `RUST_LOG`.

mod boot;
mod config;
mod connect;
mod lifecycle;
mod logging;
mod pool;
mod run;
mod size;
mod trace;
mod trailing;
mod vhost_user;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "pier", version, about = "Run WASI components with vsock sockets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log more: -v for pier's debug output, -vv for its trace output.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log less: -q for warnings only, -qq for errors only.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "verbose")]
    quiet: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one component, or several from a config file, on one vsock
    /// endpoint.
    #[command(after_long_help = config::HELP)]
    Run(run::RunArgs),
    /// Boot an app's unikernel image in pier's KVM hypervisor, console on
    /// stdout; the guest's exit code is pier's.
    Boot(boot::BootArgs),
    /// Keep VMs prepared for `pier boot --pool`, which then boots in a few
    /// milliseconds less.
    Pool(pool::PoolArgs),
    /// One of `pier pool`'s prepared VMs, waiting for its boot.
    #[command(hide = true)]
    PoolWorker(pool::WorkerArgs),
    /// Serve the vsock devices of VMs another VMM runs (QEMU's
    /// vhost-user-vsock), as a drop-in for vhost-device-vsock.
    VhostUser(vhost_user::VhostUserArgs),
    /// Connect to a component's port through the hybrid vsock socket and
    /// join stdin/stdout to the connection.
    Connect(connect::ConnectArgs),
    /// Read a ring trace (`--ring-trace`): every virtqueue event with the
    /// rings after it, as text or as an HTML page that steps through them.
    Trace(trace::TraceArgs),
}

fn main() -> ExitCode {
    let args = trailing::rewrite(&Cli::command(), std::env::args_os().collect());
    let cli = Cli::parse_from(args);
    logging::init(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Boot(args) => match args.pool.clone() {
            Some(_) if args.traces_rings() => {
                Err(anyhow::anyhow!("--ring-trace needs a boot of its own, not --pool"))
            }
            Some(socket) => {
                boot::BootJob::from_args(args).and_then(|job| pool::boot(&socket, &job))
            }
            None => boot::run(args),
        },
        Command::Pool(args) => pool::serve(args),
        Command::PoolWorker(args) => pool::worker(args),
        Command::VhostUser(args) => vhost_user::run(args),
        Command::Connect(args) => connect::run(&args).map(|()| 0),
        Command::Trace(args) => trace::run(&args),
    };
    match result {
        Ok(code) => exit_code(code),
        Err(e) => {
            eprintln!("pier: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Exit statuses are one byte; a component's `exit(256)` must not read as
/// success.
fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn rewritten(line: &str) -> String {
        let args = line.split(' ').map(OsString::from).collect();
        let out = trailing::rewrite(&Cli::command(), args);
        out.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn what_follows_the_component_is_the_apps() {
        assert_eq!(
            rewritten("pier run echo.wasm --port 1234"),
            "pier run echo.wasm -- --port 1234"
        );
        assert_eq!(
            rewritten("pier -v run --listen 1234 echo.wasm --port 1234 --stats"),
            "pier -v run --listen 1234 echo.wasm -- --port 1234 --stats",
            "pier's options before the component are pier's; after the app's first, the app's"
        );
        assert_eq!(rewritten("pier boot echo --port 1234"), "pier boot echo -- --port 1234");
        assert_eq!(rewritten("pier run echo.wasm hello"), "pier run echo.wasm -- hello");
    }

    #[test]
    fn pier_options_after_the_component_and_the_dash_dash_form_still_work() {
        for line in [
            "pier run echo.wasm --listen 1234 -- --port 1234",
            "pier run echo.wasm -- --port 1234",
            "pier run echo.wasm --listen 1234",
            "pier run echo.wasm --listen=1234 --stats",
            "pier run --config pier.toml",
            "pier connect /tmp/x.vsock 1234",
            "pier vhost-user --vm guest-cid=3,socket=s,uds-path=u",
            "pier",
        ] {
            assert_eq!(rewritten(line), line);
        }
        assert_eq!(
            rewritten("pier run echo.wasm --uds /tmp/x --port 1234"),
            "pier run echo.wasm --uds /tmp/x -- --port 1234",
            "an option's value is not taken for the app's first argument"
        );
    }
}
