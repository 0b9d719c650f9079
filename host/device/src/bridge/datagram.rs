//! Datagrams between the guest and host programs, beside the host stack.
//!
//! vsock datagrams (type 3, the unmerged datagram RFC) have no connection,
//! no credit and no RST, so there is nothing for the host stack to do with
//! them except hand them on; the device gives them to the bridge instead
//! ([`Bridge::forward_guest_datagram`]) and takes the bridge's datagrams for
//! the guest ([`Bridge::drain_host_datagrams`]), both through the bridge's
//! [`HostSide`] implementation.
//!
//! On the host, one `SOCK_DGRAM` Unix datagram is one vsock datagram, with
//! an 8-byte header in front that names the two ports (`pier_hybrid`'s
//! [`encode_datagram_header`]):
//!
//! - **Host → guest**: a host program sends header + payload to
//!   `<uds>_dgram`; the guest receives the payload from `(2, host port)` on
//!   its datagram socket bound to `guest port`.
//! - **Guest → host**: a datagram the guest sends to `(2, P)` goes to the
//!   Unix datagram socket a host program bound at `<uds>_dgram_<P>`, with
//!   the same header (the guest's source port, then `P`). It is sent from
//!   `<uds>_dgram`, so the receiver can answer with `send_to` to the
//!   address `recv_from` gave it (with the header filled in).
//!
//! Nothing is queued in the bridge. Host → guest datagrams wait in the
//! `<uds>_dgram` socket's kernel queue until the device has room: the
//! bridge receives one at a time into a buffer of its own and holds it
//! (one at most) until the device takes it, so a guest that does not post
//! receive buffers makes host senders block or see `EAGAIN`, which is how
//! the RFC wants datagram senders throttled.
//! Guest → host datagrams are sent at once or dropped and counted: no
//! receiver, or a receiver whose queue is full, never draws an RST and
//! never stalls the device.

use pier_hybrid::{DATAGRAM_HEADER_LEN, decode_datagram_header, encode_datagram_header};
use pier_stack::wire::{Header, MAX_PAYLOAD, Op, RawHeader, SocketType};
use pier_stack::{Instant, SinkFull, Stack, TxSink, VMADDR_CID_HOST, VMADDR_PORT_ANY, VsockAddr};

use super::sys::{recv, send_parts_to, would_block};
use super::{Bridge, BridgeStats};
use crate::cid::GuestCid;
use crate::host_side::{EventSource, Relay, Siblings};

impl Bridge {
    /// A datagram the guest sent to the host: forwards it to
    /// `<uds>_dgram_<dst_port>`, or drops and counts it.
    pub fn forward_guest_datagram(&mut self, header: &Header, payload: &[u8]) {
        if header.socket_type != SocketType::Datagram
            || header.op != Op::Rw
            || header.dst_cid != VMADDR_CID_HOST as u64
            || header.src_cid != self.config.guest_cid.as_u64()
            || header.len as usize != payload.len()
        {
            self.stats.datagrams_rejected += 1;
            return;
        }
        if payload.len() > MAX_PAYLOAD {
            self.stats.datagrams_too_large += 1;
            return;
        }
        let to = match self.paths.datagram_receiver(header.dst_port) {
            Ok(to) => to,
            Err(_) => {
                self.stats.datagrams_failed += 1;
                return;
            }
        };
        let ports = encode_datagram_header(header.src_port, header.dst_port);
        match send_parts_to(&self.dgram, &[&ports, payload], &to) {
            Ok(_) => self.stats.datagrams_from_guest += 1,
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTDIR) => {
                    self.stats.datagrams_no_receiver += 1
                }
                Some(libc::EAGAIN) => self.stats.datagrams_receiver_full += 1,
                Some(libc::EMSGSIZE) => self.stats.datagrams_too_large += 1,
                _ => self.stats.datagrams_failed += 1,
            },
        }
    }

    /// Whether host programs may have datagrams for the guest waiting
    /// (the `<uds>_dgram` socket was readable and has not been drained, or
    /// the bridge holds one the guest had no room for).
    pub fn guest_datagrams_pending(&self) -> bool {
        self.dgram_readable || self.held_dgram.len.is_some()
    }

    /// Offers waiting host datagrams to `sink` (the device's receive
    /// queue), in order, until the socket is empty or the sink is full.
    /// A datagram the sink refuses is held by the bridge and offered first
    /// on the next call. Returns how many the sink took.
    ///
    /// `sink` should answer [`SinkFull`] only while it has no room: a
    /// datagram it can never take would stay at the head. Datagrams larger
    /// than [`BridgeConfig::max_datagram_payload`](super::BridgeConfig) are
    /// dropped before the sink sees them.
    pub fn drain_host_datagrams(
        &mut self,
        mut sink: impl FnMut(&RawHeader, &[u8]) -> Result<(), SinkFull>,
    ) -> usize {
        let mut moved = 0;
        loop {
            let len = match self.held_dgram.len.take() {
                Some(len) => len,
                None if self.dgram_readable => {
                    // One call takes the datagram off the queue; MSG_TRUNC
                    // reports its real length, so one too large for the
                    // buffer is still recognised (and dropped below).
                    match recv(&self.dgram, self.held_dgram.buf(), libc::MSG_TRUNC) {
                        Ok(len) => len,
                        Err(e) => {
                            if !would_block(&e) {
                                self.stats.datagrams_failed += 1;
                            }
                            self.dgram_readable = false;
                            break;
                        }
                    }
                }
                None => break,
            };
            let buf = self.held_dgram.buf();
            let datagram = &buf[..len.min(buf.len())];
            let limit = self.config.max_datagram_payload.min(MAX_PAYLOAD);
            match decode_datagram_header(datagram) {
                None => self.stats.datagrams_malformed += 1,
                Some((guest_port, _, _)) if guest_port == VMADDR_PORT_ANY => {
                    self.stats.datagrams_malformed += 1
                }
                Some(_) if len - DATAGRAM_HEADER_LEN > limit => self.stats.datagrams_too_large += 1,
                Some((guest_port, host_port, payload)) => {
                    let header = Header::datagram(
                        VsockAddr::new(VMADDR_CID_HOST, host_port),
                        VsockAddr::new(self.config.guest_cid.get(), guest_port),
                        payload.len() as u32,
                    );
                    if sink(&header.to_raw(), payload).is_err() {
                        // Kept for the next call; the rest wait in the
                        // socket's queue, so senders are still throttled.
                        self.held_dgram.len = Some(len);
                        break;
                    }
                    self.stats.datagrams_to_guest += 1;
                    moved += 1;
                }
            }
        }
        moved
    }
}

