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
//!   [`layout::VSOCK_GSI`] (IOAPIC pin 5 of the in-kernel irqchip), so
//!   raising an interrupt delivers it. The loop's per-round hook
//!   ([`InterruptDelivery`]) has one more job here: applying the register
//!   writes KVM queued without an exit (`crate::coalesced`) before each
//!   round.
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
    Bus, DeviceEvents, DeviceSpec, DeviceStats, DeviceThread, InterruptDelivery, IrqLine, MmioBus,
    MmioDevice, VsockConfig, VsockMmio, WaitingDevice,
};
use vm_memory::GuestMemoryMmap;

use crate::coalesced::QueuedWrites;
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

/// Makes the device's stop drop the guest bytes host programs have not
/// read yet instead of waiting for them ([`crate::StopHandle::stop`]).
#[derive(Clone, Debug)]
pub(crate) struct UrgentStop(Arc<DeviceThread>);

impl UrgentStop {
    pub(crate) fn make_urgent(&self) {
        // Only the loop's wake-up can fail; the request stays set, and the
        // loop sees it at its next event.
        let _ = self.0.make_stop_urgent();
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
    /// The register writes KVM queues instead of exiting, if it does.
    queued_writes: Option<QueuedWrites>,
    /// The device, once attached: the queued writes are applied to it.
    device: Option<Arc<GuestDevice>>,
}

type GuestDevice = MmioDevice<Arc<GuestMemoryMmap>>;

/// The KVM bus's hand in each round: interrupts already went out on the
/// irqfd when they were raised, and the register writes KVM queued are
/// applied before the round looks at the device.
struct QueuedWritesFirst {
    writes: QueuedWrites,
    device: Arc<GuestDevice>,
}

impl InterruptDelivery for QueuedWritesFirst {
    fn deliver(&mut self, _raised: u64) -> bool {
        false
    }

    fn before_round(&mut self) {
        // What a write means for the loop (a status change to look at) is
        // not signalled: the loop is about to run the round that looks.
        self.writes.apply(|offset, data| {
            let _ = self.device.mmio_write(offset, data);
        });
    }
}

/// A KVM ioctl's failure as the device's setup reports it.
fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> io::Error {
    move |e| io::Error::other(format!("{op}: {e}"))
}

impl Bus for KvmBus<'_> {
    type Memory = Arc<GuestMemoryMmap>;
    type Device = GuestDevice;

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
        let device = Arc::new(MmioDevice::new(regs));
        self.device = Some(device.clone());
        Ok(device)
    }

    fn interrupt_delivery(&mut self) -> io::Result<Box<dyn InterruptDelivery>> {
        Ok(match (&self.queued_writes, &self.device) {
            (Some(writes), Some(device)) => {
                Box::new(QueuedWritesFirst { writes: writes.clone(), device: device.clone() })
            }
            _ => Box::new(IrqLine),
        })
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

#[cfg(test)]
mod tests {
    use pier_device::MmioBus;
    use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER};
    use virtio_bindings::virtio_mmio::VIRTIO_MMIO_STATUS;
    use vm_memory::GuestAddress;

    use super::*;
    use crate::coalesced::Ring;

    fn status(device: &GuestDevice) -> u32 {
        let mut value = [0u8; 4];
        device.mmio_read(u64::from(VIRTIO_MMIO_STATUS), &mut value);
        u32::from_le_bytes(value)
    }

    /// `DRIVER_OK` may be followed by nothing that exits, only by kicks,
    /// which reach the device loop straight from KVM: the loop's round
    /// must find the status writes KVM queued applied, in order.
    #[test]
    fn the_status_writes_kvm_queued_are_applied_before_the_round() {
        let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap());
        let regs = VsockMmio::new(mem, VsockConfig::default()).unwrap();
        let device = Arc::new(MmioDevice::new(regs));
        let mut ring = Ring::detached();
        let addr = layout::VSOCK_MMIO_BASE + u64::from(VIRTIO_MMIO_STATUS);
        let acknowledged = VIRTIO_CONFIG_S_ACKNOWLEDGE;
        let with_driver = acknowledged | VIRTIO_CONFIG_S_DRIVER;
        ring.queue(addr, acknowledged);
        ring.queue(addr, with_driver);
        let writes = QueuedWrites::new(ring);
        let mut hook = QueuedWritesFirst { writes: writes.clone(), device: device.clone() };
        assert_eq!(status(&device), 0, "nothing applied before the round");

        hook.before_round();
        assert_eq!(status(&device), with_driver, "both writes, in order");
        let mut left = 0;
        writes.apply(|_, _| left += 1);
        assert_eq!(left, 0, "each write is applied once");
    }
}

