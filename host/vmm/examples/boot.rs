//! Boots an image with its console on stdout and exits with the guest's
//! code: a stand-in for `pier boot` until the CLI has it.
//!
//! `cargo run -p pier-vmm --example boot -- IMAGE [--uds PATH] [-- APP ARGS]`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use pier_vmm::{DeviceSpec, Exit, GuestCid, VmConfig};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(image) = args.next() else {
        eprintln!("usage: boot IMAGE [--uds PATH] [-- APP ARGS]");
        return ExitCode::from(2);
    };
    let mut config = VmConfig::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--uds" => {
                let Some(path) = args.next() else {
                    eprintln!("boot: --uds needs a path");
                    return ExitCode::from(2);
                };
                config.vsock = Some(DeviceSpec::new(GuestCid::DEFAULT, PathBuf::from(path)));
            }
            "--" => {
                config.app_args = args.by_ref().collect();
            }
            other => {
                eprintln!("boot: unknown option {other}");
                return ExitCode::from(2);
            }
        }
    }
    let start = Instant::now();
    let result = pier_vmm::boot(image.as_ref(), config);
    eprintln!("boot: the VM ran for {:?}", start.elapsed());
    match result {
        Ok(Exit::Code(code)) => {
            eprintln!("boot: the guest exited with {code}");
            ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
        }
        Ok(Exit::Stopped) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("boot: {e}");
            ExitCode::FAILURE
        }
    }
}
