//! Seqpacket messages and datagrams through `msg-echo`, from the host side
//! of the bridge (`<uds>_seqpacket` and `<uds>_dgram`, framed as
//! `docs/host-sockets.md` says).

mod common;

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{PierRun, data, path, wasm};
use socket2::{Domain, SockAddr, Socket, Type};

const EOR: u8 = 1;

fn msg_echo() -> PierRun {
    let app = wasm("msg-echo");
    // It answers datagrams to their sender, so it may send to the host.
    PierRun::start(&[app.to_str().unwrap(), "--listen", "1235", "--connect", "2:*"])
}

/// A seqpacket connection to the guest's `port`, after `CONNECT`/`OK`.
fn seqpacket(run: &PierRun, port: u32) -> Socket {
    let target = path(&run.uds, "_seqpacket");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        s.set_send_buffer_size(1 << 20).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if s.connect(&SockAddr::unix(&target).unwrap()).is_ok() {
            s.send(format!("CONNECT {port}").as_bytes()).unwrap();
            let mut buf = [0u8; 64];
            if let Ok(n) = (&s).read(&mut buf)
                && buf[..n].starts_with(b"OK ")
            {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "seqpacket port {port} never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Messages of many sizes come back one for one, with their boundaries
/// and their end-of-record marks; then a half-close ends the echo.
#[test]
fn seqpacket_keeps_boundaries_and_end_of_record() {
    let run = msg_echo();
    let conn = seqpacket(&run, 1235);
    let sizes = [1usize, 2, 100, 4096, 65_535, 65_536, 65_537, 200_000, 256 * 1024, 7];
    let mut buf = vec![0u8; 256 * 1024 + 1];
    for (i, &size) in sizes.iter().enumerate() {
        let eor = i % 3 == 0;
        let payload = data(i as u64 + 40, size);
        let mut message = vec![if eor { EOR } else { 0 }];
        message.extend_from_slice(&payload);
        conn.send(&message).unwrap();
        let n = (&conn).read(&mut buf).unwrap_or_else(|e| {
            panic!("message {i} ({size} bytes): {e}; pier stderr:\n{}", run.stderr())
        });
        assert_eq!(n, size + 1, "message {i}: one message back, whole");
        assert_eq!(buf[0] & EOR != 0, eor, "message {i}: the end-of-record mark survives");
        assert!(buf[1..n] == payload[..], "message {i}: same bytes");
    }
    // A burst: boundaries hold even when messages queue up.
    for i in 0..50u64 {
        let mut message = vec![(i % 2) as u8];
        message.extend_from_slice(&data(i, 1000 + i as usize));
        conn.send(&message).unwrap();
    }
    for i in 0..50u64 {
        let n = (&conn).read(&mut buf).unwrap();
        assert_eq!(n, 1 + 1000 + i as usize, "burst message {i} keeps its size");
        assert_eq!(buf[0], (i % 2) as u8);
        assert!(buf[1..n] == data(i, 1000 + i as usize)[..]);
    }
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let n = (&conn).read(&mut buf).unwrap();
    assert_eq!(n, 0, "after our half-close the guest finishes and closes");
}

/// A datagram to the guest comes back to the socket it came from, with
/// the 8-byte ports header filled in.
#[test]
fn datagrams_round_trip() {
    let run = msg_echo();
    // Our host port 9000: the guest's reply to (2, 9000) arrives at
    // `<uds>_dgram_9000`, so bind there; send from it too.
    let me = UnixDatagram::bind(path(&run.uds, "_dgram_9000")).unwrap();
    me.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let guest = path(&run.uds, "_dgram");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = vec![0u8; 65536 + 8];
    // The component may still be binding: resend until the first answer.
    let first = loop {
        let mut d = Vec::from(1235u32.to_le_bytes());
        d.extend_from_slice(&9000u32.to_le_bytes());
        d.extend_from_slice(b"ping");
        let _ = me.send_to(&d, &guest);
        if let Ok(n) = me.recv(&mut buf) {
            break buf[..n].to_vec();
        }
        assert!(Instant::now() < deadline, "no datagram came back; stderr:\n{}", run.stderr());
    };
    assert_eq!(&first[..4], 1235u32.to_le_bytes(), "guest port first");
    assert_eq!(&first[4..8], 9000u32.to_le_bytes(), "then our port");
    assert_eq!(&first[8..], b"ping");

    me.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for (i, size) in [0usize, 1, 1000, 32 * 1024, 65536].into_iter().enumerate() {
        let payload = data(i as u64 + 9, size);
        let mut d = Vec::from(1235u32.to_le_bytes());
        d.extend_from_slice(&9000u32.to_le_bytes());
        d.extend_from_slice(&payload);
        me.send_to(&d, &guest).unwrap();
        let n = me.recv(&mut buf).unwrap();
        assert_eq!(n, size + 8, "datagram {i}: whole");
        assert!(buf[8..n] == payload[..], "datagram {i}: same bytes");
    }
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
    let listener = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    listener.bind(&SockAddr::unix(path(&uds, "_6000")).unwrap()).unwrap();
    listener.listen(4).unwrap();
    listener.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
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
    let (conn, _) = listener.accept().expect("the component connected");
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Long enough for the component to have sent everything and exited.
    std::thread::sleep(Duration::from_millis(1000));
    let mut buf = vec![0u8; SIZE + 2];
    for i in 0..COUNT {
        let n = (&conn)
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("message {i}: {e}; pier stderr:\n{}", run.stderr()));
        assert_eq!(n, 1 + SIZE, "message {i} whole");
        assert!(buf[1..n].iter().all(|&b| b == i as u8), "message {i} has its own bytes");
    }
    assert_eq!((&conn).read(&mut buf).unwrap(), 0, "then the connection ends");
    assert_eq!(run.wait(Duration::from_secs(30)), 0, "stderr:\n{}", run.stderr());
}
