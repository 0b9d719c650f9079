//! pier's virtio-vsock device in the VM: the device model's KVM bus.
//!
//! pier-device is written once for every bus; this is the KVM one, and it
//! supplies what every bus does (memory and notifications) through
//! [`Bus`]:
//!
//! - **guest → device**: the register file sits at
//!   [`layout::VSOCK_MMIO_BASE`]; ordinary register accesses arrive as MMIO
//!   exits and go to [`MmioDevice`]. Queue kicks never reach userspace:
//!   each queue's [`DeviceEvents`] eventfd is a KVM ioeventfd on
//!   `QueueNotify` (offset 0x50) matching that queue's index, so a kick
//!   wakes the device thread straight from the kernel (about 1.5 µs for
//!   the guest against 10 µs or more for a userspace exit).
//! - **device → guest**: the register file's interrupt line is the
//!   [`DeviceEvents`] irq eventfd, registered as a KVM irqfd on GSI
//!   [`layout::VSOCK_GSI`] (IOAPIC pin 5 of the in-kernel irqchip), so the
//!   device loop delivers with [`IrqLine`](pier_device::IrqLine) and nothing more.
//! - **memory**: the register file and queues read guest RAM through the
//!   same `GuestMemoryMmap` KVM maps, so descriptors are used in place, with
//!   no bounce buffers.
//! - **host side**: the Firecracker-compatible bridge `pier run` uses,
//!   with the same socket paths (`docs/host-sockets.md`), assembled by
//!   [`Bus::start`] from the [`DeviceSpec`] as on every bus.
//!
//! Beside the counters ([`StatsHandle`]), a [`FaultInjector`] reaches the
//! device thread from outside, for the soak's resets (`docs/soak.md`).

use std::io;
use std::sync::Arc;

use kvm_ioctls::{IoEventAddress, VmFd};
use pier_device::capture::CaptureHandle;
use pier_device::device::NUM_QUEUES;
use pier_device::mmio::QUEUE_NOTIFY_OFFSET;
use pier_device::spec::bridge_only;
use pier_device::{
    Bus, DeviceEvents, DeviceSpec, DeviceStats, DeviceThread, MmioBus, MmioDevice, VsockConfig,
    VsockMmio,
};
use vm_memory::GuestMemoryMmap;

use crate::error::Error;
use crate::layout;

/// Reads the vsock device's counters (endpoint, host stack, bridge) from
/// any thread, while the VM runs or after it ended.
#[derive(Clone, Debug)]
pub struct StatsHandle(Arc<DeviceThread>);

impl StatsHandle {
    /// A copy of the counters; `None` if the device thread did not answer.
    pub fn stats(&self) -> Option<DeviceStats> {
        self.0.stats()
    }
}

/// A fault [`FaultInjector::inject`] sets off in a running VM's device, to
/// check that the guest and host programs live through what a vsock device
/// can do to them. Nothing in normal running injects one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The device sends the driver a TRANSPORT_RESET on the same CID (what
    /// a VM gets once its snapshot is restored): connections end on both
    /// sides, the driver and listeners stay.
    TransportReset,
    /// The device asks the driver for a reset (DEVICE_NEEDS_RESET); a
    /// guest that follows it, as pier-rt does, resets the device and
    /// restarts its driver under the same stack: connections end on both
    /// sides, listeners stay.
    DeviceReset,
}

/// Sets off [`Fault`]s in the vsock device of a running VM, from any
/// thread.
#[derive(Clone, Debug)]
pub struct FaultInjector(Arc<DeviceThread>);

impl FaultInjector {
    /// Asks the device thread for `fault`, which it sets off at its next
    /// round; fails only if the thread cannot be woken.
    pub fn inject(&self, fault: Fault) -> io::Result<()> {
        match fault {
            Fault::TransportReset => self.0.reset_transport(),
            Fault::DeviceReset => self.0.request_reset(),
        }
    }
}

