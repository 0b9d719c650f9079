//! The virtio-vsock device as the virtio 1.2 spec defines it (§5.10):
//! the constants both sides of the queues use, the driver's and the
//! device's.
//!
//! A driver and a device that each wrote their own copy of a feature bit
//! or a queue index could disagree; here there is one copy, in the crate
//! both pier-driver and pier-device already depend on. It also says what
//! the negotiated features mean for the stack: which socket types it may
//! carry ([`VsockFeatures::socket_types`]).

use bitflags::bitflags;

use crate::Features;

/// The device id of a socket device (§5.10.1).
pub const VSOCK_DEVICE_ID: u32 = 19;

/// The receive queue (device to driver), §5.10.2.
pub const RX_QUEUE: u16 = 0;
/// The transmit queue (driver to device).
pub const TX_QUEUE: u16 = 1;
/// The event queue (device to driver: transport resets).
pub const EVENT_QUEUE: u16 = 2;
/// Queues of a vsock device.
pub const NUM_QUEUES: usize = 3;

/// Bytes of the device's config space: `le64 guest_cid` (§5.10.4).
pub const CONFIG_SIZE: u64 = 8;

/// Bytes of `struct virtio_vsock_event` (§5.10.6.5).
pub const EVENT_LEN: usize = 4;
/// `virtio_vsock_event.id` of a transport reset: the driver drops its
/// connections and reads the CID again.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

bitflags! {
    /// The device features pier understands (§5.10.3, plus bit 3 for
    /// datagrams, which virtio 1.2 leaves undefined and pier defines the
    /// way the proposed datagram extension does, plus the transport bits
    /// it relies on).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct VsockFeatures: u64 {
        /// Stream sockets (`VIRTIO_VSOCK_F_STREAM`).
        const STREAM = 1 << 0;
        /// Seqpacket sockets (`VIRTIO_VSOCK_F_SEQPACKET`).
        const SEQPACKET = 1 << 1;
        /// Stream is not implied when its bit is clear
        /// (`VIRTIO_VSOCK_F_NO_IMPLIED_STREAM`).
        const NO_IMPLIED_STREAM = 1 << 2;
        /// Datagram sockets.
        const DGRAM = 1 << 3;
        /// `used_event`/`avail_event` notification suppression
        /// (`VIRTIO_F_EVENT_IDX`).
        const EVENT_IDX = 1 << 29;
        /// A modern device (`VIRTIO_F_VERSION_1`).
        const VERSION_1 = 1 << 32;
    }
}

impl VsockFeatures {
    /// Everything the driver asks for.
    pub const SUPPORTED: Self = Self::all();

    /// The socket types the negotiated features carry.
    ///
    /// With no socket-type bit at all the device is a pre-1.2 stream-only
    /// device, and stream is implied. With SEQPACKET but without
    /// NO_IMPLIED_STREAM the spec lets stream be implied too.
    pub fn socket_types(self) -> Features {
        let type_bits = Self::STREAM | Self::SEQPACKET | Self::DGRAM;
        let implied = !self.intersects(type_bits)
            || (self.contains(Self::SEQPACKET) && !self.contains(Self::NO_IMPLIED_STREAM));
        Features {
            stream: self.contains(Self::STREAM) || implied,
            seqpacket: self.contains(Self::SEQPACKET),
            datagram: self.contains(Self::DGRAM),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_types_follow_the_spec() {
        let legacy = VsockFeatures::VERSION_1;
        assert_eq!(
            legacy.socket_types(),
            Features { stream: true, seqpacket: false, datagram: false }
        );
        let linux_guest_style = VsockFeatures::VERSION_1 | VsockFeatures::SEQPACKET;
        assert!(linux_guest_style.socket_types().stream);
        let strict = VsockFeatures::SEQPACKET | VsockFeatures::NO_IMPLIED_STREAM;
        assert_eq!(
            strict.socket_types(),
            Features { stream: false, seqpacket: true, datagram: false }
        );
        let all = VsockFeatures::all();
        assert_eq!(all.socket_types(), Features::ALL);
    }
}
