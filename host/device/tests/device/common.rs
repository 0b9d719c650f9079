//! Shared test scaffolding: a driver-side harness over the in-process
//! transport, a device thread woken by eventfds, and a raw ring writer for
//! building chains that no well-behaved driver would produce.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bitflags::bitflags;
use pier_device::device::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE, status};
use pier_device::{
    DeviceEvents, DmaRegion, DmaScope, EventWaiter, HDR_LEN, InProcessHal, InProcessTransport,
    MmioEvent, QueueError, VsockConfig, VsockMmio,
};
use virtio_bindings::virtio_mmio as reg;
use virtio_drivers::transport::Transport;
use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

pub type Mem = Arc<GuestMemoryMmap>;
pub type Dev = VsockMmio<Mem>;
pub type Bus = Mutex<Dev>;

pub const TIMEOUT: Duration = Duration::from_secs(10);

bitflags! {
    /// Driver-side feature set; virtio-drivers' own `Feature` type has no
    /// vsock bits, and `begin_init` truncates to the type's known flags.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct F: u64 {
        const STREAM = 1 << 0;
        const SEQPACKET = 1 << 1;
        const NO_IMPLIED_STREAM = 1 << 2;
        const DGRAM = 1 << 3;
        const INDIRECT_DESC = 1 << 28;
        const EVENT_IDX = 1 << 29;
        const VERSION_1 = 1 << 32;
    }
}

/// A vsock header with the given payload length and op; the other fields
/// are distinctive so byte-exact comparisons mean something.
pub fn header(len: u32, op: u16) -> [u8; HDR_LEN] {
    let mut h = [0u8; HDR_LEN];
    h[0..8].copy_from_slice(&3u64.to_le_bytes());
    h[8..16].copy_from_slice(&2u64.to_le_bytes());
    h[16..20].copy_from_slice(&1234u32.to_le_bytes());
    h[20..24].copy_from_slice(&80u32.to_le_bytes());
    h[24..28].copy_from_slice(&len.to_le_bytes());
    h[28..30].copy_from_slice(&1u16.to_le_bytes());
    h[30..32].copy_from_slice(&op.to_le_bytes());
    h[36..40].copy_from_slice(&65536u32.to_le_bytes());
    h
}

pub fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Pages from the current thread's DMA region, freed on drop.
pub struct DmaBuf {
    paddr: u64,
    ptr: NonNull<u8>,
    pages: usize,
}

impl DmaBuf {
    pub fn new(pages: usize) -> Self {
        let (paddr, ptr) = InProcessHal::dma_alloc(pages, BufferDirection::Both);
        assert_ne!(paddr, 0, "DMA region exhausted");
        DmaBuf { paddr, ptr, pages }
    }

    /// # Safety
    /// The caller keeps slices of one buffer disjoint and does not use them
    /// after the buffer is dropped.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &'static mut [u8] {
        assert!(offset + len <= self.pages * PAGE_SIZE);
        // SAFETY: in bounds of a live allocation; aliasing is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: values returned by dma_alloc, freed once.
        let rc = unsafe { InProcessHal::dma_dealloc(self.paddr, self.ptr, self.pages) };
        assert_eq!(rc, 0);
    }
}

/// A driver about to initialise a device over the in-process transport.
pub struct Harness {
    pub transport: InProcessTransport<Bus>,
    pub bus: Arc<Bus>,
    pub events: Arc<DeviceEvents>,
    pub negotiated: F,
    _scope: DmaScope,
    pub region: DmaRegion,
}

impl Harness {
    /// Maps a region, builds the device and runs `begin_init`.
    pub fn new(config: VsockConfig, driver_features: F) -> Self {
        let region = DmaRegion::new(4 << 20).unwrap();
        let scope = region.enter();
        let mut dev = VsockMmio::new(region.memory(), config).unwrap();
        let events = Arc::new(DeviceEvents::new().unwrap());
        dev.set_irq(events.irq_line().unwrap());
        let bus = Arc::new(Mutex::new(dev));
        let mut transport = InProcessTransport::new(bus.clone(), events.clone()).unwrap();
        let negotiated = transport.begin_init(driver_features);
        Harness { transport, bus, events, negotiated, _scope: scope, region }
    }

    pub fn dev(&self) -> std::sync::MutexGuard<'_, Dev> {
        self.bus.lock().unwrap()
    }
}