/// The KVM bus: guest RAM as the device's memory, ioeventfds for kicks,
/// an irqfd for the interrupt line.
struct KvmBus<'a> {
    vm: &'a VmFd,
    mem: Arc<GuestMemoryMmap>,
}

/// A KVM ioctl's failure as the device's setup reports it.
fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> io::Error {
    move |e| io::Error::other(format!("{op}: {e}"))
}

impl Bus for KvmBus<'_> {
    type Memory = Arc<GuestMemoryMmap>;
    type Device = MmioDevice<Arc<GuestMemoryMmap>>;

    fn memory(&self) -> Self::Memory {
        self.mem.clone()
    }

    fn attach(
        &mut self,
        config: VsockConfig,
        events: &DeviceEvents,
    ) -> io::Result<Arc<Self::Device>> {
        let mut regs = VsockMmio::new(self.memory(), config).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the vsock queue size is not a power of two",
            )
        })?;
        regs.set_irq(events.irq_line()?);
        self.vm.register_irqfd(events.irq(), layout::VSOCK_GSI).map_err(ioctl("KVM_IRQFD"))?;
        Ok(Arc::new(MmioDevice::new(regs)))
    }

    fn route_kicks(&mut self, events: &DeviceEvents) -> io::Result<()> {
        let notify = IoEventAddress::Mmio(layout::VSOCK_MMIO_BASE + QUEUE_NOTIFY_OFFSET);
        for q in 0..NUM_QUEUES {
            let fd = events.queue(q).expect("DeviceEvents has NUM_QUEUES queues");
            self.vm.register_ioevent(fd, &notify, q as u32).map_err(ioctl("KVM_IOEVENTFD"))?;
        }
        Ok(())
    }
}

impl Drop for VmVsock {
    /// The device thread stops with the VM, even while a [`StatsHandle`]
    /// still holds it (the handle then reads its last counters).
    fn drop(&mut self) {
        let _ = self.thread.stop();
    }
}

/// The device in a running VM: its register file, its eventfds, and the
/// device thread (with the bridge) that serves it.
#[derive(Debug)]
pub(crate) struct VmVsock {
    mmio: Arc<MmioDevice<Arc<GuestMemoryMmap>>>,
    events: Arc<DeviceEvents>,
    /// Stopped (and the bridge's socket files removed) when the last
    /// reference goes; a [`StatsHandle`] may hold one.
    thread: Arc<DeviceThread>,
    /// The capture's counters and its end, when one runs.
    capture: Option<CaptureHandle>,
}

impl VmVsock {
    /// Creates the device over `mem`, wires its ioeventfds and irqfd into
    /// `vm`, binds the bridge's sockets and starts the device thread.
    pub(crate) fn attach(
        vm: &VmFd,
        mem: Arc<GuestMemoryMmap>,
        spec: &DeviceSpec,
    ) -> Result<Self, Error> {
        let started = KvmBus { vm, mem }.start(spec, bridge_only).map_err(Error::Device)?;
        Ok(Self {
            mmio: started.device,
            events: started.events,
            thread: started.thread,
            capture: started.capture,
        })
    }

    /// A handle that reads the device's counters from any thread.
    pub(crate) fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.thread.clone())
    }

    /// A handle that sets off faults in the device from any thread.
    pub(crate) fn fault_injector(&self) -> FaultInjector {
        FaultInjector(self.thread.clone())
    }

    /// The capture's handle, if one runs.
    pub(crate) fn capture(&self) -> Option<&CaptureHandle> {
        self.capture.as_ref()
    }

    /// An MMIO read exit at `offset` into the device's slot.
    pub(crate) fn read(&self, offset: u64, data: &mut [u8]) {
        self.mmio.mmio_read(offset, data);
    }

    /// An MMIO write exit at `offset` into the device's slot. Kicks normally
    /// bypass this (ioeventfd), but one KVM did not match (a write of
    /// another width) still reaches the device this way.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) {
        self.mmio.mmio_write(offset, data).signal(&self.events);
    }
}
