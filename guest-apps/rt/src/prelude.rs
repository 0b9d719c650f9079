//! What std's prelude gives an app and bare metal lacks: `use
//! pier_rt::prelude::*;` brings `Vec`, `String`, `Box`, `ToString`,
//! `ToOwned`, `format!` and `vec!` into scope on every target. On hosted targets they are the very items std's prelude has,
//! so importing them there changes nothing.
//!
//! The print macros are not here: on hosted targets a glob import of them
//! would be ambiguous with std's own, so an app imports pier-rt's by name
//! (`use pier_rt::{eprintln, println};`), which shadows std's cleanly.

pub use alloc::borrow::ToOwned;
pub use alloc::boxed::Box;
pub use alloc::string::{String, ToString};
pub use alloc::vec::Vec;
pub use alloc::{format, vec};
