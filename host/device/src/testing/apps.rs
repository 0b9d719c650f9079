//! Tiny guest-side applications for tests, benchmarks and demos: an echo
//! server, a sink and a source, each a step function for
//! [`crate::inprocess::GuestThread::serve`].
//!
//! They are written against the stack's non-blocking calls the way a
//! real event-driven server is: do what can be done, park a waker on what
//! cannot, return.

use std::task::Waker;

use pier_stack::{
    Error, Instant, Interest, Shutdown, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr,
};

use crate::inprocess::InProcessDriver;

/// One connection of an [`Echo`] server.
#[derive(Debug)]
struct EchoConn {
    socket: SocketHandle,
    /// The peer finished sending and everything was echoed: our write side is shut.
    done: bool,
}

/// A stream echo server: echoes everything, finishes the echo after the
/// peer's half-close, then closes.
#[derive(Debug)]
pub struct Echo {
    listener: SocketHandle,
    conns: Vec<EchoConn>,
    scratch: Vec<u8>,
    /// Connections served to completion.
    pub finished: usize,
}

impl Echo {
    pub fn listen(stack: &mut Stack, port: u32) -> pier_stack::Result<Self> {
        let listener = stack.socket(SocketType::Stream)?;
        stack.bind(listener, VsockAddr::new(VMADDR_CID_ANY, port))?;
        stack.listen(listener, 64)?;
        Ok(Self { listener, conns: Vec::new(), scratch: vec![0; 64 * 1024], finished: 0 })
    }

    pub fn step(&mut self, stack: &mut Stack, now: Instant, waker: &Waker) {
        while let Ok((socket, _)) = stack.accept(self.listener) {
            self.conns.push(EchoConn { socket, done: false });
        }
        let _ = stack.register_waker(self.listener, Interest::Read, waker);
        let scratch = &mut self.scratch;
        let mut finished = 0;
        self.conns.retain_mut(|conn| {
            let keep = echo_some(stack, conn, scratch, now);
            if keep {
                let _ = stack.register_waker(conn.socket, Interest::Read, waker);
                let _ = stack.register_waker(conn.socket, Interest::Write, waker);
            } else {
                finished += 1;
            }
            keep
        });
        self.finished += finished;
    }
}

/// Echoes what it can; returns whether the connection lives on.
fn echo_some(stack: &mut Stack, conn: &mut EchoConn, scratch: &mut [u8], now: Instant) -> bool {
    let s = conn.socket;
    loop {
        match stack.peek(s, scratch) {
            Ok(info) if info.eof => {
                if !conn.done {
                    conn.done = true;
                    let _ = stack.shutdown(s, Shutdown::Write);
                }
                let _ = stack.close(s, now);
                return false;
            }
            Ok(info) => match stack.send(s, &scratch[..info.len]) {
                Ok(n) => {
                    let _ = stack.recv(s, &mut scratch[..n]);
                    if n < info.len {
                        return true;
                    }
                }
                Err(Error::WouldBlock) => return true,
                Err(_) => {
                    let _ = stack.close(s, now);
                    return false;
                }
            },
            Err(Error::WouldBlock) => return true,
            Err(_) => {
                let _ = stack.close(s, now);
                return false;
            }
        }
    }
}

/// Accepts connections and discards what they send, counting bytes.
#[derive(Debug)]
pub struct Sink {
    listener: SocketHandle,
    conns: Vec<SocketHandle>,
    scratch: Vec<u8>,
    pub received: u64,
}

impl Sink {
    pub fn listen(stack: &mut Stack, port: u32) -> pier_stack::Result<Self> {
        let listener = stack.socket(SocketType::Stream)?;
        stack.bind(listener, VsockAddr::new(VMADDR_CID_ANY, port))?;
        stack.listen(listener, 64)?;
        Ok(Self { listener, conns: Vec::new(), scratch: vec![0; 256 * 1024], received: 0 })
    }

    pub fn step(&mut self, stack: &mut Stack, now: Instant, waker: &Waker) {
        while let Ok((socket, _)) = stack.accept(self.listener) {
            self.conns.push(socket);
        }
        let _ = stack.register_waker(self.listener, Interest::Read, waker);
        let (scratch, received) = (&mut self.scratch, &mut self.received);
        self.conns.retain(|&s| {
            loop {
                match stack.recv(s, scratch) {
                    Ok(info) if info.eof => {
                        let _ = stack.close(s, now);
                        break false;
                    }
                    Ok(info) => *received += info.len as u64,
                    Err(Error::WouldBlock) => {
                        let _ = stack.register_waker(s, Interest::Read, waker);
                        break true;
                    }
                    Err(_) => {
                        let _ = stack.close(s, now);
                        break false;
                    }
                }
            }
        });
    }
}

/// Accepts connections and sends each `total` bytes of a fixed pattern,
/// then closes.
#[derive(Debug)]
pub struct Source {
    listener: SocketHandle,
    conns: Vec<(SocketHandle, u64)>,
    chunk: Vec<u8>,
    total: u64,
}

impl Source {
    pub fn listen(
        stack: &mut Stack,
        port: u32,
        total: u64,
        chunk: usize,
    ) -> pier_stack::Result<Self> {
        let listener = stack.socket(SocketType::Stream)?;
        stack.bind(listener, VsockAddr::new(VMADDR_CID_ANY, port))?;
        stack.listen(listener, 64)?;
        Ok(Self { listener, conns: Vec::new(), chunk: vec![0x5a; chunk], total })
    }

    /// One step. With the `driver`, writes of 16 KiB or more go straight
    /// into its tx buffers when they can leave at once, one copy, as the
    /// shim sends a component's writes; without it, through the stack's
    /// send buffer.
    pub fn step(
        &mut self,
        stack: &mut Stack,
        mut driver: Option<&mut InProcessDriver>,
        now: Instant,
        waker: &Waker,
    ) {
        while let Ok((socket, _)) = stack.accept(self.listener) {
            self.conns.push((socket, 0));
        }
        let _ = stack.register_waker(self.listener, Interest::Read, waker);
        let (chunk, total) = (&self.chunk, self.total);
        self.conns.retain_mut(|(s, sent)| {
            loop {
                if *sent >= total {
                    let _ = stack.close(*s, now);
                    break false;
                }
                let want = chunk.len().min((total - *sent) as usize);
                let sent_now = match driver.as_deref_mut() {
                    Some(driver) => driver.send_in_place(stack, *s, &chunk[..want]),
                    None => stack.send(*s, &chunk[..want]),
                };
                match sent_now {
                    Ok(n) => *sent += n as u64,
                    Err(Error::WouldBlock) => {
                        let _ = stack.register_waker(*s, Interest::Write, waker);
                        break true;
                    }
                    Err(_) => {
                        let _ = stack.close(*s, now);
                        break false;
                    }
                }
            }
        });
    }
}
