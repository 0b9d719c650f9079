//! Time as the caller tells it.
//!
//! The stack owns no clock: every call that arms or checks a timer takes an
//! [`Instant`] from the caller. That keeps the core deterministic, so tests
//! and the loopback harness can run hours of protocol time in microseconds.

use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time, in microseconds since an epoch the caller chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    micros: u64,
}

impl Instant {
    /// The epoch: a clock that starts here (the loopback harness's does).
    pub const ZERO: Self = Self { micros: 0 };

    /// The instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self { micros }
    }

    /// The instant `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Self { micros: millis.saturating_mul(1000) }
    }

    /// Microseconds since the epoch, to convert back to the caller's clock.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.micros.saturating_sub(earlier.micros))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Instant { micros: self.micros.saturating_add(micros) }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}
