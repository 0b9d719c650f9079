//! The hybrid vsock wire, written once: everything a host program and the
//! backend (pier's bridge) must agree on byte for byte, and nothing that
//! touches a socket.
//!
//! A guest's vsock device is emulated in user space, so host programs
//! reach it through Unix sockets derived from one path, `<uds>`, with a
//! little protocol on top (Firecracker's `CONNECT`/`OK` exchange, and
//! pier's framings for seqpacket and datagrams; `docs/host-sockets.md` in
//! the pier repository describes it for users). Both sides of it build on
//! this crate: the bridge (`pier-device`) and the client (`pier-client`),
//! and the tests and benchmarks that speak it by hand. One definition
//! means the two sides cannot drift apart, and a change to the wire is a
//! change here.
//!
//! | what | bytes | here |
//! |---|---|---|
//! | host → guest request | `CONNECT <port>\n` on `<uds>` (a stream) or `<uds>_seqpacket` (one message) | [`connect_line`], [`parse_connect`] |
//! | the backend's answer | `OK <port>\n` | [`ok_line`], [`parse_ok`] |
//! | the socket names | `<uds>_seqpacket`, `<uds>_<port>`, `<uds>_dgram`, `<uds>_dgram_<port>` | [`paths`] |
//! | seqpacket messages | one flags byte (bit 0: end of record), then the message | [`seqpacket_flags`], [`decode_seqpacket_message`] |
//! | datagrams | guest port, host port (`u32` little-endian each), then the payload | [`encode_datagram_header`], [`decode_datagram_header`] |
//!
//! `no_std` and dependency-free, so the light client stays light; the
//! `std` feature (on by default) adds the socket names as `PathBuf`s.
//! Nothing here allocates: lines and name suffixes are [`WireText`]s on
//! the stack, which the bridge builds on its hot paths.
//!
//! Modules (their items re-exported here): `line` (the CONNECT and OK
//! lines), [`paths`] (the socket names), `seqpacket` (the flags byte),
//! `datagram` (the ports header), `text` ([`WireText`]).

#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "std")]
extern crate std;

mod datagram;
mod line;
pub mod paths;
mod seqpacket;
mod text;

pub use datagram::{
    DATAGRAM_HEADER_LEN, decode_datagram_header, decode_datagram_ports, encode_datagram_header,
};
pub use line::{
    LineError, MAX_CONNECT_LINE, MAX_OK_LINE, connect_line, ok_line, parse_connect, parse_ok,
};
#[cfg(feature = "std")]
pub use paths::{datagram_path, datagram_receiver_path, listener_path, seqpacket_path};
pub use seqpacket::{
    SEQPACKET_EOR, SEQPACKET_FLAGS_LEN, SeqpacketFrameError, decode_seqpacket_flags,
    decode_seqpacket_message, seqpacket_flags,
};
pub use text::WireText;
