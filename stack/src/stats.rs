//! Counters that explain what the stack did with every packet.
//!
//! Every packet that is not delivered is counted under one [`DropReason`],
//! and every RST the stack sends is counted under one [`RstReason`], so a
//! user looking at a stuck or reset connection can see why without a trace.

use core::fmt;

macro_rules! reasons {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant,)* }

        impl $name {
            /// Every reason, in declaration order: for printing all counters.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];
            /// How many reasons there are.
            pub const COUNT: usize = Self::ALL.len();
            /// The reason's name as the counters print it (kebab-case).
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reasons! {
    /// Why a received packet was not delivered.
    DropReason {
        /// Shorter than a header, or `len` disagrees with the buffer.
        Malformed => "malformed",
        /// Unknown op on a packet that is not answered (an RST, or a datagram).
        UnknownOp => "unknown-op",
        /// `dst_cid` is not this stack's CID.
        WrongDestination => "wrong-destination",
        /// A CID above 32 bits, which no socket can hold.
        InvalidCid => "invalid-cid",
        /// An RST for a connection we do not know: never answered (an RST never draws an RST).
        RstForUnknown => "rst-for-unknown",
        /// An RST we wanted to send was lost because the reply queue was full.
        ReplyQueueFull => "reply-queue-full",
        /// A datagram for a port nobody has bound.
        DatagramNoSocket => "datagram-no-socket",
        /// A datagram that does not fit the receiver's buffer.
        DatagramReceiveBufferFull => "datagram-buffer-full",
        /// A datagram we were to send that is larger than the transport's
        /// largest packet (see `Stack::set_max_payload`).
        DatagramTooLargeForTransport => "datagram-too-large-for-transport",
        /// A datagram-typed packet whose op is not RW.
        DatagramBadOp => "datagram-bad-op",
        /// A packet of a socket type the transport did not negotiate, that is not answered.
        TypeNotNegotiated => "type-not-negotiated",
        /// A non-RST packet to a socket the application has closed.
        SocketClosing => "socket-closing",
        /// Data after our own SHUT_RD.
        AfterShutdown => "after-shutdown",
        /// A packet that means nothing in the socket's state (INVALID op, a
        /// stray REQUEST on an established connection, ...).
        Ignored => "ignored",
    }
}

reasons! {
    /// Why the stack sent an RST.
    RstReason {
        /// No socket for the packet's destination (nothing bound, or bound but not listening).
        NoSocket => "no-socket",
        /// A RESPONSE with no connect in progress (for example one that came after the connect timed out).
        StrayResponse => "stray-response",
        /// The packet's type is not the socket's type.
        TypeMismatch => "type-mismatch",
        /// The packet's type is unknown or was not negotiated.
        UnsupportedType => "unsupported-type",
        /// The packet's op is unknown.
        UnknownOp => "unknown-op",
        /// The listener's accept queue is full.
        BacklogFull => "backlog-full",
        /// The stack's socket limit is reached.
        SocketLimit => "socket-limit",
        /// An op other than REQUEST reached a listener, or other than RESPONSE a connecting socket.
        ProtocolViolation => "protocol-violation",
        /// The peer sent more than the credit we granted.
        CreditOverrun => "credit-overrun",
        /// The peer queued more seqpacket messages than we keep bookkeeping for.
        MessageQueueOverflow => "message-queue-overflow",
        /// The peer never answered our close within the close timeout.
        CloseTimeout => "close-timeout",
        /// The peer shut down both directions and all data was read: the orderly end.
        PeerShutdown => "peer-shutdown",
        /// The application closed a socket whose peer had already shut down.
        CloseAfterPeerShutdown => "close-after-peer-shutdown",
        /// The application refused a connection from a catch-all listener,
        /// or did not decide before the connect timeout.
        Refused => "refused",
        /// The application aborted the connection (an abortive close, like
        /// a TCP close with `SO_LINGER` 0): queued data is discarded.
        Aborted => "aborted",
    }
}

/// The stack's counters. All are totals since the stack was created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets taken from the device.
    pub rx_packets: u64,
    /// Payload bytes taken from the device.
    pub rx_bytes: u64,
    /// Of `rx_bytes`, those a [`crate::DirectReceive`] tap took before
    /// they reached a receive buffer.
    pub rx_bytes_delivered_directly: u64,
    /// Of `rx_bytes`, those left in the driver's receive buffers for the
    /// application to read there (`Stack::set_held_buffers`).
    pub rx_bytes_held: u64,
    /// Packets handed to the transmit sink.
    pub tx_packets: u64,
    /// Payload bytes handed to the transmit sink.
    pub tx_bytes: u64,
    /// Packets delivered inside the stack (local CID or CID 1).
    pub loopback_packets: u64,
    /// Payload bytes delivered inside the stack.
    pub loopback_bytes: u64,
    /// RSTs received, for any connection or none.
    pub rst_received: u64,
    /// CREDIT_UPDATE packets sent (credit also travels in every other header).
    pub credit_updates_sent: u64,
    /// CREDIT_REQUEST packets received (each is answered; the stack sends none).
    pub credit_requests_received: u64,
    /// Connections established, by connect or by a listener.
    pub connections_established: u64,
    /// TRANSPORT_RESET events (`Stack::transport_reset`).
    pub transport_resets: u64,
    rst_sent: [u64; RstReason::COUNT],
    drops: [u64; DropReason::COUNT],
}

impl Stats {
    /// RSTs sent for `reason`.
    pub fn rst_sent(&self, reason: RstReason) -> u64 {
        self.rst_sent[reason as usize]
    }

    /// RSTs sent, for every reason.
    pub fn rst_sent_total(&self) -> u64 {
        self.rst_sent.iter().sum()
    }

    /// Packets dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// Packets dropped, for every reason.
    pub fn dropped_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub(crate) fn count_rst(&mut self, reason: RstReason) {
        self.rst_sent[reason as usize] += 1;
    }

    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        net_debug!("dropped a packet: {}", reason);
        self.drops[reason as usize] += 1;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rx        {} packets, {} bytes ({} delivered directly, {} read in place)",
            self.rx_packets, self.rx_bytes, self.rx_bytes_delivered_directly, self.rx_bytes_held
        )?;
        writeln!(f, "tx        {} packets, {} bytes", self.tx_packets, self.tx_bytes)?;
        writeln!(f, "loopback  {} packets, {} bytes", self.loopback_packets, self.loopback_bytes)?;
        writeln!(
            f,
            "connections established {}, credit updates sent {}, credit requests received {}",
            self.connections_established, self.credit_updates_sent, self.credit_requests_received
        )?;
        writeln!(f, "rst received {}, rst sent {}", self.rst_received, self.rst_sent_total())?;
        for reason in RstReason::ALL {
            let n = self.rst_sent(*reason);
            if n > 0 {
                writeln!(f, "  rst sent, {reason}: {n}")?;
            }
        }
        if self.transport_resets > 0 {
            writeln!(f, "transport resets {}", self.transport_resets)?;
        }
        writeln!(f, "dropped {}", self.dropped_total())?;
        for reason in DropReason::ALL {
            let n = self.dropped(*reason);
            if n > 0 {
                writeln!(f, "  dropped, {reason}: {n}")?;
            }
        }
        Ok(())
    }
}
