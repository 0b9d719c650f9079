//! The network: pier-driver over the virtio-mmio vsock device, pier-stack
//! above it, both in ring 3 and driven by the app's own calls.
//!
//! There is no network thread. Every socket call runs [`until`]: poll the
//! driver (received packets into the stack, the stack's packets out, the
//! stack's timers), try the operation, and if it would block either
//! return `WouldBlock` (non-blocking sockets) or wait and try again. The
//! wait is the part shaped by the hypervisor underneath: a VM exit costs
//! 8–14 µs on a nested host and a device round trip through an interrupt
//! about 60 µs, so a waiting call first keeps polling for [`SPIN`] (the
//! device's next packet usually lands within it while data flows, and
//! polling costs no exit), then halts the CPU until the device's
//! interrupt or the timer at the stack's next deadline (`irq`). An idle
//! app therefore costs its host nothing, and the stack's timers (connect
//! timeout, close timeout) fire while the app is blocked.
//!
//! The machine has one CPU and the interrupt stubs only set bits, so the
//! state needs no lock: a `RefCell` (a re-entrant call would be a bug in
//! this module, and panics rather than corrupting anything).

use alloc::format;
use alloc::string::String;
use core::cell::RefCell;
use core::ptr::NonNull;
use core::task::Poll;
use core::time::Duration;

use pier_driver::{DriverConfig, DriverError, VsockDriver};
use pier_stack::{Error, Instant, Stack, WakeList};
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceType, Transport as _};

use super::hal::BareHal;
use super::{clock, irq, virtio};
use crate::io::{self, ErrorKind};

/// How long a blocked call keeps polling before it halts. Short: on a
/// 2-core host, 0 to 50 µs gave the same echo throughput, and 150 µs lost
/// a third of it, the spinning vCPU taking the core that the device
/// thread and the host program needed.
const SPIN: Duration = Duration::from_micros(20);
/// When every transmit buffer is with the device, look again this soon
/// even if its interrupt is late.
const TX_RETRY: Duration = Duration::from_millis(1);
/// The driver's setup for a guest that polls while busy:
///
/// - the default receive side (16 buffers of 64 KiB), and 8 transmit
///   buffers instead of 32: every page of DMA memory costs a first-touch
///   fault of about 4 µs when the driver zeroes it at start, so each MiB
///   saved is about a millisecond of boot on a nested host, and one app
///   thread never has more than a few packets in flight;
/// - no EVENT_IDX, so that interrupts are off except while the guest
///   halts (`until`): under EVENT_IDX the device interrupts once per
///   batch however busy the guest is, and each interrupt costs a polling
///   guest a trap into ring 0 and an EOI exit for nothing.
const DRIVER_CONFIG: DriverConfig = DriverConfig {
    rx_buffer_size: pier_stack::wire::HEADER_LEN + pier_stack::wire::MAX_PAYLOAD,
    rx_buffers: 16,
    tx_buffers: 8,
    event_idx: false,
};
/// The longest a halt lasts without a deadline of its own. On a
/// level-triggered line (QEMU's virtio-mmio), an interrupt status nobody
/// acknowledged keeps the line up, so no edge ever comes again; waking
/// this often and acknowledging bounds what such a lost interrupt costs.
/// The wake costs about 50 µs every 100 ms: nothing, for an idle guest.
const MAX_HALT: Duration = Duration::from_millis(100);
/// The most often a waking guest reads the device's status to see whether
/// it asks for a reset (`follow_reset_request`): each read is an exit to
/// the VMM's user space, and wakes with no used buffer come hundreds of
/// times a second while data flows (an interrupt raised for buffers the
/// polling guest took already). So at most 20 exits a second, and a
/// request is seen within this plus a halt (at most [`MAX_HALT`]).
const RESET_CHECK_EVERY: Duration = Duration::from_millis(50);

type Driver = VsockDriver<BareHal, MmioTransport<'static>>;

/// virtio-mmio's `InterruptACK` register (virtio 1.2 §4.2.2).
const INTERRUPT_ACK_OFFSET: u64 = 0x64;
/// Both bits of `InterruptStatus`: used buffer and configuration change.
const ALL_INTERRUPT_BITS: u32 = 0b11;

