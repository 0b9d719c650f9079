//! Where pier's logs go and how much of them: stderr, through `tracing`.
//!
//! pier's own crates log at `info` (a refused CONNECT, a grant denial, a
//! reset), everything else (wasmtime, cranelift) at `warn`. `-v` shows
//! pier's `debug`, `-vv` its `trace`, `-q` only warnings, `-qq` only
//! errors; `RUST_LOG` replaces the filter altogether.

use tracing_subscriber::EnvFilter;

/// pier's crates, whose logs `-v` and `-q` adjust.
const PIER_TARGETS: [&str; 7] = [
    "pier",
    "pier_shim",
    "pier_device",
    "pier_stack",
    "pier_driver",
    "pier_vmm",
    "pier_vhost_user",
];

/// The filter without `RUST_LOG`: pier's crates at the level `-v` and `-q`
/// choose (info without either), every other crate at warn (wasmtime and
/// cranelift are very talkative below it), or error with `-qq`.
fn default_filter(verbose: u8, quiet: u8) -> String {
    let (pier, others) = match i16::from(verbose) - i16::from(quiet) {
        ..=-2 => ("error", "error"),
        -1 => ("warn", "warn"),
        0 => ("info", "warn"),
        1 => ("debug", "warn"),
        _ => ("trace", "warn"),
    };
    let mut filter = others.to_owned();
    for target in PIER_TARGETS {
        filter.push_str(&format!(",{target}={pier}"));
    }
    filter
}

/// Logs to stderr, filtered by `RUST_LOG` when it is set and valid, or
/// else by [`default_filter`].
pub fn init(verbose: u8, quiet: u8) {
    let from_env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = match from_env.map(|v| EnvFilter::try_new(&v).map_err(|e| (v, e))) {
        Some(Ok(filter)) => filter,
        Some(Err((value, e))) => {
            eprintln!("pier: ignoring RUST_LOG={value:?}: {e}");
            EnvFilter::new(default_filter(verbose, quiet))
        }
        None => EnvFilter::new(default_filter(verbose, quiet)),
    };
    // Colours only for a person at a terminal, not in a file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}
