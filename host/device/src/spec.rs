//! One description of a whole device, and the one place it is assembled.
//!
//! Every bus needs the same thing built: a [`VsockDevice`] with the
//! configuration its guest sees, the device loop's eventfds, the host
//! endpoint (a host stack at CID 2) with its packet capture, the
//! Unix-socket bridge behind it, and the device loop on its thread. Only
//! two things differ per bus (the module docs of [`crate::device`] draw
//! the table):
//!
//! - **guest memory**: KVM guest RAM, a vhost-user frontend's shared
//!   memfd, or a DMA region of this process;
//! - **notifications**: how kicks reach the device loop's eventfds (a KVM
//!   ioeventfd, vhost-user's kick forwarded, a plain eventfd write), and
//!   how the device's interrupts reach the driver (an irqfd, per-queue call
//!   eventfds, the guest's handler run inline).
//!
//! A [`DeviceSpec`] holds what a user chooses (the CID, the socket path,
//! the capture, the port policy, the features and queue size); a [`Bus`]
//! supplies the memory and the notifications; [`Bus::start`] runs the
//! steps between them, so that they are written once.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use mio::{Registry, Token};
use vm_memory::GuestAddressSpace;

use crate::bridge::{Bridge, BridgeConfig, PortPolicy};
use crate::capture::{Capture, CaptureConfig, CaptureHandle};
use crate::cid::GuestCid;
use crate::device::{SharedDevice, VsockConfig};
use crate::device_loop::{Clock, DeviceEvents, DeviceThread, InterruptDelivery, IrqLine};
use crate::endpoint::HostEndpoint;
use crate::host_side::HostSide;
use crate::ring_trace::RingTrace;

/// Where packets are captured, and how much of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSpec {
    /// The pcap file, created (or truncated) when the device starts.
    pub path: PathBuf,
    /// Bytes kept of each packet, both headers included (see
    /// [`CaptureConfig::snaplen`]).
    pub snaplen: u32,
}

/// Everything a user chooses about one guest's device.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    /// The guest's CID: the config space's, the only source the host
    /// endpoint accepts, and the bridge's destination.
    pub guest_cid: GuestCid,
    /// `<uds>`: the hybrid vsock socket, and the base of the other paths
    /// (`docs/host-sockets.md`).
    pub uds_path: PathBuf,
    /// Capture every packet crossing the device, when set.
    pub capture: Option<CaptureSpec>,
    /// Record every virtqueue event (`--ring-trace`), when set.
    pub ring_trace: Option<RingTrace>,
    /// Which ports host programs and the guest may reach.
    pub policy: PortPolicy,
    /// The device features offered (see [`crate::device::features`]).
    pub features: u64,
    /// The largest queue the device takes.
    pub queue_size: u16,
}

impl DeviceSpec {
    /// The device every bus offers by default, for `guest_cid` behind
    /// `uds_path`: every feature pier-driver takes, 256-entry queues, no
    /// capture, every port reachable.
    pub fn new(guest_cid: GuestCid, uds_path: impl Into<PathBuf>) -> Self {
        let defaults = VsockConfig::default();
        Self {
            guest_cid,
            uds_path: uds_path.into(),
            capture: None,
            ring_trace: None,
            policy: PortPolicy::default(),
            features: defaults.features,
            queue_size: defaults.queue_size,
        }
    }

    /// The device's configuration, as the driver will see it.
    pub fn vsock_config(&self) -> VsockConfig {
        VsockConfig {
            guest_cid: self.guest_cid.as_u64(),
            features: self.features,
            queue_size: self.queue_size,
            ring_trace: self.ring_trace.clone(),
            ..VsockConfig::default()
        }
    }

    /// The bridge's settings: the spec's CID, paths and policy, the rest
    /// at their defaults.
    pub fn bridge_config(&self) -> BridgeConfig {
        BridgeConfig {
            policy: self.policy.clone(),
            ..BridgeConfig::new(&self.uds_path, self.guest_cid)
        }
    }

