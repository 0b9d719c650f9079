//! The life of a serving command, shared by `pier run`, `pier boot` and
//! `pier vhost-user` from the moment it serves to its exit code:
//!
//! - where the hybrid vsock socket goes by default, and the two lines that
//!   say where to connect ([`announce`]);
//! - the signals: SIGINT, SIGTERM and SIGHUP stop the command, SIGUSR1
//!   prints its counters at any time and it carries on ([`Lifecycle`]);
//! - the way out: the counters once more when `--stats` asked for them,
//!   each packet capture's and ring trace's summary (`--pcap`,
//!   `--ring-trace`, [`CaptureArgs`]), and
//!   128 + the signal's number as the exit code of a command a signal
//!   stopped, as a shell reports it ([`stopped_by`]).
//!
//! What stopping means is each command's own (stop the components with a
//! grace, stop the VM, shut the servers down); the command says it through
//! the `on_stop` hook and its own messages.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;

use anyhow::{Context as _, Result};
use clap::Args;
use pier_device::{RingTrace, RingTraceHandle};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::{Handle, Signals};

/// `--pcap`, `--pcap-snaplen` and `--ring-trace`, the same for every
/// serving command.
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// Write every packet that crosses the virtio device, both ways, to
    /// FILE as pcap (link type 271, LINKTYPE_VSOCK: Wireshark and tshark
    /// decode it). Never slows the device: if the file cannot keep up,
    /// packets are dropped from the capture and counted.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bytes of each packet the capture keeps, counting its 32-byte
    /// vsockmon and 44-byte virtio headers.
    #[arg(
        long,
        value_name = "N",
        requires = "pcap",
        default_value_t = pier_shim::DEFAULT_SNAPLEN,
        value_parser = clap::value_parser!(u32).range(i64::from(pier_shim::MIN_SNAPLEN)..=i64::from(pier_shim::DEFAULT_SNAPLEN))
    )]
    pub pcap_snaplen: u32,
    /// Record every virtqueue event (available entries and their
    /// descriptors, chains taken and returned, kicks, interrupts raised
    /// or suppressed, setup and reset) to FILE as JSON lines, which
    /// `pier trace FILE` reads (docs/ring-trace.md). Never slows the
    /// device: if the file cannot keep up, events are dropped and counted.
    #[arg(long, value_name = "FILE")]
    pub ring_trace: Option<PathBuf>,
}

/// A running `--ring-trace`: where it goes, and the program's end of it.
#[derive(Debug)]
pub struct RingTraceRun {
    pub path: PathBuf,
    pub handle: RingTraceHandle,
}

impl CaptureArgs {
    /// Creates the `--ring-trace` file, if one was asked for: the device's
    /// end, for its configuration, and the command's.
    pub fn start_ring_trace(&self) -> Result<(Option<RingTrace>, Option<RingTraceRun>)> {
        let Some(path) = &self.ring_trace else {
            return Ok((None, None));
        };
        let (trace, handle) = RingTrace::create(path)?;
        Ok((Some(trace), Some(RingTraceRun { path: path.clone(), handle })))
    }
}

/// The summaries [`Lifecycle::finish`] prints: the packet capture's, then
/// the ring trace's, each ended first.
pub fn summaries(
    capture: Option<(PathBuf, impl Display)>,
    ring_trace: Option<&RingTraceRun>,
) -> Vec<(PathBuf, String)> {
    let capture = capture.map(|(path, report)| (path, report.to_string()));
    let trace = ring_trace.map(|run| (run.path.clone(), run.handle.finish().to_string()));
    capture.into_iter().chain(trace).collect()
}

/// The hybrid vsock Unix socket when `--uds` names none:
/// `$XDG_RUNTIME_DIR/pier-<cid>.vsock`, or `/tmp/pier-<cid>.vsock`.
pub fn default_uds(cid: u32) -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    dir.join(format!("pier-{cid}.vsock"))
}

