//! `--ring-trace` and `pier trace`: the trace of a known exchange decodes
//! to its sequence of queue events; `pier trace --html` writes a page a
//! real browser (Debian's chromium, headless) loads and steps through;
//! a truncated or corrupt trace is a clear error, never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{PierRun, pier, signal};
use pier_device::RingTrace;
use pier_device::device::{RX_QUEUE, TX_QUEUE};
use pier_device::ring_trace::read::{self, Event, KickVia, Trace};
use pier_device::testing::walk;
use pier_stack::wire::RawHeader;

const REQUEST: u16 = 1;
const RESPONSE: u16 = 2;
const RST: u16 = 3;
const SHUTDOWN: u16 = 4;
const RW: u16 = 5;

/// The trace at `path`, once it parses (the writer may be in the middle
/// of a line when it is read).
fn read_trace(path: &Path) -> Option<Trace> {
    read::parse(&std::fs::read_to_string(path).ok()?).ok()
}

/// One packet the trace shows returned on a queue, with what came before
/// it for the same chain.
#[derive(Debug)]
struct Carried {
    queue: usize,
    header: RawHeader,
    /// The trace's events for this chain, from its publication to its
    /// return: `["avail", "take", "used"]` when it went the normal way.
    life: Vec<&'static str>,
}

/// Every packet the trace carried between host port `host` and guest
/// port `guest`, in the order the device returned their chains, each
/// with its chain's life in the trace.
fn conversation(trace: &Trace, host: u32, guest: u32) -> Vec<Carried> {
    let mut out = Vec::new();
    for (i, record) in trace.records.iter().enumerate() {
        let Event::Used { q, head, header: Some(bytes), .. } = &record.event else { continue };
        let header = RawHeader::parse(bytes).expect("a header");
        let ours = (header.src_port, header.dst_port) == (host, guest)
            || (header.src_port, header.dst_port) == (guest, host);
        if !ours {
            continue;
        }
        // Back from the return to the chain's publication.
        let mut life = vec!["used"];
        for earlier in trace.records[..i].iter().rev() {
            match &earlier.event {
                Event::Take { q: eq, head: eh, .. } if eq == q && eh == head && life.len() == 1 => {
                    life.insert(0, "take")
                }
                Event::Avail { q: eq, head: eh, .. }
                    if eq == q && eh == head && life.len() == 2 =>
                {
                    life.insert(0, "avail");
                    break;
                }
                Event::Used { q: eq, head: eh, .. } if eq == q && eh == head => break,
                _ => {}
            }
        }
        out.push(Carried { queue: *q, header, life });
    }
    out
}

#[test]
fn an_echo_with_a_half_close_under_pier_run_decodes_to_its_queue_events() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("echo.jsonl");
    let pcap = dir.path().join("echo.pcap");
    let run = common::run_echo(&[
        "--ring-trace",
        trace_path.to_str().unwrap(),
        "--pcap",
        pcap.to_str().unwrap(),
    ]);
    let trace = check_echo_trace(run, &trace_path, KickVia::Driver);

    // The trace and the capture line up: every packet the trace carried
    // is one frame of the pcap, each frame one packet, in the same order.
    let frames = read::pcap_frames(&std::fs::read(&pcap).unwrap()).unwrap();
    let matched: Vec<usize> = read::match_frames(&trace, &frames).into_iter().flatten().collect();
    assert_eq!(matched, (1..=frames.len()).collect::<Vec<_>>());
    let out = pier().arg("trace").arg(&trace_path).arg("--pcap").arg(&pcap).output().unwrap();
    // Lines are wrapped at 80 columns: compare the words.
    let printed = String::from_utf8(out.stdout).unwrap();
    let words = printed.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains(&format!("(pcap frame {})", frames.len())), "{printed}");
}

/// The same under `pier boot`: a KVM guest's kicks reach the device as
/// eventfd wake-ups, the rest of the trace is the same device's.
#[test]
fn an_echo_with_a_half_close_under_pier_boot_decodes_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("echo.jsonl");
    let uds = dir.path().join("vm.vsock");
    let mut command = pier();
    command
        .arg("boot")
        .arg(common::image("echo"))
        .arg("--uds")
        .arg(&uds)
        .arg("--ring-trace")
        .arg(&trace_path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let run = PierRun::spawn_command(&mut command, &uds);
    check_echo_trace(run, &trace_path, KickVia::Eventfd);
}