    /// The host endpoint for this guest, recording into the capture file
    /// when the spec asks for one (the file is created now).
    pub fn host_endpoint(&self) -> io::Result<(HostEndpoint, Option<CaptureHandle>)> {
        let mut endpoint = HostEndpoint::new(self.guest_cid.as_u64(), |_| {});
        let capture = self.start_capture(&mut endpoint)?;
        Ok((endpoint, capture))
    }

    /// Creates the capture file the spec asks for, if any, and has
    /// `endpoint` record every packet into it.
    pub fn start_capture(&self, endpoint: &mut HostEndpoint) -> io::Result<Option<CaptureHandle>> {
        let Some(spec) = &self.capture else {
            return Ok(None);
        };
        let config = CaptureConfig { snaplen: spec.snaplen, ..CaptureConfig::default() };
        let (capture, handle) = Capture::create(&spec.path, config)?;
        endpoint.set_capture(Some(capture));
        Ok(Some(handle))
    }

    /// Starts the device loop for `device`, woken through `events`, serving
    /// the guest with `endpoint` and the Unix-socket bridge this spec
    /// describes. `extend` may put the bridge inside a host side of its own
    /// (vhost-user's sibling router); it gets the poller's registry and the
    /// first token after the bridge's.
    pub fn spawn<D, B, F>(
        &self,
        device: Arc<D>,
        events: Arc<DeviceEvents>,
        endpoint: HostEndpoint,
        clock: Clock,
        interrupts: Box<dyn InterruptDelivery>,
        extend: F,
    ) -> io::Result<DeviceThread>
    where
        D: SharedDevice,
        B: HostSide + Send + 'static,
        F: FnOnce(Bridge, &Registry, Token) -> io::Result<B>,
    {
        let bridge = self.bridge_config();
        DeviceThread::spawn(
            device,
            events,
            endpoint,
            move |stack, registry, token| {
                // The bridge takes the tokens from `token + 1` on, so the
                // extension's own source gets `token`.
                let bridge = Bridge::new(bridge, stack, registry, token + 1)?;
                extend(bridge, registry, Token(token))
            },
            clock,
            interrupts,
        )
    }
}

/// What a bus supplies to a device: its guest memory and its
/// notifications, both ways. The steps between are [`Bus::start`]'s, the
/// same for every bus.
pub trait Bus {
    /// The guest memory the queues live in.
    type Memory: GuestAddressSpace + Send + Sync + 'static;
    /// The device as this bus shares it: behind its face (virtio-mmio's
    /// register file) or alone (vhost-user).
    type Device: SharedDevice<Memory = Self::Memory>;

    /// The guest memory, for a new device.
    fn memory(&self) -> Self::Memory;

    /// Builds the device over [`Self::memory`] with `config`, behind this
    /// bus's face, with its notifications to the driver wired (an irqfd,
    /// call eventfds).
    fn attach(
        &mut self,
        config: VsockConfig,
        events: &DeviceEvents,
    ) -> io::Result<Arc<Self::Device>>;

    /// Makes the driver's kicks fire `events`' queue eventfds without
    /// passing through this process when the bus can (KVM ioeventfds). By
    /// default kicks arrive some other way the bus handles itself.
    fn route_kicks(&mut self, events: &DeviceEvents) -> io::Result<()> {
        let _ = events;
        Ok(())
    }

    /// How the device loop delivers interrupts after each round. By default
    /// raising them already delivered them ([`IrqLine`]).
    fn interrupt_delivery(&mut self) -> io::Result<Box<dyn InterruptDelivery>> {
        Ok(Box::new(IrqLine))
    }

    /// The whole device for `spec` on this bus, running: device, eventfds,
    /// kicks, host endpoint and capture, bridge (or what `extend` makes of
    /// it, see [`DeviceSpec::spawn`]), device loop.
    fn start<B, F>(self, spec: &DeviceSpec, extend: F) -> io::Result<StartedDevice<Self::Device>>
    where
        Self: Sized,
        B: HostSide + Send + 'static,
        F: FnOnce(Bridge, &Registry, Token) -> io::Result<B>,
    {
        self.attach_waiting(spec)?.start(spec, extend)
    }