/// Says where the guest is and how to reach `port` on it (a number, or a
/// placeholder when the command cannot know one).
pub fn announce(cid: u32, uds: &Path, port: &str) {
    let uds = uds.display().to_string();
    eprintln!("pier: guest CID {cid}, hybrid vsock socket {uds}");
    eprintln!("pier: connect with: {}", connect_command(&uds, port));
}

/// The `pier connect` command line for `uds` and `port`, naming the
/// program as it was started (a path, when it is not on PATH), so the
/// hint can be pasted as it is.
fn connect_command(uds: &str, port: &str) -> String {
    let program = std::env::args_os().next().unwrap_or_else(|| "pier".into());
    format!("{} connect {uds} {port}", program.to_string_lossy())
}

/// A command's counters, as `--stats` and SIGUSR1 print them: the report,
/// or why there is none.
pub type Stats = Result<String, &'static str>;

/// The exit code of a command that `signal` stopped, as a shell reports
/// it.
pub fn stopped_by(signal: i32) -> i32 {
    128 + signal
}

/// The signals of one serving command, watched on their own thread from
/// [`Self::start`] to [`Self::finish`].
pub struct Lifecycle {
    stats: Arc<dyn Fn() -> Stats + Send + Sync>,
    stats_at_exit: bool,
    /// The first stop signal, 0 before one came.
    first_stop: Arc<AtomicI32>,
    signals: Handle,
    watcher: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle").field("stats_at_exit", &self.stats_at_exit).finish()
    }
}

impl Lifecycle {
    /// Installs the handlers. From now on SIGUSR1 prints `stats`, and each
    /// SIGINT, SIGTERM or SIGHUP is handed to `on_stop` (a second one
    /// too: the user may not want to wait). `stats_at_exit` is `--stats`.
    pub fn start(
        stats_at_exit: bool,
        stats: impl Fn() -> Stats + Send + Sync + 'static,
        mut on_stop: impl FnMut(i32) + Send + 'static,
    ) -> Result<Self> {
        let stats: Arc<dyn Fn() -> Stats + Send + Sync> = Arc::new(stats);
        let first_stop = Arc::new(AtomicI32::new(0));
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1])
            .context("installing signal handlers")?;
        let handle = signals.handle();
        let watcher = {
            let stats = stats.clone();
            let first_stop = first_stop.clone();
            std::thread::Builder::new().name("pier-signals".into()).spawn(move || {
                for signal in signals.forever() {
                    if signal == SIGUSR1 {
                        print_stats(stats());
                        continue;
                    }
                    let _ =
                        first_stop.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
                    on_stop(signal);
                }
            })?
        };
        Ok(Self { stats, stats_at_exit, first_stop, signals: handle, watcher: Some(watcher) })
    }

    /// The first stop signal, if one came.
    pub fn stop_signal(&self) -> Option<i32> {
        Some(self.first_stop.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// The way out: prints the counters if `--stats` asked for them, then
    /// ends the captures (`end_captures` closes each and returns where it
    /// was written and its final counters) and prints their summaries, and
    /// stops watching signals. Returns the first stop signal, if one came.
    pub fn finish<P: AsRef<Path>, R: Display, I: IntoIterator<Item = (P, R)>>(
        mut self,
        end_captures: impl FnOnce() -> I,
    ) -> Option<i32> {
        if self.stats_at_exit {
            print_stats((self.stats)());
        }
        for (path, report) in end_captures() {
            eprintln!("pier: capture {}: {report}", path.as_ref().display());
        }
        self.signals.close();
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        self.stop_signal()
    }
}

/// One report on stderr, in one write, so that logs do not cut into it.
fn print_stats(stats: Stats) {
    let report = match stats {
        Ok(report) => format!("pier: stats\n{report}"),
        Err(why) => format!("pier: stats: {why}\n"),
    };
    eprint!("{report}");
}
