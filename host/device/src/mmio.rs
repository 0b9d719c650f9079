//! The virtio-mmio (version 2) face of the device: its register file.
//!
//! A driver on a virtio-mmio bus discovers, configures and resets the
//! device only through these 32-bit registers and the config space behind
//! them (virtio 1.2 §4.2.2). This module decodes them into the bus-neutral
//! steps of [`VsockDevice`] (features, status, queue setup) and keeps what
//! only this bus has: the feature and queue selectors, the queue registers
//! a driver writes before it sets `QueueReady`, and `InterruptStatus`,
//! which turns the device's notifications into bits the driver reads and
//! acknowledges on its one interrupt line. Every other bus (vhost-user)
//! drives the same [`VsockDevice`] without any of this.
//!
//! The register file does not care how its accesses arrive. A KVM VMM feeds
//! it MMIO exits; the in-process transport ([`crate::inprocess`]) calls it
//! directly ([`MmioBus`]).
//!
//! Accesses are untrusted: a register access of the wrong width or
//! alignment reads as zero and writes are ignored, config-space accesses of
//! any width are clipped to the config space, and no value a driver writes
//! can make the device panic.

use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard};

use virtio_bindings::virtio_mmio as reg;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::EventFd;

use crate::device::{
    NUM_QUEUES, Notify, QueueRings, SharedDevice, StatusChange, VSOCK_DEVICE_ID, VsockConfig,
    VsockDevice, status,
};
use crate::device_loop::DeviceEvents;

/// `MagicValue`: "virt" in little-endian.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// The virtio-mmio version this register file implements.
pub const MMIO_VERSION: u32 = 2;
/// Offset of the device-specific config space.
pub const CONFIG_OFFSET: u64 = reg::VIRTIO_MMIO_CONFIG as u64;
/// `QueueNotify`'s offset, where a KVM VMM places the queues' ioeventfds.
pub const QUEUE_NOTIFY_OFFSET: u64 = reg::VIRTIO_MMIO_QUEUE_NOTIFY as u64;

/// `InterruptStatus` bit: a queue has new used entries.
pub const INT_VRING: u32 = reg::VIRTIO_MMIO_INT_VRING;
/// `InterruptStatus` bit: the config space changed.
pub const INT_CONFIG: u32 = reg::VIRTIO_MMIO_INT_CONFIG;

/// What a register write means for the rest of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioEvent {
    /// Nothing beyond the register itself changed.
    None,
    /// `QueueNotify`: the driver kicked this queue.
    Notify(u16),
    /// Status 0 was written: every queue was forgotten, so must be every
    /// connection.
    Reset,
    /// The driver set DRIVER_OK: the queues may now be used.
    DriverOk,
    /// The driver gave up on the device (status FAILED).
    Failed,
}

impl MmioEvent {
    /// Passes the write on to the device loop: a kick to its queue's
    /// eventfd (what a KVM ioeventfd does without an exit), a lifecycle
    /// change to the control eventfd. A full eventfd counter only means the
    /// loop has not looked yet, so it is not an error.
    pub fn signal(self, events: &DeviceEvents) {
        let fd = match self {
            MmioEvent::None => return,
            MmioEvent::Notify(q) => events.queue(usize::from(q)),
            MmioEvent::Reset | MmioEvent::DriverOk | MmioEvent::Failed => Some(events.control()),
        };
        if let Some(fd) = fd {
            let _ = fd.write(1);
        }
    }
}

