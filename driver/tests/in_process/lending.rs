//! Receive buffers lent to the stack: stream payloads are read where they
//! arrived, every held buffer comes back once read (or once its socket
//! closes), and an application that does not read holds no more than the
//! driver can spare, so other connections go on.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::SocketType;

use crate::common::*;

/// Stream bytes: a counter modulo a prime, so a lost, repeated or
/// reordered byte shows.
fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Rounds of driver poll and device round, without reading.
fn run_unread(bed: &mut Testbed, rounds: usize) {
    for _ in 0..rounds {
        poll(bed);
        device_round(bed);
    }
}

#[test]
fn held_payloads_arrive_intact_and_every_buffer_comes_back() {
    let mut bed = Testbed::new(VsockConfig::default(), DriverConfig::default()).unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 80);
    let data = data(8 << 20);
    let got = stream_to_guest(&mut bed, (c, s), &data, |bed| {
        poll(bed);
        device_round(bed);
    });
    assert!(got == data, "{} of {} bytes arrived intact", got.len(), data.len());
    let held = bed.guest.stats().rx_bytes_held;
    assert!(held > data.len() as u64 / 2, "only {held} bytes were read in place");
    assert!(bed.driver.stats().rx_buffers_held > 0);
    poll(&mut bed);
    assert_eq!(bed.driver.rx_held(), 0, "every buffer read to its end is posted again");
}

#[test]
fn an_unread_connection_holds_at_most_what_the_driver_spares_and_others_go_on() {
    let mut bed = Testbed::new(VsockConfig::default(), DriverConfig::default()).unwrap();
    let (idle_guest, idle_host) = bed.connect(SocketType::Stream, 80);
    let (busy_guest, busy_host) = bed.connect(SocketType::Stream, 81);
    // The idle side's whole credit, in 16 KiB writes: more packets than
    // the driver can spare buffers for, none read.
    let idle_data = data(256 << 10);
    let mut sent = 0;
    while sent < idle_data.len() {
        let n = bed.host.stack().send(idle_host, &idle_data[sent..sent + 16384]).unwrap_or(0);
        sent += n;
        run_unread(&mut bed, 1);
        if n == 0 {
            break;
        }
    }
    run_unread(&mut bed, 8);
    let credit = bed.guest.config().buffer_size as usize;
    assert_eq!(sent, credit, "the host sent the whole credit");
    assert_eq!(
        bed.host.stack().send_space(idle_host),
        Ok(0),
        "held bytes count as queued: no credit comes back while they are unread"
    );
    let held = bed.driver.rx_held();
    assert!(held > 0, "the idle connection holds buffers");
    assert_eq!(held, bed.driver.max_lent(), "it holds all the driver spares, and no more");
    // The busy connection still gets its bytes, through the buffers left.
    let busy_data = data(1 << 20);
    let got = stream_to_guest(&mut bed, (busy_guest, busy_host), &busy_data, |bed| {
        poll(bed);
        device_round(bed);
    });
    assert!(got == busy_data, "{} of {} bytes reached the busy connection", got.len(), 1 << 20);
    // The idle connection's bytes, held and copied, read in order at last.
    let mut idle_got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(info) = bed.guest.recv(idle_guest, &mut buf) {
        if info.len == 0 {
            break;
        }
        idle_got.extend_from_slice(&buf[..info.len]);
    }
    assert!(idle_got == idle_data[..sent], "{} of {sent} idle bytes read intact", idle_got.len());
    poll(&mut bed);
    assert_eq!(bed.driver.rx_held(), 0);
    device_round(&mut bed);
    // The whole credit of the buffer as it is now: a reader that drained
    // its queue has had its buffer grown (autotuning), never shrunk.
    let buffer_now = bed.guest.buffer_size(idle_guest).unwrap() as usize;
    assert!(buffer_now >= credit);
    assert_eq!(
        bed.host.stack().send_space(idle_host),
        Ok(buffer_now),
        "reading them gave the whole credit back"
    );
}

#[test]
fn closing_a_socket_with_held_payloads_gives_their_buffers_back() {
    let mut bed = Testbed::new(VsockConfig::default(), DriverConfig::default()).unwrap();
    let (c, s) = bed.connect(SocketType::Stream, 80);
    let chunk = data(16 << 10);
    for _ in 0..4 {
        bed.host.stack().send(s, &chunk).unwrap();
        run_unread(&mut bed, 2);
    }
    assert!(bed.driver.rx_held() > 0, "the unread payloads are held");
    let now = bed.now();
    bed.guest.close(c, now).unwrap();
    poll(&mut bed);
    assert_eq!(bed.driver.rx_held(), 0, "a closed socket's buffers are posted again");
}
