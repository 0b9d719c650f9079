//! The whole virtio path in one thread: pier-driver and a guest stack on
//! one side, the register file, queues and host endpoint on the other.
//!
//! Nothing is simulated: the driver negotiates features through the
//! register file, publishes descriptors in DMA memory, and the device
//! parses them from guest memory, exactly as across a VM boundary. Only the
//! scheduling is simplified: [`Testbed::step`] runs the driver's poll and
//! then the device's round, so tests are deterministic and need no threads.
//!
//! A testbed is an [`InProcessDevice`] (its fields are reached through it)
//! plus a clock the test may stop and move.

use std::io;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant as WallClock};

use mio::Registry;
use pier_driver::{DriverConfig, PollOutcome};
use pier_stack::{
    Instant, SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VMADDR_CID_HOST, VsockAddr, WakeList,
};

use crate::device::{TX_QUEUE, VsockConfig};
use crate::host_side::{HostSide, NoHostSide};
use crate::inprocess::{InProcessDevice, Running, SetupError};

/// A guest and a device stepped by hand; see the [module documentation](self).
#[derive(Debug)]
pub struct Testbed {
    device: InProcessDevice,
    started: WallClock,
    /// A clock the test controls; `None` follows the wall clock.
    manual_now: Option<Instant>,
    /// When set, the device takes tx packets only after the driver kicked
    /// the tx queue, as a device that sleeps between notifications does.
    /// Off by default: the device then looks at every step.
    pub kicks_only: bool,
    /// Wakers collected by the last step, for tests that look at them.
    pub wakes: WakeList,
}

impl Deref for Testbed {
    type Target = InProcessDevice;
    fn deref(&self) -> &InProcessDevice {
        &self.device
    }
}

impl DerefMut for Testbed {
    fn deref_mut(&mut self) -> &mut InProcessDevice {
        &mut self.device
    }
}

impl Testbed {
    /// A device from `device` with pier-driver started on it from `driver`.
    pub fn new(device: VsockConfig, driver: DriverConfig) -> Result<Self, SetupError> {
        Ok(Self::around(InProcessDevice::new(device, driver)?))
    }

    /// The default device (every feature) and driver configuration.
    pub fn with_defaults() -> Result<Self, SetupError> {
        Self::new(VsockConfig::default(), DriverConfig::default())
    }

    fn around(device: InProcessDevice) -> Self {
        Self {
            device,
            started: WallClock::now(),
            manual_now: None,
            kicks_only: false,
            wakes: WakeList::new(),
        }
    }

    /// Reboots the guest (see [`InProcessDevice::restart_guest`]); the
    /// clock and settings stay.
    pub fn restart_guest(self, config: DriverConfig) -> Result<Self, SetupError> {
        let Self { device, started, manual_now, kicks_only, wakes } = self;
        let device = device.restart_guest(config)?;
        Ok(Self { device, started, manual_now, kicks_only, wakes })
    }

    /// The testbed's time: the wall clock since creation, unless frozen.
    pub fn now(&self) -> Instant {
        self.manual_now
            .unwrap_or_else(|| Instant::from_micros(self.started.elapsed().as_micros() as u64))
    }

    /// Freezes the clock at its current reading; `advance` moves it.
    pub fn freeze_clock(&mut self) {
        self.manual_now = Some(self.now());
    }

    /// Moves the (frozen) clock forward.
    pub fn advance(&mut self, by: Duration) {
        let now = self.now() + by;
        self.manual_now = Some(now);
    }

    /// One round on each side: the driver polls its queues, then the device
    /// takes the guest's packets and answers. Returns packets moved.
    pub fn step(&mut self) -> usize {
        self.step_with(&mut NoHostSide)
    }

    /// [`Self::step`] with a host host_side beside the host endpoint.
    pub fn step_with(&mut self, host_side: &mut impl HostSide) -> usize {
        let outcome = self.poll_driver();
        let kicked = self.take_kick(TX_QUEUE);
        outcome.received + outcome.sent + self.device_round(host_side, kicked)
    }

    /// The guest's half of a step: the driver polls its queues once.
    pub fn poll_driver(&mut self) -> PollOutcome {
        let now = self.now();
        let InProcessDevice { guest, driver, .. } = &mut self.device;
        let outcome = driver.poll(guest, now, &mut self.wakes);
        self.wakes.wake_all();
        outcome
    }

    /// Whether the driver kicked `queue` since the last look (consuming
    /// the kick, as the device loop does when it wakes).
    pub fn take_kick(&self, queue: usize) -> bool {
        self.events.queue(queue).expect("queue").read().is_ok()
    }

    /// The device's half of a step: it takes the guest's packets and
    /// answers; with [`Self::kicks_only`] it takes tx packets only when
    /// `tx_kicked`. Returns packets moved.
    pub fn device_round(&mut self, host_side: &mut impl HostSide, tx_kicked: bool) -> usize {
        let now = self.now();
        let InProcessDevice { host, mmio, .. } = &mut self.device;
        let mut mmio = mmio.lock().expect("device lock");
        let moved = if self.kicks_only && !tx_kicked {
            host.handle_timeout(now, &mut self.wakes);
            host.give_rx(&mut mmio, host_side, now, &mut self.wakes)
        } else {
            host.process(&mut mmio, host_side, now, &mut self.wakes)
        };
        drop(mmio);
        self.wakes.wake_all();
        moved
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
        panic!("the testbed never went quiet");
    }

    /// Connects a new guest socket of type `ty` to a new host listener on
    /// `port`, stepping until the handshake is done; returns the guest's
    /// socket and the host's accepted one. Panics if either side fails:
    /// every test that moves data starts here.
    pub fn connect(&mut self, ty: SocketType, port: u32) -> (SocketHandle, SocketHandle) {
        let host = self.host.stack();
        let listener = host.socket(ty).expect("host socket");
        host.bind(listener, VsockAddr::new(VMADDR_CID_ANY, port)).expect("host bind");
        host.listen(listener, 16).expect("host listen");
        let guest = self.guest.socket(ty).expect("guest socket");
        let now = self.now();
        self.guest
            .connect(guest, VsockAddr::new(VMADDR_CID_HOST, port), now)
            .expect("guest connect");
        self.run();
        self.guest.finish_connect(guest).expect("connected over virtio");
        let (accepted, peer) = self.host.stack().accept(listener).expect("host accept");
        assert_eq!(u64::from(peer.cid), self.driver.guest_cid(), "the peer is the guest");
        (guest, accepted)
    }

    /// Moves the two halves onto their own threads (see
    /// [`InProcessDevice::start`]).
    pub fn start<B, F>(self, build_host_side: F) -> io::Result<Running>
    where
        B: HostSide + Send + 'static,
        F: FnOnce(&mut Stack, &Registry, usize) -> io::Result<B>,
    {
        self.device.start(build_host_side)
    }
}
