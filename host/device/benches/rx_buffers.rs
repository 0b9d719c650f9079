//! How big should the driver's receive buffers be?
//!
//! Streams 256 MiB host -> guest through the real virtio path (driver,
//! descriptors in DMA memory, device parsing them) in one thread, with
//! receive buffers of 4 KiB (about what Linux posts) up to 64 KiB, and
//! reports throughput and the ratio to the 4 KiB baseline. Then the same
//! transfer with the ring trace's hooks switched off (no `--ring-trace`:
//! one branch each) and with a trace running into a file, which records
//! every queue event.
//!
//! `cargo bench -p pier-device --bench rx_buffers [-- --quick]`; with
//! `PIER_BENCH_JSON` set (`cargo xtask bench`) it also records them.

use std::time::Instant;

use pier_device::RingTrace;
use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::wire::HEADER_LEN;
use pier_stack::{SocketType, VMADDR_CID_ANY, VsockAddr};

fn host_to_guest(rx_buffer_size: usize, total: usize) -> f64 {
    host_to_guest_on(VsockConfig::default(), rx_buffer_size, total)
}

fn host_to_guest_on(device: VsockConfig, rx_buffer_size: usize, total: usize) -> f64 {
    let driver = DriverConfig { rx_buffer_size, ..DriverConfig::default() };
    let mut bed = Testbed::new(device, driver).unwrap();
    let l = bed.guest.socket(SocketType::Stream).unwrap();
    bed.guest.bind(l, VsockAddr::new(VMADDR_CID_ANY, 9)).unwrap();
    bed.guest.listen(l, 1).unwrap();
    let h = bed.host.stack().socket(SocketType::Stream).unwrap();
    let now = bed.now();
    bed.host.stack().connect(h, VsockAddr::new(3, 9), now).unwrap();
    bed.run();
    let (g, _) = bed.guest.accept(l).unwrap();
    let chunk = vec![0x3cu8; 64 * 1024];
    let mut buf = vec![0u8; 256 * 1024];
    let (mut sent, mut got) = (0, 0);
    let started = Instant::now();
    while got < total {
        if sent < total {
            sent += bed.host.stack().send(h, &chunk).unwrap_or(0);
        }
        bed.step();
        while let Ok(info) = bed.guest.recv(g, &mut buf) {
            got += info.len;
            if info.inq == 0 {
                break;
            }
        }
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = pier_testkit::bench::Recorder::from_env();
    let total = if quick { 32 << 20 } else { 256 << 20 };
    let runs = if quick { 1 } else { 3 };
    println!("host -> guest over the in-process virtio bed, {} MiB, best of {runs}\n", total >> 20);
    println!("| rx buffer (payload) | throughput | vs 4 KiB |");
    println!("|---|---|---|");
    let mut baseline = 0.0;
    for payload in [4096usize, 8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024] {
        let best =
            (0..runs).map(|_| host_to_guest(HEADER_LEN + payload, total)).fold(0.0, f64::max);
        if payload == 4096 {
            baseline = best;
        }
        println!(
            "| {} KiB | {:.2} Gbit/s | {:.2}x |",
            payload / 1024,
            best * 8.0 / 1e9,
            best / baseline
        );
        rec.record("rx-buffers", "pier", payload, best * 8.0 / 1e9, "Gbit/s");
        rec.record("rx-buffers", "vs-4k", payload, best / baseline, "x");
    }

    println!("\nthe same with the ring trace off (its hooks present) and on\n");
    println!("| rx buffer (payload) | ring trace off | ring trace on | on / off |");
    println!("|---|---|---|---|");
    let dir = tempfile::tempdir().unwrap();
    for payload in [4096usize, 64 * 1024] {
        let size = HEADER_LEN + payload;
        let off = (0..runs).map(|_| host_to_guest(size, total)).fold(0.0, f64::max);
        let on = (0..runs)
            .map(|_| {
                let (trace, handle) = RingTrace::create(&dir.path().join("bench.jsonl")).unwrap();
                let device = VsockConfig { ring_trace: Some(trace), ..VsockConfig::default() };
                let rate = host_to_guest_on(device, size, total);
                handle.finish();
                rate
            })
            .fold(0.0, f64::max);
        let gbit = |rate: f64| rate * 8.0 / 1e9;
        println!(
            "| {} KiB | {:.2} Gbit/s | {:.2} Gbit/s | {:.2}x |",
            payload / 1024,
            gbit(off),
            gbit(on),
            on / off
        );
        rec.record("rx-buffers-ring-trace", "off", payload, gbit(off), "Gbit/s");
        rec.record("rx-buffers-ring-trace", "on", payload, gbit(on), "Gbit/s");
        rec.record("rx-buffers-ring-trace", "on/off", payload, on / off, "x");
    }
}
