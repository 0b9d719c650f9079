//! Datagram sockets over WIT. As with seqpacket, receives come in batches
//! that this module hands out one datagram at a time. Connecting swaps the
//! socket's stream pair, which the host allows only after the old pair is
//! gone, so the pair lives in an `Option` that connect empties first.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::io;

use wasip2::io::poll::Pollable;

use super::bindings::vsock::sockets::datagram_create_socket::create_datagram_socket;
use super::bindings::vsock::sockets::datagram_socket::{
    DatagramSocket, IncomingDatagram, IncomingDatagramStream, OutgoingDatagram,
    OutgoingDatagramStream,
};
use super::network::{error, to_usize, with_network};
use super::wait::{PollRef, WasiPoll, finish, lazy, send_whole, wait};
use crate::addr::VsockAddr;
use crate::platform::contract;

/// Datagrams asked for per host call.
const BATCH: u64 = 16;

/// One stream pair from `%stream`, with what was fetched through it.
#[derive(Debug)]
struct Io {
    rx_ready: OnceCell<Pollable>,
    tx_ready: OnceCell<Pollable>,
    rx: IncomingDatagramStream,
    tx: OutgoingDatagramStream,
    queue: RefCell<VecDeque<IncomingDatagram>>,
    inq: Cell<u64>,
}

impl Io {
    fn open(socket: &DatagramSocket, peer: Option<VsockAddr>) -> io::Result<Self> {
        let (rx, tx) = socket.stream(peer.map(Into::into)).map_err(error)?;
        Ok(Self {
            rx_ready: OnceCell::new(),
            tx_ready: OnceCell::new(),
            rx,
            tx,
            queue: RefCell::new(VecDeque::new()),
            inq: Cell::new(0),
        })
    }

    fn rx_ready(&self) -> &Pollable {
        lazy(&self.rx_ready, || self.rx.subscribe())
    }

    fn tx_ready(&self) -> &Pollable {
        lazy(&self.tx_ready, || self.tx.subscribe())
    }
}

/// A datagram socket.
#[derive(Debug)]
pub(crate) struct Datagram {
    /// `None` only after a failed re-connect left the socket without
    /// streams.
    io: Option<Io>,
    socket: DatagramSocket,
    peer: Option<VsockAddr>,
    nonblocking: Cell<bool>,
}

impl Datagram {
    fn io(&self) -> io::Result<&Io> {
        self.io.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "vsock: datagram streams lost")
        })
    }

    fn send_one(&self, data: &[u8], to: Option<VsockAddr>) -> io::Result<usize> {
        let io = self.io()?;
        let datagram = OutgoingDatagram { data, remote_address: to.map(Into::into) };
        send_whole(
            self.nonblocking.get(),
            io.tx_ready(),
            || io.tx.check_send(),
            || io.tx.send(std::slice::from_ref(&datagram)),
        )?;
        Ok(data.len())
    }
}

impl contract::Socket<WasiPoll> for Datagram {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        match &self.io {
            Some(io) if io.queue.borrow().is_empty() => PollRef::Pollable(io.rx_ready()),
            // Queued datagrams, or no streams at all: a call will not wait.
            _ => PollRef::Ready,
        }
    }
}

impl contract::Datagram<WasiPoll> for Datagram {
    fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = create_datagram_socket().map_err(error)?;
        {
            let ready = socket.subscribe();
            with_network(|n| socket.start_bind(n, addr.into())).map_err(error)?;
            finish(&ready, || socket.finish_bind())?;
        }
        let io = Io::open(&socket, None)?;
        Ok(Self { io: Some(io), socket, peer: None, nonblocking: Cell::new(false) })
    }

    fn connect(&mut self, peer: VsockAddr) -> io::Result<()> {
        // The old pair (and its pollables) must be gone before `%stream`.
        self.io = None;
        match Io::open(&self.socket, Some(peer)) {
            Ok(io) => {
                self.io = Some(io);
                self.peer = Some(peer);
                Ok(())
            }
            Err(e) => {
                // Fall back to an unconnected pair so the socket stays usable.
                self.io = Io::open(&self.socket, None).ok();
                self.peer = None;
                Err(e)
            }
        }
    }

    fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        self.send_one(buf, Some(to))
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        if self.peer.is_none() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        self.send_one(buf, None)
    }

    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        let io = self.io()?;
        loop {
            if let Some(d) = io.queue.borrow_mut().pop_front() {
                // Like UDP: the part that does not fit is discarded.
                let n = d.data.len().min(buf.len());
                buf[..n].copy_from_slice(&d.data[..n]);
                return Ok((n, d.remote_address.into()));
            }
            let batch = io.rx.receive(BATCH).map_err(error)?;
            io.inq.set(batch.inq);
            io.queue.borrow_mut().extend(batch.datagrams);
            if io.queue.borrow().is_empty() {
                wait(self.nonblocking.get(), io.rx_ready())?;
            }
        }
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.remote_address().map(Into::into).map_err(error)
    }

    fn recv_queued(&self) -> io::Result<usize> {
        let io = self.io()?;
        let local: usize = io.queue.borrow().iter().map(|d| d.data.len()).sum();
        Ok(local.saturating_add(to_usize(io.inq.get())))
    }

    fn writable(&self) -> PollRef<'_> {
        match &self.io {
            Some(io) => PollRef::Pollable(io.tx_ready()),
            None => PollRef::Ready,
        }
    }
}
