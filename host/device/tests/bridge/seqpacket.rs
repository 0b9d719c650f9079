//! Seqpacket through `SOCK_SEQPACKET` Unix sockets: message boundaries and
//! the EOR flag survive both ways.

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use pier_hybrid::{SEQPACKET_EOR, connect_line, parse_ok, seqpacket_path};
use pier_stack::{Error, SocketType, Stack, VsockAddr};
use socket2::{Socket, Type};

use crate::apps::{Dialer, Echo};
use crate::driver::{AppStatus, FnApp, Harness, TIMEOUT};
use crate::host::{
    self, pattern, seq_accept, seq_dial, seq_expect_reset, seq_listen, seq_recv, seq_recv_raw,
    seq_send, seq_send_raw,
};

const PORT: u32 = 5000;

/// The finding the framing rests on: Linux's Unix `SOCK_SEQPACKET` takes
/// `MSG_EOR` on send and never reports it on receive, so EOR cannot ride
/// on the socket itself. If this test ever fails, the kernel has started
/// conveying it and the flags byte could become optional.
#[test]
fn unix_seqpacket_drops_msg_eor() {
    let (a, b) = Socket::pair(socket2::Domain::UNIX, Type::SEQPACKET, None).unwrap();
    let sent = unsafe { libc::send(a.as_raw_fd(), b"rec".as_ptr().cast(), 3, libc::MSG_EOR) };
    assert_eq!(sent, 3, "send with MSG_EOR is accepted");
    let mut buf = [0u8; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; iov points at `buf`, alive for the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) };
    assert_eq!(n, 3);
    assert_eq!(msg.msg_flags & libc::MSG_EOR, 0, "MSG_EOR does not come out the other end");
    // And an empty message reads like EOF, which the flags byte also avoids.
    assert_eq!(unsafe { libc::send(a.as_raw_fd(), buf.as_ptr().cast(), 0, 0) }, 0);
    assert_eq!(host::recv_flags(&b, &mut buf, 0).unwrap(), 0);
}

