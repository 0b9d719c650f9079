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
        Self { nanos: crate::platform::bare::clock::now_nanos() }
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

#[cfg(target_os = "none")]
impl core::ops::Add<Duration> for Instant {
    type Output = Instant;

    /// Panics on overflow, as std's does.
    fn add(self, d: Duration) -> Instant {
        self.checked_add(d).expect("overflow when adding duration to instant")
    }
}

#[cfg(target_os = "none")]
impl core::ops::Sub<Instant> for Instant {
    type Output = Duration;

    /// Zero if `earlier` is later, as std's (since 1.60) is.
    fn sub(self, earlier: Instant) -> Duration {
        self.duration_since(earlier)
    }
}
