//! Ending the app with an exit code, the same way on every target.
//!
//! On bare metal the code leaves the VM through the exit port (pier-vmm
//! returns it as written; QEMU exits with `(code << 1) | 1`), a panic
//! prints its message and exits with [`PANIC_EXIT_CODE`], and a CPU
//! exception prints a report and exits with 128 + the signal Linux would
//! send (139 for a page fault, as SIGSEGV; `docs/unikernel.md` has the
//! table).

/// The exit code of an app that panicked on bare metal: 101, Rust's own
/// code for a panic that ends a process.
pub const PANIC_EXIT_CODE: i32 = 101;

/// Ends the app (the whole VM on bare metal) with `code`.
pub fn exit(code: i32) -> ! {
    #[cfg(target_os = "none")]
    {
        crate::backend::bare::exit::exit(code)
    }
    #[cfg(not(target_os = "none"))]
    {
        std::process::exit(code)
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
