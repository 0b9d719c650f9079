//! Sleeping, the same way on every target.
//!
//! A pier app has one thread on every target, so the only `std::thread`
//! item apps need is [`sleep`]. On bare metal it halts the CPU until the
//! timer interrupt at the deadline (or the network's interrupts, which
//! are served while it waits), so a sleeping unikernel costs its host
//! nothing.

use core::time::Duration;

/// Like `std::thread::sleep`.
pub fn sleep(duration: Duration) {
    #[cfg(target_os = "none")]
    {
        crate::platform::bare::net::sleep(duration)
    }
    #[cfg(not(target_os = "none"))]
    {
        std::thread::sleep(duration)
    }
}
