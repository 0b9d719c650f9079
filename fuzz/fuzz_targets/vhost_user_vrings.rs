//! Fuzz target: `pier vhost-user`'s vring setup (`pier_vhost_user::vring`)
//! over a memory table a hostile frontend chose, as vhost-user-backend
//! hands it on: the regions of guest memory (anywhere, any size, with gaps
//! between them), then SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE,
//! SET_VRING_KICK, SET_VRING_ENABLE and the ring's ready state in any
//! order, for any queue, with the rings' contents written between steps
//! and the device's data path run on whatever starts.
//!
//! Input layout: one byte for the number of regions (1 to 4), then per
//! region a 64-bit guest address (page-aligned) and a byte of size in
//! pages (1 to 16); 64 bits of features the frontend acks; then steps, each
//! an op byte (its low bits the queue) and the op's arguments.
//!
//! Invariants, besides never panicking:
//! - a device queue runs only while its vring is ready, enabled and has a
//!   kick eventfd (what `PierVring` follows);
//! - a running queue's size is a power of two no larger than the device's
//!   maximum, and its three rings start inside guest memory, aligned as
//!   virtio requires;
//! - a queue that stops hands its ring positions back to the vring
//!   (GET_VRING_BASE then reports where the device stopped).
#![no_main]

use std::fs::File;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pier_device::{DeviceEvents, InlineKick, VsockConfig, VsockDevice};
use pier_fuzz::Input;
use pier_stack::wire::HEADER_LEN;
use pier_vhost_user::vring::{CallLines, CallNotify, PierVring, VringLink, bind_vrings};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap,
};
use vmm_sys_util::eventfd::EventFd;

const PAGE: u64 = 4096;
const QUEUES: usize = 3;
const MAX_QUEUE_SIZE: u16 = 256;

thread_local! {
    static EVENTS: Arc<DeviceEvents> = Arc::new(DeviceEvents::new().expect("eventfds"));
}

fuzz_target!(|data: &[u8]| EVENTS.with(|events| run(events.clone(), data)));

fn run(events: Arc<DeviceEvents>, data: &[u8]) {
    let mut input = Input::new(data);
    let regions: Vec<(GuestAddress, usize)> = (0..usize::from(input.u8() % 4) + 1)
        .map(|_| {
            let address = input.u64() & !(PAGE - 1);
            let pages = u64::from(input.u8() % 16) + 1;
            (GuestAddress(address), (pages * PAGE) as usize)
        })
        .collect();
    // Overlapping or wrapping regions are refused before any vring sees them.
    let Ok(mmap) = GuestMemoryMmap::<()>::from_ranges(&regions) else { return };
    let mem = GuestMemoryAtomic::new(mmap);
    let calls = Arc::new(CallLines::default());
    let config = VsockConfig { queue_size: MAX_QUEUE_SIZE, ..VsockConfig::default() };
    let notify = Box::new(CallNotify(calls.clone()));
    let device = Arc::new(std::sync::Mutex::new(
        VsockDevice::new(mem.clone(), config, notify).expect("a valid queue size"),
    ));
    device.lock().unwrap().accept_driver_features(input.u64());

    let link =
        VringLink { device: device.clone(), calls, events, kick: InlineKick::without_loop() };
    let vrings: Vec<PierVring> = {
        let _binding = bind_vrings(link);
        (0..QUEUES).map(|_| PierVring::new(mem.clone(), MAX_QUEUE_SIZE).expect("a vring")).collect()
    };

    let mut steps = 0;
    while !input.is_empty() && steps < 64 {
        steps += 1;
        let op = input.u8();
        let q = usize::from(op & 0x3) % QUEUES;
        let vring = &vrings[q];
        let before = device
            .lock()
            .unwrap()
            .queue(q)
            .filter(|dq| dq.is_ready())
            .map(|dq| (dq.queue().next_avail(), dq.queue().next_used()));
        match op >> 2 & 0xf {
            0 => vring.set_queue_size(input.u16()),
            1 => {
                let (desc, avail, used) = (input.u64(), input.u64(), input.u64());
                let _ = vring.set_queue_info(desc, avail, used);
            }
            2 => vring.set_queue_next_avail(input.u16()),
            3 => vring.set_queue_next_used(input.u16()),
            4 => vring.set_kick(Some(kick())),
            5 => vring.set_kick(None),
            6 => vring.set_enabled(input.u8() & 1 != 0),
            7 => vring.set_queue_ready(input.u8() & 1 != 0),
            8 => vring.set_queue_event_idx(input.u8() & 1 != 0),
            9 => {
                // The guest writes its rings: anywhere, inside memory or not.
                let address = GuestAddress(input.u64());
                let len = usize::from(input.u8());
                let _ = mem.memory().write_slice(input.bytes(len), address);
            }
            10 => {
                let _ = device.lock().unwrap().drain_tx(|_| {});
            }
            11 => {
                let len = usize::from(input.u8());
                let payload = input.bytes(len);
                let mut header = [0u8; HEADER_LEN];
                header[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
                let _ = device.lock().unwrap().write_rx(&header, payload);
            }
            12 => {
                let _ = device.lock().unwrap().post_event(input.u32());
            }
            _ => {
                let _ = vring.queue_used_idx();
            }
        }
        check(&device, &vrings, &mem);
        let now_live = device.lock().unwrap().queue(q).is_some_and(|dq| dq.is_ready());
        if let (Some((next_avail, next_used)), false) = (before, now_live) {
            let state = vring.get_ref();
            assert_eq!(state.get_queue().next_avail(), next_avail, "queue {q} stopped");
            assert_eq!(state.get_queue().next_used(), next_used, "queue {q} stopped");
        }
    }
}

/// A kick eventfd, as SET_VRING_KICK passes one.
fn kick() -> File {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let fd = EventFd::new(0).expect("an eventfd").into_raw_fd();
    // SAFETY: `fd` is a fresh eventfd that nothing else owns.
    unsafe { File::from_raw_fd(fd) }
}

fn check(
    device: &std::sync::Mutex<VsockDevice<GuestMemoryAtomic<GuestMemoryMmap>>>,
    vrings: &[PierVring],
    mem: &GuestMemoryAtomic<GuestMemoryMmap>,
) {
    let device = device.lock().unwrap();
    let memory = mem.memory();
    for (q, vring) in vrings.iter().enumerate() {
        let Some(dq) = device.queue(q).filter(|dq| dq.is_ready()) else { continue };
        let state = vring.get_ref();
        assert!(
            state.get_queue().ready() && state.is_enabled() && state.get_kick().is_some(),
            "queue {q} runs without a ready, enabled vring with a kick"
        );
        let queue = dq.queue();
        let size = queue.size();
        assert!(size.is_power_of_two() && size <= MAX_QUEUE_SIZE, "queue {q} size {size}");
        for (ring, address, align) in [
            ("descriptor table", queue.desc_table(), 16),
            ("available ring", queue.avail_ring(), 2),
            ("used ring", queue.used_ring(), 4),
        ] {
            let address = GuestAddress(address);
            assert!(memory.address_in_range(address), "queue {q}'s {ring} at {address:?}");
            assert_eq!(address.raw_value() % align, 0, "queue {q}'s {ring} at {address:?}");
        }
    }
}