#[test]
fn host_to_guest_seqpacket_keeps_boundaries_and_eor() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::SeqPacket, PORT));
    let s = seq_dial(&seqpacket_path(h.uds()));
    // CONNECT and the first data message go out before the OK arrives.
    seq_send_raw(&s, connect_line(PORT).as_bytes());
    seq_send(&s, b"early", false);
    let ok = seq_recv_raw(&s).unwrap();
    assert!(parse_ok(&ok).is_some() && ok.ends_with(b"\n"), "{ok:?}");
    let big = pattern(0, 200 * 1024);
    let messages: Vec<(Vec<u8>, bool)> =
        vec![(b"a".to_vec(), false), (b"bb".to_vec(), true), (big, true), (b"ccc".to_vec(), false)];
    for (payload, eor) in &messages {
        seq_send(&s, payload, *eor);
    }
    assert_eq!(seq_recv(&s).unwrap(), (b"early".to_vec(), false));
    for want in &messages {
        let got = seq_recv(&s).unwrap();
        assert_eq!((got.0.len(), got.1), (want.0.len(), want.1));
        assert!(got.0 == want.0);
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(seq_recv_raw(&s), None, "the echo closes after our EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!((st.messages_to_guest, st.messages_from_guest), (5, 5));
}

#[test]
fn guest_to_host_seqpacket_keeps_boundaries_and_eor() {
    let h = Harness::start();
    let listener = seq_listen(&pier_hybrid::listener_path(h.uds(), 6002));
    let (tx, rx) = mpsc::channel();
    let big = pattern(7, 200 * 1024);
    let outgoing: Vec<(Vec<u8>, bool)> =
        vec![(b"one".to_vec(), false), (b"two".to_vec(), true), (big.clone(), true)];
    let mut sock = None;
    let mut sent = 0;
    let mut replies = Vec::new();
    let to_send = outgoing.clone();
    h.spawn(FnApp(move |guest: &mut Stack, now| {
        let s = *sock.get_or_insert_with(|| {
            let s = guest.socket(SocketType::SeqPacket).unwrap();
            guest.connect(s, VsockAddr::new(2, 6002), now).unwrap();
            s
        });
        match guest.finish_connect(s) {
            Err(Error::WouldBlock) => return AppStatus::Idle,
            Err(e) => panic!("guest seqpacket connect: {e}"),
            Ok(()) => {}
        }
        while sent < to_send.len() {
            let (payload, eor) = &to_send[sent];
            match guest.send_message(s, payload, *eor) {
                Ok(()) => sent += 1,
                Err(Error::WouldBlock) => return AppStatus::Idle,
                Err(e) => panic!("guest send_message: {e}"),
            }
        }
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match guest.recv(s, &mut buf) {
                Ok(info) if info.eof => {
                    tx.send(std::mem::take(&mut replies)).unwrap();
                    guest.close(s, now).unwrap();
                    return AppStatus::Done;
                }
                Ok(info) => replies.push((buf[..info.len].to_vec(), info.end_of_record)),
                Err(Error::WouldBlock) => return AppStatus::Idle,
                Err(e) => panic!("guest recv: {e}"),
            }
        }
    }));
    let conn = seq_accept(&listener);
    for want in &outgoing {
        let got = seq_recv(&conn).expect("a message from the guest");
        assert_eq!((got.0.len(), got.1), (want.0.len(), want.1));
        assert!(got.0 == want.0);
    }
    seq_send(&conn, b"reply", true);
    seq_send(&conn, b"", false);
    seq_send(&conn, b"last", false);
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let replies = rx.recv_timeout(TIMEOUT).unwrap();
    // The empty message is not transmitted (vsock never sends one).
    assert_eq!(replies, vec![(b"reply".to_vec(), true), (b"last".to_vec(), false)]);
    assert_eq!(seq_recv_raw(&conn), None, "the guest's close reads as EOF");
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.messages_from_guest, 3);
}

#[test]
fn seqpacket_message_too_large_closes() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::SeqPacket, PORT));
    let s = seq_dial(&seqpacket_path(h.uds()));
    seq_send_raw(&s, b"CONNECT 5000");
    assert!(parse_ok(&seq_recv_raw(&s).unwrap()).is_some());
    // One byte over the guest's 256 KiB buffer: it can never be sent.
    seq_send(&s, &vec![1u8; 256 * 1024 + 1], true);
    seq_expect_reset(&s);
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.messages_too_large, 1);
}

#[test]
fn seqpacket_unknown_flag_bits_close() {
    let h = Harness::start();
    h.spawn(Echo::new(SocketType::SeqPacket, PORT));
    let s = seq_dial(&seqpacket_path(h.uds()));
    seq_send_raw(&s, b"connect 5000\n");
    assert!(parse_ok(&seq_recv_raw(&s).unwrap()).is_some());
    seq_send_raw(&s, &[SEQPACKET_EOR | 0x80, b'x']);
    seq_expect_reset(&s);
    let st = h.wait_stats("the connection to close", |s| s.closed == 1);
    assert_eq!(st.bad_frames, 1);
}

/// One port space, one type per port: a guest seqpacket connect to a host
/// stream listener is refused at once.
#[test]
fn guest_seqpacket_to_stream_listener_is_reset() {
    let h = Harness::start();
    let _stream_listener = host::listen(h.uds(), 6003);
    let (tx, rx) = mpsc::channel();
    h.spawn(Dialer::new(SocketType::SeqPacket, 6003, tx));
    let (result, took) = rx.recv_timeout(TIMEOUT).unwrap();
    assert_eq!(result, Err(Error::ConnectionReset));
    assert!(took < Duration::from_millis(500));
    assert_eq!(h.stats().host_refused, 1);
}