impl Drop for VmVsock {
    /// The device thread stops with the VM, even while a [`StatsHandle`]
    /// still holds it (the handle then reads its last counters).
    fn drop(&mut self) {
        if let DeviceState::Running { thread, .. } = &self.state {
            let _ = thread.stop();
        }
    }
}

/// The device in a VM: its register file, its eventfds, and the device
/// thread (with the bridge) that serves it once started.
#[derive(Debug)]
pub(crate) struct VmVsock {
    mmio: Arc<GuestDevice>,
    events: Arc<DeviceEvents>,
    state: DeviceState,
}

#[derive(Debug)]
enum DeviceState {
    /// Attached, nothing serving it: the guest's kicks wait in the
    /// eventfds ([`VmVsock::attach_waiting`]).
    Waiting(WaitingDevice<GuestDevice>),
    Running {
        /// Stopped (and the bridge's socket files removed) when the last
        /// reference goes; a [`StatsHandle`] may hold one.
        thread: Arc<DeviceThread>,
        /// The capture's counters and its end, when one runs.
        capture: Option<CaptureHandle>,
    },
    /// Between the two, only if starting failed.
    Failed,
}

impl VmVsock {
    /// Creates the device over `mem`, wires its ioeventfds and irqfd into
    /// `vm`, binds the bridge's sockets and starts the device thread, which
    /// applies `queued_writes` before each round.
    pub(crate) fn attach(
        vm: &VmFd,
        mem: Arc<GuestMemoryMmap>,
        queued_writes: Option<QueuedWrites>,
        spec: &DeviceSpec,
    ) -> Result<Self, Error> {
        let mut device = Self::attach_waiting(vm, mem, queued_writes, spec)?;
        device.start(spec)?;
        Ok(device)
    }

    /// As [`Self::attach`], but nothing serves the device until
    /// [`Self::start`]: no host socket is bound, and the guest's kicks
    /// wait.
    pub(crate) fn attach_waiting(
        vm: &VmFd,
        mem: Arc<GuestMemoryMmap>,
        queued_writes: Option<QueuedWrites>,
        spec: &DeviceSpec,
    ) -> Result<Self, Error> {
        let bus = KvmBus { vm, mem, queued_writes, device: None };
        let waiting = bus.attach_waiting(spec).map_err(Error::Device)?;
        Ok(Self {
            mmio: waiting.device.clone(),
            events: waiting.events.clone(),
            state: DeviceState::Waiting(waiting),
        })
    }

    /// Starts the device thread with `spec`'s host side; `spec` must
    /// describe the device the guest saw (the same CID). Once running, a
    /// second call has nothing to do.
    pub(crate) fn start(&mut self, spec: &DeviceSpec) -> Result<(), Error> {
        if let DeviceState::Waiting(waiting) = &self.state {
            // Refused before the parts are taken: the device still waits.
            waiting.check(spec).map_err(Error::Device)?;
        }
        match std::mem::replace(&mut self.state, DeviceState::Failed) {
            DeviceState::Waiting(waiting) => {
                let started = waiting.start(spec, bridge_only).map_err(Error::Device)?;
                self.state =
                    DeviceState::Running { thread: started.thread, capture: started.capture };
                Ok(())
            }
            running @ DeviceState::Running { .. } => {
                self.state = running;
                Ok(())
            }
            DeviceState::Failed => {
                Err(Error::Device(io::Error::other("the vsock device failed to start before")))
            }
        }
    }

    fn thread(&self) -> Option<&Arc<DeviceThread>> {
        match &self.state {
            DeviceState::Running { thread, .. } => Some(thread),
            _ => None,
        }
    }

    /// A handle that reads the device's counters from any thread, once
    /// the device runs.
    pub(crate) fn stats_handle(&self) -> Option<StatsHandle> {
        self.thread().map(|thread| StatsHandle(thread.clone()))
    }

    /// Stops the device thread (see [`crate::Vm::stop_device`]); a second
    /// call, the drop after it, or a device never started, has nothing
    /// left to do.
    pub(crate) fn stop(&self) -> io::Result<()> {
        self.thread().map_or(Ok(()), |thread| thread.stop())
    }

    /// A handle that makes the device's stop drop what it still holds.
    pub(crate) fn urgent_stop(&self) -> Option<UrgentStop> {
        self.thread().map(|thread| UrgentStop(thread.clone()))
    }

    /// A handle that sets off faults in the device from any thread.
    pub(crate) fn fault_injector(&self) -> Option<FaultInjector> {
        self.thread().map(|thread| FaultInjector(thread.clone()))
    }

    /// The capture's handle, if one runs.
    pub(crate) fn capture(&self) -> Option<&CaptureHandle> {
        match &self.state {
            DeviceState::Running { capture, .. } => capture.as_ref(),
            _ => None,
        }
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
