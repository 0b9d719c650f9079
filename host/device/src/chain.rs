//! The whole virtio chain in one thread: pier-driver and a guest stack on
//! one side, the register file, queues and host endpoint on the other.
//!
//! Nothing is simulated: the driver negotiates features through the
//! register file, publishes descriptors in DMA memory, and the device
//! parses them from guest memory, exactly as across a VM boundary. Only the
//! scheduling is simplified: [`Chain::step`] runs the driver's poll and then
//! the device's round, so tests are deterministic and need no threads.

use std::sync::Arc;
use std::time::Instant as WallClock;

use pier_driver::{DriverConfig, DriverError, VsockDriver};
use pier_stack::{Instant, Stack, WakeList};
use vm_memory::GuestMemoryMmap;

use crate::endpoint::{HostEndpoint, NoRelayHooks, RelayHooks};
use crate::inprocess::{DeviceEvents, DmaRegion, InProcessHal, InProcessTransport};
use crate::mmio::{MmioDevice, VsockConfig, VsockMmio};

/// The register file as the in-process transport sees it.
pub type SharedMmio = MmioDevice<Arc<GuestMemoryMmap>>;
/// pier-driver over the in-process transport.
pub type InProcessDriver = VsockDriver<InProcessHal, InProcessTransport<SharedMmio>>;

/// DMA memory for one chain: queues plus the driver's buffers, with room.
const REGION_BYTES: usize = 16 << 20;

/// A guest (driver + stack) and a device (register file + host endpoint).
pub struct Chain {
    pub guest: Stack,
    pub driver: InProcessDriver,
    pub host: HostEndpoint,
    pub mmio: Arc<SharedMmio>,
    pub events: Arc<DeviceEvents>,
    /// Keeps the DMA memory alive for as long as the driver uses it.
    _region: DmaRegion,
    started: WallClock,
    /// A clock the test controls; `None` follows the wall clock.
    manual_now: Option<Instant>,
    /// When set, the device takes tx packets only after the driver kicked
    /// the tx queue, as a device that sleeps between notifications does.
    /// Off by default: the device then looks at every step.
    pub kicks_only: bool,
    pub wakes: WakeList,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("driver", &self.driver).finish_non_exhaustive()
    }
}

/// Why a chain could not be built.
#[derive(Debug)]
pub enum ChainError {
    Io(std::io::Error),
    Transport(String),
    Driver(DriverError),
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Transport(e) => write!(f, "transport: {e}"),
            Self::Driver(e) => write!(f, "driver: {e}"),
        }
    }
}

impl std::error::Error for ChainError {}

/// Starts pier-driver on the device, its DMA memory from `region`, and the
/// guest stack it feeds.
fn start_guest(
    mmio: &Arc<SharedMmio>,
    events: &Arc<DeviceEvents>,
    region: &DmaRegion,
    config: DriverConfig,
) -> Result<(Stack, InProcessDriver), ChainError> {
    let _scope = region.enter();
    let transport = InProcessTransport::new(mmio.clone(), events.clone())
        .map_err(|e| ChainError::Transport(format!("{e:?}")))?;
    let driver = VsockDriver::new(transport, config).map_err(ChainError::Driver)?;
    Ok((Stack::new(driver.stack_config()), driver))
}

impl Chain {
    pub fn new(device: VsockConfig, driver: DriverConfig) -> Result<Self, ChainError> {
        let region = DmaRegion::new(REGION_BYTES).map_err(ChainError::Io)?;
        let guest_cid = device.guest_cid;
        let mut mmio = VsockMmio::new(region.memory(), device)
            .ok_or_else(|| ChainError::Transport("bad queue size".into()))?;
        let events = Arc::new(DeviceEvents::new().map_err(ChainError::Io)?);
        mmio.set_irq(events.irq_line().map_err(ChainError::Io)?);
        let mmio = Arc::new(MmioDevice::new(mmio));
        let (guest, driver) = start_guest(&mmio, &events, &region, driver)?;
        Ok(Self {
            guest,
            driver,
            host: HostEndpoint::new(guest_cid, |_| {}),
            mmio,
            events,
            _region: region,
            started: WallClock::now(),
            manual_now: None,
            kicks_only: false,
            wakes: WakeList::new(),
        })
    }

