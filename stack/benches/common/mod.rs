//! What pier-stack's benchmarks share: the quick-mode switch and the JSON
//! lines `cargo xtask bench` reads.
//!
//! A copy of `xtask::bench::Recorder`'s format rather than a use of it:
//! xtask depends on pier-stack, and a dev-dependency back on xtask would
//! build pier-stack twice. The format is five fields; keep the two alike.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::Write;

/// `PIER_BENCH_QUICK=1` (`cargo xtask bench --quick`) or `-- --quick`.
pub fn quick() -> bool {
    std::env::var("PIER_BENCH_QUICK").is_ok_and(|v| v == "1")
        || std::env::args().any(|a| a == "--quick")
}

/// Appends `{"bench":..,"case":..,"x":..,"value":..,"unit":..}` lines to
/// `$PIER_BENCH_JSON` when it is set; does nothing otherwise.
#[derive(Debug)]
pub struct Recorder(Option<File>);

impl Recorder {
    pub fn from_env() -> Self {
        Recorder(std::env::var_os("PIER_BENCH_JSON").map(|path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("PIER_BENCH_JSON={}: {e}", path.to_string_lossy()))
        }))
    }

    /// One measurement; strings are written as they are, so they must
    /// hold no quote or backslash.
    pub fn record(&mut self, bench: &str, case: &str, x: X, value: f64, unit: &str) {
        let Some(file) = &mut self.0 else { return };
        let x = match x {
            X::Num(v) => format!("{v}"),
            X::Label(s) => format!("\"{s}\""),
        };
        let value = if value.is_finite() { format!("{value}") } else { "null".into() };
        writeln!(
            file,
            "{{\"bench\":\"{bench}\",\"case\":\"{case}\",\"x\":{x},\"value\":{value},\"unit\":\"{unit}\"}}"
        )
        .expect("writing the benchmark's JSON line");
    }
}

/// The x of a record: a byte count (a row of a sweep, a point on a
/// plot), or a label (a row such as "empty backlog").
#[derive(Debug)]
pub enum X<'a> {
    Num(usize),
    Label(&'a str),
}
