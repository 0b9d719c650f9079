//! The program's console output: one line for each event worth reporting
//! (the listeners up, each error met), on stdout, which is the guest's
//! serial console.

use std::io::Write;

/// One line on the console, prefixed with the program's name so it stands
/// out from the kernel's messages.
pub fn log(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "vsock-test: {line}");
    let _ = out.flush();
}
