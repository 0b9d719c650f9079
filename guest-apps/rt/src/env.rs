//! The app's arguments, the same way on every target.

/// The app's arguments, without the program name (unlike
/// `std::env::args`, which has no program name to give on bare metal):
/// the words after `--` on the boot command line.
#[cfg(target_os = "none")]
pub fn args() -> impl Iterator<Item = &'static str> {
    crate::platform::bare::cmdline::app_args()
}

/// The app's arguments, without the program name (unlike
/// `std::env::args`, which has no program name to give on bare metal).
///
/// They are `&'static str` on every target, so app code handles them the
/// same way everywhere; here they are read from std once and kept. An
/// argument that is not UTF-8 is converted lossily.
#[cfg(not(target_os = "none"))]
pub fn args() -> impl Iterator<Item = &'static str> {
    static ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ARGS.get_or_init(|| {
        std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect()
    })
    .iter()
    .map(String::as_str)
}

/// The value of the environment variable `name`, if the app has one.
///
/// A component sees only what `pier run --env` (or the config file's
/// `env`) gave it; a unikernel has no environment at all, so there it is
/// always `None`.
#[cfg(not(target_os = "none"))]
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value of the environment variable `name`: a unikernel has no
/// environment, so always `None`.
#[cfg(target_os = "none")]
pub fn var(name: &str) -> Option<alloc::string::String> {
    let _ = name;
    None
}
