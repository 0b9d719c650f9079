//! The two connection-oriented socket kinds, as type parameters. One
//! listener and one connection type serve both ([`conn`](crate::conn),
//! and [`asynch::conn`](crate::asynch::conn)), and the platform contract
//! finds each kind's platform types by them; what only one kind can do is
//! written where that kind is named.
//!
//! Neither type has a value: they only name a kind.

/// Byte streams with half-close: [`VsockListener`](crate::VsockListener)
/// and [`VsockStream`](crate::VsockStream).
#[derive(Debug)]
pub enum Stream {}

/// Reliable messages with boundaries and end-of-record:
/// [`SeqpacketListener`](crate::SeqpacketListener) and
/// [`SeqpacketStream`](crate::SeqpacketStream).
#[derive(Debug)]
pub enum Seqpacket {}
