//! Programs on the guest's stack, polled by the loop.

use std::sync::mpsc::Sender;
use std::time::Duration;

use pier_stack::{Error, Instant, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr};

use crate::driver::{AppStatus, GuestApp};
use crate::host::{fill, matches};

/// Binds and listens on `port` of the guest stack.
pub fn guest_listener(guest: &mut Stack, ty: SocketType, port: u32) -> SocketHandle {
    let h = guest.socket(ty).unwrap();
    guest.bind(h, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
    guest.listen(h, 16).unwrap();
    h
}

/// Echoes every connection on a port back to its sender: bytes for a
/// stream, whole messages (with their EOR flag) for seqpacket. At the
/// peer's EOF it closes once everything is echoed.
pub struct Echo {
    ty: SocketType,
    port: u32,
    listener: Option<SocketHandle>,
    conns: Vec<EchoConn>,
    buf: Vec<u8>,
}

struct EchoConn {
    h: SocketHandle,
    pending: Vec<u8>,
    pending_eor: bool,
    eof: bool,
}

impl Echo {
    pub fn new(ty: SocketType, port: u32) -> Self {
        Echo { ty, port, listener: None, conns: Vec::new(), buf: vec![0; 512 * 1024] }
    }
}

impl GuestApp for Echo {
    fn start(&mut self, guest: &mut Stack, _now: Instant) {
        self.listener = Some(guest_listener(guest, self.ty, self.port));
    }

    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus {
        let mut status = AppStatus::Idle;
        while let Ok((h, _)) = guest.accept(self.listener.unwrap()) {
            self.conns.push(EchoConn { h, pending: Vec::new(), pending_eor: false, eof: false });
            status = AppStatus::Busy;
        }
        let seqpacket = self.ty == SocketType::SeqPacket;
        self.conns.retain_mut(|c| {
            loop {
                if !c.pending.is_empty() {
                    let sent = if seqpacket {
                        guest.send_message(c.h, &c.pending, c.pending_eor).map(|()| c.pending.len())
                    } else {
                        guest.send(c.h, &c.pending)
                    };
                    match sent {
                        Ok(n) => {
                            c.pending.drain(..n);
                            status = AppStatus::Busy;
                            continue;
                        }
                        Err(Error::WouldBlock) => return true,
                        Err(_) => {
                            let _ = guest.close(c.h, now);
                            return false;
                        }
                    }
                }
                if c.eof {
                    let _ = guest.close(c.h, now);
                    return false;
                }
                match guest.recv(c.h, &mut self.buf) {
                    Ok(info) if info.eof => c.eof = true,
                    Ok(info) => {
                        assert!(!info.truncated, "echo buffer too small");
                        c.pending.extend_from_slice(&self.buf[..info.len]);
                        c.pending_eor = info.end_of_record;
                        status = AppStatus::Busy;
                    }
                    Err(Error::WouldBlock) => return true,
                    Err(_) => {
                        let _ = guest.close(c.h, now);
                        return false;
                    }
                }
            }
        });
        status
    }
}

/// What a [`Sink`] saw.
#[derive(Debug)]
pub struct SinkReport {
    pub bytes: u64,
    pub intact: bool,
    pub eof: bool,
}

/// Accepts one stream connection and reads the pattern until EOF, pausing
/// `pause` after every `pause_every` bytes so the sender runs out of credit.
pub struct Sink {
    port: u32,
    pause_every: u64,
    pause: Duration,
    listener: Option<SocketHandle>,
    conn: Option<SocketHandle>,
    received: u64,
    intact: bool,
    next_pause: u64,
    paused_until: Option<Instant>,
    report: Sender<SinkReport>,
    buf: Vec<u8>,
}

impl Sink {
    pub fn new(port: u32, pause_every: u64, pause: Duration, report: Sender<SinkReport>) -> Self {
        Sink {
            port,
            pause_every,
            pause,
            listener: None,
            conn: None,
            received: 0,
            intact: true,
            next_pause: pause_every,
            paused_until: None,
            report,
            buf: vec![0; 64 * 1024],
        }
    }
}

impl GuestApp for Sink {
    fn start(&mut self, guest: &mut Stack, _now: Instant) {
        self.listener = Some(guest_listener(guest, SocketType::Stream, self.port));
    }

    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus {
        let h = match self.conn {
            Some(h) => h,
            None => match guest.accept(self.listener.unwrap()) {
                Ok((h, _)) => {
                    self.conn = Some(h);
                    h
                }
                Err(_) => return AppStatus::Idle,
            },
        };
        if let Some(until) = self.paused_until {
            if now < until {
                return AppStatus::Idle;
            }
            self.paused_until = None;
        }
        let mut status = AppStatus::Idle;
        loop {
            match guest.recv(h, &mut self.buf) {
                Ok(info) if info.eof => {
                    let _ = guest.close(h, now);
                    let _ = self.report.send(SinkReport {
                        bytes: self.received,
                        intact: self.intact,
                        eof: true,
                    });
                    return AppStatus::Done;
                }
                Ok(info) => {
                    self.intact &= matches(self.received, &self.buf[..info.len]);
                    self.received += info.len as u64;
                    status = AppStatus::Busy;
                    if self.received >= self.next_pause {
                        self.next_pause += self.pause_every;
                        self.paused_until = Some(now + self.pause);
                        return status;
                    }
                }
                Err(Error::WouldBlock) => return status,
                Err(_) => {
                    let _ = guest.close(h, now);
                    let _ = self.report.send(SinkReport {
                        bytes: self.received,
                        intact: self.intact,
                        eof: false,
                    });
                    return AppStatus::Done;
                }
            }
        }
    }
}

/// Connects to host port `port` and sends `len` bytes of the pattern, then
/// closes. Reports the connect's outcome, then the end of sending.
pub struct Source {
    port: u32,
    len: u64,
    h: Option<SocketHandle>,
    connected: bool,
    sent: u64,
    chunk: Vec<u8>,
    report: Sender<Result<u64, Error>>,
}

impl Source {
    pub fn new(port: u32, len: u64, report: Sender<Result<u64, Error>>) -> Self {
        Source { port, len, h: None, connected: false, sent: 0, chunk: vec![0; 64 * 1024], report }
    }
}

impl GuestApp for Source {
    fn start(&mut self, guest: &mut Stack, now: Instant) {
        let h = guest.socket(SocketType::Stream).unwrap();
        guest.connect(h, VsockAddr::new(2, self.port), now).unwrap();
        self.h = Some(h);
    }

    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus {
        let h = self.h.unwrap();
        if !self.connected {
            match guest.finish_connect(h) {
                Ok(()) => self.connected = true,
                Err(Error::WouldBlock) => return AppStatus::Idle,
                Err(e) => {
                    let _ = guest.close(h, now);
                    let _ = self.report.send(Err(e));
                    return AppStatus::Done;
                }
            }
        }
        let mut status = AppStatus::Idle;
        loop {
            if self.sent == self.len {
                let _ = guest.close(h, now);
                let _ = self.report.send(Ok(self.sent));
                return AppStatus::Done;
            }
            let n = (self.len - self.sent).min(self.chunk.len() as u64) as usize;
            fill(self.sent, &mut self.chunk[..n]);
            match guest.send(h, &self.chunk[..n]) {
                Ok(k) => {
                    self.sent += k as u64;
                    status = AppStatus::Busy;
                }
                Err(Error::WouldBlock) => return status,
                Err(e) => {
                    let _ = guest.close(h, now);
                    let _ = self.report.send(Err(e));
                    return AppStatus::Done;
                }
            }
        }
    }
}

/// Connects to host port `port` with a socket of type `ty` and reports how
/// the connect ended and how long it took (in stack time); then closes,
/// or with [`Dialer::holding`] keeps a connection it got open for good.
pub struct Dialer {
    ty: SocketType,
    port: u32,
    h: Option<SocketHandle>,
    started: Instant,
    report: Sender<(Result<(), Error>, Duration)>,
    hold: bool,
    reported: bool,
}

impl Dialer {
    pub fn new(ty: SocketType, port: u32, report: Sender<(Result<(), Error>, Duration)>) -> Self {
        Dialer { ty, port, h: None, started: Instant::ZERO, report, hold: false, reported: false }
    }

    /// A dialer that never closes the connection it got.
    pub fn holding(
        ty: SocketType,
        port: u32,
        report: Sender<(Result<(), Error>, Duration)>,
    ) -> Self {
        Dialer { hold: true, ..Self::new(ty, port, report) }
    }
}

impl GuestApp for Dialer {
    fn start(&mut self, guest: &mut Stack, now: Instant) {
        let h = guest.socket(self.ty).unwrap();
        guest.connect(h, VsockAddr::new(2, self.port), now).unwrap();
        self.h = Some(h);
        self.started = now;
    }

    fn poll(&mut self, guest: &mut Stack, now: Instant) -> AppStatus {
        let h = self.h.unwrap();
        if self.reported {
            return AppStatus::Idle;
        }
        match guest.finish_connect(h) {
            Err(Error::WouldBlock) => AppStatus::Idle,
            result => {
                let keep = self.hold && result.is_ok();
                let _ = self.report.send((result, now - self.started));
                self.reported = true;
                if keep {
                    return AppStatus::Idle;
                }
                let _ = guest.close(h, now);
                AppStatus::Done
            }
        }
    }
}
