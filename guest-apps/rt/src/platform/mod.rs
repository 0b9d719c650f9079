//! The implementation behind the public shells, picked at compile time,
//! so an app's source never changes between targets.
//!
//! `contract` says, as traits, what every platform supplies; [`Active`]
//! is the one this build runs on, and the shells reach it only through
//! the contract.
//!
//! - `wasi`: a WASI 0.2 component; every call goes to the host through
//!   the `vsock:sockets@0.1.0` WIT imports, and waiting is `wasi:io/poll`.
//! - `wasi3` (the `wasi-0-3` feature): a WASI 0.3 component on
//!   `vsock:sockets@0.2.0`, whose calls are the component model's async
//!   functions and streams, and whose waiting is the component model's.
//! - `bare` (`target_os = "none"`): the app as a bootable unikernel image,
//!   with pier-driver and pier-stack linked in and driven by the app's own
//!   calls.
//! - `unsupported`: every other target (the developer's own machine), so
//!   that apps still compile there; every constructor fails.
//! - `loopback`: pier-rt's own tests on the developer's machine, where
//!   sockets connect to each other in memory, so the shells, the `Poller`
//!   and the executor run for real.

pub(crate) mod contract;

#[cfg(target_os = "wasi")]
mod wit_error;

#[cfg(all(target_os = "wasi", not(feature = "wasi-0-3")))]
mod wasi;

#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
pub(crate) mod wasi3;

#[cfg(target_os = "none")]
pub(crate) mod bare;

#[cfg(not(any(target_os = "wasi", target_os = "none")))]
mod unsupported;

#[cfg(all(test, not(any(target_os = "wasi", target_os = "none"))))]
pub(crate) mod loopback;

/// The platform this build runs on.
#[cfg(all(target_os = "wasi", not(feature = "wasi-0-3")))]
pub(crate) type Active = wasi::Wasi;
/// The platform this build runs on.
#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
pub(crate) type Active = wasi3::Wasi3;
/// The platform this build runs on.
#[cfg(target_os = "none")]
pub(crate) type Active = bare::Bare;
/// The platform this build runs on.
#[cfg(all(not(test), not(any(target_os = "wasi", target_os = "none"))))]
pub(crate) type Active = unsupported::Unsupported;
/// The platform this build runs on.
#[cfg(all(test, not(any(target_os = "wasi", target_os = "none"))))]
pub(crate) type Active = loopback::Loopback;

/// How the active platform waits.
pub(crate) type Waiting = <Active as contract::Platform>::Wait;
/// The active platform's readiness condition, borrowing its socket.
pub(crate) type PollRef<'a> = <Waiting as contract::Wait>::PollRef<'a>;
/// The active platform's readiness condition, without its borrow.
pub(crate) type RawPoll = <Waiting as contract::Wait>::RawPoll;