/// The bridge as the device model's host side: its sockets join the
/// device loop, every guest datagram belongs to it (even one it drops),
/// none to the host stack; guest stream bytes go straight to their Unix
/// socket when it can take them; host datagrams reach the guest's receive
/// queue through the device's one writer.
impl Relay for Bridge {
    fn service(&mut self, stack: &mut Stack, now: Instant) {
        Bridge::service(self, stack, now);
    }

    fn guest_datagram(&mut self, header: &RawHeader, payload: &[u8]) -> bool {
        match header.check() {
            Ok(header) => self.forward_guest_datagram(&header, payload),
            Err(_) => self.stats.datagrams_rejected += 1,
        }
        true
    }

    fn guest_stream_bytes(
        &mut self,
        socket: pier_stack::SocketHandle,
        data: pier_stack::Payload<'_>,
    ) -> usize {
        Bridge::guest_stream_bytes(self, socket, data)
    }

    fn lend_rx(
        &mut self,
        stack: &mut Stack,
        rx: &mut dyn crate::host_side::RxLender,
        now: Instant,
    ) {
        Bridge::lend_rx(self, stack, rx, now);
    }

    fn host_datagrams(&mut self, sink: &mut dyn TxSink) {
        self.drain_host_datagrams(|header, payload| sink.transmit(header, payload));
    }

    fn guest_cid_changed(&mut self, cid: GuestCid) {
        self.set_guest_cid(cid);
    }

    fn bridge_stats(&self) -> Option<BridgeStats> {
        Some(self.stats())
    }

    fn undelivered_guest_bytes(&self, stack: &Stack) -> usize {
        Bridge::undelivered_guest_bytes(self, stack)
    }
}

/// Its Unix sockets and its CONNECT-line deadlines.
impl EventSource for Bridge {
    fn handle_event(&mut self, stack: &mut Stack, event: &mio::event::Event, now: Instant) {
        Bridge::handle_event(self, stack, event, now);
    }

    fn poll_at(&self) -> Option<Instant> {
        Bridge::poll_at(self)
    }

    fn events_handled(&mut self) {
        Bridge::events_handled(self);
    }
}

/// One guest only: nothing to route.
impl Siblings for Bridge {}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use pier_hybrid::datagram_path;
    use pier_stack::Config;

    use super::*;
    use crate::bridge::BridgeConfig;

    fn framed(guest_port: u32, payload: &[u8]) -> Vec<u8> {
        let mut d = encode_datagram_header(guest_port, 1234).to_vec();
        d.extend_from_slice(payload);
        d
    }

    /// What the sink took, payload by payload.
    fn drain(bridge: &mut Bridge, room: bool) -> Vec<Vec<u8>> {
        let mut taken = Vec::new();
        bridge.drain_host_datagrams(|_, payload| {
            if !room {
                return Err(SinkFull);
            }
            taken.push(payload.to_vec());
            Ok(())
        });
        taken
    }

    #[test]
    fn a_refused_host_datagram_is_held_and_offered_first_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("v.sock");
        let mut stack = Stack::new(Config::new(VMADDR_CID_HOST));
        let poll = mio::Poll::new().unwrap();
        let config = BridgeConfig::new(&uds, GuestCid::new(3).unwrap());
        let mut bridge = Bridge::new(config, &mut stack, poll.registry(), 0).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let largest = vec![7u8; MAX_PAYLOAD];
        for datagram in [
            framed(5, b"first"),
            framed(5, &largest),
            // One byte over what a vsock packet carries, so over the
            // bridge's buffer: dropped, not cut short.
            framed(5, &vec![1u8; MAX_PAYLOAD + 1]),
            framed(5, b"last"),
        ] {
            sender.send_to(&datagram, datagram_path(&uds)).unwrap();
        }

        assert!(drain(&mut bridge, false).is_empty());
        assert!(drain(&mut bridge, false).is_empty(), "a second refusal loses nothing");
        assert!(bridge.guest_datagrams_pending(), "the refused datagram is held");
        let taken = drain(&mut bridge, true);
        assert_eq!(taken, [b"first".to_vec(), largest, b"last".to_vec()]);
        assert!(!bridge.guest_datagrams_pending(), "the socket is drained");
        let stats = bridge.stats();
        assert_eq!((stats.datagrams_to_guest, stats.datagrams_too_large), (3, 1));
    }
}
