//! Chains no honest driver writes. Every one must produce an error (or a
//! well-defined outcome), never a panic, and must not wedge the queue.

use pier_device::QueueError;
use pier_device::device::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE, features as fb};
use pier_device::queues::TxLending;
use pier_stack::wire::HEADER_LEN;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::common::*;

const MEM: usize = 4 << 20;

fn feats() -> u64 {
    fb::VERSION_1 | fb::EVENT_IDX | fb::STREAM
}

/// Writes a good one-descriptor TX packet at `addr` into descriptor `i`.
fn good_tx(d: &mut RawDevice, i: u16, addr: u64, len: usize) -> Vec<u8> {
    let mut pkt = header(len as u32, 5).to_vec();
    pkt.extend(payload(len, i as u8));
    d.mem.write_slice(&pkt, GuestAddress(addr)).unwrap();
    d.queues[TX_QUEUE].set_desc(i, addr, pkt.len() as u32, 0, 0);
    d.queues[TX_QUEUE].publish(i);
    pkt
}

/// Pops one TX chain, returning the packet bytes or the error.
fn pop(d: &mut RawDevice) -> Option<Result<Vec<u8>, QueueError>> {
    let mem = d.mem.clone();
    let q = d.dev.queue_mut(TX_QUEUE).unwrap();
    match q.pop_tx(&*mem) {
        Ok(Some(p)) => {
            let mut v = p.header.to_vec();
            v.extend(p.payload.to_vec());
            Some(Ok(v))
        }
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

/// After a bad chain, the queue still carries a good packet.
fn still_works(d: &mut RawDevice, desc: u16) {
    let pkt = good_tx(d, desc, DATA + 0x8000, 33);
    assert_eq!(pop(d), Some(Ok(pkt)));
    assert_eq!(pop(d), None);
}

#[test]
fn descriptor_outside_memory_is_rejected_and_returned() {
    let mut d = raw_device(feats(), 16, MEM);
    let tx = &mut d.queues[TX_QUEUE];
    // Straddles the end of memory.
    tx.set_desc(0, MEM as u64 - 10, 100, 0, 0);
    tx.publish(0);
    // Entirely outside, at an address whose end overflows u64.
    tx.set_desc(1, u64::MAX - 4, 64, 0, 0);
    tx.publish(1);
    assert_eq!(pop(&mut d), Some(Err(QueueError::BadAddress { addr: MEM as u64 - 10, len: 100 })));
    assert!(matches!(pop(&mut d), Some(Err(QueueError::BadAddress { .. }))));
    // Both chains went back to the driver with used length 0.
    let tx = &d.queues[TX_QUEUE];
    assert_eq!(tx.used_idx(), 2);
    assert_eq!(tx.used_elem(0), (0, 0));
    assert_eq!(tx.used_elem(1), (1, 0));
    still_works(&mut d, 2);
}

#[test]
fn descriptor_loops_are_bounded() {
    let mut d = raw_device(feats(), 16, MEM);
    let tx = &mut d.queues[TX_QUEUE];
    tx.set_desc(0, DATA, 8, F_NEXT, 1);
    tx.set_desc(1, DATA, 8, F_NEXT, 0);
    tx.publish(0);
    tx.set_desc(2, DATA, 8, F_NEXT, 2); // self-loop
    tx.publish(2);
    assert_eq!(pop(&mut d), Some(Err(QueueError::ChainTooLong)));
    assert_eq!(pop(&mut d), Some(Err(QueueError::ChainTooLong)));
    still_works(&mut d, 3);
}

#[test]
fn descriptor_indices_out_of_range() {
    let mut d = raw_device(feats(), 16, MEM);
    let tx = &mut d.queues[TX_QUEUE];
    tx.set_desc(0, DATA, 8, F_NEXT, 40);
    tx.publish(0);
    tx.publish(999); // head outside the table
    assert_eq!(pop(&mut d), Some(Err(QueueError::DescriptorIndex(40))));
    assert_eq!(pop(&mut d), Some(Err(QueueError::DescriptorIndex(999))));
    // Only the chain with a valid head can be returned.
    assert_eq!(d.queues[TX_QUEUE].used_idx(), 1);
    still_works(&mut d, 1);
}

#[test]
fn chain_length_overflowing_u32_is_rejected() {
    // 17 descriptors of 256 MiB over the same (lazily mapped) memory add up
    // to more than 4 GiB.
    let big: u32 = 0x1000_0000;
    let mut d = raw_device(feats(), 32, big as usize + MEM);
    let tx = &mut d.queues[TX_QUEUE];
    for i in 0..17u16 {
        let last = i == 16;
        tx.set_desc(i, 0, big, if last { 0 } else { F_NEXT }, i + 1);
    }
    tx.publish(0);
    assert_eq!(pop(&mut d), Some(Err(QueueError::LengthOverflow)));
    still_works(&mut d, 20);
}

#[test]
fn tx_lengths_are_validated() {
    let mut d = raw_device(feats(), 16, MEM);
    // Shorter than a header.
    d.queues[TX_QUEUE].set_desc(0, DATA, 43, 0, 0);
    d.queues[TX_QUEUE].publish(0);
    assert_eq!(pop(&mut d), Some(Err(QueueError::ShortHeader(43))));

    // Header says 100 bytes, chain carries 20.
    d.mem.write_slice(&header(100, 5), GuestAddress(DATA)).unwrap();
    d.queues[TX_QUEUE].set_desc(1, DATA, (HEADER_LEN + 20) as u32, 0, 0);
    d.queues[TX_QUEUE].publish(1);
    assert_eq!(pop(&mut d), Some(Err(QueueError::Truncated { declared: 100, available: 20 })));

    // Header says 4 GiB - 1 (the device caps payloads at 8 KiB here).
    d.mem.write_slice(&header(u32::MAX, 5), GuestAddress(DATA)).unwrap();
    d.queues[TX_QUEUE].set_desc(2, DATA, HEADER_LEN as u32, 0, 0);
    d.queues[TX_QUEUE].publish(2);
    assert_eq!(pop(&mut d), Some(Err(QueueError::PayloadTooLong { len: u32::MAX, max: 8192 })));

    // Bytes beyond `len` are not payload.
    d.mem.write_slice(&header(5, 5), GuestAddress(DATA)).unwrap();
    d.queues[TX_QUEUE].set_desc(3, DATA, 4000, 0, 0);
    d.queues[TX_QUEUE].publish(3);
    let got = pop(&mut d).unwrap().unwrap();
    assert_eq!(got.len(), HEADER_LEN + 5);
    still_works(&mut d, 4);
}

#[test]
fn wrong_direction_descriptors() {
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[TX_QUEUE].set_desc(0, DATA, 64, F_WRITE, 0);
    d.queues[TX_QUEUE].publish(0);
    assert_eq!(pop(&mut d), Some(Err(QueueError::WrongDirection)));

    // A device-readable buffer in RX is returned unused.
    d.queues[RX_QUEUE].set_desc(0, DATA, 4096, 0, 0);
    d.queues[RX_QUEUE].publish(0);
    let r = d.dev.write_rx(&header(1, 5), &[1]);
    assert_eq!(r, Err(QueueError::WrongDirection));
    assert_eq!(d.queues[RX_QUEUE].used_elem(0), (0, 0));
}

#[test]
fn indirect_descriptors_only_when_negotiated() {
    // Not negotiated: rejected.
    let mut d = raw_device(feats(), 16, MEM);
    let table = DATA + 0x4000;
    let pkt_addr = DATA + 0x5000;
    let mut pkt = header(10, 5).to_vec();
    pkt.extend(payload(10, 3));
    d.mem.write_slice(&pkt, GuestAddress(pkt_addr)).unwrap();
    RawQueue::write_desc(&d.mem, table, pkt_addr, 20, F_NEXT, 1);
    RawQueue::write_desc(&d.mem, table + 16, pkt_addr + 20, pkt.len() as u32 - 20, 0, 0);
    d.queues[TX_QUEUE].set_desc(0, table, 32, F_INDIRECT, 0);
    d.queues[TX_QUEUE].publish(0);
    assert_eq!(pop(&mut d), Some(Err(QueueError::BadIndirect)));

    // Negotiated: the same chain parses, nesting and NEXT|INDIRECT do not.
    let mut d = raw_device(feats() | fb::INDIRECT_DESC, 16, MEM);
    d.mem.write_slice(&pkt, GuestAddress(pkt_addr)).unwrap();
    RawQueue::write_desc(&d.mem, table, pkt_addr, 20, F_NEXT, 1);
    RawQueue::write_desc(&d.mem, table + 16, pkt_addr + 20, pkt.len() as u32 - 20, 0, 0);
    d.queues[TX_QUEUE].set_desc(0, table, 32, F_INDIRECT, 0);
    d.queues[TX_QUEUE].publish(0);
    assert_eq!(pop(&mut d), Some(Ok(pkt)));

    let nested = DATA + 0x6000;
    RawQueue::write_desc(&d.mem, nested, table, 32, F_INDIRECT, 0);
    d.queues[TX_QUEUE].set_desc(1, nested, 16, F_INDIRECT, 0);
    d.queues[TX_QUEUE].publish(1);
    assert_eq!(pop(&mut d), Some(Err(QueueError::BadIndirect)));
    d.queues[TX_QUEUE].set_desc(2, table, 32, F_INDIRECT | F_NEXT, 3);
    d.queues[TX_QUEUE].publish(2);
    assert_eq!(pop(&mut d), Some(Err(QueueError::BadIndirect)));
    d.queues[TX_QUEUE].set_desc(3, table, 24, F_INDIRECT, 0); // not a multiple of 16
    d.queues[TX_QUEUE].publish(3);
    assert_eq!(pop(&mut d), Some(Err(QueueError::BadIndirect)));
    still_works(&mut d, 5);
}

#[test]
fn available_index_running_ahead_is_fatal() {
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[TX_QUEUE].set_avail_idx(17);
    let err = d.dev.drain_tx(|_| panic!("no packet expected")).unwrap_err();
    assert_eq!(err, QueueError::AvailIndex);
    assert!(err.is_fatal());
    assert!(!d.dev.driver_ok(), "a fatal queue error sets NEEDS_RESET");
}

#[test]
fn rx_buffer_too_small_is_kept_for_a_smaller_packet() {
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[RX_QUEUE].set_desc(0, DATA, HEADER_LEN as u32, F_WRITE | F_NEXT, 1);
    d.queues[RX_QUEUE].set_desc(1, DATA + 0x1000, 100, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(0);
    let big = payload(500, 1);
    assert_eq!(
        d.dev.write_rx(&header(500, 5), &big),
        Err(QueueError::BufferTooSmall {
            needed: HEADER_LEN + 500,
            capacity: HEADER_LEN as u64 + 100
        })
    );
    assert_eq!(d.queues[RX_QUEUE].used_idx(), 0, "chain stays available");
    let small = payload(100, 2);
    assert_eq!(d.dev.write_rx(&header(100, 5), &small), Ok(Some((HEADER_LEN + 100) as u32)));
    assert_eq!(d.queues[RX_QUEUE].used_elem(0), (0, (HEADER_LEN + 100) as u32));
    let mut back = vec![0u8; 100];
    d.mem.read_slice(&mut back, GuestAddress(DATA + 0x1000)).unwrap();
    assert_eq!(back, small);
    assert_eq!(d.dev.write_rx(&header(1, 5), &[0]), Ok(None));

    // A chain too small for even a header can never be used: returned.
    d.queues[RX_QUEUE].set_desc(2, DATA, 10, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(2);
    assert!(matches!(d.dev.write_rx(&header(0, 5), &[]), Err(QueueError::BufferTooSmall { .. })));
    assert_eq!(d.queues[RX_QUEUE].used_elem(1), (2, 0));
}

/// Reads what `source` holds into the lent iovecs, as the bridge does
/// (`readv` straight into guest memory).
fn readv_into(
    source: &std::os::unix::net::UnixStream,
    iovecs: &[libc::iovec],
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `RxPayload::read_with` lends iovecs over mapped, writable
    // guest memory, valid while this closure runs.
    let n = unsafe { libc::readv(source.as_raw_fd(), iovecs.as_ptr(), iovecs.len() as i32) };
    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// A buffer lent in place gets the bytes a host read wrote into it right
/// after the header, even with the header split over two descriptors and
/// the payload over two more, and goes back with header and bytes as its
/// used length.
#[test]
fn an_rx_buffer_lent_in_place_takes_the_read_bytes_behind_the_header() {
    use std::io::Write;
    let mut d = raw_device(feats(), 16, MEM);
    d.queues[RX_QUEUE].set_desc(0, DATA, 30, F_WRITE | F_NEXT, 1);
    d.queues[RX_QUEUE].set_desc(1, DATA + 0x1000, 100, F_WRITE | F_NEXT, 2);
    d.queues[RX_QUEUE].set_desc(2, DATA + 0x2000, 50, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(0);
    let (mut writer, reader) = std::os::unix::net::UnixStream::pair().unwrap();
    let data = payload(120, 3);
    writer.write_all(&data).unwrap();
    let header = header(120, 5);
    let used = d.dev.fill_rx(|area| {
        assert_eq!(area.capacity(), 30 + 100 + 50 - HEADER_LEN, "all but the header's bytes");
        let n = area
            .read_with(120, |iovecs| {
                let lens: Vec<usize> = iovecs.iter().map(|v| v.iov_len).collect();
                assert_eq!(lens, [100 - (HEADER_LEN - 30), 120 - (100 - (HEADER_LEN - 30))]);
                readv_into(&reader, iovecs)
            })
            .unwrap();
        assert_eq!(n, 120);
        Some(header)
    });
    assert_eq!(used, Ok(Some((HEADER_LEN + 120) as u32)));
    assert_eq!(d.queues[RX_QUEUE].used_elem(0), (0, (HEADER_LEN + 120) as u32));
    let mut written = [0u8; 30 + 100 + 50];
    d.mem.read_slice(&mut written[..30], GuestAddress(DATA)).unwrap();
    d.mem.read_slice(&mut written[30..130], GuestAddress(DATA + 0x1000)).unwrap();
    d.mem.read_slice(&mut written[130..], GuestAddress(DATA + 0x2000)).unwrap();
    assert_eq!(&written[..HEADER_LEN], &header, "the header, across its two descriptors");
    assert_eq!(&written[HEADER_LEN..HEADER_LEN + 120], &data[..], "then the bytes read");
}

/// A lender that declines leaves the buffer for the next packet; with no
/// buffer the lender is not called; a buffer with no room past a header
/// is too small, kept if it holds a header (for a packet without
/// payload) and returned if it does not.
#[test]
fn an_rx_buffer_lent_in_place_and_declined_stays_for_the_next_packet() {
    let mut d = raw_device(feats(), 16, MEM);
    assert_eq!(d.dev.fill_rx(|_| panic!("no buffer is posted")), Ok(None));
    d.queues[RX_QUEUE].set_desc(0, DATA, 4096, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(0);
    assert_eq!(d.dev.fill_rx(|_| None), Ok(None));
    assert_eq!(d.queues[RX_QUEUE].used_idx(), 0, "the declined buffer stays available");
    assert_eq!(d.dev.write_rx(&header(1, 5), &[9]), Ok(Some(HEADER_LEN as u32 + 1)));
    assert_eq!(d.queues[RX_QUEUE].used_elem(0), (0, HEADER_LEN as u32 + 1));

    d.queues[RX_QUEUE].set_desc(1, DATA, HEADER_LEN as u32, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(1);
    assert!(matches!(
        d.dev.fill_rx(|_| panic!("no room for a byte")),
        Err(QueueError::BufferTooSmall { .. })
    ));
    assert_eq!(d.queues[RX_QUEUE].used_idx(), 1, "a header's worth is kept");
    assert!(d.dev.write_rx(&header(0, 5), &[]).unwrap().is_some());
    d.queues[RX_QUEUE].set_desc(2, DATA, 10, F_WRITE, 0);
    d.queues[RX_QUEUE].publish(2);
    assert!(matches!(d.dev.fill_rx(|_| None), Err(QueueError::BufferTooSmall { .. })));
    assert_eq!(d.queues[RX_QUEUE].used_elem(2), (2, 0), "less than a header goes back unused");
}

#[test]
fn event_queue_writes_exactly_one_le32() {
    let mut d = raw_device(feats(), 16, MEM);
    d.mem.write_slice(&[0xaa; 8], GuestAddress(DATA)).unwrap();
    d.queues[EVENT_QUEUE].set_desc(0, DATA, 2, F_WRITE | F_NEXT, 1);
    d.queues[EVENT_QUEUE].set_desc(1, DATA + 2, 6, F_WRITE, 0);
    d.queues[EVENT_QUEUE].publish(0);
    assert_eq!(d.dev.post_event(0x0102_0304), Ok(true));
    assert_eq!(d.queues[EVENT_QUEUE].used_elem(0), (0, 4));
    let mut back = [0u8; 8];
    d.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert_eq!(back, [4, 3, 2, 1, 0xaa, 0xaa, 0xaa, 0xaa]);
    assert_eq!(d.dev.post_event(0), Ok(false), "no buffer left");
}

#[test]
fn needs_interrupt_is_wrap_safe() {
    let mut d = raw_device(feats(), 4, MEM);
    let mem = d.mem.clone();
    // Start the device's used index just below the wrap.
    {
        let q = d.dev.queue_mut(RX_QUEUE).unwrap().queue_mut();
        virtio_queue::QueueT::set_next_used(q, 65534);
    }
    d.queues[RX_QUEUE].set_used_event(65535);
    // The interrupt is due exactly when the used index moves past 65535,
    // i.e. from 65535 to 0.
    let mut pattern = Vec::new();
    for i in 0..3u16 {
        d.queues[RX_QUEUE].set_desc(i, DATA, 64, F_WRITE, 0);
        d.queues[RX_QUEUE].publish(i);
        assert!(d.dev.write_rx(&header(0, 5), &[]).unwrap().is_some());
        let q = d.dev.queue_mut(RX_QUEUE).unwrap();
        pattern.push(q.needs_interrupt(&*mem).unwrap());
    }
    assert_eq!(pattern, [false, true, false]);

    // avail_event follows the device's position across the wrap too.
    let tx = d.dev.queue_mut(TX_QUEUE).unwrap();
    virtio_queue::QueueT::set_next_avail(tx.queue_mut(), 65535);
    d.queues[TX_QUEUE].set_avail_idx(65535);
    good_tx(&mut d, 0, DATA, 1);
    assert_eq!(d.queues[TX_QUEUE].avail_idx, 0);
    let stats = d.dev.drain_tx(|p| assert!(p.is_ok())).unwrap();
    assert_eq!(stats.packets, 1);
    assert_eq!(d.queues[TX_QUEUE].avail_event(), 0);
}

#[test]
fn no_interrupt_flag_is_honoured_without_event_idx() {
    let mut d = raw_device(fb::VERSION_1 | fb::STREAM, 8, MEM);
    let mem = d.mem.clone();
    let avail_flags = GuestAddress(d.queues[RX_QUEUE].avail);
    for (flag, expected) in [(1u16, false), (0, true), (1, false)] {
        mem.write_obj(flag, avail_flags).unwrap();
        let i = d.queues[RX_QUEUE].avail_idx;
        d.queues[RX_QUEUE].set_desc(i, DATA, 64, F_WRITE, 0);
        d.queues[RX_QUEUE].publish(i);
        assert!(d.dev.write_rx(&header(0, 5), &[]).unwrap().is_some());
        let q = d.dev.queue_mut(RX_QUEUE).unwrap();
        assert_eq!(q.needs_interrupt(&*mem).unwrap(), expected, "flags = {flag}");
    }
}

/// A cheap deterministic generator; proptest would shrink, but the point
/// here is only "no panic, no hang" over many garbage rings.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 16
    }
}

#[test]
fn random_garbage_rings_never_panic() {
    let mut d = raw_device(feats() | fb::INDIRECT_DESC, 16, MEM);
    let mut rng = Lcg(0x5eed);
    let addrs = [0, DATA, DATA + 0xfff, MEM as u64 - 8, MEM as u64, u64::MAX - 3, 0x1_0000];
    let (mut packets, mut errors, mut fatal) = (0, 0, 0);
    for _round in 0..3000 {
        for q in [TX_QUEUE, RX_QUEUE, EVENT_QUEUE] {
            for i in 0..16u16 {
                let addr = addrs[rng.next() as usize % addrs.len()].wrapping_add(rng.next() % 64);
                let len = match rng.next() % 4 {
                    0 => rng.next() as u32,
                    1 => 0,
                    _ => (rng.next() % 256) as u32,
                };
                let flags = (rng.next() % 8) as u16;
                let next = (rng.next() % 20) as u16;
                d.queues[q].set_desc(i, addr, len, flags, next);
            }
            // Headers with random lengths where data addresses point.
            let mut h = header((rng.next() % 300) as u32, 5);
            h[24] = rng.next() as u8;
            d.mem.write_slice(&h, GuestAddress(DATA)).unwrap();
            let n = rng.next() % 4;
            for _ in 0..n {
                let head = (rng.next() % 18) as u16;
                d.queues[q].publish(head);
            }
            if rng.next().is_multiple_of(50) {
                let jump = rng.next() as u16;
                d.queues[q].set_avail_idx(jump);
            }
        }
        match d.dev.drain_tx(|r| match r {
            Ok(_) => packets += 1,
            Err(e) => {
                assert!(!e.is_fatal());
                errors += 1
            }
        }) {
            Ok(_) => {}
            Err(e) => {
                assert!(e.is_fatal());
                fatal += 1;
                resync(&mut d, TX_QUEUE);
            }
        }
        for _ in 0..4 {
            match d.dev.write_rx(&header(10, 5), &[7; 10]) {
                Ok(_) => {}
                Err(e) if e.is_fatal() => {
                    fatal += 1;
                    resync(&mut d, RX_QUEUE);
                }
                Err(_) => errors += 1,
            }
        }
        match d.dev.post_event(0) {
            Err(e) if e.is_fatal() => resync(&mut d, EVENT_QUEUE),
            _ => {}
        }
        for q in 0..3 {
            let mem = d.mem.clone();
            let _ = d.dev.queue_mut(q).unwrap().needs_interrupt(&*mem);
        }
    }
    // The generator really exercised all three outcomes.
    assert!(packets > 0 && errors > 0 && fatal > 0, "{packets} {errors} {fatal}");
}

/// After a fatal error the device asks for a reset (NEEDS_RESET), so the
/// "driver" resets it and sets it up again.
fn resync(d: &mut RawDevice, q: usize) {
    assert!(!d.dev.driver_ok(), "queue {q}: a fatal error must set NEEDS_RESET");
    d.reinit();
}

/// Where a drained packet's payload was when the callback had it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PayloadAt {
    /// Copied out, into the queue's scratch buffer.
    Scratch,
    /// Lent in place as bytes of guest memory.
    LentInPlace,
    /// Left in guest memory, to be copied out of only.
    SharedInGuest,
}

/// Each drained chain goes back to the driver only after its packet was
/// handed over, in every lending mode; a payload in one guest buffer is
/// read from guest memory itself unless the caller asked for copies, as
/// bytes only when the bus allowed lending in place.
#[test]
fn a_drained_tx_chain_goes_back_only_after_its_packet_was_handed_over() {
    for lending in [TxLending::Copied, TxLending::InPlace, TxLending::Shared] {
        let mut d = raw_device(feats(), 16, MEM);
        d.dev.set_tx_lending(lending);
        // One descriptor (the payload can be read in place) and a header and
        // payload split over two (the rust-vmm layout), then a payload split
        // over two (copied).
        let one = good_tx(&mut d, 0, DATA, 500);
        let mut split = header(300, 5).to_vec();
        split.extend(payload(300, 9));
        d.mem.write_slice(&split, GuestAddress(DATA + 0x1000)).unwrap();
        let tx = &mut d.queues[TX_QUEUE];
        tx.set_desc(1, DATA + 0x1000, HEADER_LEN as u32, F_NEXT, 2);
        tx.set_desc(2, DATA + 0x1000 + HEADER_LEN as u64, 300, 0, 0);
        tx.publish(1);
        tx.set_desc(3, DATA + 0x1000, HEADER_LEN as u32 + 100, F_NEXT, 4);
        tx.set_desc(4, DATA + 0x1000 + HEADER_LEN as u64 + 100, 200, 0, 0);
        tx.publish(3);
        let base = d.mem.get_host_address(GuestAddress(0)).unwrap() as usize;
        let guest = base..base + MEM;
        let RawDevice { dev, queues, .. } = &mut d;
        let mut seen = Vec::new();
        let mut in_guest_memory = Vec::new();
        let stats = dev
            .drain_tx(|p| {
                let p = p.expect("a good packet");
                let used_before = queues[TX_QUEUE].used_idx();
                let mut bytes = p.header.to_vec();
                bytes.extend(p.payload.to_vec());
                seen.push((p.head, used_before, bytes));
                in_guest_memory.push(match p.payload.as_bytes() {
                    Some(b) if guest.contains(&(b.as_ptr() as usize)) => PayloadAt::LentInPlace,
                    Some(_) => PayloadAt::Scratch,
                    None => PayloadAt::SharedInGuest,
                });
            })
            .unwrap();
        assert_eq!(stats.packets, 3);
        assert_eq!(
            seen,
            [(0, 0, one), (1, 1, split.clone()), (3, 2, split)],
            "{lending:?}: each chain was still the device's while its packet was read"
        );
        let one_buffer = match lending {
            TxLending::Copied => PayloadAt::Scratch,
            TxLending::InPlace => PayloadAt::LentInPlace,
            TxLending::Shared => PayloadAt::SharedInGuest,
        };
        assert_eq!(
            in_guest_memory,
            [one_buffer, one_buffer, PayloadAt::Scratch],
            "{lending:?}: payloads in one buffer stay in guest memory unless copies were asked \
             for; a split one is copied"
        );
        assert_eq!(d.queues[TX_QUEUE].used_idx(), 3);
    }
}
