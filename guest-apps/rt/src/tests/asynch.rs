//! The async layer: the socket futures, `block_on`, `spawn` and the
//! reactor that wakes tasks when their sockets are ready.

use std::cell::Cell;
use std::future::poll_fn;
use std::io::ErrorKind;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use super::{assert_kind, dialable, nobody};
use crate::addr::{VMADDR_CID_LOCAL, VMADDR_PORT_ANY, VsockAddr};
use crate::asynch::{
    self, AsyncReadExt, AsyncWriteExt, SeqpacketListener, SeqpacketStream, Stream, VsockDatagram,
    VsockListener, VsockStream,
};
use crate::io;
use crate::platform::loopback::BUFFER;

fn any() -> VsockAddr {
    VsockAddr::new(VMADDR_CID_LOCAL, VMADDR_PORT_ANY)
}

async fn read_to_end(reader: &mut (impl asynch::AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match reader.read(&mut buf).await? {
            0 => return Ok(all),
            n => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn an_accept_waiting_in_one_task_meets_a_connect_from_another() {
    let reply = asynch::block_on(async {
        let listener = VsockListener::bind(any())?;
        let addr = dialable(listener.local_addr()?);
        let client = asynch::spawn(async move {
            let mut conn = VsockStream::connect(addr).await?;
            conn.write_all(b"ping").await?;
            conn.close().await?;
            read_to_end(&mut conn).await
        });
        let (mut conn, peer) = listener.accept().await?;
        assert_eq!(peer, conn.peer_addr()?);
        assert_eq!(read_to_end(&mut conn).await?, b"ping");
        conn.write_all(b"pong").await?;
        drop(conn);
        client.await
    });
    assert_eq!(reply.unwrap(), b"pong");
}

#[test]
fn incoming_is_a_stream_of_connections() {
    let peers = asynch::block_on(async {
        let listener = VsockListener::bind(any())?;
        let addr = dialable(listener.local_addr()?);
        let dialer = asynch::spawn(async move {
            let a = VsockStream::connect(addr).await?;
            let b = VsockStream::connect(addr).await?;
            io::Result::Ok([a.local_addr()?, b.local_addr()?])
        });
        let mut incoming = listener.incoming();
        let mut peers = Vec::new();
        for _ in 0..2 {
            let next = poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await;
            peers.push(next.expect("incoming never ends")?.peer_addr()?);
        }
        assert_eq!(peers, dialer.await?);
        io::Result::Ok(peers.len())
    });
    assert_eq!(peers.unwrap(), 2);
}

#[test]
fn split_halves_move_to_tasks_and_dropping_the_write_half_half_closes() {
    let echoed = asynch::block_on(async {
        let listener = VsockListener::bind(any())?;
        let addr = dialable(listener.local_addr()?);
        let client = asynch::spawn(async move {
            let (mut rx, mut tx) = VsockStream::connect(addr).await?.into_split();
            let writer = asynch::spawn(async move {
                tx.write_all(b"through halves").await?;
                // `tx` drops after this: the server reads the end.
                tx.peer_addr()
            });
            let peer = writer.await?;
            assert_eq!(peer, rx.peer_addr()?);
            read_to_end(&mut rx).await
        });
        let (mut conn, _) = listener.accept().await?;
        let request = read_to_end(&mut conn).await?;
        conn.write_all(&request).await?;
        drop(conn);
        client.await
    });
    assert_eq!(echoed.unwrap(), b"through halves");
}

#[test]
fn a_writer_waits_for_room_and_goes_on_as_the_reader_drains() {
    let total = asynch::block_on(async {
        let listener = VsockListener::bind(any())?;
        let addr = dialable(listener.local_addr()?);
        let writer = asynch::spawn(async move {
            let mut conn = VsockStream::connect(addr).await?;
            conn.write_all(&vec![9; 3 * BUFFER]).await?;
            conn.close().await
        });
        let (mut conn, _) = listener.accept().await?;
        let got = read_to_end(&mut conn).await?;
        writer.await?;
        io::Result::Ok(got.len())
    });
    assert_eq!(total.unwrap(), 3 * BUFFER);
}

#[test]
fn a_task_that_always_finds_data_yields_to_the_others() {
    let (reads_when_other_ran, reads) = asynch::block_on(async {
        let listener = VsockListener::bind(any()).unwrap();
        let addr = dialable(listener.local_addr().unwrap());
        let mut client = VsockStream::connect(addr).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client.write_all(&[1; 1000]).await.unwrap();
        let reads = Rc::new(Cell::new(0));
        let counted = reads.clone();
        let reader = asynch::spawn(async move {
            for _ in 0..1000 {
                server.read(&mut [0; 1]).await.unwrap();
                counted.set(counted.get() + 1);
            }
        });
        let seen = reads.clone();
        let other = asynch::spawn(async move { seen.get() });
        let when = other.await;
        reader.await;
        (when, reads.get())
    });
    assert_eq!(reads, 1000);
    assert!(reads_when_other_ran < 1000, "the reader ran to the end before the other task ran");
}

#[test]
fn a_join_handle_gives_the_tasks_output_and_says_when_it_finished() {
    asynch::block_on(async {
        let handle = asynch::spawn(async { 42 });
        assert!(!handle.is_finished());
        assert_eq!(handle.await, 42);
    });
}

#[test]
#[should_panic(expected = "nothing can wake them")]
fn block_on_panics_when_every_task_waits_and_none_on_a_socket() {
    asynch::block_on(std::future::pending::<()>());
}

#[test]
fn an_async_connect_where_nobody_listens_is_refused() {
    asynch::block_on(async {
        assert_kind(VsockStream::connect(nobody()).await, ErrorKind::ConnectionRefused);
        let (_listener, addr) = super::listening();
        let zero = VsockStream::connect_timeout(addr, Some(Duration::ZERO)).await;
        assert_kind(zero, ErrorKind::InvalidInput);
    });
}

#[test]
fn async_seqpacket_keeps_message_boundaries_and_end_of_record() {
    let got = asynch::block_on(async {
        let listener = SeqpacketListener::bind(any())?;
        let addr = dialable(listener.local_addr()?);
        let sender = asynch::spawn(async move {
            let (_rx, tx) = SeqpacketStream::connect(addr).await?.into_split();
            tx.send(b"one").await?;
            tx.send_eor(b"two", true).await?;
            io::Result::Ok(())
        });
        let (conn, _) = listener.accept().await?;
        let mut buf = [0; 16];
        let first = conn.recv(&mut buf).await?;
        let second = conn.recv(&mut buf).await?;
        sender.await?;
        let end = conn.recv(&mut buf).await?;
        io::Result::Ok([
            (first.len, first.end_of_record),
            (second.len, second.end_of_record),
            (end.len, end.end_of_record),
        ])
    });
    assert_eq!(got.unwrap(), [(3, false), (3, true), (0, false)]);
}

#[test]
fn an_async_datagram_receive_waits_for_the_send() {
    let got = asynch::block_on(async {
        let a = VsockDatagram::bind(any())?;
        let mut b = VsockDatagram::bind(any())?;
        let (a_addr, b_addr) = (dialable(a.local_addr()?), dialable(b.local_addr()?));
        b.connect(a_addr)?;
        let receiver = asynch::spawn(async move {
            let mut buf = [0; 16];
            let n = b.recv(&mut buf).await?;
            io::Result::Ok(buf[..n].to_vec())
        });
        a.send_to(b"dgram", b_addr).await?;
        receiver.await
    });
    assert_eq!(got.unwrap(), b"dgram");
}
