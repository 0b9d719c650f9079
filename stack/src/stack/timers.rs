//! Deadlines and transport events: connect and close timeouts, unanswered
//! catch-all connections, and the device's TRANSPORT_RESET.

use alloc::vec::Vec;
use core::mem;

use super::Stack;
use crate::readiness::WakeList;
use crate::socket::{ConnectionSocket, SocketHandle};
use crate::time::Instant;

impl Stack {
    /// The connection `h`, if it is still alive.
    fn connection(&self, h: SocketHandle) -> Option<&ConnectionSocket> {
        self.sockets.get(h).and_then(|e| e.socket.as_connection())
    }

    /// The earliest deadline, if any: call `handle_timeout` then.
    pub fn poll_at(&self) -> Option<Instant> {
        self.timers.iter().filter_map(|&h| self.connection(h).and_then(|c| c.deadline)).min()
    }

    /// Fires every deadline at or before `now`: connects time out, closes
    /// that got no RST send one.
    pub fn handle_timeout(&mut self, now: Instant, wakes: &mut WakeList) {
        let timers = mem::take(&mut self.timers);
        let mut kept = Vec::with_capacity(timers.len());
        for h in timers {
            let Some(s) = self.connection(h) else { continue };
            let Some(deadline) = s.deadline else { continue };
            if deadline > now {
                kept.push(h);
                continue;
            }
            let outcome = self.conn_mut(h).timed_out();
            self.apply(h, outcome);
        }
        kept.append(&mut self.timers);
        self.timers = kept;
        self.drain_wakes(wakes);
    }

    /// The device reported TRANSPORT_RESET (for example after a snapshot
    /// restore): adopt the new CID, fail every connection with
    /// connection-reset without sending anything, keep listeners.
    pub fn transport_reset(&mut self, new_cid: u32, wakes: &mut WakeList) {
        self.stats.transport_resets += 1;
        net_debug!("transport reset: CID {} -> {}", self.local_cid, new_cid);
        self.local_cid = new_cid;
        self.replies.clear();
        let handles: Vec<SocketHandle> = self.sockets.keys().collect();
        for h in handles {
            let Some(c) = self.sockets[h].socket.as_connection_mut() else { continue };
            let outcome = c.transport_reset();
            self.apply(h, outcome);
        }
        self.drain_wakes(wakes);
    }
}
