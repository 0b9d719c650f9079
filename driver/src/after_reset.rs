//! The transport as virtio-drivers' `VirtQueue::new` sees it while the
//! driver builds its queues: every call goes to the real transport, except
//! the question whether a queue is already in use, which the driver
//! answers itself.
//!
//! `VirtQueue::new` first asks the transport whether the queue is in use
//! (`queue_used`: on virtio-mmio a write of `QueueSel` and a read of
//! `QueueReady`) and refuses one that is. [`crate::VsockDriver::new`]
//! builds its queues right after `begin_init`, whose first step resets the
//! device, and a reset leaves no queue in use (virtio 1.2 §2.4: a reset
//! returns the device, its queues included, to its initial state).
//! Asking the device again costs a register read per queue, and in a VM a
//! register read is an exit to the hypervisor (20 to 80 µs on a nested
//! host): three exits of every boot, for an answer the driver already has.

use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{PhysAddr, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A transport whose device this driver has just reset (see the module
/// documentation); only for building the queues, before `DRIVER_OK`.
pub(crate) struct JustReset<'a, T>(pub(crate) &'a mut T);

impl<T: Transport> Transport for JustReset<'_, T> {
    fn device_type(&self) -> DeviceType {
        self.0.device_type()
    }

    fn read_device_features(&mut self) -> u64 {
        self.0.read_device_features()
    }

    fn write_driver_features(&mut self, driver_features: u64) {
        self.0.write_driver_features(driver_features)
    }

    fn max_queue_size(&mut self, queue: u16) -> u32 {
        self.0.max_queue_size(queue)
    }

    fn notify(&mut self, queue: u16) {
        self.0.notify(queue)
    }

    fn get_status(&self) -> DeviceStatus {
        self.0.get_status()
    }

    fn set_status(&mut self, status: DeviceStatus) {
        self.0.set_status(status)
    }

    fn set_guest_page_size(&mut self, guest_page_size: u32) {
        self.0.set_guest_page_size(guest_page_size)
    }

    fn requires_legacy_layout(&self) -> bool {
        self.0.requires_legacy_layout()
    }

    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        self.0.queue_set(queue, size, descriptors, driver_area, device_area)
    }

    fn queue_unset(&mut self, queue: u16) {
        self.0.queue_unset(queue)
    }

    fn queue_used(&mut self, _queue: u16) -> bool {
        // The reset in `begin_init` left every queue unused.
        false
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        self.0.ack_interrupt()
    }

    fn read_config_generation(&self) -> u32 {
        self.0.read_config_generation()
    }

    fn read_config_space<V: FromBytes + IntoBytes>(&self, offset: usize) -> Result<V> {
        self.0.read_config_space(offset)
    }

    fn write_config_space<V: IntoBytes + Immutable>(
        &mut self,
        offset: usize,
        value: V,
    ) -> Result<()> {
        self.0.write_config_space(offset, value)
    }
}
