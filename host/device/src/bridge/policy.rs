//! Which ports each side of the bridge may reach: the capability policy of
//! a backend whose guest is not pier's (under vhost-user, a Linux guest
//! whose programs pier does not vet as it vets a component's grants).
//!
//! Two lists, both "every port" unless narrowed, as with Firecracker and
//! vhost-device-vsock, whose host side has no policy at all:
//!
//! - the guest ports a host program may `CONNECT` to: anything else is
//!   closed before the guest sees a packet;
//! - the host ports (`<uds>_<port>` listeners) the guest may connect to:
//!   anything else is refused with an RST, whatever listens there.
//!
//! Every denial is logged at `warn`, naming the guest, the direction and
//! the port, and counted (`denied` in `--stats`).

/// A set of ports: all of them, or a list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Ports {
    /// Every port.
    #[default]
    Any,
    /// Only these.
    Only(Vec<u32>),
}

impl Ports {
    /// Whether `port` is in the set.
    pub fn allows(&self, port: u32) -> bool {
        match self {
            Ports::Any => true,
            Ports::Only(ports) => ports.contains(&port),
        }
    }

    /// The set of a list of grants: `*` anywhere means every port, no
    /// grant at all also means every port (nothing was narrowed).
    pub fn from_grants(grants: &[Option<u32>]) -> Self {
        if grants.is_empty() || grants.iter().any(Option::is_none) {
            Ports::Any
        } else {
            Ports::Only(grants.iter().flatten().copied().collect())
        }
    }
}

/// What each side may reach; see the [module documentation](self).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// Guest ports host programs may `CONNECT` to.
    pub to_guest: Ports,
    /// Host ports the guest may connect to.
    pub to_host: Ports,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_narrow_only_when_given_and_star_widens() {
        assert_eq!(Ports::from_grants(&[]), Ports::Any);
        assert_eq!(Ports::from_grants(&[Some(1), None]), Ports::Any);
        let only = Ports::from_grants(&[Some(1234), Some(5000)]);
        assert!(only.allows(1234) && only.allows(5000));
        assert!(!only.allows(22));
        assert!(Ports::Any.allows(22));
    }
}
