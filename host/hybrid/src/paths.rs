//! The host-side socket names, every one derived from the backend's
//! stream socket `<uds>` by gluing a suffix onto it (the names are
//! siblings of `<uds>`, not children, so `Path::join` would be wrong):
//!
//! | name | bound by | for |
//! |---|---|---|
//! | `<uds>` | the backend (listens) | host → guest streams |
//! | `<uds>_seqpacket` | the backend (listens) | host → guest seqpacket |
//! | `<uds>_<port>` | a host program (listens) | guest → host connections to host port `<port>` |
//! | `<uds>_dgram` | the backend | host → guest datagrams, and the source of guest → host ones |
//! | `<uds>_dgram_<port>` | a host program | guest → host datagrams to host port `<port>` |
//!
//! `<port>` is decimal without leading zeros, as the guest dialled it.
//! The suffixes are here as text (for callers that build names as bytes,
//! as the bridge does without allocating), and with the `std` feature
//! whole names as `PathBuf`s.

use crate::WireText;

/// Suffix of the seqpacket listener, `<uds>_seqpacket`: the name Cloud
/// Hypervisor's proposal #8894 uses (a host-initiated connection carries
/// no socket type, so each type needs its own listener).
pub const SEQPACKET_SUFFIX: &str = "_seqpacket";

/// Suffix of the backend's datagram socket, `<uds>_dgram`.
pub const DATAGRAM_SUFFIX: &str = "_dgram";

/// Bytes of the longest suffix, `_dgram_4294967295`: a base path this
/// much shorter than a Unix socket address has room for every name.
pub const MAX_SUFFIX_LEN: usize = "_dgram_4294967295".len();

/// `_<port>`: the suffix of the listener for the guest's connections to
/// host port `port`.
pub fn listener_suffix(port: u32) -> WireText {
    WireText::new().push("_").push_decimal(port)
}

/// `_dgram_<port>`: the suffix of the socket the guest's datagrams to
/// host port `port` go to.
pub fn datagram_receiver_suffix(port: u32) -> WireText {
    WireText::new().push(DATAGRAM_SUFFIX).push("_").push_decimal(port)
}

#[cfg(feature = "std")]
pub use self::std_paths::*;

#[cfg(feature = "std")]
mod std_paths {
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    use super::{DATAGRAM_SUFFIX, SEQPACKET_SUFFIX, datagram_receiver_suffix, listener_suffix};

    /// `<uds><suffix>`.
    fn suffixed(uds: &Path, suffix: &str) -> PathBuf {
        let mut name = OsString::from(uds.as_os_str());
        name.push(suffix);
        PathBuf::from(name)
    }

    /// Where host → guest seqpacket connections go: `<uds>_seqpacket`. A
    /// Unix connection carries no socket type, so each type has its own
    /// listener.
    pub fn seqpacket_path(uds: impl AsRef<Path>) -> PathBuf {
        suffixed(uds.as_ref(), SEQPACKET_SUFFIX)
    }

    /// Where the guest's connections to host port `port` arrive:
    /// `<uds>_<port>`, the port in decimal as the guest dialled it.
    pub fn listener_path(uds: impl AsRef<Path>, port: u32) -> PathBuf {
        suffixed(uds.as_ref(), &listener_suffix(port))
    }

    /// The backend's datagram socket, `<uds>_dgram`: host → guest
    /// datagrams are sent to it, and guest → host datagrams come from it.
    pub fn datagram_path(uds: impl AsRef<Path>) -> PathBuf {
        suffixed(uds.as_ref(), DATAGRAM_SUFFIX)
    }

    /// Where the guest's datagrams to host port `port` arrive:
    /// `<uds>_dgram_<port>`.
    pub fn datagram_receiver_path(uds: impl AsRef<Path>, port: u32) -> PathBuf {
        suffixed(uds.as_ref(), &datagram_receiver_suffix(port))
    }

    /// The names the backend itself binds when it starts, and removes
    /// when it stops: `<uds>`, `<uds>_seqpacket`, `<uds>_dgram`.
    pub fn backend_paths(uds: impl AsRef<Path>) -> [PathBuf; 3] {
        let uds = uds.as_ref();
        [uds.to_path_buf(), seqpacket_path(uds), datagram_path(uds)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_the_exact_bytes() {
        assert_eq!(listener_suffix(5000).as_str(), "_5000");
        assert_eq!(listener_suffix(0).as_str(), "_0");
        assert_eq!(datagram_receiver_suffix(8000).as_str(), "_dgram_8000");
        assert_eq!(datagram_receiver_suffix(u32::MAX).len(), MAX_SUFFIX_LEN);
        assert!(listener_suffix(u32::MAX).len() <= MAX_SUFFIX_LEN);
        assert!(SEQPACKET_SUFFIX.len() <= MAX_SUFFIX_LEN);
    }

    #[cfg(feature = "std")]
    #[test]
    fn every_name_is_a_sibling_of_the_base_path() {
        use std::path::{Path, PathBuf};
        let uds = Path::new("/run/v.sock");
        assert_eq!(seqpacket_path(uds), PathBuf::from("/run/v.sock_seqpacket"));
        assert_eq!(listener_path(uds, 1234), PathBuf::from("/run/v.sock_1234"));
        assert_eq!(datagram_path(uds), PathBuf::from("/run/v.sock_dgram"));
        assert_eq!(datagram_receiver_path(uds, 7), PathBuf::from("/run/v.sock_dgram_7"));
        assert_eq!(
            datagram_receiver_path(uds, u32::MAX),
            PathBuf::from("/run/v.sock_dgram_4294967295")
        );
        assert_eq!(
            backend_paths(uds),
            [uds.to_path_buf(), seqpacket_path(uds), datagram_path(uds)]
        );
        // A trailing slash stays part of the name, never a directory.
        assert_eq!(datagram_path("/run/dir/"), PathBuf::from("/run/dir/_dgram"));
    }
}