    /// Replaces the guest, as a reboot does: the old driver resets the
    /// device as it goes (status 0), then a new driver and stack set it up
    /// again in the same memory. The host endpoint stays: what it does
    /// about the old driver's connections is what a real device does.
    pub fn restart_guest(self, config: DriverConfig) -> Result<Self, ChainError> {
        let Self {
            driver,
            host,
            mmio,
            events,
            _region,
            started,
            manual_now,
            kicks_only,
            wakes,
            ..
        } = self;
        drop(driver);
        let (guest, driver) = start_guest(&mmio, &events, &_region, config)?;
        Ok(Self {
            guest,
            driver,
            host,
            mmio,
            events,
            _region,
            started,
            manual_now,
            kicks_only,
            wakes,
        })
    }

    /// The default device (every feature) and driver configuration.
    pub fn with_defaults() -> Result<Self, ChainError> {
        Self::new(VsockConfig::default(), DriverConfig::default())
    }

    pub fn now(&self) -> Instant {
        self.manual_now
            .unwrap_or_else(|| Instant::from_micros(self.started.elapsed().as_micros() as u64))
    }

    /// Freezes the clock at its current reading; `advance` moves it.
    pub fn freeze_clock(&mut self) {
        self.manual_now = Some(self.now());
    }

    pub fn advance(&mut self, by: std::time::Duration) {
        let now = self.now() + by;
        self.manual_now = Some(now);
    }

    /// One round on each side: the driver polls its queues, then the device
    /// takes the guest's packets and answers. Returns packets moved.
    pub fn step(&mut self) -> usize {
        self.step_with(&mut NoRelayHooks)
    }

    pub fn step_with(&mut self, datagrams: &mut impl RelayHooks) -> usize {
        let now = self.now();
        let outcome = self.driver.poll(&mut self.guest, now, &mut self.wakes);
        let mut mmio = self.mmio.lock().expect("device lock");
        let kicked = self.events.queue(crate::mmio::TX_QUEUE).expect("tx").read().is_ok();
        let moved = if self.kicks_only && !kicked {
            self.host.handle_timeout(now, &mut self.wakes);
            self.host.give_rx(&mut mmio, now, &mut self.wakes)
        } else {
            self.host.process(&mut mmio, datagrams, now, &mut self.wakes)
        };
        drop(mmio);
        self.wakes.wake_all();
        outcome.received + outcome.sent + moved
    }

    /// Moves the two halves onto their own threads: the device loop (with
    /// `service` beside the host endpoint) and the guest's poll loop.
    pub fn start<S: crate::runner::HostService + 'static>(
        self,
        service: S,
    ) -> std::io::Result<Running> {
        let clock = crate::runner::Clock::new();
        let guest = crate::runner::GuestThread::spawn(self.driver, &self.events, clock)?;
        let device = crate::runner::DeviceThread::spawn(
            self.mmio.clone(),
            self.events.clone(),
            self.host,
            service,
            clock,
            Some(guest.interrupt_handler()),
        )?;
        Ok(Running { guest, device, _region: self._region })
    }

    /// Steps until a round moves nothing.
    pub fn run(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..100_000 {
            let moved = self.step();
            total += moved;
            if moved == 0 && !self.guest.has_pending_tx() && !self.host.stack().has_pending_tx() {
                return total;
            }
        }
        panic!("the chain never went quiet");
    }
}

/// A chain whose halves run on their own threads (see [`Chain::start`]).
#[derive(Debug)]
pub struct Running {
    pub guest: crate::runner::GuestThread,
    pub device: crate::runner::DeviceThread,
    /// Dropped last: the threads above stop first.
    _region: DmaRegion,
}