pub(crate) struct Net {
    driver: Driver,
    pub(crate) stack: Stack,
    wakes: WakeList,
    /// The device's `InterruptACK` register, written without reading
    /// `InterruptStatus` first ([`Net::acknowledge_interrupt`]).
    interrupt_ack: NonNull<u32>,
    /// When `follow_reset_request` may read the device's status next.
    next_status_read: Instant,
}

/// Starts pier-driver on `transport`, polling from the start (`until`
/// asks for interrupts when it halts).
fn start_driver(transport: MmioTransport<'static>) -> Result<Driver, DriverError> {
    let mut driver = VsockDriver::new(transport, DRIVER_CONFIG)?;
    driver.set_interrupts(false);
    Ok(driver)
}

impl Net {
    /// Finds the vsock device, routes its interrupt and starts the driver.
    fn start() -> Result<Self, String> {
        let (transport, base, irq) = virtio::windows()
            .find_map(|(base, size, irq)| {
                let header = NonNull::new(base as *mut VirtIOHeader)?;
                // SAFETY: `virtio::windows` checked that the window lies in
                // the identity-mapped MMIO range and holds the registers;
                // nothing else drives a device there, and the mapping never
                // goes away. `new` only reads (magic, version, device ID).
                let transport = unsafe { MmioTransport::new(header, size as usize) }.ok()?;
                (transport.device_type() == DeviceType::Socket).then_some((transport, base, irq))
            })
            .ok_or_else(|| String::from("no virtio-vsock device on the boot command line"))?;
        if !irq::route_device(irq) {
            return Err(format!("the vsock device's interrupt {irq} has no IOAPIC pin"));
        }
        let mut driver =
            start_driver(transport).map_err(|e| format!("virtio-vsock at {base:#x}: {e}"))?;
        let mut stack = Stack::new(driver.stack_config());
        // Stream payloads stay in the receive buffers until the app reads
        // them: one copy fewer per received byte. The device writes only
        // buffers the driver posted, and a held buffer is not posted.
        driver.lend_rx_buffers(&mut stack);
        let interrupt_ack = NonNull::new((base + INTERRUPT_ACK_OFFSET) as *mut u32)
            .ok_or_else(|| String::from("a virtio device at address 0"))?;
        Ok(Self {
            driver,
            stack,
            wakes: WakeList::new(),
            interrupt_ack,
            // The device just took DRIVER_OK from this driver: no need to
            // ask it at the first wake whether it wants a reset (an exit).
            next_status_read: now() + RESET_CHECK_EVERY,
        })
    }

    /// Restarts the driver under the same stack, as the device asked
    /// (DEVICE_NEEDS_RESET): the held payloads are copied out of the old
    /// driver's buffers, the old driver resets the device, a new one sets
    /// it up, and the stack ends every connection with connection-reset
    /// and keeps its listeners, as Linux does when its device goes away.
    /// Bytes received before the reset stay readable. If the new driver
    /// cannot start, the network is gone and every later call says why.
    fn restart(mut self) -> Result<Self, String> {
        self.stack.take_back_held_buffers();
        let mut driver = start_driver(self.driver.reset())
            .map_err(|e| format!("virtio-vsock, restarting after a reset: {e}"))?;
        self.stack.transport_reset(driver.guest_cid() as u32, &mut self.wakes);
        self.wakes.wake_all();
        driver.lend_rx_buffers(&mut self.stack);
        Ok(Self { driver, ..self })
    }

    /// Clears both interrupt bits, which lowers a level-triggered line
    /// (QEMU's virtio-mmio) so that its next rise is an edge the IOAPIC
    /// sees. It writes without reading `InterruptStatus` first: the driver
    /// polls every queue after a wake whatever the bits say, and pier-rt
    /// acts on no configuration change, so the read would only cost a VM
    /// exit to the host's user space on every wake. A bit the device sets
    /// between the last poll and this write is cleared unseen, but its
    /// buffer is found by the poll that follows.
    fn acknowledge_interrupt(&mut self) {
        // SAFETY: the register lies in the device's window, which
        // `virtio::windows` checked is identity-mapped MMIO that stays
        // mapped; writing `InterruptACK` touches no memory.
        unsafe { self.interrupt_ack.as_ptr().write_volatile(ALL_INTERRUPT_BITS) }
    }

