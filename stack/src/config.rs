//! Stack-wide settings and the negotiated transport features.

use core::time::Duration;

use crate::wire::SocketType;

/// Socket types the transport negotiated with the device.
///
/// A socket of a type that is not here cannot be created
/// ([`crate::Error::SocketTypeNotSupported`]), and packets of that type are
/// answered with RST (stream, seqpacket) or dropped (datagrams), so nothing
/// waits on a transport that will never carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Stream sockets (SOCK_STREAM).
    pub stream: bool,
    /// Seqpacket sockets (SOCK_SEQPACKET, feature bit 1).
    pub seqpacket: bool,
    /// Datagram sockets (SOCK_DGRAM, feature bit 3 of the datagram RFC).
    pub datagram: bool,
}

impl Features {
    /// Every socket type: for a stack whose transport carries them all
    /// (the loopback harness, tests).
    pub const ALL: Self = Self { stream: true, seqpacket: true, datagram: true };

    /// Whether sockets of type `ty` may be created and their packets carried.
    pub const fn supports(self, ty: SocketType) -> bool {
        match ty {
            SocketType::Stream => self.stream,
            SocketType::SeqPacket => self.seqpacket,
            SocketType::Datagram => self.datagram,
        }
    }
}

impl Default for Features {
    fn default() -> Self {
        Self::ALL
    }
}

/// Linux's default and maximum socket buffer (SO_VM_SOCKETS_BUFFER_SIZE).
pub const DEFAULT_BUFFER_SIZE: u32 = 256 * 1024;
/// Linux's minimum socket buffer.
pub const MIN_BUFFER_SIZE: u32 = 128;
/// How far a stream's buffer grows by itself by default
/// ([`Config::buffer_autotune_max`]).
pub const DEFAULT_BUFFER_AUTOTUNE_MAX: u32 = 1024 * 1024;

/// The settings of one [`crate::Stack`]. [`Config::new`] gives Linux's
/// defaults; fields are set before `Stack::new`, and only the features
/// change later ([`crate::Stack::set_features`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// This stack's CID. Traffic to it, or to CID 1, stays inside the stack.
    pub local_cid: u32,
    /// The socket types the transport negotiated.
    pub features: Features,
    /// Default receive buffer of a new socket; advertised to the peer as `buf_alloc`.
    pub buffer_size: u32,
    /// Largest buffer `set_buffer_size` accepts (SO_VM_SOCKETS_BUFFER_MAX_SIZE).
    pub max_buffer_size: u32,
    /// Largest size a stream's receive buffer grows to by itself, as TCP's
    /// receive buffer autotuning grows it: doubled whenever the peer was
    /// about to run out of credit although the application had read
    /// everything (the buffer, not the reader, held the transfer back).
    /// A socket whose application sets its buffer size keeps that size.
    /// `buffer_size` or less turns autotuning off, as Linux has it.
    pub buffer_autotune_max: u32,
    /// Default connect timeout (SO_VM_SOCKETS_CONNECT_TIMEOUT).
    pub connect_timeout: Duration,
    /// How long a closed connection waits for the peer's RST before sending its own.
    pub close_timeout: Duration,
    /// Most sockets alive at once, including unaccepted and closing ones.
    pub max_sockets: usize,
    /// Most RSTs for unknown connections held while the device is busy.
    pub reply_queue_len: usize,
    /// Send buffer of a datagram socket (the sender throttles itself here).
    pub datagram_send_buffer: u32,
    /// Receive buffer of a datagram socket; datagrams that do not fit are dropped.
    pub datagram_receive_buffer: u32,
    /// Whether ports at or below 1023 may be bound.
    pub allow_privileged_ports: bool,
    /// Seed for the first ephemeral port; Linux picks it at random.
    pub ephemeral_seed: u32,
}

impl Config {
    /// Linux's defaults for a stack at `local_cid`: 256 KiB buffers, a 2 s
    /// connect timeout, an 8 s close timeout, privileged ports allowed, every
    /// socket type; and, which Linux does not have, stream buffers that
    /// grow to 1 MiB while their reader keeps up
    /// ([`Config::buffer_autotune_max`]).
    pub fn new(local_cid: u32) -> Self {
        Self {
            local_cid,
            features: Features::ALL,
            buffer_size: DEFAULT_BUFFER_SIZE,
            max_buffer_size: DEFAULT_BUFFER_SIZE,
            buffer_autotune_max: DEFAULT_BUFFER_AUTOTUNE_MAX,
            connect_timeout: Duration::from_secs(2),
            close_timeout: Duration::from_secs(8),
            max_sockets: 4096,
            reply_queue_len: 256,
            datagram_send_buffer: DEFAULT_BUFFER_SIZE,
            datagram_receive_buffer: DEFAULT_BUFFER_SIZE,
            allow_privileged_ports: true,
            ephemeral_seed: local_cid.wrapping_mul(2_654_435_761),
        }
    }
}
