//! The counters `pier run` and `pier boot` print on SIGUSR1, read back by
//! the tests that check what happened on the far side of a connection (the
//! bridge, the guest, a component) while pier keeps running.

use std::thread;
use std::time::{Duration, Instant};

use super::{PierRun, signal};

/// Asks `pier run` for a report (SIGUSR1) and returns it, from the line
/// after `pier: stats` on, once its first component's sockets line is in
/// (the stderr reader appends line by line, so a report arrives in pieces).
pub fn report(run: &PierRun) -> String {
    report_through(run, "\n  sockets: ")
}

/// [`report`] for `pier boot`, whose report is the device's alone: once
/// the bridge's datagrams line, the last that is always there, is in.
pub fn device_report(run: &PierRun) -> String {
    report_through(run, "\n  datagrams: to guest ")
}

/// Asks for a report and returns it once it contains `line`.
fn report_through(run: &PierRun, line: &str) -> String {
    const HEAD: &str = "pier: stats\n";
    let before = run.stderr().matches(HEAD).count();
    signal(run, "USR1");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stderr = run.stderr();
        if stderr.matches(HEAD).count() > before
            && let Some(block) = stderr.rsplit(HEAD).next()
            && block.contains(line)
        {
            return block.to_owned();
        }
        let tail = &stderr[stderr.len().saturating_sub(4000)..];
        assert!(Instant::now() < deadline, "no stats report after SIGUSR1:\n{tail}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The number after `name` on the first line of `report` from `after` on
/// that contains `line`: `counter(r, "", "connections:", "active")`.
pub fn counter(report: &str, after: &str, line: &str, name: &str) -> Option<u64> {
    let rest = &report[report.find(after)?..];
    let line = rest.lines().find(|l| l.contains(line))?;
    let digits = line[line.find(name)? + name.len()..].trim_start();
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}
