//! `pier boot IMAGE`: boot a unikernel image in pier-vmm, with the guest's
//! console on stdout and its vsock device behind the same hybrid Unix
//! socket `pier run` uses.
//!
//! The guest's exit code becomes pier's. SIGINT, SIGTERM or SIGHUP stop
//! the VM wherever the guest is; the socket files are removed, and the
//! exit code is 128 + the signal's number, as for `pier run`. SIGUSR1
//! prints the device's counters (`--stats` prints them at the end too).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pier_vmm::{CaptureSpec, DeviceSpec, Exit, GuestCid, StatsHandle, Vm, VmConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

#[derive(Args, Debug)]
pub struct BootArgs {
    /// The image: an app built for x86_64-unknown-none (`cargo xtask image
    /// NAME` builds one).
    image: PathBuf,
    /// The guest's CID.
    #[arg(long, value_name = "N", default_value_t = 3)]
    cid: u32,
    /// The hybrid vsock Unix socket [default: $XDG_RUNTIME_DIR/pier-<cid>.vsock,
    /// or /tmp/pier-<cid>.vsock].
    #[arg(long, value_name = "PATH")]
    uds: Option<PathBuf>,
    /// Guest memory: bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE", default_value = "128M")]
    mem: String,
    #[command(flatten)]
    capture: crate::CaptureArgs,
    /// Print the device's counters (packets, bytes, connections, drops
    /// and resets by reason) when the VM ends. SIGUSR1 prints them at any
    /// time, with or without this flag. The guest's own counters live in
    /// the guest.
    #[arg(long)]
    stats: bool,
    /// Arguments for the app: everything after the image (from the first
    /// argument that is not one of pier's options), or after `--`.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

/// The device's counters on stderr, as one block.
fn print_stats(stats: Option<&StatsHandle>) {
    let report = match stats.map(StatsHandle::stats) {
        Some(Some(device)) => format!("pier: stats\n{device}"),
        Some(None) => "pier: stats: the device did not answer\n".to_owned(),
        None => "pier: stats: the VM has no vsock device\n".to_owned(),
    };
    eprint!("{report}");
}

pub fn run(args: BootArgs) -> Result<i32> {
    let mem_size = parse_size(&args.mem)?;
    let uds = args.uds.unwrap_or_else(|| crate::default_uds(args.cid));
    let config = VmConfig {
        mem_size,
        app_args: args.args,
        vsock: Some(DeviceSpec {
            capture: args
                .capture
                .pcap
                .clone()
                .map(|path| CaptureSpec { path, snaplen: args.capture.pcap_snaplen }),
            ..DeviceSpec::new(GuestCid::new(args.cid)?, &uds)
        }),
        ..VmConfig::default()
    };
    let mut vm = Vm::new(&args.image, config)
        .with_context(|| format!("booting {}", args.image.display()))?;
    eprintln!("pier: guest CID {}, hybrid vsock socket {}", args.cid, uds.display());
    // The app's ports are its own business (the unikernel has no grants),
    // so the hint names none.
    eprintln!(
        "pier: connect with: {}",
        crate::connect_command(&uds.display().to_string(), "<PORT>")
    );

    let stop = vm.stop_handle();
    let stats = vm.stats_handle();
    let signal = Arc::new(AtomicI32::new(0));
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1]).context("installing signal handlers")?;
    let signals_handle = signals.handle();
    let watcher = {
        let signal = signal.clone();
        let stats = stats.clone();
        std::thread::Builder::new().name("pier-signals".into()).spawn(move || {
            for s in signals.forever() {
                if s == SIGUSR1 {
                    print_stats(stats.as_ref());
                    continue;
                }
                signal.store(s, Ordering::SeqCst);
                stop.stop();
                break;
            }
        })?
    };
    let result = vm.run();
    if args.stats {
        print_stats(stats.as_ref());
    }
    if let (Some(path), Some(report)) = (&args.capture.pcap, vm.finish_capture()) {
        eprintln!("pier: capture {}: {report}", path.display());
    }
    // The device thread ends and the socket files go before pier exits.
    drop(vm);
    signals_handle.close();
    let _ = watcher.join();
    match result.with_context(|| format!("running {}", args.image.display()))? {
        Exit::Code(code) => Ok(i32::try_from(code).unwrap_or(-1)),
        Exit::Stopped => {
            let signal = signal.load(Ordering::SeqCst);
            eprintln!("pier: stopped the VM (signal {signal})");
            Ok(128 + signal)
        }
    }
}

/// `SIZE` as `--mem` takes it: bytes, or a number with K, M or G.
fn parse_size(text: &str) -> Result<u64> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let Ok(n) = digits.parse::<u64>() else {
        bail!("--mem {text:?}: not a size (bytes, or a number with K, M or G)")
    };
    n.checked_mul(1 << shift).with_context(|| format!("--mem {text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
