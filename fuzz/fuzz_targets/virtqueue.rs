//! Fuzz target: the device side of a split virtqueue
//! (`pier_device::queues::DeviceQueue`) over rings a hostile driver wrote.
//!
//! Input layout: one byte of queue setup, one byte giving the length of an
//! operation script, the script, then an image of guest memory starting
//! at address 0 (the rest of the 64 KiB is zero). The descriptor table
//! sits at 0 and the available and used rings right behind it, as a
//! driver lays them out, so even a short input fills every ring field;
//! descriptors can point anywhere, inside memory or not. Script steps pop
//! TX chains, drain with a budget, write RX packets, post events, ask about
//! interrupts and notifications, and rewrite guest memory in between (a
//! driver racing the device).
//!
//! Invariants, besides never panicking or looping:
//! - a popped TX packet carries exactly the payload its header's `len`
//!   announces, never more than the configured cap;
//! - each pop or write returns at most one chain (the used index moves by
//!   0 or 1), and a chain the device kept (`BufferTooSmall`, empty ring)
//!   moves it by 0;
//! - an RX write's used length is header + payload;
//! - `drain_tx` hands back no more chains than its budget, and the used
//!   index moves by exactly the chains it reports.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use pier_device::queues::{DeviceQueue, QueueError, TxLending};
use pier_fuzz::Input;
use pier_stack::wire::HEADER_LEN;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest memory size: large enough for a 256-entry queue and its buffers.
const MEM_SIZE: usize = 64 * 1024;

thread_local! {
    /// One mapping reused for every input: mapping 64 KiB per execution
    /// would cost more than the code under test.
    static MEM: GuestMemoryMmap<()> =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap();
    static ZEROES: RefCell<Vec<u8>> = RefCell::new(vec![0; MEM_SIZE]);
}

fuzz_target!(|data: &[u8]| {
    MEM.with(|mem| ZEROES.with(|z| run(mem, &z.borrow(), data)));
});

fn run(mem: &GuestMemoryMmap<()>, zeroes: &[u8], data: &[u8]) {
    let mut input = Input::new(data);
    let setup = input.u8();
    let script_len = usize::from(input.u8());
    let mut script = Input::new(input.bytes(script_len));
    let image = input.rest();

    mem.write_slice(zeroes, GuestAddress(0)).unwrap();
    mem.write_slice(&image[..image.len().min(MEM_SIZE)], GuestAddress(0)).unwrap();

    // Sizes 1..=256, mostly powers of two; an invalid size is refused.
    let size: u16 = 1 << (setup & 0x7).min(8);
    let size = if setup & 0x80 != 0 { size + u16::from(setup >> 3 & 0x3) } else { size };
    let Some(mut q) = DeviceQueue::new(256) else { return };
    let desc = 0u64;
    let avail = desc + 16 * u64::from(size);
    let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
    {
        use virtio_queue::QueueT;
        let raw = q.queue_mut();
        raw.set_size(size);
        raw.set_desc_table_address(Some(desc as u32), Some(0));
        raw.set_avail_ring_address(Some(avail as u32), Some(0));
        raw.set_used_ring_address(Some(used as u32), Some(0));
    }
    let event_idx = setup & 0x08 != 0;
    let indirect = setup & 0x10 != 0;
    if setup & 0x20 != 0 {
        q.set_max_payload(usize::from(script.u16()));
    }
    if !q.activate(mem, 0, 0, event_idx, indirect) {
        return;
    }
    let max_payload = q.max_payload();

    let mut steps = 0;
    while !script.is_empty() && steps < 64 {
        steps += 1;
        let before = next_used(&q);
        match script.u8() % 8 {
            0 => match q.pop_tx(mem) {
                Ok(Some(p)) => {
                    let len = u32::from_le_bytes(p.header[24..28].try_into().unwrap());
                    assert_eq!(p.payload.len(), len as usize);
                    assert!(p.payload.len() <= max_payload);
                    assert_eq!(next_used(&q).wrapping_sub(before), 1);
                }
                Ok(None) => assert_eq!(next_used(&q), before),
                Err(_) => assert!(next_used(&q).wrapping_sub(before) <= 1),
            },
            1 => {
                let budget = usize::from(script.u8() % 8);
                // Every way of handing a payload over: the single-threaded
                // fuzzer writes no guest memory during a drain, so the
                // in-place mode is as sound here as on the in-process bus.
                let lending = match script.u8() % 3 {
                    0 => TxLending::Copied,
                    1 => TxLending::InPlace,
                    _ => TxLending::Shared,
                };
                let mut seen = 0usize;
                let result = q.drain_tx(mem, budget, lending, |r| {
                    seen += 1;
                    if let Ok(p) = r {
                        let len = u32::from_le_bytes(p.header[24..28].try_into().unwrap());
                        assert_eq!(p.payload.len(), len as usize);
                        assert!(p.payload.len() <= max_payload);
                        // A payload left in guest memory copies out whole.
                        assert_eq!(p.payload.to_vec().len(), len as usize);
                    }
                });
                assert!(seen <= budget);
                let moved = usize::from(next_used(&q).wrapping_sub(before));
                assert!(moved <= seen);
                if let Ok(stats) = result {
                    assert_eq!(stats.returned(), seen);
                    assert!(stats.returned() <= budget);
                }
            }
            2 => {
                let mut header = [0u8; HEADER_LEN];
                header[..4].copy_from_slice(&script.u32().to_le_bytes());
                let payload = vec![0xA5; usize::from(script.u8()) * 4];
                match q.write_rx(mem, &header, &payload) {
                    Ok(Some(n)) => {
                        assert_eq!(n as usize, HEADER_LEN + payload.len());
                        assert_eq!(next_used(&q).wrapping_sub(before), 1);
                    }
                    Ok(None) => assert_eq!(next_used(&q), before),
                    Err(QueueError::BufferTooSmall { needed, capacity }) => {
                        assert!(capacity < needed as u64);
                        assert!(next_used(&q).wrapping_sub(before) <= 1);
                    }
                    Err(_) => assert!(next_used(&q).wrapping_sub(before) <= 1),
                }
            }
            3 => {
                let _ = q.post_event(mem, script.u32());
                assert!(next_used(&q).wrapping_sub(before) <= 1);
            }
            4 => {
                let _ = q.needs_interrupt(mem);
                let _ = q.has_available(mem);
            }
            5 => {
                let _ = q.enable_notification(mem);
            }
            6 => {
                let _ = q.disable_notification(mem);
            }
            _ => {
                // The driver rewrites two bytes anywhere in the first 4 KiB:
                // a new available index, a descriptor changed under the device.
                let at = u64::from(script.u16() % 4096);
                let _ = mem.write_slice(&script.u16().to_le_bytes(), GuestAddress(at));
            }
        }
    }
}

fn next_used(q: &DeviceQueue) -> u16 {
    use virtio_queue::QueueT;
    q.queue().next_used()
}
