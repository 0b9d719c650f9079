//! The guest's context id, checked once where it enters the host.
//!
//! A vsock address names its machine by CID. 0 (the hypervisor), 1 (local
//! loopback) and 2 (the host) are taken, and `u32::MAX` is
//! `VMADDR_CID_ANY`, so a guest gets 3 or above. Linux keeps CIDs in 32
//! bits; virtio's config space holds 64 with the upper half reserved, so a
//! [`GuestCid`] is 32 bits and widens for the wire. Every setting that
//! names a guest (`pier run --cid`, `pier boot --cid`, `pier vhost-user
//! --vm guest-cid=`, containerd's `pier.dev/cid`) parses into this type,
//! so the rule and its message exist once.

use std::fmt;
use std::str::FromStr;

/// A CID a guest may have: 3 or above, not `VMADDR_CID_ANY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuestCid(u32);

/// Why a number is not a [`GuestCid`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CidError {
    /// 0, 1, 2 or `u32::MAX`.
    Reserved(u64),
    /// More than 32 bits.
    TooLarge(u64),
    /// Not a decimal number.
    NotANumber(String),
}

impl fmt::Display for CidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reserved(cid) => write!(f, "CID {cid} is reserved; use 3 or above"),
            Self::TooLarge(cid) => write!(f, "CID {cid} does not fit in 32 bits"),
            Self::NotANumber(text) => write!(f, "{text:?} is not a CID (a number, 3 or above)"),
        }
    }
}

impl std::error::Error for CidError {}

impl GuestCid {
    /// The CID `pier run` and `pier boot` give a guest when told nothing.
    pub const DEFAULT: GuestCid = GuestCid(3);

    /// `cid`, if a guest may have it.
    pub const fn new(cid: u32) -> Result<Self, CidError> {
        match cid {
            0..=2 | u32::MAX => Err(CidError::Reserved(cid as u64)),
            _ => Ok(GuestCid(cid)),
        }
    }

    /// The CID as Linux and the socket addresses hold it.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The CID as the packet header and the config space hold it.
    pub const fn as_u64(self) -> u64 {
        self.0 as u64
    }
}

impl Default for GuestCid {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u32> for GuestCid {
    type Error = CidError;
    fn try_from(cid: u32) -> Result<Self, CidError> {
        Self::new(cid)
    }
}

impl TryFrom<u64> for GuestCid {
    type Error = CidError;
    fn try_from(cid: u64) -> Result<Self, CidError> {
        Self::new(u32::try_from(cid).map_err(|_| CidError::TooLarge(cid))?)
    }
}

impl FromStr for GuestCid {
    type Err = CidError;
    fn from_str(text: &str) -> Result<Self, CidError> {
        let cid: u64 = text.parse().map_err(|_| CidError::NotANumber(text.to_owned()))?;
        Self::try_from(cid)
    }
}

impl fmt::Display for GuestCid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<GuestCid> for u32 {
    fn from(cid: GuestCid) -> u32 {
        cid.0
    }
}

impl From<GuestCid> for u64 {
    fn from(cid: GuestCid) -> u64 {
        cid.as_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_cids_are_refused_with_one_message() {
        for cid in [0u32, 1, 2, u32::MAX] {
            let e = GuestCid::new(cid).unwrap_err();
            assert_eq!(e.to_string(), format!("CID {cid} is reserved; use 3 or above"));
        }
        assert_eq!(GuestCid::new(3).unwrap().get(), 3);
        assert_eq!(GuestCid::new(u32::MAX - 1).unwrap().as_u64(), u64::from(u32::MAX - 1));
    }

    #[test]
    fn text_and_wide_numbers_parse_or_say_why_not() {
        assert_eq!("42".parse::<GuestCid>(), Ok(GuestCid(42)));
        assert_eq!("2".parse::<GuestCid>(), Err(CidError::Reserved(2)));
        assert_eq!("x".parse::<GuestCid>(), Err(CidError::NotANumber("x".into())));
        assert_eq!(GuestCid::try_from(1u64 << 32), Err(CidError::TooLarge(1 << 32)));
        assert_eq!("-3".parse::<GuestCid>(), Err(CidError::NotANumber("-3".into())));
    }
}
