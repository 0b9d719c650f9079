//! The pcap encoding, byte by byte, against Linux's `struct
//! af_vsockmon_hdr` and the op groups of `virtio_transport_build_skb`, and
//! the writer as loopback middleware recording a whole connection.
//! (tshark decoding these files is checked by pier-device's
//! `tests/capture.rs`, where the device writes them.)

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use pier_stack::phy::{
    DEFAULT_SNAPLEN, FILE_HEADER_LEN, LINKTYPE_VSOCK, MIN_SNAPLEN, MonitorOp, PcapWriter,
    RECORD_HEADER_LEN, Side, VSOCKMON_HEADER_LEN, file_header, vsockmon_header,
};
use pier_stack::wire::{HEADER_LEN, Op, RawHeader, SocketType, shutdown_flags};
use pier_stack::{Instant, Shutdown, VsockAddr};

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn rw(len: u32) -> RawHeader {
    RawHeader {
        src_cid: 3,
        dst_cid: 2,
        src_port: 0xdead_beef,
        dst_port: 1234,
        len,
        type_: SocketType::Stream as u16,
        op: Op::Rw as u16,
        flags: 0,
        buf_alloc: 262_144,
        fwd_cnt: 7,
    }
}

#[test]
fn monitor_ops_group_virtio_ops_as_linux_does() {
    let expected = [
        (0, MonitorOp::Unknown),    // INVALID
        (1, MonitorOp::Connect),    // REQUEST
        (2, MonitorOp::Connect),    // RESPONSE
        (3, MonitorOp::Disconnect), // RST
        (4, MonitorOp::Disconnect), // SHUTDOWN
        (5, MonitorOp::Payload),    // RW
        (6, MonitorOp::Control),    // CREDIT_UPDATE
        (7, MonitorOp::Control),    // CREDIT_REQUEST
        (8, MonitorOp::Unknown),
        (u16::MAX, MonitorOp::Unknown),
    ];
    for (virtio, monitor) in expected {
        assert_eq!(MonitorOp::from_virtio(virtio), monitor, "virtio op {virtio}");
    }
    // The values of `enum af_vsockmon_op`.
    let values = [MonitorOp::Unknown, MonitorOp::Connect, MonitorOp::Disconnect];
    assert_eq!(values.map(|op| op as u16), [0, 1, 2]);
    assert_eq!([MonitorOp::Control as u16, MonitorOp::Payload as u16], [3, 4]);
}

#[test]
fn vsockmon_header_matches_the_kernel_layout() {
    let h = vsockmon_header(&rw(5));
    assert_eq!(h.len(), 32, "sizeof(struct af_vsockmon_hdr)");
    assert_eq!(u64_at(&h, 0), 3, "src_cid");
    assert_eq!(u64_at(&h, 8), 2, "dst_cid");
    assert_eq!(u32_at(&h, 16), 0xdead_beef, "src_port");
    assert_eq!(u32_at(&h, 20), 1234, "dst_port");
    assert_eq!(u16_at(&h, 24), 4, "op: AF_VSOCK_OP_PAYLOAD");
    assert_eq!(u16_at(&h, 26), 2, "transport: AF_VSOCK_TRANSPORT_VIRTIO");
    assert_eq!(u16_at(&h, 28), 44, "len: the virtio header that follows");
    assert_eq!(&h[30..32], &[0, 0], "reserved");
}

#[test]
fn file_header_names_link_type_271() {
    let h = file_header(65_536);
    assert_eq!(h.len(), FILE_HEADER_LEN);
    assert_eq!(&h[0..4], &[0xd4, 0xc3, 0xb2, 0xa1], "microsecond magic, little-endian");
    assert_eq!((u16_at(&h, 4), u16_at(&h, 6)), (2, 4), "version 2.4");
    assert_eq!(&h[8..16], &[0; 8], "thiszone, sigfigs");
    assert_eq!(u32_at(&h, 16), 65_536, "snaplen");
    assert_eq!(u32_at(&h, 20), 271);
    assert_eq!(LINKTYPE_VSOCK, 271);
}

