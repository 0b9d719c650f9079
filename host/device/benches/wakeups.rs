//! What a thread hop costs on this machine, against a system call.
//!
//! Every path through pier's device crosses threads: a host program's
//! write wakes the device loop, the device loop wakes the application's
//! thread, and back. The other benchmarks show the paths; this one prices
//! their steps, measured in the same run:
//!
//! - a system call that does nothing (`getppid`), the floor of every
//!   socket call;
//! - one thread waking another through an eventfd and sleeping until it is
//!   woken back (a ping-pong, as the device loop and an application hand a
//!   burst to each other), with the scheduler free to put the two threads
//!   on either CPU;
//! - the same ping-pong with both threads held on one CPU, where a wakeup
//!   is a switch between two threads and no CPU has to be woken from its
//!   idle halt.
//!
//! On a nested virtual machine (this project's CI machines) waking a CPU
//! that halted is the expensive part: the host must schedule the vCPU
//! again. That is why pier's hops cost what the chain and echo profiles
//! show, and why saving a system call matters far less than saving a hop.
//!
//! `cargo bench -p pier-device --bench wakeups [-- --quick]`

use std::time::Instant;

use pier_testkit::bench::Recorder;
use vmm_sys_util::eventfd::EventFd;

/// Nanoseconds per `getppid` system call, best of `runs`.
fn system_call(calls: u32, runs: usize) -> f64 {
    (0..runs)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..calls {
                // SAFETY: getppid has no arguments and cannot fail.
                std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
            }
            started.elapsed().as_secs_f64() * 1e9 / f64::from(calls)
        })
        .fold(f64::MAX, f64::min)
}

/// Holds the calling thread on `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity get a valid pointer to it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
    }
}

/// Microseconds per wakeup: `trips` eventfd round trips between two
/// threads (two wakeups each), both on `cpu` if given.
fn ping_pong(trips: u32, cpu: Option<usize>) -> f64 {
    let ping = EventFd::new(0).unwrap();
    let pong = EventFd::new(0).unwrap();
    let (ping2, pong2) = (ping.try_clone().unwrap(), pong.try_clone().unwrap());
    let other = std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_to(cpu);
        }
        for _ in 0..trips {
            ping2.read().unwrap();
            pong2.write(1).unwrap();
        }
    });
    if let Some(cpu) = cpu {
        pin_to(cpu);
    }
    let started = Instant::now();
    for _ in 0..trips {
        ping.write(1).unwrap();
        pong.read().unwrap();
    }
    let per_wakeup = started.elapsed().as_secs_f64() * 1e6 / f64::from(trips) / 2.0;
    other.join().unwrap();
    per_wakeup
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = Recorder::from_env();
    let runs = if quick { 2 } else { 5 };
    let (calls, trips) = if quick { (200_000, 5_000) } else { (2_000_000, 50_000) };
    let syscall_ns = system_call(calls, runs);
    // Each ping-pong on a thread of its own, so that pinning one does not
    // hold the next; the CPU left free keeps the measuring thread.
    let best = |cpu: Option<usize>| {
        (0..runs)
            .map(|_| std::thread::spawn(move || ping_pong(trips, cpu)).join().unwrap())
            .fold(f64::MAX, f64::min)
    };
    let across = best(None);
    let one_cpu = best(Some(0));
    println!("what a thread hop costs, best of {runs}\n");
    println!(
        "| system call | wakeup, either CPU | wakeup, one CPU | either CPU / one CPU | wakeup (either CPU) / system call |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {syscall_ns:.0} ns | {across:.2} us | {one_cpu:.2} us | {:.1}x | {:.0}x |",
        across / one_cpu,
        across * 1000.0 / syscall_ns
    );
    rec.record("wakeups", "syscall", "per event", syscall_ns / 1000.0, "us");
    rec.record("wakeups", "wakeup-any-cpu", "per event", across, "us");
    rec.record("wakeups", "wakeup-one-cpu", "per event", one_cpu, "us");
    rec.record("wakeups", "any/one", "per event", across / one_cpu, "x");
    rec.record("wakeups", "wakeup/syscall", "per event", across * 1000.0 / syscall_ns, "x");
}
