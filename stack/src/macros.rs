//! Debug output through the `log` crate, compiled in only with the `log`
//! feature (as smoltcp's `net_debug!`), so a stack built without it has no
//! logging code at all: a `no_std` target pays nothing, and the host
//! programs that want it (the `pier` command) turn it on.
//!
//! Without the feature the arguments are still evaluated for their type
//! only (never formatted), so a message cannot rot unnoticed.

#[cfg(feature = "log")]
macro_rules! net_debug {
    ($($arg:tt)*) => { ::log::debug!(target: "pier_stack", $($arg)*) };
}

#[cfg(not(feature = "log"))]
macro_rules! net_debug {
    ($($arg:tt)*) => {{
        if false {
            let _ = ::core::format_args!($($arg)*);
        }
    }};
}
