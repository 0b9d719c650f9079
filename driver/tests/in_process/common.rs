//! What the driver's tests share: the device's side seen on its own (a
//! round without a driver poll, a device that sleeps between kicks), the
//! kicks and interrupts the tests count, and a bus that records how the
//! driver talks to the register file.

use std::sync::{Arc, Mutex};

use pier_device::device::{RX_QUEUE, TX_QUEUE, VsockConfig};
use pier_device::inprocess::SharedMmio;
use pier_device::testing::Testbed;
use pier_device::{
    DeviceEvents, DmaRegion, InProcessDevice, InProcessHal, InProcessTransport, MmioBus,
    MmioDevice, MmioEvent, NoHostSide, VsockMmio,
};
use pier_driver::{DriverConfig, DriverError, PollOutcome, VsockDriver, VsockFeatures};
use pier_stack::{SocketHandle, SocketType, Stack, VMADDR_CID_ANY, VsockAddr, WakeList};
use virtio_bindings::virtio_mmio as reg;
use virtio_drivers::transport::DeviceStatus;

/// A testbed whose device offers `features` (bits of [`VsockFeatures`]).
pub fn offering(features: VsockFeatures, driver: DriverConfig) -> Testbed {
    let device = VsockConfig { features: features.bits(), ..VsockConfig::default() };
    Testbed::new(device, driver).expect("the driver starts")
}

/// A listener of type `ty` on `port` of `stack`.
pub fn listen(stack: &mut Stack, ty: SocketType, port: u32) -> SocketHandle {
    let l = stack.socket(ty).unwrap();
    stack.bind(l, VsockAddr::new(VMADDR_CID_ANY, port)).unwrap();
    stack.listen(l, 16).unwrap();
    l
}

/// Sends `bytes` from the guest's socket `c` and checks that they reach
/// the host's socket `s`.
pub fn assert_reaches_host(bed: &mut Testbed, c: SocketHandle, s: SocketHandle, bytes: &[u8]) {
    bed.guest.send(c, bytes).unwrap();
    bed.run();
    let mut buf = vec![0u8; bytes.len() + 1];
    let info = bed.host.stack().recv(s, &mut buf).expect("the bytes reached the host");
    assert_eq!(&buf[..info.len], bytes);
}

/// Streams `data` from the host's socket `s` to the guest's socket `c`,
/// sending what the host stack takes and calling `step` to move packets,
/// until everything has arrived or `step` has run 100 000 times. Returns
/// everything the guest read from `c`.
pub fn stream_to_guest(
    bed: &mut Testbed,
    (c, s): (SocketHandle, SocketHandle),
    data: &[u8],
    mut step: impl FnMut(&mut Testbed),
) -> Vec<u8> {
    let (mut sent, mut got) = (0, Vec::with_capacity(data.len()));
    let mut buf = vec![0u8; 65536];
    for _ in 0..100_000 {
        if sent < data.len() {
            sent += bed.host.stack().send(s, &data[sent..]).unwrap_or(0);
        }
        step(bed);
        while let Ok(info) = bed.guest.recv(c, &mut buf) {
            got.extend_from_slice(&buf[..info.len]);
        }
        if sent == data.len() && got.len() >= data.len() {
            break;
        }
    }
    got
}

/// One driver poll and no device round.
pub fn poll(bed: &mut Testbed) -> PollOutcome {
    bed.poll_driver()
}

/// One full device round (tx taken, rx given, timers fired) and no driver
/// poll. Returns the packets moved.
pub fn device_round(bed: &mut Testbed) -> usize {
    bed.device_round(&mut NoHostSide, true)
}

/// Kicks the driver sent on `queue` since the last look: the in-process
/// transport's ioeventfd for the queue, read (and so cleared) here.
pub fn kicks(bed: &Testbed, queue: usize) -> u64 {
    bed.events.queue(queue).expect("a vsock queue").read().unwrap_or(0)
}

/// Interrupts the device has raised so far, on every queue.
pub fn interrupts(bed: &Testbed) -> u64 {
    bed.mmio.lock().unwrap().interrupts_raised()
}

/// Tx kicks the driver counted itself (all its kicks but rx refills; event
/// buffers reposted are not counted).
pub fn tx_kicks_counted(bed: &Testbed) -> u64 {
    let stats = bed.driver.stats();
    stats.notifications - stats.rx_notifications
}

/// A device that sleeps between kicks, as a device thread does: it takes
/// tx chains only after a tx kick, and once it has found the rx ring empty
/// it looks at that ring again only after an rx kick. A kick the driver
/// owes and does not send stalls it, which the tests see as a stall.
#[derive(Debug, Default)]
pub struct KickDrivenDevice {
    /// The last rx round left packets waiting for buffers.
    rx_waiting: bool,
    /// Kicks it was woken by, per queue (the driver's kicks, as counted by
    /// the device rather than by the driver).
    pub tx_kicks: u64,
    pub rx_kicks: u64,
}