#[test]
fn a_record_is_both_headers_then_the_payload_up_to_the_snap_length() {
    let payload: Vec<u8> = (0..100).collect();
    let mut writer = PcapWriter::new(Vec::new(), MIN_SNAPLEN + 10);
    let at = Instant::from_micros(1_700_000_123_456_789);
    assert!(writer.packet(at, &rw(100), &payload));
    let file = writer.into_sink();
    assert_eq!(u32_at(&file, 16), MIN_SNAPLEN + 10);
    let rec = &file[FILE_HEADER_LEN..];
    assert_eq!(u32_at(rec, 0), 1_700_000_123, "seconds");
    assert_eq!(u32_at(rec, 4), 456_789, "microseconds");
    assert_eq!(u32_at(rec, 8), 32 + 44 + 10, "captured: cut at the snap length");
    assert_eq!(u32_at(rec, 12), 32 + 44 + 100, "original length");
    let body = &rec[RECORD_HEADER_LEN..];
    assert_eq!(body.len(), 32 + 44 + 10, "nothing past the captured bytes");
    assert_eq!(&body[..VSOCKMON_HEADER_LEN], &vsockmon_header(&rw(100)));
    assert_eq!(&body[32..32 + HEADER_LEN], &rw(100).encode());
    assert_eq!(&body[76..], &payload[..10]);
}

#[test]
fn a_snap_length_below_the_headers_still_keeps_them() {
    let writer = PcapWriter::new(Vec::new(), 1);
    assert_eq!(writer.snaplen(), MIN_SNAPLEN);
    assert_eq!(u32_at(writer.sink(), 16), MIN_SNAPLEN);
}

/// (monitor op, virtio op, src port, dst port, virtio len, payload) of
/// every record in a capture.
fn records(file: &[u8]) -> Vec<(u16, u16, u32, u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = FILE_HEADER_LEN;
    while at < file.len() {
        let captured = u32_at(file, at + 8) as usize;
        let body = &file[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + captured];
        let virtio = RawHeader::parse(&body[VSOCKMON_HEADER_LEN..]).unwrap();
        out.push((
            u16_at(body, 24),
            virtio.op,
            u32_at(body, 16),
            u32_at(body, 20),
            virtio.len,
            body[VSOCKMON_HEADER_LEN + HEADER_LEN..].to_vec(),
        ));
        at += RECORD_HEADER_LEN + captured;
    }
    out
}

#[test]
fn the_loopback_records_a_half_closed_connection_and_a_refusal() {
    let file = Rc::new(RefCell::new(Vec::new()));
    let mut lb = pair();
    lb.add_middleware(PcapWriter::new(file.clone(), DEFAULT_SNAPLEN));

    // Nobody listens on 4321: REQUEST, then RST.
    let to = VsockAddr::new(HOST, 4321);
    let (refused, outcome) = try_connect(&mut lb, Side::A, SocketType::Stream, to);
    assert!(outcome.is_err());
    let refused_port = lb.a.local_addr(refused).unwrap().port;

    // A connection whose client half-closes after 5 bytes.
    let (client, _server) = connected(&mut lb, SocketType::Stream, 1234);
    let client_port = lb.a.local_addr(client).unwrap().port;
    lb.a.send(client, b"hello").unwrap();
    lb.a.shutdown(client, Shutdown::Write).unwrap();
    lb.run();

    let expected = vec![
        (1, Op::Request as u16, refused_port, 4321, 0, vec![]),
        (2, Op::Rst as u16, 4321, refused_port, 0, vec![]),
        (1, Op::Request as u16, client_port, 1234, 0, vec![]),
        (1, Op::Response as u16, 1234, client_port, 0, vec![]),
        (4, Op::Rw as u16, client_port, 1234, 5, b"hello".to_vec()),
        (2, Op::Shutdown as u16, client_port, 1234, 0, vec![]),
    ];
    assert_eq!(records(&file.borrow()), expected);
    // The flags of the half-close travel in the virtio header.
    let tail = file.borrow().len() - HEADER_LEN;
    let last = RawHeader::parse(&file.borrow()[tail..]).unwrap();
    assert_eq!(last.flags, shutdown_flags::SEND);
}
