//! The generated bindings of the `vsock:sockets` imports. wasi:io and
//! wasi:clocks map onto the `wasip2` crate, so the streams and pollables
//! we get back are the same types std and other WASI crates use.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

wit_bindgen::generate!({
    path: "../../wit",
    world: "vsock:sockets/imports",
    with: {
        "wasi:io/error@0.2.12": wasip2::io::error,
        "wasi:io/poll@0.2.12": wasip2::io::poll,
        "wasi:io/streams@0.2.12": wasip2::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
    },
    // Outgoing messages borrow the caller's buffer instead of copying it
    // into a Vec first.
    ownership: Borrowing { duplicate_if_necessary: false },
});
