//! The cost of a non-blocking accept on an empty backlog.
//!
//! An epoll server accepts in a loop until would-block, so every readiness
//! event ends with one accept that finds nothing. Linux's vsock once armed
//! a wait and a timeout for it (`docs/linux-behaviours.md#nonblocking-accept`);
//! pier's must return at once and arm nothing. The stack's test
//! (`empty_backlog_accept_arms_nothing` in `stack/src/stack/endpoint.rs`)
//! checks that it arms nothing; this measures what it costs, against the
//! kernel's own non-blocking `accept4` on an empty Unix and TCP listener in
//! the same run (a system call each: the floor an application on a host
//! socket pays).
//!
//! `cargo bench -p pier-stack --bench accept [-- --quick]`

use std::hint::black_box;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::time::Instant;

use pier_stack::phy::Loopback;
use pier_stack::{Error, SocketType, VMADDR_CID_ANY, VsockAddr};
use pier_testkit::bench::Recorder;

/// Nanoseconds per `Stack::accept` on a listener with nothing queued.
fn pier_accept(calls: u32) -> f64 {
    let mut lb = Loopback::guest_and_host();
    let l = lb.b.socket(SocketType::Stream).unwrap();
    lb.b.bind(l, VsockAddr::new(VMADDR_CID_ANY, 1234)).unwrap();
    lb.b.listen(l, 128).unwrap();
    let deadline = lb.b.poll_at();
    let started = Instant::now();
    for _ in 0..calls {
        let r = black_box(&mut lb.b).accept(black_box(l));
        assert!(matches!(r, Err(Error::WouldBlock)));
    }
    let ns = started.elapsed().as_secs_f64() * 1e9 / f64::from(calls);
    assert_eq!(lb.b.poll_at(), deadline, "accept armed a timer");
    ns
}

/// Nanoseconds per non-blocking `accept` that returns would-block.
fn kernel_accept(calls: u32, mut accept: impl FnMut() -> std::io::Result<()>) -> f64 {
    let started = Instant::now();
    for _ in 0..calls {
        let e = accept().expect_err("nothing to accept");
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(calls)
}

fn main() {
    let quick = pier_testkit::bench::quick();
    let mut rec = Recorder::from_env();
    let runs = if quick { 3 } else { 5 };
    let (stack_calls, kernel_calls) =
        if quick { (2_000_000, 200_000) } else { (20_000_000, 2_000_000) };

    let pier = (0..runs).map(|_| pier_accept(stack_calls)).fold(f64::MAX, f64::min);

    let dir = std::env::temp_dir().join(format!("pier-accept-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unix_listener = UnixListener::bind(dir.join("l.sock")).unwrap();
    unix_listener.set_nonblocking(true).unwrap();
    let unix = (0..runs)
        .map(|_| kernel_accept(kernel_calls, || unix_listener.accept().map(drop)))
        .fold(f64::MAX, f64::min);
    drop(unix_listener);
    std::fs::remove_dir_all(&dir).unwrap();

    let tcp_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp_listener.set_nonblocking(true).unwrap();
    let tcp = (0..runs)
        .map(|_| kernel_accept(kernel_calls, || tcp_listener.accept().map(drop)))
        .fold(f64::MAX, f64::min);

    println!("non-blocking accept on an empty backlog, best of {runs}\n");
    println!("| | pier-stack | Unix listener | TCP listener (127.0.0.1) | Unix / pier |");
    println!("|---|---|---|---|---|");
    println!("| per call | {pier:.1} ns | {unix:.1} ns | {tcp:.1} ns | {:.0}x |", unix / pier);
    for (case, value, unit) in [
        ("pier-stack", pier, "ns"),
        ("unix", unix, "ns"),
        ("tcp", tcp, "ns"),
        ("unix/pier", unix / pier, "x"),
    ] {
        rec.record("accept", case, "per call", value, unit);
    }
}
