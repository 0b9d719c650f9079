//! Feature bits the driver negotiates, and what they mean for socket types.

use bitflags::bitflags;
use pier_stack::Features;

bitflags! {
    /// The device features pier understands (virtio spec §5.10.3, plus the
    /// datagram RFC's bit 3, plus the transport bits it relies on).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct VsockFeatures: u64 {
        const STREAM = 1 << 0;
        const SEQPACKET = 1 << 1;
        const NO_IMPLIED_STREAM = 1 << 2;
        const DGRAM = 1 << 3;
        const EVENT_IDX = 1 << 29;
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
