//! The in-process device on real threads: the device loop woken by queue eventfds and
//! running the guest's interrupt handler, the guest thread woken for its
//! timers, the application by wakers.

use std::time::Duration;

use pier_device::testing::Testbed;
use pier_device::{EventSource, Relay, Siblings};
use pier_stack::{
    Error, Instant, Interest, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr,
};

/// A host-side echo server on port 7, living in the device loop.
#[derive(Default)]
struct Echo {
    listener: Option<SocketHandle>,
    conns: Vec<SocketHandle>,
}

impl Echo {
    /// Listens on port 7 of the host stack; the device loop calls this
    /// when it builds its backend.
    fn build(stack: &mut Stack, _: &mio::Registry, _: usize) -> std::io::Result<Self> {
        let l = stack.socket(SocketType::Stream).unwrap();
        stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, 7)).unwrap();
        stack.listen(l, 16).unwrap();
        Ok(Self { listener: Some(l), conns: Vec::new() })
    }
}

impl EventSource for Echo {}
impl Siblings for Echo {}

impl Relay for Echo {
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        while let Ok((c, _)) = stack.accept(self.listener.unwrap()) {
            self.conns.push(c);
        }
        let mut buf = vec![0u8; 65536];
        self.conns.retain(|&c| {
            loop {
                let space = 65536;
                match stack.peek(c, &mut buf[..space]) {
                    Ok(info) if info.eof => {
                        let _ = stack.close(c, now);
                        break false;
                    }
                    Ok(info) => match stack.send(c, &buf[..info.len]) {
                        Ok(n) => {
                            let _ = stack.recv(c, &mut buf[..n]);
                            if n < info.len {
                                break true;
                            }
                        }
                        Err(Error::WouldBlock) => break true,
                        Err(_) => break false,
                    },
                    Err(Error::WouldBlock) => break true,
                    Err(_) => break false,
                }
            }
        });
    }
}

#[test]
fn echo_across_threads() {
    let running = Testbed::with_defaults().unwrap().start(Echo::build).unwrap();
    let guest = &running.guest;
    let c = guest.with(|s, now| {
        let c = s.socket(SocketType::Stream).unwrap();
        s.connect(c, VsockAddr::new(2, 7), now).unwrap();
        c
    });
    guest
        .wait_for(c, Interest::Write, Duration::from_secs(5), |s, _| match s.finish_connect(c) {
            Err(Error::WouldBlock) => None,
            other => Some(other),
        })
        .expect("connect finished in time")
        .expect("connected");
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let mut sent = 0;
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 65536];
    while got.len() < data.len() {
        if sent < data.len() {
            sent += guest.with(|s, _| s.send(c, &data[sent..]).unwrap_or(0));
        }
        let n = guest
            .wait_for(c, Interest::Read, Duration::from_secs(5), |s, _| match s.recv(c, &mut buf) {
                Ok(info) => Some(info.len),
                Err(Error::WouldBlock) if sent < data.len() => Some(0),
                Err(Error::WouldBlock) => None,
                Err(e) => panic!("{e}"),
            })
            .expect("echo arrived in time");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == data, "4 MiB echoed intact across threads");
}

/// Wakes a thread parked in [`std::thread::park_timeout`].
struct Unpark(std::thread::Thread, std::sync::atomic::AtomicBool);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.1.store(true, std::sync::atomic::Ordering::Release);
        self.0.unpark();
    }
}

/// The guest's timers fire while the application sleeps on its waker: the
/// application's own call armed the timer and then never touches the stack
/// again, so only the guest thread (asleep with no deadline when the timer
/// was armed) can fire it.
#[test]
fn guest_timer_fires_while_the_application_waits() {
    use std::sync::atomic::Ordering;
    let running = Testbed::with_defaults().unwrap().start(Echo::build).unwrap();
    let guest = &running.guest;
    // Give the guest thread time to go to sleep with no deadline.
    std::thread::sleep(Duration::from_millis(50));
    let unpark = std::sync::Arc::new(Unpark(
        std::thread::current(),
        std::sync::atomic::AtomicBool::new(false),
    ));
    let waker = std::task::Waker::from(unpark.clone());
    let c = guest.with(|s, now| {
        let c = s.socket(SocketType::Stream).unwrap();
        s.set_connect_timeout(c, Duration::from_millis(300)).unwrap();
        // Nothing answers CID 9: the device drops packets for other CIDs.
        s.connect(c, VsockAddr::new(9, 7), now).unwrap();
        s.register_waker(c, Interest::Write, &waker).unwrap();
        c
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !unpark.1.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(100));
    }
    assert!(unpark.1.load(Ordering::Acquire), "the connect timer woke the application");
    assert_eq!(guest.with(|s, _| s.finish_connect(c)), Err(Error::TimedOut));
}
