//! The in-process bus: pier-driver and the device model in one process.
//!
//! pier runs one driver everywhere: the same `VirtQueue` code that runs in
//! the unikernel also runs in the Wasm host shim, against the same device
//! model. virtio-drivers reaches hardware only through two traits, so this
//! bus implements both for a process:
//!
//! - [`hal`]: the platform ([`InProcessHal`]); "physical" memory is a
//!   [`DmaRegion`] the device reads through vm-memory, as it reads guest
//!   RAM under KVM;
//! - [`transport`]: the bus ([`InProcessTransport`]); register accesses
//!   are calls on the register file, kicks are eventfd writes (as KVM's
//!   ioeventfd), interrupts an eventfd (as irqfd);
//! - [`guest`]: the guest side's threads ([`GuestThread`]) and the bus's
//!   one trick, the guest's interrupt handler run inline on the device
//!   thread ([`InlineInterrupts`]).
//!
//! [`InProcessDevice`] puts them together: a device, its host endpoint,
//! and a driver bound to it, which [`InProcessDevice::start`] sets running
//! on a [`DeviceThread`] and a [`GuestThread`].

pub mod guest;
pub mod hal;
pub mod transport;

use std::io;
use std::sync::Arc;

use mio::Registry;
use pier_driver::{DriverConfig, VsockDriver};
use pier_stack::Stack;

pub use guest::{DriverFactory, GuestStats, GuestThread, InlineInterrupts, InterruptHandler};
pub use hal::{DmaRegion, DmaScope, InProcessHal};
pub use transport::{
    DeferredKicks, EventWaiter, InProcessDriver, InProcessTransport, SetupError, SharedMmio,
};

use crate::capture::CaptureHandle;
use crate::device::VsockConfig;
use crate::device_loop::{Clock, DeviceEvents, DeviceThread, InterruptDelivery};
use crate::endpoint::HostEndpoint;
use crate::host_side::HostSide;
use crate::mmio::{MmioDevice, VsockMmio};
use crate::queues::TxLending;
use crate::spec::{DeviceSpec, bridge_only};

/// DMA memory for one device: queues plus the driver's buffers, with room.
const REGION_BYTES: usize = 16 << 20;

/// A device (register file, queues, host endpoint) with pier-driver and a
/// guest stack bound to it, in this process, not yet running: the fields
/// are there to look at or set up before [`Self::start`].
pub struct InProcessDevice {
    /// The guest's stack, at the CID the driver read.
    pub guest: Stack,
    /// The driver, through the in-process transport.
    pub driver: InProcessDriver,
    /// The host side: a stack at CID 2 and its queue plumbing.
    pub host: HostEndpoint,
    /// The register file and queues.
    pub mmio: Arc<SharedMmio>,
    /// Kicks, lifecycle changes and the interrupt line.
    pub events: Arc<DeviceEvents>,
    /// The guest's "physical" memory; outlives the driver that uses it
    /// (and every driver a restart starts in its place).
    pub(crate) region: Arc<DmaRegion>,
    /// What the driver was started with, for a restart.
    driver_config: DriverConfig,
}

impl std::fmt::Debug for InProcessDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessDevice").field("driver", &self.driver).finish_non_exhaustive()
    }
}

impl InProcessDevice {
    /// Builds the device from `device`, then starts pier-driver on it with
    /// `driver`: features negotiated, queues stocked, DRIVER_OK set.
    pub fn new(device: VsockConfig, driver: DriverConfig) -> Result<Self, SetupError> {
        let region = Arc::new(DmaRegion::new(REGION_BYTES).map_err(SetupError::Io)?);
        let guest_cid = device.guest_cid;
        let mut mmio = VsockMmio::new(region.memory(), device)
            .ok_or_else(|| SetupError::Transport("bad queue size".into()))?;
        let events = Arc::new(DeviceEvents::new().map_err(SetupError::Io)?);
        mmio.set_irq(events.irq_line().map_err(SetupError::Io)?);
        // The only writer of this memory is pier-driver in this process,
        // which leaves published buffers alone until they come back.
        mmio.set_tx_lending(TxLending::InPlace);
        let mmio = Arc::new(MmioDevice::new(mmio));
        let driver_config = driver;
        let (guest, driver) = start_guest(&mmio, &events, &region, driver_config)?;
        let host = HostEndpoint::new(guest_cid, |_| {});
        Ok(Self { guest, driver, host, mmio, events, region, driver_config })
    }

    /// Replaces the guest, as a reboot does: the old driver resets the
    /// device as it goes (status 0), then a new driver and stack set it up
    /// again in the same memory. The host endpoint stays: what it does
    /// about the old driver's connections is what a real device does.
    pub fn restart_guest(self, config: DriverConfig) -> Result<Self, SetupError> {
        let Self { driver, host, mmio, events, region, .. } = self;
        drop(driver);
        let (guest, driver) = start_guest(&mmio, &events, &region, config)?;
        Ok(Self { guest, driver, host, mmio, events, region, driver_config: config })
    }