    /// Moves everything that is ready, and says when to look again.
    fn pump(&mut self, now: Instant) -> Option<Instant> {
        let outcome = self.driver.poll(&mut self.stack, now, &mut self.wakes);
        // Nothing registers wakers here (callers re-check after each
        // pump), so the list is empty; emptying it keeps it that way.
        self.wakes.wake_all();
        let timers = self.stack.poll_at();
        if outcome.tx_blocked {
            let retry = now + TX_RETRY;
            Some(timers.map_or(retry, |t| t.min(retry)))
        } else {
            timers
        }
    }
}

struct Machine(RefCell<Option<Result<Net, String>>>);

// SAFETY: one CPU, and nothing outside the app's thread of control (the
// interrupt stubs touch only `irq`'s atomic) reaches the cell.
unsafe impl Sync for Machine {}

static NET: Machine = Machine(RefCell::new(None));

/// Runs `f` on the network, starting it on first use.
pub(crate) fn with<R>(f: impl FnOnce(&mut Net) -> R) -> io::Result<R> {
    let mut cell = NET.0.borrow_mut();
    match cell.get_or_insert_with(Net::start) {
        Ok(net) => Ok(f(net)),
        Err(why) => Err(io::Error::new(ErrorKind::Unsupported, format!("pier-rt: {why}"))),
    }
}

/// The stack's clock: microseconds since boot.
pub(crate) fn now() -> Instant {
    Instant::from_micros(clock::now_nanos() / 1000)
}

/// Retries `attempt` (after polling the driver each time) until it is
/// `Ready`, waiting between tries. Returns `Pending` at once for a
/// non-blocking call, and once `deadline` passes for a bounded one.
pub(crate) fn until<T>(
    nonblocking: bool,
    deadline: Option<Instant>,
    mut attempt: impl FnMut(&mut Stack, Instant) -> Poll<T>,
) -> io::Result<Poll<T>> {
    let mut spin_until: Option<Instant> = None;
    loop {
        let now = now();
        let (outcome, next) = with(|net| {
            net.pump(now);
            let outcome = attempt(&mut net.stack, now);
            // What the attempt queued leaves now, not at the next call.
            let next = net.pump(now);
            (outcome, next)
        })?;
        if outcome.is_ready() || nonblocking || deadline.is_some_and(|d| now >= d) {
            return Ok(outcome);
        }
        let spin_end = *spin_until.get_or_insert(now + SPIN);
        if now < spin_end {
            core::hint::spin_loop();
            continue;
        }
        spin_until = None;
        // Interrupts on, then one last look: a buffer the device used
        // before it saw the flag raised no interrupt.
        if with(|net| {
            net.driver.set_interrupts(true);
            net.driver.has_used()
        })? {
            with(|net| net.driver.set_interrupts(false))?;
            continue;
        }
        let latest = now + MAX_HALT;
        let wake = [deadline, next].into_iter().flatten().fold(latest, Instant::min);
        irq::halt_until(Some(clock::tsc_at_micros(wake.total_micros())));
        with(|net| {
            net.driver.set_interrupts(false);
            // Whatever woke us: the queues are polled on the next round
            // either way.
            net.acknowledge_interrupt();
        })?;
        follow_reset_request();
    }
}

/// Restarts the driver if the device asked for a reset. Reading the
/// device's status costs an exit, so it is read only after a wake that
/// brought no used buffer, and at most every [`RESET_CHECK_EVERY`]: a
/// device that asks for a reset serves no queue, so the guest soon wakes
/// with nothing used (from the request's configuration interrupt, or at
/// the latest from the timer [`MAX_HALT`] bounds). Echoing 256 MiB that
/// was 8 reads, where reading on every such wake was 782 a second; idle,
/// it is 20 a second, beside the wakes' own exits.
fn follow_reset_request() {
    let now = now();
    let mut cell = NET.0.borrow_mut();
    let asked = match &mut *cell {
        Some(Ok(net)) if now >= net.next_status_read && !net.driver.has_used() => {
            net.next_status_read = now + RESET_CHECK_EVERY;
            net.driver.device_needs_reset()
        }
        _ => false,
    };
    if asked && let Some(Ok(net)) = cell.take() {
        *cell = Some(net.restart());
    }
}

