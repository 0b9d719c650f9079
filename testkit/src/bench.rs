//! The measurements benchmarks record for `cargo xtask bench`: one JSON
//! line per measurement, appended to the file `PIER_BENCH_JSON` names
//! ([`Recorder`]), and read back by [`parse_records`]. The writer and the
//! reader are here together, so the format has one home; `cargo xtask
//! bench` (the xtask crate) turns the records into the tables and plots of
//! `docs/benchmarks.md`.
//!
//! `PIER_BENCH_QUICK=1` (`cargo xtask bench --quick`) asks every benchmark
//! for fewer bytes and runs ([`quick`]).
//!
//! Comparisons that carry a goal run [`rounds`] alternated rounds, each
//! measuring every column once (in [`round_order`]), and report each
//! column's [`median`] and each ratio as a [`PairedRatio`] (the rounds'
//! own ratios), so that the host's drift hits both sides of a ratio
//! alike.
//!
//! Benchmarks that report what a path costs beside how fast it is measure
//! a process with [`Meter`]: its CPU time and its system calls over one
//! stretch of work, so every cost table is counted the same way.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::json;

/// The environment variable naming the JSON-lines file benchmarks append to.
pub const JSON_ENV: &str = "PIER_BENCH_JSON";
/// The environment variable that asks benchmarks for their quick mode.
pub const QUICK_ENV: &str = "PIER_BENCH_QUICK";

/// Whether this benchmark run is the quick one: `PIER_BENCH_QUICK=1`, or
/// `--quick` on the command line (`cargo bench ... -- --quick`, as before
/// `cargo xtask bench` existed).
pub fn quick() -> bool {
    std::env::var(QUICK_ENV).is_ok_and(|v| v == "1") || std::env::args().any(|a| a == "--quick")
}

/// The value of `--<name>=value` on the command line, if given: the
/// options a benchmark takes to run part of itself while comparing two
/// builds (`--sizes=`, `--only=`).
pub fn arg(name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    std::env::args().find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}

/// The write sizes `--sizes=a,b,..` asks for, if given.
pub fn chosen_sizes() -> Option<Vec<usize>> {
    let list = arg("sizes")?;
    Some(list.split(',').map(|s| s.parse().expect("--sizes takes byte counts")).collect())
}

/// Whether `--only=a,b,..` (if given) names `part`.
pub fn runs_part(part: &str) -> bool {
    arg("only").is_none_or(|only| only.split(',').any(|o| o == part))
}

/// Rounds of a full run's throughput comparisons. Each round measures
/// every column of a comparison once, back to back, so the columns of one
/// round meet the same host: on a shared or nested host the speed of both
/// sides drifts by a quarter or more within a minute, and a best-of over
/// separate stretches compares one side's luckiest moment with the
/// other's.
pub const ROUNDS: usize = 5;

/// How many alternated rounds to run: [`ROUNDS`], or one in quick mode.
pub fn rounds() -> usize {
    if quick() { 1 } else { ROUNDS }
}

/// The order round `round` (from 0) measures `columns` columns in: as
/// listed in even rounds, reversed in odd ones. A column can leave the
/// host changed for the next (caches, the CPU's clock, where the
/// scheduler put threads), so no column may always run first.
pub fn round_order(round: usize, columns: usize) -> impl Iterator<Item = usize> {
    let reversed = round % 2 == 1;
    (0..columns).map(move |i| if reversed { columns - 1 - i } else { i })
}

/// The middle of `samples` (the mean of the middle two for an even
/// count); NaN for none. A column's figure over rounds: unlike the best,
/// one lucky round does not make it. A NaN sample is a round that failed
/// (a benchmark records one so, and counts it apart): it is left out, not
/// sorted in as a figure.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| !s.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One column against another over the same rounds: the ratio within
/// each round, and their median and range. The two columns of a round ran
/// back to back, so each round's ratio cancels what the host did to both;
/// the range says how far one round's verdict can stray.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairedRatio {
    pub median: f64,
    pub lowest: f64,
    pub highest: f64,
}

