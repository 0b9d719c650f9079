//! The macros an app uses in place of std's where std is missing:
//! printing and the entry point. On hosted targets they are std's own, so
//! a WASI app's output goes exactly where std sends it.

/// Like `std::print!`: to stdout (COM1 on bare metal).
#[cfg(target_os = "none")]
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::__private::print(::core::format_args!($($arg)*)) };
}

/// Like `std::println!`: to stdout (COM1 on bare metal).
#[cfg(target_os = "none")]
#[macro_export]
macro_rules! println {
    () => { $crate::__private::print(::core::format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::__private::print(::core::format_args!("{}\n", ::core::format_args!($($arg)*)))
    };
}

/// Like `std::eprint!`: to stderr (COM1 on bare metal).
#[cfg(target_os = "none")]
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::print!($($arg)*) };
}

/// Like `std::eprintln!`: to stderr (COM1 on bare metal).
#[cfg(target_os = "none")]
#[macro_export]
macro_rules! eprintln {
    ($($arg:tt)*) => { $crate::println!($($arg)*) };
}

/// Like `std::print!`.
#[cfg(not(target_os = "none"))]
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { ::std::print!($($arg)*) };
}

/// Like `std::println!`.
#[cfg(not(target_os = "none"))]
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => { ::std::println!($($arg)*) };
}

/// Like `std::eprint!`.
#[cfg(not(target_os = "none"))]
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { ::std::eprint!($($arg)*) };
}

/// Like `std::eprintln!`.
#[cfg(not(target_os = "none"))]
#[macro_export]
macro_rules! eprintln {
    ($($arg:tt)*) => { ::std::eprintln!($($arg)*) };
}

/// Names the app's `main` function, once, at the crate root:
/// `pier_rt::main!(main);`.
///
/// On hosted targets std calls `main` and this expands to nothing. On bare
/// metal there is no std runtime (the app is `no_main`), so this defines
/// the symbol pier-rt's boot code calls once the machine is up; `main`'s
/// return value becomes the exit code through [`process::Termination`]
/// (`()` is 0, an `Err` is printed and is 1), as with std.
///
/// [`process::Termination`]: crate::process::Termination
///
/// `pier_rt::main!(async serve);` names an `async fn serve()` instead: the
/// entry runs it with [`asynch::block_on`](crate::asynch::block_on), which
/// also runs every task it spawns, and its output becomes the exit code
/// the same way.
#[cfg(target_os = "none")]
#[macro_export]
macro_rules! main {
    (async $main:path) => {
        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub extern "Rust" fn __pier_rt_main() -> i32 {
            $crate::process::Termination::report($crate::asynch::block_on($main()))
        }
    };
    ($main:path) => {
        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub extern "Rust" fn __pier_rt_main() -> i32 {
            $crate::process::Termination::report($main())
        }
    };
}

/// Names the app's `main` function, once, at the crate root:
/// `pier_rt::main!(main);`. On this target std calls `main`, so this
/// expands to nothing; on bare metal it defines the image's entry.
///
/// `pier_rt::main!(async serve);` names an `async fn serve()` instead, and
/// defines `fn main` (so the app has none of its own): it runs `serve`
/// with [`asynch::block_on`](crate::asynch::block_on), which also runs
/// every task it spawns, and `serve`'s output becomes the exit code as
/// `main`'s would (`()`, `Result`, `ExitCode`).
#[cfg(not(any(target_os = "none", all(target_os = "wasi", feature = "wasi-0-3"))))]
#[macro_export]
macro_rules! main {
    (async $main:path) => {
        fn main() -> ::std::process::ExitCode {
            ::std::process::Termination::report($crate::asynch::block_on($main()))
        }
    };
    ($main:path) => {};
}

/// Names the app's `main` function, once, at the crate root:
/// `pier_rt::main!(main);`. Built for WASI 0.3 (the `wasi-0-3` feature),
/// this exports `wasi:cli/run@0.3.0`, whose task the component model's
/// async calls run in, and calls `main` from it; `main`'s return value
/// becomes the exit code through [`process::Termination`] (`()` and
/// `Ok` are 0, an `Err` is printed and is 1, an `ExitCode` is itself).
/// std's own entry still calls `main` when a host runs the component
/// through WASI 0.2's `run`; every socket constructor then says the app
/// needs WASI 0.3.
///
/// [`process::Termination`]: crate::process::Termination
///
/// `pier_rt::main!(async serve);` names an `async fn serve()` instead:
/// the export awaits it, and the tasks it spawns run beside it in the
/// export's task. This form defines `fn main` (so the app has none of its
/// own), which only says that the app needs WASI 0.3.
#[cfg(all(target_os = "wasi", feature = "wasi-0-3"))]
#[macro_export]
macro_rules! main {
    (async $main:path) => {
        fn main() -> ::std::process::ExitCode {
            $crate::__private::wrong_world()
        }
        $crate::main!(@export $crate::__private::run_async_main($main()));
    };
    ($main:path) => {
        $crate::main!(@export $crate::__private::run_main(|| {
            $crate::process::Termination::report($main())
        }));
    };
    (@export $run:expr) => {
        #[doc(hidden)]
        struct __PierRtRun;
        impl $crate::__private::wasi3::exports::wasi::cli::run::Guest for __PierRtRun {
            // The 0.3 entry calls the `main` std's entry would: on purpose.
            #[allow(clippy::main_recursion)]
            async fn run() -> ::core::result::Result<(), ()> {
                $run.await
            }
        }
        $crate::__private::wasi3::export_run!(__PierRtRun);
    };
}
