//! Where payloads lie in the driver's receive buffers: on a page boundary,
//! the header filling the end of the page before it, in every buffer
//! posted. A host kernel's `rep movsb` copy of socket bytes into a payload
//! then runs at full speed on AMD Zen CPUs, where a destination a few
//! bytes past its source in the page runs at a fraction of it.

use pier_device::device::VsockConfig;
use pier_device::testing::Testbed;
use pier_driver::DriverConfig;
use pier_stack::wire::{HEADER_LEN, RawHeader};
use virtio_drivers::PAGE_SIZE;

#[test]
fn every_posted_receive_payload_starts_on_a_page_boundary() {
    let small = DriverConfig {
        rx_buffer_size: HEADER_LEN + 4096,
        rx_buffers: 8,
        ..DriverConfig::default()
    };
    for config in [DriverConfig::default(), small] {
        let bed = Testbed::new(VsockConfig::default(), config).unwrap();
        let mut starts = Vec::new();
        let mut mmio = bed.mmio.lock().unwrap();
        for _ in 0..config.rx_buffers {
            let filled = mmio.device_mut().fill_rx(|payload| {
                payload
                    .read_with(usize::MAX, |iovecs| {
                        starts.push(iovecs[0].iov_base as usize);
                        Ok::<_, ()>(0)
                    })
                    .unwrap();
                // An empty packet the driver drops: the device moves on to
                // the next buffer.
                Some(RawHeader::default().encode())
            });
            assert!(filled.unwrap().is_some(), "the driver posted {} buffers", starts.len());
        }
        drop(mmio);
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), config.rx_buffers, "each buffer seen once");
        for start in starts {
            assert_eq!(
                start % PAGE_SIZE,
                0,
                "a payload at {start:#x}, {} into its page",
                start % PAGE_SIZE
            );
        }
    }
}