impl KickDrivenDevice {
    /// One device round. Returns the packets moved.
    pub fn round(&mut self, bed: &mut Testbed) -> usize {
        let now = bed.now();
        let (tx_kicks, rx_kicks) = (kicks(bed, TX_QUEUE), kicks(bed, RX_QUEUE));
        self.tx_kicks += tx_kicks;
        self.rx_kicks += rx_kicks;
        let (tx_kicked, rx_kicked) = (tx_kicks > 0, rx_kicks > 0);
        let InProcessDevice { host, mmio, .. } = &mut **bed;
        let mut mmio = mmio.lock().unwrap();
        let mut wakes = WakeList::new();
        let mut moved = 0;
        // A drain cut short by the device's budget goes on unkicked.
        if tx_kicked || host.tx_pending() {
            moved += host.take_tx(&mut mmio, &mut NoHostSide, now, &mut wakes).unwrap();
        }
        host.handle_timeout(now, &mut wakes);
        if rx_kicked || !self.rx_waiting {
            moved += host.give_rx(&mut mmio, &mut NoHostSide, now, &mut wakes);
            self.rx_waiting = host.stack().has_pending_tx();
        }
        drop(mmio);
        wakes.wake_all();
        moved
    }

    /// A driver poll, then a round of this device.
    pub fn step(&mut self, bed: &mut Testbed) -> usize {
        let outcome = poll(bed);
        outcome.received + outcome.sent + self.round(bed)
    }
}

/// A register file behind a bus that records the driver's status writes
/// (with what the device then holds), the registers it reads and the
/// widths of its config-space accesses, and that can refuse every feature
/// set (FEATURES_OK never sticks).
struct RecordingBus {
    inner: SharedMmio,
    refuse_features: bool,
    statuses: Mutex<Vec<Status>>,
    reads: Mutex<Vec<u64>>,
    config_widths: Mutex<Vec<usize>>,
}

/// One status write: what the driver wrote and what the device kept.
#[derive(Clone, Copy, Debug)]
pub struct Status {
    pub written: DeviceStatus,
    pub held: DeviceStatus,
}

impl MmioBus for RecordingBus {
    fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        self.reads.lock().unwrap().push(offset);
        if offset >= pier_device::mmio::CONFIG_OFFSET {
            self.config_widths.lock().unwrap().push(data.len());
        }
        self.inner.mmio_read(offset, data)
    }

    fn mmio_write(&self, offset: u64, data: &[u8]) -> MmioEvent {
        if offset != u64::from(reg::VIRTIO_MMIO_STATUS) || data.len() != 4 {
            return self.inner.mmio_write(offset, data);
        }
        let written = u32::from_le_bytes(data.try_into().unwrap());
        let mut value = written;
        if self.refuse_features {
            value &= !DeviceStatus::FEATURES_OK.bits();
        }
        let event = self.inner.mmio_write(offset, &value.to_le_bytes());
        let held = self.inner.lock().unwrap().status();
        self.statuses.lock().unwrap().push(Status {
            written: DeviceStatus::from_bits_retain(written),
            held: DeviceStatus::from_bits_retain(held),
        });
        event
    }
}

/// What a driver start on a [`RecordingBus`] did.
#[derive(Debug)]
pub struct Recorded {
    /// The started driver's CID and features, or why it did not start.
    pub outcome: Result<(u64, VsockFeatures), DriverError>,
    /// Every status write, the dropped transport's reset included.
    pub statuses: Vec<Status>,
    /// The offset of every register read, in order.
    pub reads: Vec<u64>,
    /// Widths of the config-space reads.
    pub config_widths: Vec<usize>,
}

/// Starts pier-driver with `driver` on a device from `device`, through a
/// recording bus, then drops it.
pub fn start_recorded(
    device: VsockConfig,
    driver: DriverConfig,
    refuse_features: bool,
) -> Recorded {
    let region = DmaRegion::new(8 << 20).unwrap();
    let _scope = region.enter();
    let bus = Arc::new(RecordingBus {
        inner: MmioDevice::new(VsockMmio::new(region.memory(), device).unwrap()),
        refuse_features,
        statuses: Mutex::new(Vec::new()),
        reads: Mutex::new(Vec::new()),
        config_widths: Mutex::new(Vec::new()),
    });
    let events = Arc::new(DeviceEvents::new().unwrap());
    let transport = InProcessTransport::new(bus.clone(), events).unwrap();
    let outcome = VsockDriver::<InProcessHal, _>::new(transport, driver)
        .map(|driver| (driver.guest_cid(), driver.features()));
    let statuses = bus.statuses.lock().unwrap().clone();
    let reads = bus.reads.lock().unwrap().clone();
    let config_widths = bus.config_widths.lock().unwrap().clone();
    Recorded { outcome, statuses, reads, config_widths }
}