impl PairedRatio {
    /// `a[i] / b[i]` for every round `i` both columns ran and neither
    /// failed (NaN); NaN throughout when they share none.
    pub fn of(a: &[f64], b: &[f64]) -> Self {
        let ratios: Vec<f64> =
            a.iter().zip(b).map(|(a, b)| a / b).filter(|r| !r.is_nan()).collect();
        if ratios.is_empty() {
            return Self { median: f64::NAN, lowest: f64::NAN, highest: f64::NAN };
        }
        Self {
            median: median(&ratios),
            lowest: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            highest: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The x coordinate of a measurement: a size in bytes (a row of a sweep,
/// a point on a plot) or a label (a row such as "median").
#[derive(Clone, Debug, PartialEq)]
pub enum X {
    Num(f64),
    Label(String),
}

impl From<usize> for X {
    fn from(v: usize) -> Self {
        X::Num(v as f64)
    }
}

impl From<u64> for X {
    fn from(v: u64) -> Self {
        X::Num(v as f64)
    }
}

impl From<&str> for X {
    fn from(v: &str) -> Self {
        X::Label(v.to_owned())
    }
}

/// Where a benchmark binary writes its measurements for `cargo xtask
/// bench`; without `PIER_BENCH_JSON` it writes nothing and the binary
/// behaves as it always did.
#[derive(Debug)]
pub struct Recorder {
    file: Option<File>,
}

impl Recorder {
    /// Opens `$PIER_BENCH_JSON` for appending: several binaries write to
    /// one file, one after the other.
    pub fn from_env() -> Self {
        let file = std::env::var_os(JSON_ENV).map(|path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("{JSON_ENV}={}: {e}", path.to_string_lossy()))
        });
        Self { file }
    }

    /// A recorder writing to a new (or emptied) `path`, whatever the
    /// environment says: `cargo xtask bench` starts each run's file with it.
    pub fn create(path: &Path) -> Result<Self, String> {
        let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self { file: Some(file) })
    }

    /// Appends one measurement. Hand-formatted: a flat object of strings
    /// and numbers needs no serialisation library in every benchmark.
    pub fn record(&mut self, bench: &str, case: &str, x: impl Into<X>, value: f64, unit: &str) {
        let Some(file) = &mut self.file else { return };
        let x = match x.into() {
            X::Num(v) => format!("{v}"),
            X::Label(s) => json::string(&s),
        };
        let line = format!(
            "{{\"bench\":{},\"case\":{},\"x\":{x},\"value\":{},\"unit\":{}}}\n",
            json::string(bench),
            json::string(case),
            if value.is_finite() { format!("{value}") } else { "null".into() },
            json::string(unit)
        );
        file.write_all(line.as_bytes()).expect("writing the benchmark's JSON line");
    }
}

/// One measurement read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub bench: String,
    pub case: String,
    pub x: X,
    pub value: f64,
    pub unit: String,
}

/// Parses the JSON lines [`Recorder`] writes (and only those: flat
/// objects of strings and numbers). A line it cannot read is an error
/// naming the line, not a silent gap in a table.
pub fn parse_records(text: &str) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields = parse_object(line).map_err(|e| format!("line {}: {e}: {line}", i + 1))?;
        let get = |name: &str| -> Result<X, String> {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| format!("line {}: no {name:?}", i + 1))
        };
        let string = |name: &str| -> Result<String, String> {
            Ok(match get(name)? {
                X::Label(s) => s,
                X::Num(v) => format!("{v}"),
            })
        };
        let value = match get("value")? {
            X::Num(v) => v,
            X::Label(s) if s == "null" => f64::NAN,
            X::Label(s) => return Err(format!("line {}: value {s:?} is not a number", i + 1)),
        };
        records.push(Record {
            bench: string("bench")?,
            case: string("case")?,
            x: get("x")?,
            value,
            unit: string("unit")?,
        });
    }
    Ok(records)
}

