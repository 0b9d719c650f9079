//! `pier trace FILE [--pcap PCAP] [--html OUT]`: a ring trace
//! (`--ring-trace`) read back, step by step, with the rings after each.
//!
//! As text it prints each record the way the virtqueue walkthrough prints
//! its steps: what happened, the virtio 1.2 section that governs it, the
//! packet it carried (and its frame in the pcap, given one), and the queue
//! as it stood after it. `--html` writes one self-contained page (inline
//! script and style, nothing fetched) that draws each queue's descriptor
//! table and both rings after each step, stepped with buttons or the
//! arrow keys. The page embeds each step once, as what it changed, and
//! rebuilds the rings as it steps, so its size grows with the trace and
//! not with the trace times the rings.
//!
//! The reading, the replay and the words are pier-device's
//! (`ring_trace::read`); a file that is not a whole trace is an error
//! naming the line.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pier_device::ring_trace::read::{self, Event, QueueState, Rings, Trace};
use pier_device::ring_trace::view::{packet_text, wrapped};
use serde_json::{Value, json};

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The ring trace (`pier run|boot|vhost-user --ring-trace FILE`).
    file: PathBuf,
    /// The packet capture of the same run (`--pcap`): each packet is named
    /// by its frame number there, as Wireshark numbers them.
    #[arg(long, value_name = "PCAP")]
    pcap: Option<PathBuf>,
    /// Write the steps as one self-contained HTML page to OUT instead.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    /// Print only the first N steps (with --last, the first and the last).
    #[arg(long, value_name = "N")]
    first: Option<usize>,
    /// Print only the last N steps.
    #[arg(long, value_name = "N")]
    last: Option<usize>,
}

pub fn run(args: &TraceArgs) -> Result<i32> {
    let text = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let text = String::from_utf8(text).map_err(|e| {
        anyhow::anyhow!("{}: not a ring trace: not UTF-8 text ({e})", args.file.display())
    })?;
    let trace = read::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let frames = match &args.pcap {
        None => vec![None; trace.records.len()],
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let headers = read::pcap_frames(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            read::match_frames(&trace, &headers)
        }
    };
    match &args.html {
        Some(out) => {
            if args.first.is_some() || args.last.is_some() {
                bail!("--first and --last choose text lines; the page holds every step");
            }
            let page = html_page(&trace, &frames, &args.file.display().to_string());
            std::fs::write(out, &page)
                .with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "pier: {} steps of {} written to {} ({} bytes)",
                trace.records.len(),
                args.file.display(),
                out.display(),
                page.len()
            );
        }
        None => print_text(&trace, &frames, args.first, args.last),
    }
    if trace.missing > 0 {
        eprintln!(
            "pier: {} records missing from the trace (the device dropped them: its queue was full)",
            trace.missing
        );
    }
    Ok(0)
}

/// Whether step `i` of `n` is printed, given `--first` and `--last`.
fn shown(i: usize, n: usize, first: Option<usize>, last: Option<usize>) -> bool {
    match (first, last) {
        (None, None) => true,
        (f, l) => f.is_some_and(|f| i < f) || l.is_some_and(|l| i + l >= n),
    }
}

fn print_text(trace: &Trace, frames: &[Option<usize>], first: Option<usize>, last: Option<usize>) {
    use std::io::Write as _;
    let mut rings = Rings::default();
    let n = trace.records.len();
    let mut out = std::io::stdout().lock();
    let mut skipped = 0usize;
    for (i, record) in trace.records.iter().enumerate() {
        let described = read::describe(&record.event, &rings);
        rings.apply(&record.event);
        if !shown(i, n, first, last) {
            skipped += 1;
            continue;
        }
        let mut text = String::new();
        if skipped > 0 {
            let _ = writeln!(text, "\n... {skipped} steps not shown ...");
            skipped = 0;
        }
        let gap = if i == 0 { "" } else { "\n" };
        let title = format!("[{:.3} ms] {}", record.t_us as f64 / 1000.0, described.title);
        let _ = write!(text, "{gap}{:>2}. {}", i + 1, wrapped("    ", &title).trim_start());
        text.push_str(&wrapped("  spec: ", described.spec));
        for note in &described.notes {
            text.push_str(&wrapped("  ", note));
        }
        if let Some(packet) = &described.packet {
            let frame = frames[i].map(|f| format!(" (pcap frame {f})")).unwrap_or_default();
            text.push_str(&wrapped("  packet: ", &format!("{packet}{frame}")));
        }
        if let Some(q) =
            record.event.queue().filter(|_| !matches!(record.event, Event::Kick { .. }))
        {
            let _ = write!(text, "{}", rings.view(q));
        }
        if out.write_all(text.as_bytes()).is_err() {
            // The reader went away (a pager quit): nothing more to print.
            return;
        }
    }
}