/// An echo with a half-close through `run`, which traces its rings to
/// `trace_path`; then the trace, decoded, with its kicks seen `via`.
/// Returns the trace.
fn check_echo_trace(mut run: PierRun, trace_path: &Path, via: KickVia) -> Trace {
    let line = b"hello over vsock\n";
    let host_port = common::echo_with_half_close(&run.uds, 1234, line);
    // The host program has its EOF before the RST that ends the close
    // handshake has crossed the device: wait until the trace shows it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let ended = read_trace(trace_path).is_some_and(|t| {
            conversation(&t, host_port, 1234).last().is_some_and(|c| c.header.op == RST)
        });
        if ended {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&run, "TERM");
    assert_eq!(run.wait(Duration::from_secs(30)), 128 + 15, "{}", run.stderr());

    let text = std::fs::read_to_string(trace_path).unwrap();
    let trace = read::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let stderr = run.stderr();
    let summary = format!(
        "pier: capture {}: {} ring events written, 0 dropped",
        trace_path.display(),
        trace.records.len()
    );
    assert!(stderr.contains(&summary), "expected {summary:?} in:\n{stderr}");
    assert_eq!(trace.missing, 0);

    // The device came up in the trace: features, then each queue.
    let names: Vec<&str> = trace.records.iter().map(|r| r.event.name()).collect();
    let features = names.iter().position(|&n| n == "features").expect("features");
    let first_queue = names.iter().position(|&n| n == "queue").expect("queue setup");
    assert!(features < first_queue, "{names:?}");

    // Host to guest on rx, guest to host on tx, in the echo's order:
    // REQUEST, RESPONSE, the line, our half-close, the line back, the
    // guest's SHUTDOWN and the RST that ends it.
    let echo = conversation(&trace, host_port, 1234);
    let ops: Vec<(usize, u16)> = echo.iter().map(|c| (c.queue, c.header.op)).collect();
    let position = |queue: usize, op: u16| {
        ops.iter()
            .position(|&o| o == (queue, op))
            .unwrap_or_else(|| panic!("no {op} on {queue}: {ops:?}"))
    };
    assert_eq!(ops[..2], [(RX_QUEUE, REQUEST), (TX_QUEUE, RESPONSE)], "{ops:?}");
    let (line_in, half_close) = (position(RX_QUEUE, RW), position(RX_QUEUE, SHUTDOWN));
    let (line_back, guest_close) = (position(TX_QUEUE, RW), position(TX_QUEUE, SHUTDOWN));
    assert!(line_in < half_close && half_close < guest_close, "{ops:?}");
    assert!(line_in < line_back && line_back < guest_close, "{ops:?}");
    assert_eq!(echo[half_close].header.flags, 2, "SEND only: a half-close");
    assert_eq!(echo.last().unwrap().header.op, RST, "{ops:?}");
    assert_eq!(echo[line_in].header.len as usize, line.len());
    assert_eq!(echo[line_back].header.len as usize, line.len());
    // Each packet's chain: published, taken, returned, in that order.
    for c in &echo {
        assert_eq!(c.life, ["avail", "take", "used"], "{c:?}");
    }

    // `pier trace` prints the same steps, each with its ring.
    let out = pier().arg("trace").arg(trace_path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.contains("the device returns chain"), "{printed}");
    assert!(printed.contains("SHUTDOWN"), "{printed}");
    // Where the device saw the kicks: the bus's own way.
    assert!(
        trace.records.iter().any(|r| matches!(r.event, Event::Kick { via: v, .. } if v == via))
    );
    trace
}

/// The walkthrough's trace, written through the device's own recorder.
fn walk_trace(path: &Path) -> usize {
    let (trace, handle) = RingTrace::create(path).unwrap();
    let steps = walk::walk_traced(Some(trace)).expect("testbed");
    assert!(!steps.is_empty());
    let report = handle.finish();
    assert_eq!(report.0.dropped, 0, "{report}");
    report.0.written as usize
}

#[test]
fn a_truncated_or_corrupt_trace_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("walk.jsonl");
    walk_trace(&good);
    let text = std::fs::read_to_string(&good).unwrap();
    let run_on = |name: &str, contents: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        let out = pier().arg("trace").arg(&path).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Cut in the middle of the last record.
    let (code, stderr) = run_on("cut.jsonl", &text[..text.len() - 10]);
    let lines = text.lines().count();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("truncated: line {lines} ends without its newline")),
        "{stderr}"
    );
    // A line that is not a record.
    let mut corrupt: Vec<&str> = text.lines().collect();
    corrupt[3] = "{\"seq\":3,\"t\":1,\"ev\":\"used\",\"q\":7}";
    let (code, stderr) = run_on("corrupt.jsonl", &(corrupt.join("\n") + "\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("line 4 is corrupt: queue 7 does not exist"), "{stderr}");
    // Not JSON at all, and not a trace.
    let (code, stderr) = run_on("binary.jsonl", "\u{1}\u{2}garbage\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not a ring trace"), "{stderr}");
    let (code, stderr) = run_on("empty.jsonl", "");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("empty"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// chromium, installed first when the machine lacks it.
fn chromium() -> PathBuf {
    pier_testkit::tools::ensure(pier_testkit::tools::CHROMIUM).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_walkthroughs_trace_page_loads_in_chromium_and_steps_through_the_rings() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("walk.jsonl");
    let records = walk_trace(&trace);
    let page = dir.path().join("walk.html");
    let out = pier().arg("trace").arg(&trace).arg("--html").arg(&page).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("src=\"http") && !html.contains("<link"), "the page fetches nothing");

    // Step 40 of the page, as the browser has it once the script ran.
    // `selftest` also steps to the end, back to the start and to 40 again.
    let url = format!("file://{}#step=40&selftest", page.display());
    let out = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"])
        .arg("--user-data-dir=".to_string() + dir.path().join("profile").to_str().unwrap())
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains(&format!("data-steps=\"{records}\"")), "{dom}");
    assert!(dom.contains("<span id=\"at\">40</span>"), "the page went to step 40:\n{dom}");
    assert!(dom.contains("data-selftest=\"ok\""), "stepping back did not undo:\n{dom}");
    // The rings are drawn: each queue's descriptor table, both rings.
    for queue in ["rx (queue 0)", "tx (queue 1)", "event (queue 2)"] {
        assert!(dom.contains(queue), "{queue} missing:\n{dom}");
    }
    assert!(dom.contains("<th>desc</th>") && dom.contains("<th>avail</th>"), "{dom}");
    assert!(dom.contains("virtio 1.2 §"), "each step names its spec section:\n{dom}");
    // The packet list links each packet to its step.
    assert!(dom.contains("id=\"packet-"), "{dom}");
}
