//! Command-line helpers for pier apps.
//!
//! The example apps all take a port (and sometimes a CID) as `--flag N`;
//! these helpers keep that parsing, and its error messages, in one place.
//! They take the words [`crate::env::args`] gives, so they work on every
//! target an app builds for.

use alloc::format;
use alloc::string::String;

use crate::io::{self, ErrorKind};

/// An `InvalidInput` error carrying a usage message.
pub fn usage(msg: impl Into<String>) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, msg.into())
}

/// The number after `flag`, or a usage error naming it.
pub fn number(value: Option<&str>, flag: &str) -> io::Result<u32> {
    let value = value.ok_or_else(|| usage(format!("{flag} needs a value")))?;
    value.parse().map_err(|_| usage(format!("{flag}: not a number: {value:?}")))
}

/// Parses `[--port N]` (or `--help`, which prints `help` and exits) for
/// apps that take nothing else.
pub fn port_only<'a>(
    mut args: impl Iterator<Item = &'a str>,
    default: u32,
    help: &str,
) -> io::Result<u32> {
    let mut port = default;
    while let Some(arg) = args.next() {
        match arg {
            "--port" => port = number(args.next(), "--port")?,
            "-h" | "--help" => {
                crate::println!("{help}");
                crate::process::exit(0);
            }
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    Ok(port)
}
