//! Seqpacket messages and datagrams through `msg-echo`, from the host side
//! of the bridge (`<uds>_seqpacket` and `<uds>_dgram`, framed as
//! `docs/host-sockets.md` says).

mod common;

use std::time::Duration;

use common::{PierRun, scenarios, wasm};
use pier_client::HybridSeqpacketListener;

fn msg_echo() -> PierRun {
    let app = wasm("msg-echo");
    // It answers datagrams to their sender, so it may send to the host.
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1235", "--connect", "2:*"])
}

/// Messages of many sizes come back one for one, with their boundaries
/// and their end-of-record marks; then a half-close ends the echo.
#[test]
fn seqpacket_keeps_boundaries_and_end_of_record() {
    scenarios::seqpacket_keeps_boundaries_and_end_of_record(&msg_echo(), 1235);
}

/// A datagram to the guest comes back to the socket it came from, with
/// the 8-byte ports header filled in.
#[test]
fn datagrams_round_trip() {
    scenarios::datagrams_round_trip(&msg_echo(), 1235);
}

/// A message the component's sender accepted but the peer's credit could
/// not take yet still arrives after the component exits: the host program
/// reads nothing until the component is gone, so the last message is
/// held when the component drops its sender.
#[test]
fn messages_held_for_credit_survive_the_component_exiting() {
    const SIZE: usize = 150 * 1024;
    // The bridge's Unix send buffer takes at most six such messages and the
    // host stack one more, so the eighth is always held.
    const COUNT: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener = HybridSeqpacketListener::bind(&uds, 6000).unwrap();
    // accept fails after 30 s rather than hang if the component never dials.
    socket2::SockRef::from(&listener).set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let probe = wasm("probe");
    let (size, count) = (SIZE.to_string(), COUNT.to_string());
    let mut run = PierRun::start_in(
        &uds,
        &[
            probe.to_str().unwrap(),
            "--connect",
            "2:6000",
            "--",
            "blurt-messages",
            "2",
            "6000",
            &size,
            &count,
        ],
        std::process::Stdio::null(),
        std::process::Stdio::null(),
    );
    let conn = listener.accept().expect("the component connected");
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Long enough for the component to have sent everything and exited.
    std::thread::sleep(Duration::from_millis(1000));
    let mut buf = vec![0u8; SIZE + 1];
    for i in 0..COUNT {
        let (n, _) = conn
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("message {i}: {e}; pier stderr:\n{}", run.stderr()));
        assert_eq!(n, SIZE, "message {i} whole");
        assert!(buf[..n].iter().all(|&b| b == i as u8), "message {i} has its own bytes");
    }
    assert_eq!(conn.recv(&mut buf).unwrap().0, 0, "then the connection ends");
    assert_eq!(run.wait(Duration::from_secs(30)), 0, "stderr:\n{}", run.stderr());
}
