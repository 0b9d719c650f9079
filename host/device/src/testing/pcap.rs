//! Reading a capture back the way its users will: through tshark, whose
//! vsock dissector is the reason the format is vsockmon's. Tests compare
//! what tshark decoded with what they made happen.
//!
//! tshark is required, never optional: the tests get its path from
//! pier-testkit's `tools::ensure`, which installs it when it is missing
//! or fails naming the command that would, so a machine that lacks it
//! fails the test instead of passing it unchecked.

use std::path::Path;
use std::process::Command;

/// One packet as tshark's `vsock` dissector decoded it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes on the wire: vsockmon header, virtio header, whole payload.
    pub frame_len: u32,
    /// Bytes in the file (the snap length cut the rest).
    pub captured_len: u32,
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    /// `af_vsockmon_hdr.op`: 1 connect, 2 disconnect, 3 control, 4 payload.
    pub monitor_op: u16,
    /// `af_vsockmon_hdr.transport`: 2 for virtio.
    pub transport: u16,
    /// `af_vsockmon_hdr.len`: the virtio header's size.
    pub transport_len: u16,
    pub virtio_type: u16,
    pub virtio_op: u16,
    pub virtio_len: u32,
    pub virtio_flags: u32,
    /// The payload bytes in the file.
    pub payload: Vec<u8>,
    /// tshark's one-line summary of the packet in `-V` output, such as
    /// `vSocket, Op: Connect, Transport: Virtio`.
    pub summary: String,
}

const FIELDS: [&str; 14] = [
    "frame.len",
    "frame.cap_len",
    "vsock.src_cid",
    "vsock.dst_cid",
    "vsock.src_port",
    "vsock.dst_port",
    "vsock.op",
    "vsock.trans",
    "vsock.trans_len",
    "vsock.virtio.type",
    "vsock.virtio.op",
    "vsock.virtio.len",
    "vsock.virtio.flags",
    "vsock.payload",
];

fn tshark(program: &Path, path: &Path, args: &[&str]) -> String {
    let output = Command::new(program).arg("-r").arg(path).args(args).output();
    let output = match output {
        Ok(output) => output,
        Err(e) => panic!("running {} failed: {e}", program.display()),
    };
    assert!(
        output.status.success(),
        "tshark could not read {}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("tshark prints UTF-8")
}

fn number<T: TryFrom<u64>>(text: &str) -> T {
    let value = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    let value = value.unwrap_or_else(|e| panic!("tshark printed {text:?}, not a number: {e}"));
    T::try_from(value).unwrap_or_else(|_| panic!("{value} out of range"))
}

fn hex(text: &str) -> Vec<u8> {
    // Newer tshark versions separate bytes with ':'.
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Every packet of the pcap file at `path`, as the tshark at `program`
/// decodes it (both its field values and its verbose `-V` summary lines).
pub fn decode(program: &Path, path: &Path) -> Vec<Decoded> {
    let mut args = vec!["-T", "fields", "-E", "separator=/t"];
    for field in FIELDS {
        args.extend(["-e", field]);
    }
    let fields = tshark(program, path, &args);
    let verbose = tshark(program, path, &["-V"]);
    let summaries: Vec<&str> = verbose.lines().filter(|l| l.starts_with("vSocket")).collect();
    let rows: Vec<&str> = fields.lines().collect();
    assert_eq!(
        summaries.len(),
        rows.len(),
        "tshark decoded {} packets as vsock out of {}:\n{verbose}",
        summaries.len(),
        rows.len()
    );
    rows.iter()
        .zip(summaries)
        .map(|(row, summary)| {
            let f: Vec<&str> = row.split('\t').collect();
            assert_eq!(f.len(), FIELDS.len(), "tshark row {row:?}");
            Decoded {
                frame_len: number(f[0]),
                captured_len: number(f[1]),
                src_cid: number(f[2]),
                dst_cid: number(f[3]),
                src_port: number(f[4]),
                dst_port: number(f[5]),
                monitor_op: number(f[6]),
                transport: number(f[7]),
                transport_len: number(f[8]),
                virtio_type: number(f[9]),
                virtio_op: number(f[10]),
                virtio_len: number(f[11]),
                virtio_flags: number(f[12]),
                payload: hex(f[13]),
                summary: summary.to_owned(),
            }
        })
        .collect()
}