    /// Moves the two halves onto their own threads: the device loop, with
    /// the host side `build_host_side` makes (see [`DeviceThread::spawn`]), and
    /// the guest's. The device thread runs the guest's interrupt handler
    /// inline.
    pub fn start<B, F>(self, build_host_side: F) -> io::Result<Running>
    where
        B: HostSide + Send + 'static,
        F: FnOnce(&mut Stack, &Registry, usize) -> io::Result<B>,
    {
        self.run_on_threads(|mmio, events, host, clock, interrupts| {
            DeviceThread::spawn(mmio, events, host, build_host_side, clock, interrupts)
        })
    }

    /// [`Self::start`] with the host side `spec` describes: its capture and
    /// its Unix-socket bridge. (The device itself is the one [`Self::new`]
    /// made; give it `spec.vsock_config()`.)
    pub fn start_spec(mut self, spec: &DeviceSpec) -> io::Result<(Running, Option<CaptureHandle>)> {
        let capture = spec.start_capture(&mut self.host)?;
        let running = self.run_on_threads(|mmio, events, host, clock, interrupts| {
            spec.spawn(mmio, events, host, clock, interrupts, bridge_only)
        })?;
        Ok((running, capture))
    }

    /// Starts the guest's thread, then the device loop `spawn` makes, with
    /// the guest's interrupt handler as its interrupt delivery.
    fn run_on_threads(
        self,
        spawn: impl FnOnce(
            Arc<SharedMmio>,
            Arc<DeviceEvents>,
            HostEndpoint,
            Clock,
            Box<dyn InterruptDelivery>,
        ) -> io::Result<DeviceThread>,
    ) -> io::Result<Running> {
        let clock = Clock::new();
        let restart: DriverFactory = {
            let (mmio, events, region) =
                (self.mmio.clone(), self.events.clone(), self.region.clone());
            let config = self.driver_config;
            Box::new(move |kicks| start_driver(&mmio, &events, &region, config, Some(kicks)))
        };
        let guest = GuestThread::spawn(self.guest, self.driver, &self.events, clock, restart)?;
        let interrupts = {
            let mut mmio = self.mmio.lock().expect("device lock");
            InlineInterrupts::new(
                &mut mmio,
                guest.interrupt_handler(),
                &self.events,
                guest.app_cpu(),
            )
        };
        let device =
            spawn(self.mmio.clone(), self.events.clone(), self.host, clock, Box::new(interrupts))?;
        // The application's kicks, flushed after it releases the guest
        // lock, run the device's round on its own thread when the loop is
        // idle.
        guest.deferred_kicks().answer_inline(device.inline_kick());
        Ok(Running { guest, device, _region: self.region })
    }
}

/// Starts pier-driver on the device, its DMA memory from `region`, and the
/// guest stack it feeds, which reads received stream payloads in the
/// driver's buffers (pier-driver is the only writer of this memory, and
/// the device writes only buffers that are posted).
fn start_guest(
    mmio: &Arc<SharedMmio>,
    events: &Arc<DeviceEvents>,
    region: &DmaRegion,
    config: DriverConfig,
) -> Result<(Stack, InProcessDriver), SetupError> {
    let mut driver = start_driver(mmio, events, region, config, None)?;
    let mut stack = Stack::new(driver.stack_config());
    driver.lend_rx_buffers(&mut stack);
    Ok((stack, driver))
}

/// Starts pier-driver on the device, its DMA memory from `region`; a
/// driver that takes over from another shares its guest thread's `kicks`.
fn start_driver(
    mmio: &Arc<SharedMmio>,
    events: &Arc<DeviceEvents>,
    region: &DmaRegion,
    config: DriverConfig,
    kicks: Option<&Arc<DeferredKicks>>,
) -> Result<InProcessDriver, SetupError> {
    let _scope = region.enter();
    let mut transport = match kicks {
        Some(kicks) => {
            InProcessTransport::with_deferred_kicks(mmio.clone(), events.clone(), kicks.clone())
        }
        None => InProcessTransport::new(mmio.clone(), events.clone()),
    }
    .map_err(|e| SetupError::Transport(format!("{e:?}")))?;
    transport.set_ring_trace(mmio.lock().expect("device lock").device().ring_trace().cloned());
    VsockDriver::new(transport, config).map_err(SetupError::Driver)
}

/// An in-process device running on its threads (see
/// [`InProcessDevice::start`]).
#[derive(Debug)]
pub struct Running {
    /// The guest side: its stack, for the application to use.
    pub guest: GuestThread,
    /// The device loop.
    pub device: DeviceThread,
    /// Dropped last: the threads above stop first.
    _region: Arc<DmaRegion>,
}