pub enum Cmd {
    Rx(Vec<u8>, Vec<u8>),
    Event(u32),
}

/// A device thread that sleeps on the queue eventfds like a VMM's device
/// thread sleeps on ioeventfds.
pub struct DeviceThread {
    cmds: Sender<Cmd>,
    wake: EventFd,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    pub tx_packets: Receiver<(Vec<u8>, Vec<u8>)>,
    pub errors: Receiver<QueueError>,
    /// Used lengths of RX writes, in order.
    pub rx_used: Receiver<u32>,
}

impl DeviceThread {
    pub fn spawn(bus: Arc<Bus>, events: &DeviceEvents) -> Self {
        let wake = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut fds: Vec<&EventFd> = (0..3).map(|q| events.queue(q).unwrap()).collect();
        fds.push(events.control());
        fds.push(&wake);
        let mut waiter = EventWaiter::new(&fds).unwrap();
        let (cmds, cmd_rx) = mpsc::channel::<Cmd>();
        let (tx_out, tx_packets) = mpsc::channel();
        let (err_out, errors) = mpsc::channel();
        let (used_out, rx_used) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut rx_pending: VecDeque<(Vec<u8>, Vec<u8>)> = VecDeque::new();
            let mut ev_pending: VecDeque<u32> = VecDeque::new();
            while !stop2.load(Ordering::Acquire) {
                waiter.wait(Some(Duration::from_millis(50))).unwrap();
                while let Ok(cmd) = cmd_rx.try_recv() {
                    match cmd {
                        Cmd::Rx(h, p) => rx_pending.push_back((h, p)),
                        Cmd::Event(id) => ev_pending.push_back(id),
                    }
                }
                let mut dev = bus.lock().unwrap();
                if !dev.driver_ok() {
                    continue;
                }
                let res = dev.drain_tx(|r| match r {
                    Ok(p) => tx_out.send((p.header.to_vec(), p.payload.to_vec())).unwrap(),
                    Err(e) => err_out.send(e).unwrap(),
                });
                if let Err(e) = res {
                    err_out.send(e).unwrap();
                }
                dev.interrupt_if_needed(TX_QUEUE).unwrap();

                while let Some((h, p)) = rx_pending.front() {
                    let h: &[u8; HDR_LEN] = h.as_slice().try_into().unwrap();
                    match dev.write_rx(h, p) {
                        Ok(Some(used)) => {
                            used_out.send(used).unwrap();
                            rx_pending.pop_front();
                        }
                        Ok(None) => {
                            // Out of RX buffers: ask for a kick, unless
                            // buffers raced in while we looked.
                            let more = dev
                                .with_queue(RX_QUEUE, |q, m| q.enable_notification(m))
                                .unwrap()
                                .unwrap();
                            if !more {
                                break;
                            }
                        }
                        Err(e) => {
                            err_out.send(e).unwrap();
                            rx_pending.pop_front();
                        }
                    }
                }
                dev.interrupt_if_needed(RX_QUEUE).unwrap();

                while let Some(id) = ev_pending.front() {
                    match dev.post_event(*id) {
                        Ok(true) => {
                            ev_pending.pop_front();
                        }
                        Ok(false) => break,
                        Err(e) => {
                            err_out.send(e).unwrap();
                            ev_pending.pop_front();
                        }
                    }
                }
                dev.interrupt_if_needed(EVENT_QUEUE).unwrap();
            }
        });
        DeviceThread { cmds, wake, stop, handle: Some(handle), tx_packets, errors, rx_used }
    }

    pub fn send(&self, cmd: Cmd) {
        self.cmds.send(cmd).unwrap();
        self.wake.write(1).unwrap();
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        if let Some(h) = self.handle.take() {
            let r = h.join();
            if !std::thread::panicking() {
                r.unwrap();
            }
        }
    }
}

/// Waits for an interrupt on the driver side and acknowledges it.
pub fn wait_irq(h: &mut Harness, waiter: &mut EventWaiter) -> u32 {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let status = h.transport.ack_interrupt().bits();
        if status != 0 {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "no interrupt within {TIMEOUT:?}");
        waiter.wait(Some(Duration::from_millis(100))).unwrap();
    }
}

// ---------------------------------------------------------------------------
// Raw rings: a "driver" that writes descriptors by hand.

pub fn w(dev: &mut Dev, off: u32, value: u32) -> MmioEvent {
    dev.write(u64::from(off), &value.to_le_bytes())
}