/// `{"key": "string" | number | null, ...}`; `null` reads as the label
/// `"null"`.
fn parse_object(line: &str) -> Result<Vec<(String, X)>, String> {
    let mut chars = line.trim().chars().peekable();
    let mut fields = Vec::new();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    let string = |chars: &mut std::iter::Peekable<std::str::Chars>| -> Result<String, String> {
        if chars.next() != Some('"') {
            return Err("expected a string".into());
        }
        let mut s = String::new();
        loop {
            match chars.next().ok_or("unterminated string")? {
                '"' => return Ok(s),
                '\\' => match chars.next().ok_or("unterminated escape")? {
                    'u' => {
                        let hex: String = chars.by_ref().take(4).collect();
                        let code = u32::from_str_radix(&hex, 16).map_err(|e| e.to_string())?;
                        s.push(char::from_u32(code).ok_or("bad \\u escape")?);
                    }
                    'n' => s.push('\n'),
                    't' => s.push('\t'),
                    c => s.push(c),
                },
                c => s.push(c),
            }
        }
    };
    skip_ws(&mut chars);
    if chars.next() != Some('{') {
        return Err("expected an object".into());
    }
    loop {
        skip_ws(&mut chars);
        if chars.peek() == Some(&'}') {
            break;
        }
        let key = string(&mut chars)?;
        skip_ws(&mut chars);
        if chars.next() != Some(':') {
            return Err("expected ':'".into());
        }
        skip_ws(&mut chars);
        let value = if chars.peek() == Some(&'"') {
            X::Label(string(&mut chars)?)
        } else {
            let mut raw = String::new();
            while chars.peek().is_some_and(|&c| c != ',' && c != '}' && !c.is_whitespace()) {
                raw.push(chars.next().unwrap_or_default());
            }
            if raw == "null" {
                X::Label(raw)
            } else {
                X::Num(raw.parse().map_err(|_| format!("{raw:?} is not a number"))?)
            }
        };
        fields.push((key, value));
        skip_ws(&mut chars);
        match chars.next() {
            Some(',') => continue,
            Some('}') => break,
            _ => return Err("expected ',' or '}'".into()),
        }
    }
    Ok(fields)
}

/// CPU seconds (user + system, every thread, exited ones included) `pid`
/// has used so far: the total `/proc/PID/stat` gives as utime + stime, but
/// read through the process's CPU-time clock, in nanoseconds rather than
/// 10 ms ticks, since a quick run of a backend can take under a tick.
pub fn cpu_seconds(pid: u32) -> f64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: both calls only write the out-parameters they are given.
    let ts = unsafe {
        let err = libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock);
        assert_eq!(err, 0, "no CPU-time clock for process {pid}: error {err}");
        let mut ts: libc::timespec = std::mem::zeroed();
        assert_eq!(libc::clock_gettime(clock, &mut ts), 0, "reading process {pid}'s CPU time");
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// What one process spent on a measured stretch of work.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_seconds: f64,
    /// Every system call the process's threads entered: perf's count of
    /// the `raw_syscalls:sys_enter` tracepoint (counting, not sampling, so
    /// it costs the process next to nothing).
    pub syscalls: u64,
}

impl Usage {
    /// Adds another stretch.
    pub fn add(&mut self, other: Self) {
        self.cpu_seconds += other.cpu_seconds;
        self.syscalls += other.syscalls;
    }

    /// CPU milliseconds per MiB of `bytes`.
    pub fn cpu_ms_per_mib(&self, bytes: u64) -> f64 {
        self.cpu_seconds * 1e3 / (bytes as f64 / (1u64 << 20) as f64)
    }

    /// System calls per MiB of `bytes`.
    pub fn syscalls_per_mib(&self, bytes: u64) -> f64 {
        self.syscalls as f64 / (bytes as f64 / (1u64 << 20) as f64)
    }
}

/// Measures one process from [`Meter::start`] to [`Meter::stop`]: its CPU
/// time, and its system calls through `perf stat` attached to it
/// (installed through pier-testkit's tools, like the other programs the
/// benchmarks need).
#[derive(Debug)]
pub struct Meter {
    pid: u32,
    cpu_at_start: f64,
    perf: Child,
    /// perf's control FIFO, held open while it counts.
    _control: std::fs::File,
    /// The folder of the two FIFOs, removed at `stop`.
    fifo_dir: std::path::PathBuf,
}