/// Something a register file can be reached through: MMIO exits of a VMM,
/// or the in-process transport.
pub trait MmioBus: Send + Sync {
    /// Reads `data.len()` bytes at `offset` from the start of the device.
    fn mmio_read(&self, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset`, returning what the write means.
    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent;
}

/// Driver-written queue registers, latched until `QueueReady` is set so
/// that half-written 64-bit addresses are never applied.
#[derive(Clone, Copy, Debug, Default)]
struct QueueRegs {
    num: u32,
    desc: u64,
    driver: u64,
    device: u64,
}

/// `InterruptStatus` and the one interrupt line behind it, shared by the
/// register file, the device's [`Notify`] and [`MmioDevice`]'s lock-free
/// interrupt registers.
#[derive(Debug, Default)]
struct InterruptLine {
    status: AtomicU32,
    /// A KVM irqfd, the in-process transport's interrupt eventfd, or
    /// nothing while a device loop delivers interrupts itself.
    line: Mutex<Option<EventFd>>,
}

impl InterruptLine {
    fn raise(&self, bits: u32) -> io::Result<()> {
        self.status.fetch_or(bits, Ordering::AcqRel);
        match &*self.line.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(line) => line.write(1),
            None => Ok(()),
        }
    }
}

/// The device's notifications as virtio-mmio delivers them (virtio 1.2
/// §4.2.3.4): a bit in `InterruptStatus`, then the line.
#[derive(Debug)]
struct MmioNotify(Arc<InterruptLine>);

impl Notify for MmioNotify {
    fn used_buffer(&mut self, _queue: usize) {
        // A failed eventfd write only loses a wakeup the driver also
        // recovers from by polling, so it is not a queue error.
        let _ = self.0.raise(INT_VRING);
    }

    fn config_changed(&mut self) {
        let _ = self.0.raise(INT_CONFIG);
    }
}

/// The register file of one virtio-vsock device, in front of the device
/// it drives (which it dereferences to).
#[derive(Debug)]
pub struct VsockMmio<A: GuestAddressSpace> {
    device: VsockDevice<A>,
    interrupts: Arc<InterruptLine>,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    queue_regs: [QueueRegs; NUM_QUEUES],
}

impl<A: GuestAddressSpace> Deref for VsockMmio<A> {
    type Target = VsockDevice<A>;
    fn deref(&self) -> &VsockDevice<A> {
        &self.device
    }
}

impl<A: GuestAddressSpace> DerefMut for VsockMmio<A> {
    fn deref_mut(&mut self) -> &mut VsockDevice<A> {
        &mut self.device
    }
}

impl<A: GuestAddressSpace> VsockMmio<A> {
    /// Creates a device over `mem` behind a register file. Returns `None`
    /// if `config.queue_size` is not a power of two in 1..=32768.
    pub fn new(mem: A, config: VsockConfig) -> Option<Self> {
        let interrupts = Arc::new(InterruptLine::default());
        let device = VsockDevice::new(mem, config, Box::new(MmioNotify(interrupts.clone())))?;
        Some(VsockMmio {
            device,
            interrupts,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            queue_regs: [QueueRegs::default(); NUM_QUEUES],
        })
    }

    /// The device behind the registers.
    pub fn device(&self) -> &VsockDevice<A> {
        &self.device
    }

    /// The device behind the registers, mutably.
    pub fn device_mut(&mut self) -> &mut VsockDevice<A> {
        &mut self.device
    }

    /// Sets the line interrupts are raised on (a KVM irqfd, or the
    /// in-process transport's interrupt eventfd).
    pub fn set_irq(&mut self, irq: EventFd) {
        *self.interrupts.line.lock().unwrap_or_else(|p| p.into_inner()) = Some(irq);
    }

    /// Takes the interrupt line away, for a device loop that delivers
    /// interrupts itself (it watches
    /// [`VsockDevice::interrupts_raised`]).
    pub fn take_irq(&mut self) -> Option<EventFd> {
        self.interrupts.line.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The `InterruptStatus` register.
    pub fn interrupt_status(&self) -> u32 {
        self.interrupts.status.load(Ordering::Acquire)
    }

    /// Sets bits in `InterruptStatus` and triggers the interrupt line,
    /// whatever the queues' suppression says.
    pub fn raise_interrupt(&mut self, bits: u32) -> io::Result<()> {
        self.device.count_interrupt();
        self.interrupts.raise(bits)
    }

    /// Reads from the register file. Any width and offset is accepted.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG_OFFSET {
            self.device.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let value = self.read_reg(offset);
        data.copy_from_slice(&value.to_le_bytes());
    }

    /// Writes to the register file. Any width and offset is accepted;
    /// invalid accesses are ignored.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> MmioEvent {
        if offset >= CONFIG_OFFSET {
            // guest_cid is read-only for the driver.
            return MmioEvent::None;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return MmioEvent::None;
        };
        if !offset.is_multiple_of(4) {
            return MmioEvent::None;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes))
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let Ok(offset) = u32::try_from(offset) else {
            return 0;
        };
        let sel = usize::try_from(self.queue_sel).ok().and_then(|i| self.device.queue(i));
        let features = self.device.device_features();
        match offset {
            reg::VIRTIO_MMIO_MAGIC_VALUE => MAGIC_VALUE,
            reg::VIRTIO_MMIO_VERSION => MMIO_VERSION,
            reg::VIRTIO_MMIO_DEVICE_ID => VSOCK_DEVICE_ID,
            reg::VIRTIO_MMIO_VENDOR_ID => self.device.config().vendor_id,
            reg::VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => features as u32,
                1 => (features >> 32) as u32,
                _ => 0,
            },
            reg::VIRTIO_MMIO_QUEUE_NUM_MAX => sel.map_or(0, |q| u32::from(q.queue().max_size())),
            reg::VIRTIO_MMIO_QUEUE_READY => sel.map_or(0, |q| u32::from(q.is_ready())),
            reg::VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status(),
            reg::VIRTIO_MMIO_STATUS => self.device.status(),
            reg::VIRTIO_MMIO_CONFIG_GENERATION => self.device.config_generation(),
            // There is no shared-memory region: a missing region reads as
            // all ones, length and base (spec 4.2.2.1), so a driver that
            // probes SHMSel 0 sees "none" rather than an empty region at 0.
            reg::VIRTIO_MMIO_SHM_LEN_LOW
            | reg::VIRTIO_MMIO_SHM_LEN_HIGH
            | reg::VIRTIO_MMIO_SHM_BASE_LOW
            | reg::VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            // Write-only and unknown registers read as 0.
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) -> MmioEvent {
        let Ok(offset) = u32::try_from(offset) else {
            return MmioEvent::None;
        };
        match offset {
            reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            reg::VIRTIO_MMIO_QUEUE_NUM => self.with_queue_regs(|r| r.num = value),
            reg::VIRTIO_MMIO_QUEUE_READY => self.write_queue_ready(value),
            reg::VIRTIO_MMIO_QUEUE_NOTIFY => {
                if let Ok(q) = u16::try_from(value)
                    && usize::from(q) < NUM_QUEUES
                {
                    return MmioEvent::Notify(q);
                }
            }
            reg::VIRTIO_MMIO_INTERRUPT_ACK => {
                self.interrupts.status.fetch_and(!value, Ordering::AcqRel);
            }
            reg::VIRTIO_MMIO_STATUS => return self.write_status(value),
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.desc, value))
            }
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.desc, value))
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.driver, value))
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.driver, value))
            }
            reg::VIRTIO_MMIO_QUEUE_USED_LOW => {
                self.with_queue_regs(|r| set_low(&mut r.device, value))
            }
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH => {
                self.with_queue_regs(|r| set_high(&mut r.device, value))
            }
            _ => {}
        }
        MmioEvent::None
    }

    /// Applies `f` to the latched registers of the selected queue, unless
    /// that queue is live (the spec forbids changing a ready queue).
    fn with_queue_regs(&mut self, f: impl FnOnce(&mut QueueRegs)) {
        let Ok(i) = usize::try_from(self.queue_sel) else {
            return;
        };
        if let (Some(r), Some(q)) = (self.queue_regs.get_mut(i), self.device.queue(i))
            && !q.is_ready()
        {
            f(r);
        }
    }

    /// `DriverFeatures` carries one 32-bit half of the feature word, chosen
    /// by `DriverFeaturesSel`.
    fn write_driver_features(&mut self, value: u32) {
        let mut features = self.device.driver_features();
        match self.driver_features_sel {
            0 => set_low(&mut features, value),
            1 => set_high(&mut features, value),
            _ => return,
        }
        self.device.set_driver_features(features);
    }

    fn write_queue_ready(&mut self, value: u32) {
        let Ok(i) = usize::try_from(self.queue_sel) else {
            return;
        };
        let Some(regs) = self.queue_regs.get(i).copied() else {
            return;
        };
        if value == 0 {
            // Forget ring positions so a re-setup starts from index 0.
            self.device.deactivate_queue(i);
            return;
        }
        if self.device.status() & status::FEATURES_OK == 0 {
            return;
        }
        let Ok(size) = u16::try_from(regs.num) else {
            return;
        };
        // virtio-mmio starts a new queue's rings at index 0. Rings outside
        // guest memory leave QueueReady at 0, which the driver can read back.
        let rings = QueueRings {
            size,
            desc: regs.desc,
            avail: regs.driver,
            used: regs.device,
            next_avail: 0,
            next_used: 0,
        };
        self.device.activate_queue(i, rings);
    }

    fn write_status(&mut self, value: u32) -> MmioEvent {
        match self.device.set_status(value) {
            StatusChange::None => MmioEvent::None,
            StatusChange::Reset => {
                self.device_features_sel = 0;
                self.driver_features_sel = 0;
                self.queue_sel = 0;
                self.queue_regs = [QueueRegs::default(); NUM_QUEUES];
                self.interrupts.status.store(0, Ordering::Release);
                MmioEvent::Reset
            }
            StatusChange::DriverOk => MmioEvent::DriverOk,
            StatusChange::Failed => MmioEvent::Failed,
        }
    }
}

/// The register file as a bus reaches it from several threads: the
/// interrupt registers lock-free, everything else behind one lock.
///
/// A vCPU that takes the device's interrupt reads `InterruptStatus` and
/// writes `InterruptACK` first thing. The device loop holds the lock while
/// it works on the queues, so if those two registers went through the lock
/// every interrupt would wait for the device's round to end. They live in
/// an atomic the register file shares.
#[derive(Debug)]
pub struct MmioDevice<A: GuestAddressSpace> {
    interrupts: Arc<InterruptLine>,
    regs: Mutex<VsockMmio<A>>,
}

impl<A: GuestAddressSpace> MmioDevice<A> {
    pub fn new(mmio: VsockMmio<A>) -> Self {
        Self { interrupts: mmio.interrupts.clone(), regs: Mutex::new(mmio) }
    }

    /// The register file and the device behind it.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, VsockMmio<A>>> {
        self.regs.lock()
    }
}

/// The device behind a locked register file, as the device loop sees it.
#[derive(Debug)]
pub struct MmioDeviceGuard<'a, A: GuestAddressSpace>(MutexGuard<'a, VsockMmio<A>>);

impl<A: GuestAddressSpace> Deref for MmioDeviceGuard<'_, A> {
    type Target = VsockDevice<A>;
    fn deref(&self) -> &VsockDevice<A> {
        &self.0.device
    }
}

impl<A: GuestAddressSpace> DerefMut for MmioDeviceGuard<'_, A> {
    fn deref_mut(&mut self) -> &mut VsockDevice<A> {
        &mut self.0.device
    }
}

impl<A: GuestAddressSpace + Send + 'static> SharedDevice for MmioDevice<A> {
    type Memory = A;
    type Guard<'a> = MmioDeviceGuard<'a, A>;

    fn lock_device(&self) -> MmioDeviceGuard<'_, A> {
        MmioDeviceGuard(self.regs.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl<A: GuestAddressSpace + Send> MmioBus for MmioDevice<A> {
    fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        if offset == u64::from(reg::VIRTIO_MMIO_INTERRUPT_STATUS) && data.len() == 4 {
            data.copy_from_slice(&self.interrupts.status.load(Ordering::Acquire).to_le_bytes());
            return;
        }
        self.regs.mmio_read(offset, data)
    }

    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent {
        if offset == u64::from(reg::VIRTIO_MMIO_INTERRUPT_ACK)
            && let Ok(bytes) = <[u8; 4]>::try_from(data)
        {
            self.interrupts.status.fetch_and(!u32::from_le_bytes(bytes), Ordering::AcqRel);
            return MmioEvent::None;
        }
        self.regs.mmio_write(offset, data)
    }
}

impl<A: GuestAddressSpace + Send> MmioBus for Mutex<VsockMmio<A>> {
    fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        self.lock().unwrap_or_else(|p| p.into_inner()).read(offset, data)
    }

    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent {
        self.lock().unwrap_or_else(|p| p.into_inner()).write(offset, data)
    }
}

fn set_low(v: &mut u64, low: u32) {
    *v = (*v & !0xffff_ffff) | u64::from(low);
}

fn set_high(v: &mut u64, high: u32) {
    *v = (*v & 0xffff_ffff) | (u64::from(high) << 32);
}
