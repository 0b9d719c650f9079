//! The app's arguments, the same way on every target.

/// The app's arguments, without the program name (unlike
/// `std::env::args`, which has no program name to give on bare metal):
/// the words after `--` on the boot command line.
#[cfg(target_os = "none")]
pub fn args() -> impl Iterator<Item = &'static str> {
    crate::backend::bare::cmdline::app_args()
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