/// What changed in queue `q` from `before` to `after`, as the page's
/// script applies it: `[field, index, value]` triples (index -1 for a
/// queue-wide field).
fn changes(before: &QueueState, after: &QueueState) -> Vec<Value> {
    let mut out = Vec::new();
    if before.live != after.live
        || before.size != after.size
        || before.desc_table != after.desc_table
    {
        out.push(json!([
            "setup",
            -1,
            [
                after.live,
                after.size,
                after.desc_table,
                after.avail_ring,
                after.used_ring,
                after.event_idx
            ]
        ]));
    }
    let scalars = [
        ("avail_idx", before.avail_idx, after.avail_idx),
        ("avail_seen", before.avail_seen, after.avail_seen),
        ("used_idx", before.used_idx, after.used_idx),
        ("next_avail", before.next_avail, after.next_avail),
        ("used_event", before.used_event, after.used_event),
        ("avail_event", before.avail_event, after.avail_event),
        ("used_flags", before.used_flags, after.used_flags),
        ("avail_flags", before.avail_flags, after.avail_flags),
    ];
    for (name, old, new) in scalars {
        if old != new {
            out.push(json!([name, -1, new]));
        }
    }
    for (i, d) in after.descs.iter().enumerate() {
        if before.descs.get(i) != Some(d) {
            out.push(json!(["desc", i, [d.addr, d.len, d.flags, d.next]]));
        }
    }
    for (i, head) in after.avail.iter().enumerate() {
        if before.avail.get(i) != Some(head) {
            out.push(json!(["avail", i, head]));
        }
    }
    for (i, used) in after.used.iter().enumerate() {
        if before.used.get(i) != Some(used) {
            out.push(json!(["used", i, [used.0, used.1]]));
        }
    }
    for (i, packet) in after.packets.iter().enumerate() {
        if before.packets.get(i) != Some(packet) {
            out.push(json!(["packet", i, packet.as_ref().and_then(packet_text)]));
        }
    }
    out
}

/// Adds the cells `event` wrote but left at the value they had (an
/// avail entry naming head 0 over a slot that held 0, say), so that the
/// page outlines every cell a step names, not only those whose value
/// moved. Setting a cell to the value it has changes nothing on the page.
fn touched(event: &Event, after: &QueueState, delta: &mut Vec<Value>) {
    let size = after.size.max(1);
    let mut cells: Vec<(&str, usize)> = Vec::new();
    match event {
        Event::Avail { pos, descs, .. } => {
            cells.push(("avail", usize::from(pos % size)));
            cells.extend(descs.iter().map(|d| ("desc", usize::from(d.index))));
        }
        Event::Used { idx, .. } => cells.push(("used", usize::from(idx.wrapping_sub(1) % size))),
        _ => {}
    }
    for (field, index) in cells {
        let named = |v: &Value| v[0] == field && v[1] == index;
        if delta.iter().any(named) {
            continue;
        }
        let value = match field {
            "avail" => after.avail.get(index).map(|h| json!(h)),
            "used" => after.used.get(index).map(|u| json!([u.0, u.1])),
            _ => after.descs.get(index).map(|d| json!([d.addr, d.len, d.flags, d.next])),
        };
        if let Some(value) = value {
            delta.push(json!([field, index, value]));
        }
    }
}

/// The page: the template with the trace's steps in it.
fn html_page(trace: &Trace, frames: &[Option<usize>], name: &str) -> String {
    let mut rings = Rings::default();
    let mut steps = Vec::with_capacity(trace.records.len());
    // Each spec section is written once; steps name it by its place.
    let mut sections: Vec<&str> = Vec::new();
    for (i, record) in trace.records.iter().enumerate() {
        let described = read::describe(&record.event, &rings);
        let q = record.event.queue();
        let before = q.map(|q| rings.state(q).clone());
        rings.apply(&record.event);
        let delta = match (q, &before) {
            (Some(q), Some(before)) => {
                let mut delta = changes(before, rings.state(q));
                touched(&record.event, rings.state(q), &mut delta);
                delta
            }
            _ => Vec::new(),
        };
        let section = match sections.iter().position(|&s| s == described.spec) {
            Some(known) => known,
            None => {
                sections.push(described.spec);
                sections.len() - 1
            }
        };
        steps.push(json!([
            q.map_or(-1, |q| q as i64),
            described.title,
            section,
            described.notes.join("\n"),
            described.packet,
            frames[i],
            record.t_us,
            delta
        ]));
    }
    let data =
        json!({ "name": name, "missing": trace.missing, "sections": sections, "steps": steps });
    // Inside a <script>, "</" could end it early.
    let data = data.to_string().replace("</", "<\\/");
    PAGE.replace("/*TRACE_DATA*/null", &data)
}

const PAGE: &str = include_str!("trace_page.html");
