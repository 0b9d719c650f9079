//! Where the in-process device loop's thread runs: on the CPU the
//! application last called in from, following it when it moves. The two
//! hand every receive buffer back and forth, and a wakeup across CPUs
//! costs several times one on the same CPU (docs/benchmarks.md).
//!
//! A test binary of its own: it finds the device loop's thread by name,
//! and the tests of another binary would start more of them.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pier_device::GuestCid;
use pier_device::bridge::{Bridge, BridgeConfig};
use pier_device::testing::Testbed;
use pier_device::testing::apps::Sink;

const PORT: u32 = 9;

/// The CPUs thread `tid` may run on (0: the calling thread).
fn thread_cpus(tid: libc::pid_t) -> Vec<usize> {
    // SAFETY: sched_getaffinity writes only the set it is given.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set), 0);
        set
    };
    // SAFETY: CPU_ISSET reads the set.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Keeps the calling thread on `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: the set is a plain bitmask on the stack.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
    }
}

/// The thread named `pier-device` in this process (the only one). A new
/// thread names itself once it runs, so this waits for the name.
fn device_loop_thread() -> libc::pid_t {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let named: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| {
                let task = task.ok()?;
                let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
                (comm.trim() == "pier-device").then(|| task.file_name().to_str()?.parse().ok())?
            })
            .collect();
        if named.len() == 1 || Instant::now() > deadline {
            assert_eq!(named.len(), 1, "one device loop thread in this process: {named:?}");
            return named[0];
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A host program's stream to the guest's sink: `total` bytes in, EOF,
/// and the sink's close back.
fn stream_to_guest(uds: &Path, total: usize) {
    let mut s = pier_client::HybridStream::connect(uds, PORT).unwrap().into_inner();
    let chunk = vec![0x5au8; 64 * 1024];
    for _ in 0..total / chunk.len() {
        s.write_all(&chunk).unwrap();
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
}

#[test]
fn the_device_loop_thread_follows_the_application_to_its_cpu() {
    let cpus = thread_cpus(0);
    assert!(
        cpus.len() >= 2,
        "this test moves the application between two CPUs; this process may use only {cpus:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let config = BridgeConfig::new(&uds, GuestCid::DEFAULT);
    let running = Arc::new(
        Testbed::with_defaults()
            .unwrap()
            .start(|stack, registry, token| Bridge::new(config, stack, registry, token))
            .unwrap(),
    );
    let device = device_loop_thread();
    let mut sink = Some(running.guest.with(|stack, _| Sink::listen(stack, PORT).unwrap()));
    for cpu in [cpus[1], cpus[0], cpus[1]] {
        // The application: the sink, served from a thread kept on `cpu`.
        let stop = Arc::new(AtomicBool::new(false));
        let app = {
            let (running, stop, mut app_sink) = (running.clone(), stop.clone(), sink.take());
            std::thread::spawn(move || {
                pin_to(cpu);
                let s = app_sink.as_mut().unwrap();
                running.guest.serve(&stop, |stack, _, now, waker| s.step(stack, now, waker));
                app_sink
            })
        };
        stream_to_guest(&uds, 1 << 20);
        // The loop moves before it next sleeps, once the stream is done.
        let deadline = Instant::now() + Duration::from_secs(5);
        while thread_cpus(device) != [cpu] && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Release);
        sink = app.join().unwrap();
        assert_eq!(
            thread_cpus(device),
            [cpu],
            "the device loop's thread keeps to the application's CPU {cpu}"
        );
    }
    assert_eq!(sink.unwrap().received, 3 << 20, "every byte reached the sink");
}