pub fn r(dev: &Dev, off: u32) -> u32 {
    let mut b = [0u8; 4];
    dev.read(u64::from(off), &mut b);
    u32::from_le_bytes(b)
}

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

/// Where data buffers start in a raw device's memory.
pub const DATA: u64 = 0x10_0000;

pub struct RawQueue {
    pub mem: Mem,
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub avail_idx: u16,
}

impl RawQueue {
    pub fn set_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        Self::write_desc(&self.mem, self.desc + 16 * u64::from(i), addr, len, flags, next);
    }

    pub fn write_desc(mem: &Mem, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&d, GuestAddress(at)).unwrap();
    }

    /// Puts `head` on the available ring and bumps the index.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        self.mem.write_obj(head, GuestAddress(self.avail + 4 + 2 * slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx);
    }

    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.mem.write_obj(idx, GuestAddress(self.avail + 2)).unwrap();
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// (id, len) of used ring entry number `n` (wrapping).
    pub fn used_elem(&self, n: u16) -> (u32, u32) {
        let at = self.used + 4 + 8 * u64::from(n % self.size);
        let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
        (id, len)
    }

    pub fn set_used_event(&self, v: u16) {
        let at = self.avail + 4 + 2 * u64::from(self.size);
        self.mem.write_obj(v, GuestAddress(at)).unwrap();
    }

    pub fn avail_event(&self) -> u16 {
        let at = self.used + 4 + 8 * u64::from(self.size);
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }
}

pub struct RawDevice {
    pub dev: Dev,
    pub mem: Mem,
    pub queues: Vec<RawQueue>,
    features: u64,
    size: u16,
}

/// A device driven to DRIVER_OK by raw register writes, with all three
/// rings laid out by hand.
pub fn raw_device(features: u64, size: u16, mem_size: usize) -> RawDevice {
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), mem_size)]).unwrap());
    let dev = VsockMmio::new(
        mem.clone(),
        VsockConfig { features, queue_size: size, max_tx_payload: 8192, ..VsockConfig::default() },
    )
    .unwrap();
    let mut d = RawDevice { dev, mem, queues: Vec::new(), features, size };
    d.init();
    d
}

impl RawDevice {
    /// What a rebooted driver does: reset the device (status 0), then set
    /// it up again with fresh, zeroed rings at the same addresses.
    pub fn reinit(&mut self) {
        w(&mut self.dev, reg::VIRTIO_MMIO_STATUS, 0);
        self.init();
    }

    fn init(&mut self) {
        let (features, size) = (self.features, self.size);
        let dev = &mut self.dev;
        w(dev, reg::VIRTIO_MMIO_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w(dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, features as u32);
        w(dev, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w(dev, reg::VIRTIO_MMIO_DRIVER_FEATURES, (features >> 32) as u32);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(dev, reg::VIRTIO_MMIO_STATUS, s);
        assert_eq!(r(dev, reg::VIRTIO_MMIO_STATUS), s, "features refused");
        self.queues.clear();
        for q in 0..3u32 {
            let base = 0x1_0000 * u64::from(q + 1);
            let desc = base;
            let avail = desc + 16 * u64::from(size);
            let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
            let end = used + 6 + 8 * u64::from(size);
            self.mem.write_slice(&vec![0u8; (end - base) as usize], GuestAddress(base)).unwrap();
            w(dev, reg::VIRTIO_MMIO_QUEUE_SEL, q);
            w(dev, reg::VIRTIO_MMIO_QUEUE_NUM, u32::from(size));
            w(dev, reg::VIRTIO_MMIO_QUEUE_DESC_LOW, desc as u32);
            w(dev, reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
            w(dev, reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail as u32);
            w(dev, reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH, 0);
            w(dev, reg::VIRTIO_MMIO_QUEUE_USED_LOW, used as u32);
            w(dev, reg::VIRTIO_MMIO_QUEUE_USED_HIGH, 0);
            w(dev, reg::VIRTIO_MMIO_QUEUE_READY, 1);
            assert_eq!(r(dev, reg::VIRTIO_MMIO_QUEUE_READY), 1);
            let mem = self.mem.clone();
            self.queues.push(RawQueue { mem, size, desc, avail, used, avail_idx: 0 });
        }
        assert_eq!(w(dev, reg::VIRTIO_MMIO_STATUS, s | status::DRIVER_OK), MmioEvent::DriverOk);
    }
}
