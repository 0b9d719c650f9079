//! pier's virtio-vsock device in the VM: the device model's KVM bus.
//!
//! pier-device is written once for every bus; this is the KVM one, and it
//! plugs into the same seam the in-process bus uses:
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
//!   device loop delivers with [`IrqLine`] and nothing more.
//! - **memory**: the register file and queues read guest RAM through the
//!   same `GuestMemoryMmap` KVM maps, so descriptors are used in place, with
//!   no bounce buffers.
//! - **host side**: the Firecracker-compatible [`Bridge`] `pier run` uses,
//!   with the same socket paths (`docs/host-sockets.md`).

use std::path::PathBuf;
use std::sync::Arc;

use kvm_ioctls::{IoEventAddress, VmFd};
use pier_device::bridge::{Bridge, BridgeConfig};
use pier_device::capture::{Capture, CaptureConfig, CaptureHandle};
use pier_device::device::NUM_QUEUES;
use pier_device::mmio::QUEUE_NOTIFY_OFFSET;
use pier_device::{
    Clock, DeviceEvents, DeviceStats, DeviceThread, HostEndpoint, IrqLine, MmioBus, MmioDevice,
    VsockConfig, VsockMmio,
};
use vm_memory::GuestMemoryMmap;

use crate::error::{Error, kvm};
use crate::layout;

/// How the VM's vsock device is reached from the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VsockSetup {
    /// The guest's CID (above 2).
    pub guest_cid: u32,
    /// `<uds>`: the hybrid vsock socket, and the base of the other paths.
    pub uds_path: PathBuf,
    /// Capture every packet crossing the device to this pcap file
    /// (LINKTYPE_VSOCK), keeping at most `snaplen` bytes of each.
    pub pcap: Option<PcapSetup>,
}

/// Where and how much to capture (`docs/observability.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapSetup {
    /// The pcap file, created (or truncated) at boot.
    pub path: PathBuf,
    /// Bytes kept of each packet, both headers included.
    pub snaplen: u32,
}

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

impl Drop for VsockDevice {
    /// The device thread stops with the VM, even while a [`StatsHandle`]
    /// still holds it (the handle then reads its last counters).
    fn drop(&mut self) {
        let _ = self.thread.stop();
    }
}

/// The device in a running VM: its register file, its eventfds, and the
/// device thread (with the bridge) that serves it.
#[derive(Debug)]
pub(crate) struct VsockDevice {
    mmio: Arc<MmioDevice<Arc<GuestMemoryMmap>>>,
    events: Arc<DeviceEvents>,
    /// Stopped (and the bridge's socket files removed) when the last
    /// reference goes; a [`StatsHandle`] may hold one.
    thread: Arc<DeviceThread>,
    /// The capture's counters and its end, when one runs.
    capture: Option<CaptureHandle>,
}

impl VsockDevice {
    /// Creates the device over `mem`, wires its ioeventfds and irqfd into
    /// `vm`, binds the bridge's sockets and starts the device thread.
    pub(crate) fn attach(
        vm: &VmFd,
        mem: Arc<GuestMemoryMmap>,
        setup: &VsockSetup,
    ) -> Result<Self, Error> {
        let config =
            VsockConfig { guest_cid: u64::from(setup.guest_cid), ..VsockConfig::default() };
        let mut regs = VsockMmio::new(mem, config)
            .ok_or_else(|| Error::Config("the vsock queue size is not a power of two".into()))?;
        let events = Arc::new(DeviceEvents::new().map_err(Error::Device)?);
        regs.set_irq(events.irq_line().map_err(Error::Device)?);
        let notify = IoEventAddress::Mmio(layout::VSOCK_MMIO_BASE + QUEUE_NOTIFY_OFFSET);
        for q in 0..NUM_QUEUES {
            let fd = events.queue(q).expect("DeviceEvents has NUM_QUEUES queues");
            vm.register_ioevent(fd, &notify, q as u32).map_err(kvm("KVM_IOEVENTFD"))?;
        }
        vm.register_irqfd(events.irq(), layout::VSOCK_GSI).map_err(kvm("KVM_IRQFD"))?;
        let mmio = Arc::new(MmioDevice::new(regs));
        let mut endpoint = HostEndpoint::new(u64::from(setup.guest_cid), |_| {});
        let capture = match &setup.pcap {
            Some(pcap) => {
                let config = CaptureConfig { snaplen: pcap.snaplen, ..CaptureConfig::default() };
                let (capture, handle) =
                    Capture::create(&pcap.path, config).map_err(Error::Device)?;
                endpoint.set_capture(Some(capture));
                Some(handle)
            }
            None => None,
        };
        let bridge = BridgeConfig::new(&setup.uds_path, setup.guest_cid);
        let thread = DeviceThread::spawn(
            mmio.clone(),
            events.clone(),
            endpoint,
            |stack, registry, token| Bridge::new(bridge, stack, registry, token),
            Clock::new(),
            Box::new(IrqLine),
        )
        .map_err(Error::Device)?;
        Ok(Self { mmio, events, thread: Arc::new(thread), capture })
    }

    /// A handle that reads the device's counters from any thread.
    pub(crate) fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.thread.clone())
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
