//! Time, the same way on every target: [`Instant`], a monotonic clock.
//!
//! On hosted targets it is `std::time::Instant`. On bare metal it counts
//! the TSC at the rate the hypervisor passed on the command line
//! (`pier.tsc_khz`, which pier-vmm always passes).

pub use core::time::Duration;

#[cfg(not(target_os = "none"))]
pub use std::time::Instant;

/// A moment of the monotonic clock, like `std::time::Instant`.
#[cfg(target_os = "none")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    nanos: u64,
}

#[cfg(target_os = "none")]
impl Instant {
    /// Now.
    pub fn now() -> Self {
        Self { nanos: crate::backend::bare::clock::now_nanos() }
    }

    /// Time since `earlier`, zero if `earlier` is later.
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// Time since this instant.
    pub fn elapsed(&self) -> Duration {
        Self::now().duration_since(*self)
    }

    /// This instant plus `d`, if representable.
    pub fn checked_add(&self, d: Duration) -> Option<Instant> {
        let nanos = self.nanos.checked_add(u64::try_from(d.as_nanos()).ok()?)?;
        Some(Self { nanos })
    }
}
