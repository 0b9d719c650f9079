//! Stream bytes sent straight into tx buffers (`VsockDriver::send_in_place`):
//! they arrive intact and in order, never pass through the socket's send
//! buffer while tx buffers are free, and what cannot go in place (no free
//! buffer, a small write) queues behind as with `Stack::send`.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::{DriverConfig, MIN_SEND_IN_PLACE};
use pier_stack::SocketType;

use crate::common::*;

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Sends `data` from the guest with `send_in_place`, `write` bytes at a
/// time at most, moving packets
/// between calls; returns what the host read and the most bytes that
/// waited in the guest socket's send buffer.
fn send_all(bed: &mut Testbed, data: &[u8], write: usize) -> (Vec<u8>, usize) {
    let (c, s) = bed.connect(SocketType::Stream, 80);
    let (mut sent, mut got, mut queued_max) = (0, Vec::new(), 0);
    let mut buf = vec![0u8; 65536];
    for _ in 0..100_000 {
        if sent < data.len() {
            let testbed = &mut **bed;
            let end = data.len().min(sent.saturating_add(write));
            sent +=
                testbed.driver.send_in_place(&mut testbed.guest, c, &data[sent..end]).unwrap_or(0);
            queued_max = queued_max.max(bed.guest.unsent_bytes());
        }
        device_round(bed);
        poll(bed);
        while let Ok(info) = bed.host.stack().recv(s, &mut buf) {
            got.extend_from_slice(&buf[..info.len]);
        }
        if got.len() >= data.len() {
            break;
        }
    }
    (got, queued_max)
}

#[test]
fn bytes_sent_in_place_arrive_intact_without_the_send_buffer() {
    let mut bed = Testbed::new(VsockConfig::default(), DriverConfig::default()).unwrap();
    let data = data(8 << 20);
    let (got, queued_max) = send_all(&mut bed, &data, usize::MAX);
    assert!(got == data, "{} of {} bytes arrived intact", got.len(), data.len());
    assert_eq!(queued_max, 0, "with tx buffers free nothing waited in the send buffer");
}

#[test]
fn without_a_free_tx_buffer_bytes_queue_behind_in_order() {
    let config = DriverConfig { tx_buffers: 1, ..DriverConfig::default() };
    let mut bed = Testbed::new(VsockConfig::default(), config).unwrap();
    let data = data(4 << 20);
    let (got, queued_max) = send_all(&mut bed, &data, usize::MAX);
    assert!(got == data, "{} of {} bytes arrived intact", got.len(), data.len());
    assert!(queued_max > 0, "with one tx buffer some bytes had to queue");
}

#[test]
fn small_writes_go_through_the_send_buffer() {
    let mut bed = Testbed::new(VsockConfig::default(), DriverConfig::default()).unwrap();
    let data = data(1 << 20);
    let (got, queued_max) = send_all(&mut bed, &data, MIN_SEND_IN_PLACE - 1);
    assert!(got == data, "{} of {} bytes arrived intact", got.len(), data.len());
    assert!(queued_max > 0, "small writes waited in the send buffer");
}
