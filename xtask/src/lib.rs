//! `cargo xtask`'s tasks, as a library for its binary and its tests. What
//! they share with the tests and benchmarks (the guest and image builds,
//! the tools, QEMU, the Linux guest, containerd, OCI images, the benchmark
//! records) is in pier-testkit; here are only what the commands alone use:
//!
//! - [`bench`]: `cargo xtask bench`, the benchmarks run and the tables and
//!   plots of `docs/benchmarks.md` rewritten from their records;
//! - [`fuzz`]: `cargo xtask fuzz`, the fuzz targets built and fuzzed;
//! - [`seeds`]: `cargo xtask fuzz-seeds`, the seed corpus in
//!   `fuzz/corpus/`.

pub mod bench;
pub mod fuzz;
pub mod module_cycles;
pub mod seeds;