/// `until` for a socket call: `WouldBlock` means wait, any other result
/// ends it; returns `WouldBlock` as an error when it gives up.
pub(crate) fn call<T>(
    nonblocking: bool,
    op: impl FnMut(&mut Stack, Instant) -> pier_stack::Result<T>,
) -> io::Result<T> {
    call_mapped(nonblocking, op, error)
}

/// `call`, with the caller's mapping of the stack's errors.
pub(crate) fn call_mapped<T>(
    nonblocking: bool,
    mut op: impl FnMut(&mut Stack, Instant) -> pier_stack::Result<T>,
    map: fn(Error) -> io::Error,
) -> io::Result<T> {
    let outcome = until(nonblocking, None, |stack, now| match op(stack, now) {
        Err(Error::WouldBlock) => Poll::Pending,
        result => Poll::Ready(result),
    })?;
    match outcome {
        Poll::Ready(result) => result.map_err(map),
        Poll::Pending => Err(ErrorKind::WouldBlock.into()),
    }
}

/// The longest the app's exit waits for its data to leave.
const EXIT_DRAIN: Duration = Duration::from_secs(5);

/// Before the app's exit ends the machine: lets what the app wrote leave
/// (queued bytes, and packets the device has not taken yet), as Linux
/// keeps sending a process's data after it exits. Bounded by
/// [`EXIT_DRAIN`], so a peer that never gives credit cannot hold the VM.
/// Nothing to do when the network never started.
pub(crate) fn drain_before_exit() {
    let started = NET.0.try_borrow().is_ok_and(|net| matches!(*net, Some(Ok(_))));
    if !started {
        return;
    }
    let deadline = now() + EXIT_DRAIN;
    let _ = until(false, Some(deadline), |stack, _| {
        if stack.unsent_bytes() == 0 && !stack.has_pending_tx() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    while now() < deadline && with(|net| net.driver.tx_in_flight()).unwrap_or(0) > 0 {
        let _ = with(|net| net.pump(now()));
        core::hint::spin_loop();
    }
}

/// Waits `duration`, serving the network meanwhile.
pub(crate) fn sleep(duration: Duration) {
    let deadline = now() + duration;
    // Without a device there is nothing to serve; the clock still runs.
    if until(false, Some(deadline), |_, _| Poll::<()>::Pending).is_err() {
        while now() < deadline {
            irq::halt_until(Some(clock::tsc_at_micros(deadline.total_micros())));
        }
    }
}

/// Maps a stack error to the `io::ErrorKind` the WASI platform reports
/// for the same failure (through the shim's WIT error codes), so an app
/// sees the same kinds on both targets.
pub(crate) fn error(e: Error) -> io::Error {
    let kind = match e {
        Error::WouldBlock => return ErrorKind::WouldBlock.into(),
        Error::Already => ErrorKind::ResourceBusy,
        Error::IsConnected | Error::NotConnected | Error::BadHandle => ErrorKind::NotConnected,
        Error::InvalidArgument | Error::MessageTooLarge => ErrorKind::InvalidInput,
        Error::AddressInUse => ErrorKind::AddrInUse,
        Error::AddressNotAvailable => ErrorKind::AddrNotAvailable,
        Error::PermissionDenied => ErrorKind::PermissionDenied,
        Error::ConnectionReset => ErrorKind::ConnectionReset,
        Error::BrokenPipe => ErrorKind::BrokenPipe,
        Error::TimedOut => ErrorKind::TimedOut,
        Error::NotSupported | Error::SocketTypeNotSupported => ErrorKind::Unsupported,
        Error::Protocol => ErrorKind::ConnectionRefused,
        Error::SocketLimit | Error::Fault => ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

/// Like `error`, for the outcome of a connect: vsock refuses with an RST,
/// so a reset during the handshake is a refusal (ECONNREFUSED is what
/// Linux's connect(2) reports).
pub(crate) fn connect_error(e: Error) -> io::Error {
    match e {
        Error::ConnectionReset | Error::Protocol | Error::NotConnected => {
            io::Error::new(ErrorKind::ConnectionRefused, "vsock: connection refused")
        }
        e => error(e),
    }
}
