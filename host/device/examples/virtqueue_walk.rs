//! Watch pier-driver and the device model work the virtqueues, one step
//! at a time: `cargo run -p pier-device --example virtqueue_walk`. The
//! steps are `pier_device::testing::walk`'s; `docs/driver.md` reads them.

use std::process::ExitCode;

use pier_device::testing::walk;

fn main() -> ExitCode {
    match walk::walk() {
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
