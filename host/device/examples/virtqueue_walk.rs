//! Watch pier-driver and the device model work the virtqueues, one step
//! at a time: `cargo run -p pier-device --example virtqueue_walk`. The
//! steps are `pier_device::testing::walk`'s; `docs/driver.md` reads them.
//!
//! With `--ring-trace FILE`, the device also records every queue event of
//! the walk into FILE, which `pier trace FILE --html OUT` draws.

use std::path::PathBuf;
use std::process::ExitCode;

use pier_device::RingTrace;
use pier_device::testing::walk;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let trace_path = match (args.next().as_deref(), args.next(), args.next()) {
        (None, _, _) => None,
        (Some("--ring-trace"), Some(path), None) => Some(PathBuf::from(path)),
        _ => {
            eprintln!("usage: virtqueue_walk [--ring-trace FILE]");
            return ExitCode::from(2);
        }
    };
    let (trace, handle) = match trace_path.as_deref().map(RingTrace::create).transpose() {
        Ok(created) => created.unzip(),
        Err(e) => {
            eprintln!("virtqueue_walk: {e}");
            return ExitCode::FAILURE;
        }
    };
    let steps = walk::walk_traced(trace);
    if let (Some(handle), Some(path)) = (handle, &trace_path) {
        eprintln!("virtqueue_walk: ring trace {}: {}", path.display(), handle.finish());
    }
    match steps {
        Ok(steps) => {
            print!("{}", walk::render(&steps));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("virtqueue_walk: could not set up the testbed: {e}");
            ExitCode::FAILURE
        }
    }
}
