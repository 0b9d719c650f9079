//! Ending the app with an exit code, the same way on every target.
//!
//! In a WASI component the code goes out through `wasi:cli/exit`'s
//! `exit-with-code` (WASI 0.2.12), so 3 or 42 reach `pier run` and
//! containerd as 3 or 42; std's `process::exit` uses the older `exit`,
//! which carries only ok or err, and every failure would come out as 1.
//!
//! On bare metal the code leaves the VM through the exit port (pier-vmm
//! returns it as written; QEMU exits with `(code << 1) | 1`), a panic
//! prints its message and exits with [`PANIC_EXIT_CODE`], and a CPU
//! exception prints a report and exits with 128 + the signal Linux would
//! send (139 for a page fault, as SIGSEGV; `docs/unikernel.md` has the
//! table).

pub use crate::unikernel::PANIC_EXIT_CODE;

/// Ends the app (the whole VM on bare metal) with `code`. On bare metal,
/// what the app wrote to its sockets still leaves first (for at most 5 s),
/// as Linux delivers a process's data after it exits.
pub fn exit(code: i32) -> ! {
    #[cfg(target_os = "none")]
    {
        crate::platform::bare::net::drain_before_exit();
        crate::platform::bare::exit::exit(code)
    }
    #[cfg(target_os = "wasi")]
    {
        // std's exit flushes stdout first; this one must too.
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        // An exit code is a byte to whoever reads it (a Linux process's
        // status keeps the low 8 bits, so 256 is 0 there too).
        wasip2::cli::exit::exit_with_code(code as u8);
        unreachable!("wasi:cli/exit returned")
    }
    #[cfg(not(any(target_os = "none", target_os = "wasi")))]
    {
        std::process::exit(code)
    }
}

/// Like `std::process::ExitCode`: what `main` returns to set the exit
/// code without calling [`exit`]. Off WASI and bare metal, it is std's.
#[cfg(not(any(target_os = "none", target_os = "wasi")))]
pub use std::process::ExitCode;

/// Like `std::process::ExitCode`: what `main` returns to set the exit
/// code without calling [`exit`].
///
/// It is pier-rt's own in a component too: std's `ExitCode` leaves `main`
/// through `wasi:cli/run`'s result, ok or err, so 42 would come out as 1.
/// This one exits through [`exit`] (`exit-with-code`) for any code above 1.
#[cfg(any(target_os = "none", target_os = "wasi"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitCode(u8);

#[cfg(any(target_os = "none", target_os = "wasi"))]
impl ExitCode {
    /// Exit code 0.
    pub const SUCCESS: Self = Self(0);
    /// Exit code 1.
    pub const FAILURE: Self = Self(1);
}

#[cfg(any(target_os = "none", target_os = "wasi"))]
impl From<u8> for ExitCode {
    fn from(code: u8) -> Self {
        Self(code)
    }
}

/// std calls `main` in a component, so this is what it asks of the code
/// `main` returns. 0 and 1 go back as std's own (its usual exit, after its
/// cleanup); anything else must end the component here, as only
/// `exit-with-code` can say it.
#[cfg(target_os = "wasi")]
impl std::process::Termination for ExitCode {
    fn report(self) -> std::process::ExitCode {
        if self.0 > 1 {
            exit(i32::from(self.0));
        }
        std::process::ExitCode::from(self.0)
    }
}

/// What `main` may return, as std's `Termination`: `()` exits 0, `Ok(())`
/// exits 0, `Err(e)` prints `Error: {e:?}` on stderr and exits 1.
pub trait Termination {
    /// The exit code, after printing what needs printing.
    fn report(self) -> i32;
}

impl Termination for () {
    fn report(self) -> i32 {
        0
    }
}

#[cfg(any(target_os = "none", target_os = "wasi"))]
impl Termination for ExitCode {
    fn report(self) -> i32 {
        i32::from(self.0)
    }
}

impl<E: core::fmt::Debug> Termination for Result<(), E> {
    fn report(self) -> i32 {
        match self {
            Ok(()) => 0,
            Err(e) => {
                crate::eprintln!("Error: {e:?}");
                1
            }
        }
    }
}