    /// The device for `spec` on this bus with nothing serving it yet: the
    /// driver can find it, negotiate and set its queues up, and its kicks
    /// and status changes wait in the eventfds until
    /// [`WaitingDevice::start`] starts the loop, which then answers them.
    /// A guest booted ahead of its host side (`pier pool --preboot`)
    /// meets the device this way: no host socket exists until a user asks
    /// for the guest.
    fn attach_waiting(mut self, spec: &DeviceSpec) -> io::Result<WaitingDevice<Self::Device>>
    where
        Self: Sized,
    {
        let events = Arc::new(DeviceEvents::new()?);
        let config = spec.vsock_config();
        let device = self.attach(config.clone(), &events)?;
        self.route_kicks(&events)?;
        let interrupts = self.interrupt_delivery()?;
        Ok(WaitingDevice { device, events, interrupts, config })
    }
}

/// A device attached to its bus whose loop has not started (see
/// [`Bus::attach_waiting`]).
pub struct WaitingDevice<D> {
    /// The device, as the bus reaches it.
    pub device: Arc<D>,
    /// Kicks, lifecycle changes and the interrupt line.
    pub events: Arc<DeviceEvents>,
    interrupts: Box<dyn InterruptDelivery>,
    /// What the driver was shown; the spec that starts the loop must
    /// agree with it.
    config: VsockConfig,
}

impl<D> std::fmt::Debug for WaitingDevice<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingDevice").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<D: SharedDevice> WaitingDevice<D> {
    /// Starts the loop with `spec`'s host side (endpoint, capture, bridge
    /// or what `extend` makes of it). `spec` must describe the device the
    /// driver already saw: the same CID, features and queue size; only
    /// the host side (socket path, capture, policy) is chosen now.
    pub fn start<B, F>(self, spec: &DeviceSpec, extend: F) -> io::Result<StartedDevice<D>>
    where
        B: HostSide + Send + 'static,
        F: FnOnce(Bridge, &Registry, Token) -> io::Result<B>,
    {
        self.check(spec)?;
        let Self { device, events, interrupts, .. } = self;
        let (endpoint, capture) = spec.host_endpoint()?;
        let thread =
            spec.spawn(device.clone(), events.clone(), endpoint, Clock::new(), interrupts, extend)?;
        Ok(StartedDevice { device, events, thread: Arc::new(thread), capture })
    }

    /// Whether [`Self::start`] would take `spec`: the device the driver
    /// saw, the same CID, features and queue size.
    pub fn check(&self, spec: &DeviceSpec) -> io::Result<()> {
        let asked = spec.vsock_config();
        if (asked.guest_cid, asked.features, asked.queue_size)
            != (self.config.guest_cid, self.config.features, self.config.queue_size)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the device was attached as CID {} (features {:#x}, queues of {}) and cannot start as CID {} (features {:#x}, queues of {})",
                    self.config.guest_cid,
                    self.config.features,
                    self.config.queue_size,
                    asked.guest_cid,
                    asked.features,
                    asked.queue_size
                ),
            ));
        }
        Ok(())
    }
}

/// A device running on its bus (see [`Bus::start`]).
#[derive(Debug)]
pub struct StartedDevice<D> {
    /// The device, as the bus reaches it.
    pub device: Arc<D>,
    /// Kicks, lifecycle changes and the interrupt line.
    pub events: Arc<DeviceEvents>,
    /// The device loop, with the bridge; shared so that a stats reader may
    /// outlive the bus's own handle.
    pub thread: Arc<DeviceThread>,
    /// The capture's counters and its end, when one runs.
    pub capture: Option<CaptureHandle>,
}

/// The bridge as the whole host side, for buses that need nothing more.
pub fn bridge_only(bridge: Bridge, _: &Registry, _: Token) -> io::Result<Bridge> {
    Ok(bridge)
}
