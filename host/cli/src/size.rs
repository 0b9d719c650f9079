//! Sizes as the command line and the config file write them: bytes, or a
//! number with K, M or G (`--mem`, `--max-memory`, `max_memory`). Its own
//! module, with nothing but `anyhow`, so the config file's fuzz target can
//! compile it with the config parser.

use anyhow::{Context as _, Result, bail};

/// `SIZE` as `--mem` and `--max-memory` take it: bytes, or a number with
/// K, M or G. Errors name `option`, the option or key it came from.
pub fn parse_size(option: &str, text: &str) -> Result<u64> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let Ok(n) = digits.parse::<u64>() else {
        bail!("{option} {text:?}: not a size (bytes, or a number with K, M or G)")
    };
    n.checked_mul(1 << shift).with_context(|| format!("{option} {text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("--mem", "128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("--mem", "4096").unwrap(), 4096);
        assert_eq!(parse_size("--mem", "1g").unwrap(), 1 << 30);
        assert!(parse_size("--mem", "12Q").is_err());
        assert!(parse_size("--mem", "").is_err());
        assert!(parse_size("--mem", "99999999999G").is_err());
    }
}
