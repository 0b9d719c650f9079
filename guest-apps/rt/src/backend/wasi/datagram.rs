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
use super::{PollRef, error, finish, lazy, send_error, to_usize, wait, with_network};
use crate::VsockAddr;

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
    pub(crate) fn bind(addr: VsockAddr) -> io::Result<Self> {
        let socket = create_datagram_socket().map_err(error)?;
        {
            let ready = socket.subscribe();
            with_network(|n| socket.start_bind(n, addr.into())).map_err(error)?;
            finish(&ready, || socket.finish_bind())?;
        }
        let io = Io::open(&socket, None)?;
        Ok(Self { io: Some(io), socket, peer: None, nonblocking: Cell::new(false) })
    }

    pub(crate) fn connect(&mut self, peer: VsockAddr) -> io::Result<()> {
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

    fn io(&self) -> io::Result<&Io> {
        self.io.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "vsock: datagram streams lost")
        })
    }

    pub(crate) fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        self.send_one(buf, Some(to))
    }

    pub(crate) fn send(&self, buf: &[u8]) -> io::Result<usize> {
        if self.peer.is_none() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        self.send_one(buf, None)
    }

    fn send_one(&self, data: &[u8], to: Option<VsockAddr>) -> io::Result<usize> {
        let io = self.io()?;
        let datagram = OutgoingDatagram { data, remote_address: to.map(Into::into) };
        loop {
            match io.tx.check_send() {
                Ok(0) => wait(self.nonblocking.get(), io.tx_ready())?,
                Ok(_) => match io.tx.send(std::slice::from_ref(&datagram)) {
                    Ok(0) => wait(self.nonblocking.get(), io.tx_ready())?,
                    Ok(_) => return Ok(data.len()),
                    Err(e) => return Err(send_error(e)),
                },
                Err(e) => return Err(send_error(e)),
            }
        }
    }

    pub(crate) fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
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

    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    pub(crate) fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.local_address().map(Into::into).map_err(error)
    }

    pub(crate) fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.remote_address().map(Into::into).map_err(error)
    }

    pub(crate) fn recv_queued(&self) -> io::Result<usize> {
        let io = self.io()?;
        let local: usize = io.queue.borrow().iter().map(|d| d.data.len()).sum();
        Ok(local.saturating_add(to_usize(io.inq.get())))
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    pub(crate) fn readable(&self) -> PollRef<'_> {
        match &self.io {
            Some(io) if io.queue.borrow().is_empty() => PollRef::Pollable(io.rx_ready()),
            // Queued datagrams, or no streams at all: a call will not wait.
            _ => PollRef::Ready,
        }
    }

    pub(crate) fn writable(&self) -> PollRef<'_> {
        match &self.io {
            Some(io) => PollRef::Pollable(io.tx_ready()),
            None => PollRef::Ready,
        }
    }
}
