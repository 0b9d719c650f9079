//! Datagram sockets over `vsock:sockets@0.2.0`, in `udp@0.3`'s shape: one
//! datagram per async call each way. As with seqpacket, a receive is kept
//! in flight and its datagram held until a call takes it, and a send runs
//! in the background. Connecting drops a received datagram not yet read,
//! as Linux drops those queued.

use std::cell::Cell;
use std::fmt::Debug;
use std::io;
use std::rc::Rc;

use super::bindings::vsock::sockets::types::{DatagramSocket, ErrorCode, IncomingDatagram};
use super::convert::{error, send_error, to_usize};
use super::wait::in_async_run;
use super::wait::{Pending, PollRef, Sending, Wasi3Wait, wait};
use crate::addr::VsockAddr;
use crate::platform::contract;

/// A datagram socket.
pub(crate) struct Datagram {
    receive: Pending<Result<IncomingDatagram, ErrorCode>>,
    /// The last datagram's inq hint.
    inq: Cell<u64>,
    send: Sending<Result<(), ErrorCode>>,
    socket: Rc<DatagramSocket>,
    nonblocking: Cell<bool>,
}

impl Debug for Datagram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datagram")
            .field("socket", &self.socket)
            .field("receive", &self.receive)
            .field("send", &self.send)
            .finish()
    }
}

impl Datagram {
    fn start_receive(&self) {
        if self.receive.is_idle() {
            let socket = self.socket.clone();
            self.receive.start(async move { socket.receive().await });
        }
    }

    fn settle_send(&self, nonblocking: bool) -> io::Result<()> {
        if self.send.is_busy() {
            wait(nonblocking, &self.send)?;
        }
        match self.send.take() {
            Some(Err(code)) => Err(send_error(code)),
            _ => Ok(()),
        }
    }

    fn send_one(&self, buf: &[u8], to: Option<VsockAddr>) -> io::Result<usize> {
        let nonblocking = self.nonblocking.get();
        self.settle_send(nonblocking)?;
        let socket = self.socket.clone();
        let data = buf.to_vec();
        self.send.start(async move { socket.send(data, to.map(Into::into)).await });
        // A datagram the host refuses at once (too large, no peer) fails
        // this call rather than the next.
        if !nonblocking || !self.send.is_busy() {
            self.settle_send(nonblocking)?;
        }
        Ok(buf.len())
    }

    fn recv_one(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        loop {
            match self.receive.take() {
                Some(Ok(d)) => {
                    self.inq.set(d.inq);
                    let n = d.data.len().min(buf.len());
                    buf[..n].copy_from_slice(&d.data[..n]);
                    return Ok((n, d.remote_address.into()));
                }
                Some(Err(code)) => return Err(error(code)),
                None => {}
            }
            self.start_receive();
            wait(self.nonblocking.get(), &self.receive)?;
        }
    }
}

impl contract::Socket<Wasi3Wait> for Datagram {
    fn local_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_local_address().map(Into::into).map_err(error)
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking.set(nonblocking);
        Ok(())
    }

    fn readable(&self) -> PollRef<'_> {
        self.start_receive();
        PollRef::Op(&self.receive)
    }
}

impl contract::Datagram<Wasi3Wait> for Datagram {
    fn bind(addr: VsockAddr) -> io::Result<Self> {
        in_async_run()?;
        let socket = DatagramSocket::create().map_err(error)?;
        socket.bind(addr.into()).map_err(error)?;
        Ok(Self {
            receive: Pending::default(),
            inq: Cell::new(0),
            send: Sending::default(),
            socket: Rc::new(socket),
            nonblocking: Cell::new(false),
        })
    }

    fn connect(&mut self, peer: VsockAddr) -> io::Result<()> {
        self.receive.cancel();
        self.socket.connect(peer.into()).map_err(error)
    }

    fn send_to(&self, buf: &[u8], to: VsockAddr) -> io::Result<usize> {
        self.send_one(buf, Some(to))
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_one(buf, None)
    }

    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, VsockAddr)> {
        self.recv_one(buf)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_one(buf).map(|(n, _)| n)
    }

    fn peer_addr(&self) -> io::Result<VsockAddr> {
        self.socket.get_remote_address().map(Into::into).map_err(error)
    }

    fn recv_queued(&self) -> io::Result<usize> {
        let (held, inq) = self.receive.with_done(|done| match done {
            Some(Ok(d)) => (d.data.len(), to_usize(d.inq)),
            _ => (0, to_usize(self.inq.get())),
        });
        Ok(held.saturating_add(inq))
    }

    fn writable(&self) -> PollRef<'_> {
        if self.send.is_busy() { PollRef::Op(&self.send) } else { PollRef::Ready }
    }
}