impl Meter {
    pub fn start(pid: u32) -> Self {
        let perf_path = crate::tools::ensure(crate::tools::PERF).unwrap_or_else(|e| panic!("{e}"));
        // perf starts with its counters off and turns them on when told
        // through a control FIFO, then acknowledges on a second one: so
        // the meter knows perf counts before the stretch begins. (A fixed
        // pause was not enough on a loaded machine: perf could be
        // stopped before it had attached, and then reported nothing.)
        static METERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = METERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fifo_dir = std::env::temp_dir().join(format!("pier-meter-{}-{n}", std::process::id()));
        std::fs::create_dir(&fifo_dir).expect("a folder for perf's control FIFOs");
        let (ctl, ack) = (fifo_dir.join("ctl"), fifo_dir.join("ack"));
        for fifo in [&ctl, &ack] {
            let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mkfifo(3) with a NUL-terminated path.
            let rc = unsafe { libc::mkfifo(path.as_ptr(), 0o600) };
            assert_eq!(rc, 0, "mkfifo {}: {}", fifo.display(), std::io::Error::last_os_error());
        }
        let control = format!("fifo:{},{}", ctl.display(), ack.display());
        let perf = Command::new(perf_path)
            .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "--delay", "-1"])
            .args(["--control", &control, "-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perf stat");
        let mut ctl =
            std::fs::OpenOptions::new().write(true).open(&ctl).expect("perf's control FIFO");
        ctl.write_all(b"enable\n").expect("enabling perf's counters");
        let mut acked = String::new();
        std::fs::File::open(&ack)
            .and_then(|mut a| {
                let mut byte = [0u8; 1];
                while a.read(&mut byte)? == 1 && byte[0] != b'\n' {
                    acked.push(byte[0] as char);
                }
                Ok(())
            })
            .expect("perf's acknowledgement");
        assert_eq!(acked, "ack", "perf stat did not acknowledge enabling its counters");
        Self { pid, cpu_at_start: cpu_seconds(pid), perf, _control: ctl, fifo_dir }
    }

    pub fn stop(mut self) -> Usage {
        let cpu_seconds = cpu_seconds(self.pid) - self.cpu_at_start;
        // SAFETY: kill(2) on a child this meter owns and has not reaped.
        unsafe { libc::kill(self.perf.id() as libc::pid_t, libc::SIGINT) };
        let mut report = String::new();
        self.perf.stderr.take().expect("piped").read_to_string(&mut report).expect("perf output");
        self.perf.wait().expect("perf stat exits");
        let _ = std::fs::remove_dir_all(&self.fifo_dir);
        let syscalls = report
            .lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next()?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("perf stat gave no syscall count:\n{report}"));
        Usage { cpu_seconds, syscalls }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_sample_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[9.0, 1.0, 5.0]), 5.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 8.0]), 3.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn a_paired_ratio_divides_within_each_round_not_the_medians() {
        // Medians 4 and 3 would give 1.33; the rounds' own ratios are
        // 2, 1 and 3.
        let ratio = PairedRatio::of(&[2.0, 4.0, 9.0], &[1.0, 4.0, 3.0]);
        assert_eq!(ratio, PairedRatio { median: 2.0, lowest: 1.0, highest: 3.0 });
        assert!(PairedRatio::of(&[1.0], &[]).median.is_nan(), "no shared round");
    }

    #[test]
    fn rounds_alternate_which_column_runs_first() {
        let order = |round| round_order(round, 3).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1, 2]);
        assert_eq!(order(1), [2, 1, 0]);
        assert_eq!(order(4), [0, 1, 2]);
    }

    #[test]
    fn a_failed_round_is_left_out_of_the_median_and_the_ratios() {
        let nan = f64::NAN;
        assert_eq!(median(&[nan, 1.0, 5.0, 9.0]), 5.0);
        assert!(median(&[nan]).is_nan());
        // The first round failed on one side, the third on the other: the
        // ratio is of the second and fourth rounds alone (2 and 4).
        let ratio = PairedRatio::of(&[nan, 4.0, 1.0, 8.0], &[1.0, 2.0, nan, 2.0]);
        assert_eq!(ratio, PairedRatio { median: 3.0, lowest: 2.0, highest: 4.0 });
        let none = PairedRatio::of(&[nan, 1.0], &[1.0, nan]);
        assert!(none.lowest.is_nan() && none.highest.is_nan(), "no round both ran: {none:?}");
    }

    #[test]
    fn records_round_trip_through_the_json_lines() {
        let dir = std::env::temp_dir().join(format!("pier-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        let _ = std::fs::remove_file(&path);
        let mut rec = Recorder::create(&path).unwrap();
        rec.record("b", "pier \"quoted\"", 4096usize, 12.5, "Gbit/s");
        rec.record("b", "ratio", "median", f64::NAN, "x");
        let records = parse_records(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(records[0].case, "pier \"quoted\"");
        assert_eq!(records[0].x, X::Num(4096.0));
        assert_eq!(records[0].value, 12.5);
        assert_eq!(records[1].x, X::Label("median".into()));
        assert!(records[1].value.is_nan());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
