//! pier's virtio-vsock device model: everything on the host side of the
//! virtqueues, written once and plugged into every bus.
//!
//! ```text
//!  guest driver ══ bus ══ face (mmio | vhost-user) ── device ── queues ── endpoint (host Stack, CID 2) ── host side ── host programs
//!                  │                                                                                   (bridge: Unix sockets)
//!                  └── device_loop: wakes on kicks, runs rounds, delivers interrupts
//! ```
//!
//! The modules, in the order a packet meets them:
//!
//! - [`mmio`]: the virtio-mmio (version 2) face: the register file that
//!   decodes a driver's accesses into the device's steps, and
//!   `InterruptStatus`; [`MmioDevice`] is the register file as several
//!   threads reach it (the vhost-user face lives in `pier-vhost-user`);
//! - [`device`]: [`VsockDevice`], the device whatever the bus: features,
//!   status and driver sessions, config space, the three queues, the
//!   TRANSPORT_RESET event, and the [`Notify`] a bus supplies to deliver
//!   its notifications;
//! - [`queues`]: device-side split virtqueues that turn hostile descriptor
//!   chains into packets (44-byte header + payload) or precise errors;
//! - [`endpoint`]: the host end of every connection, a `pier-stack` at
//!   CID 2, following the driver's lifecycle and negotiated features;
//! - [`host_side`]: the seam between the endpoint and host programs, split
//!   by role: [`Relay`], [`EventSource`] and [`Siblings`] (together
//!   [`HostSide`]);
//! - [`bridge`]: the host side pier ships, Firecracker's hybrid vsock
//!   protocol over Unix sockets (its wire format is `pier-hybrid`'s);
//! - [`capture`]: `--pcap`: every packet the endpoint moves, queued to a
//!   writer thread as pcap records, never blocking the device;
//! - [`ring_trace`]: `--ring-trace`: every virtqueue event (available
//!   entries, takes, used entries, kicks, interrupts and their
//!   suppression, setup and reset) as JSON lines, recorded the capture's
//!   way, and read back into ring states for `pier trace`;
//! - [`report`]: the device's counters as the text `--stats` prints;
//! - [`cid`]: [`GuestCid`], the guest's CID, checked once where it
//!   enters;
//! - [`spec`]: [`DeviceSpec`], what a user chooses about a device, and
//!   [`Bus`], what each bus supplies (memory, notifications) and the one
//!   assembly of device, endpoint, capture, bridge and loop;
//! - [`device_loop`]: the device's event loop on its own thread, which a
//!   bus plugs into with eventfds ([`DeviceEvents`]) and an
//!   [`InterruptDelivery`];
//! - [`inprocess`]: the in-process bus: virtio-drivers' `Hal` and
//!   `Transport` for a driver in this process (the Wasm shim's), and the
//!   guest threads that run it;
//! - `testing` (feature `testing`): a single-thread testbed and tiny guest
//!   applications, for tests and benchmarks.
//!
//! The buses: the in-process one lives here; pier-vmm's KVM bus and
//! pier-vhost-user's each implement [`Bus`] with their own memory and
//! notifications, and [`Bus::start`] assembles the rest.

pub mod bridge;
pub mod capture;
pub mod cid;
pub mod device;
pub mod device_loop;
pub mod endpoint;
mod guest_copy;
pub mod host_side;
pub mod inprocess;
pub mod mmio;
pub mod queues;
mod record_queue;
pub mod report;
pub mod ring_trace;
pub mod spec;
#[cfg(feature = "testing")]
pub mod testing;

pub use capture::{Capture, CaptureConfig, CaptureHandle, CaptureReport};
pub use cid::{CidError, GuestCid};
pub use device::{
    NoNotify, Notify, QueuePosition, QueueRings, SharedDevice, StatusChange, VsockConfig,
    VsockDevice,
};
pub use device_loop::{
    Clock, DeviceEvents, DeviceStats, DeviceThread, InlineKick, InterruptDelivery, IrqLine,
};
pub use endpoint::{EndpointStats, HostEndpoint};
pub use host_side::{EventSource, HostSide, NoHostSide, Relay, RxLender, Siblings, WithSiblings};
pub use inprocess::{
    DmaRegion, DmaScope, EventWaiter, GuestStats, GuestThread, InProcessDevice, InProcessHal,
    InProcessTransport, Running,
};
pub use mmio::{MmioBus, MmioDevice, MmioEvent, VsockMmio};
pub use queues::{DeviceQueue, DrainStats, QueueError, RxPayload, TxPacket};
pub use ring_trace::{RingTrace, RingTraceHandle, RingTraceReport};
pub use spec::{Bus, CaptureSpec, DeviceSpec, StartedDevice, WaitingDevice};
