//! The smallest pier app, and the unikernel's first boot test: it greets,
//! says which privilege level it runs at, echoes its arguments, and exits
//! with the code it is told.
//!
//! Usage: `hello [WORD]... [alloc MIB] [copy] [devices] [env NAME] [exit CODE] [return CODE] [panic] [wait MS] [spin] [fault]`
//! - `exit CODE`: exit with CODE (default 0) through `pier_rt::process::exit`;
//! - `return CODE`: the same, by returning `ExitCode::from(CODE)` from `main`;
//! - `panic`: panic with the message "hello was asked to panic";
//! - `env NAME`: print `env NAME=VALUE`, or `env NAME unset` (a unikernel
//!   has no environment);
//! - `alloc MIB`: fill a heap buffer of MIB MiB and print its byte sum;
//! - `fault`: read unmapped memory (a page fault on bare metal, a trap on
//!   WASI);
//! - `wait MS`: spin until the clock says MS milliseconds have passed;
//! - `spin`: print "spinning", then compute forever (for stop tests);
//! - `copy`: print whether the vector copy loop can run and which copy
//!   strategy the stack chose (`vector copy: yes`, `copy strategy:
//!   Vector`);
//! - `devices`: list the virtio-mmio devices the boot command line names
//!   (none on WASI);
//! - any other word is printed back as `arg: WORD`.
//!
//! The same source builds for wasm32-wasip2 and x86_64-unknown-none; the
//! attribute below is its one per-target line.

#![cfg_attr(target_os = "none", no_std, no_main)]

extern crate alloc;

use alloc::vec::Vec;
use pier_rt::process::ExitCode;
use pier_rt::time::{Duration, Instant};

pier_rt::main!(main);

fn main() -> ExitCode {
    pier_rt::println!("hello from pier-rt");
    if let Some(level) = pier_rt::diag::privilege_level() {
        pier_rt::println!("privilege level: {level}");
    }
    let mut code = 0;
    let mut returns = false;
    let mut args = pier_rt::env::args();
    while let Some(arg) = args.next() {
        match arg {
            "exit" | "return" => match args.next().and_then(|c| c.parse().ok()) {
                Some(c) => {
                    code = c;
                    returns = arg == "return";
                }
                None => {
                    pier_rt::eprintln!("hello: {arg} needs a number");
                    code = 2;
                }
            },
            "env" => match args.next() {
                Some(name) => match pier_rt::env::var(name) {
                    Some(value) => pier_rt::println!("env {name}={value}"),
                    None => pier_rt::println!("env {name} unset"),
                },
                None => {
                    pier_rt::eprintln!("hello: env needs a name");
                    code = 2;
                }
            },
            "panic" => panic!("hello was asked to panic"),
            "fault" => {
                // A null pointer read would not fault (page 0 is mapped in
                // the unikernel); the top of the address space is not.
                let p = (usize::MAX - 15) as *const u8;
                // SAFETY: none; faulting is the point.
                pier_rt::println!("read {}", unsafe { p.read_volatile() });
            }
            "copy" => {
                let (vector, strategy) = pier_rt::diag::copy_routine();
                pier_rt::println!("vector copy: {}", if vector { "yes" } else { "no" });
                pier_rt::println!("copy strategy: {strategy:?}");
            }
            "wait" => match args.next().and_then(|n| n.parse::<u64>().ok()) {
                Some(ms) => {
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_millis(ms) {
                        core::hint::spin_loop();
                    }
                    pier_rt::println!("waited {ms} ms");
                }
                None => {
                    pier_rt::eprintln!("hello: wait needs a number of milliseconds");
                    code = 2;
                }
            },
            "spin" => {
                pier_rt::println!("spinning");
                loop {
                    core::hint::spin_loop();
                }
            }
            "alloc" => match args.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(mib) => {
                    let buf: Vec<u8> = (0..mib << 20).map(|i| i as u8).collect();
                    let sum: u64 = buf.iter().map(|&b| u64::from(b)).sum();
                    pier_rt::println!("allocated {mib} MiB, sum {sum}");
                }
                None => {
                    pier_rt::eprintln!("hello: alloc needs a number of MiB");
                    code = 2;
                }
            },
            "devices" => {
                for d in pier_rt::diag::virtio_devices() {
                    pier_rt::println!(
                        "virtio-mmio at {:#x} irq {}: version {}, device {}",
                        d.base,
                        d.irq,
                        d.version,
                        d.device_id
                    );
                }
            }
            other => pier_rt::println!("arg: {other}"),
        }
    }
    if returns {
        return ExitCode::from(code as u8);
    }
    pier_rt::process::exit(code)
}
