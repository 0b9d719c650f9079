//! `pier vhost-user`: serve the vsock devices of VMs that another VMM runs
//! (QEMU's `vhost-user-vsock-device` or `-pci`), a drop-in for rust-vmm's
//! vhost-device-vsock command line, with pier's host side behind it:
//! seqpacket, half-close that reaches the host program, guests that reach
//! each other by CID, a port policy (`--allow-to-guest`, `--allow-to-host`),
//! `--pcap` and `--stats`.
//!
//! Each `--vm` is served on its own thread, one frontend after another:
//! when QEMU goes away the guest's connections to host programs are reset
//! and the socket waits for the next QEMU. SIGINT, SIGTERM or SIGHUP end
//! pier and remove every socket file (exit code 128 + the signal's number);
//! SIGUSR1 prints every guest's counters.

use std::path::PathBuf;
use std::sync::{Arc, mpsc};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pier_vhost_user::router::Router;
use pier_vhost_user::{PortPolicy, Ports, ServeOptions, VmServer, VmSpec, check_specs};

use crate::lifecycle::{self, CaptureArgs, Lifecycle};

#[derive(Args, Debug)]
pub struct VhostUserArgs {
    /// A guest to serve, as vhost-device-vsock takes it:
    /// `guest-cid=N,socket=PATH,uds-path=PATH`, plus pier's optional
    /// `groups=A+B` (guests reach each other only within a group; all
    /// share one group by default) and `pcap=FILE`. Repeatable.
    #[arg(long = "vm", value_name = "SPEC", required = true)]
    vms: Vec<VmSpec>,
    /// Let host programs CONNECT to this guest port (`*`: every port).
    /// Repeatable; without it, every port (as vhost-device-vsock). Others
    /// are closed before the guest sees a packet, with a warning.
    #[arg(long, value_name = "PORT|*", value_parser = port_grant)]
    allow_to_guest: Vec<Option<u32>>,
    /// Let guests connect to this host port, `<uds>_<PORT>` (`*`: every
    /// port). Repeatable; without it, every port. Others are refused with
    /// an RST, with a warning.
    #[arg(long, value_name = "PORT|*", value_parser = port_grant)]
    allow_to_host: Vec<Option<u32>>,
    #[command(flatten)]
    capture: CaptureArgs,
    /// Print each guest's device counters when pier exits. SIGUSR1 prints
    /// them at any time, with or without this flag.
    #[arg(long)]
    stats: bool,
}

/// `PORT` or `*` (every port, `None`).
fn port_grant(text: &str) -> Result<Option<u32>, String> {
    if text == "*" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| format!("{text:?} is neither a port number nor *"))
}

/// Every guest's device counters, and the siblings' router's.
fn stats(servers: &[Arc<VmServer>], router: &Router) -> String {
    let mut report = String::new();
    for server in servers {
        let cid = server.spec().guest_cid;
        match server.stats() {
            Some(stats) => report.push_str(&format!("guest CID {cid}\n{stats}")),
            None => report.push_str(&format!("guest CID {cid}: the device did not answer\n")),
        }
    }
    let r = router.stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    report.push_str(&format!(
        "siblings: forwarded {}, to unknown CIDs (RST) {}, inbox full (RST) {}\n",
        load(&r.forwarded),
        load(&r.unknown_cid),
        load(&r.inbox_full)
    ));
    report
}

pub fn run(args: VhostUserArgs) -> Result<i32> {
    let mut specs = args.vms;
    if let Some(pcap) = &args.capture.pcap {
        if specs.len() > 1 {
            bail!("--pcap takes one guest; with several --vm, give each its own pcap=FILE");
        }
        specs[0].pcap = Some(pcap.clone());
    }
    if args.capture.ring_trace.is_some() && specs.len() > 1 {
        bail!("--ring-trace takes one guest, not {}", specs.len());
    }
    check_specs(&specs).map_err(anyhow::Error::msg)?;
    let (ring_trace, trace_run) = args.capture.start_ring_trace()?;
    let policy = PortPolicy {
        to_guest: Ports::from_grants(&args.allow_to_guest),
        to_host: Ports::from_grants(&args.allow_to_host),
    };
    let options = ServeOptions { pcap_snaplen: args.capture.pcap_snaplen, policy, ring_trace };
    let router = Router::new();
    let mut servers = Vec::new();
    for spec in specs {
        let cid = spec.guest_cid;
        let server = VmServer::new(spec, router.clone(), &options)
            .with_context(|| format!("serving guest CID {cid}"))?;
        let spec = server.spec();
        eprintln!(
            "pier: guest CID {}: vhost-user socket {}, hybrid vsock socket {}",
            spec.guest_cid,
            spec.socket.display(),
            spec.uds_path.display()
        );
        servers.push(Arc::new(server));
    }
    eprintln!(
        "pier: start QEMU with -chardev socket,id=vsock0,path={} -device vhost-user-vsock-device,chardev=vsock0 (or -pci), and shared memory (memory-backend-memfd,share=on)",
        servers[0].spec().socket.display()
    );

    let (stopped, stop_signals) = mpsc::channel();
    let lifecycle = {
        let (servers, router) = (servers.clone(), router.clone());
        Lifecycle::start(
            args.stats,
            move || Ok(stats(&servers, &router)),
            move |signal| {
                let _ = stopped.send(signal);
            },
        )?
    };
    for server in &servers {
        let server = server.clone();
        std::thread::Builder::new()
            .name(format!("pier-vhost-user-{}", server.spec().guest_cid))
            .spawn(move || {
                if let Err(e) = server.serve() {
                    tracing::error!(cid = server.spec().guest_cid.get(), "vhost-user: {e}");
                }
            })?;
    }
    let signal = stop_signals.recv().context("the signal thread ended")?;
    lifecycle.finish(|| {
        let mut captures = Vec::new();
        for server in &servers {
            let _ = server.shutdown();
            if let Some(report) = server.capture().map(|c| c.finish())
                && let Some(path) = &server.spec().pcap
            {
                captures.push((path.clone(), report.to_string()));
            }
        }
        captures.extend(lifecycle::summaries(None::<(PathBuf, String)>, trace_run.as_ref()));
        captures
    });
    eprintln!("pier: stopped (signal {signal})");
    Ok(lifecycle::stopped_by(signal))
}
