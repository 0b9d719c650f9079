//! pier's device model as a vhost-user-vsock backend: QEMU (or any
//! vhost-user frontend) runs the guest and its virtio transport, and pier
//! serves the device's queues from another process.
//!
//! ```text
//!  Linux guest ── virtio-vsock driver ══ QEMU ── vhost-user socket ── pier vhost-user
//!                                               (memory table, vrings,    │
//!                                                kick / call eventfds)    ├─ device loop, host stack (CID 2)
//!                                                                         └─ bridge: <uds>, <uds>_<port>
//! ```
//!
//! This is a third bus for the same device model that `pier run`
//! (in-process) and `pier boot` (KVM, virtio-mmio) use, not a copy of it:
//!
//! - **the control plane** is rust-vmm's `vhost-user-backend`: it speaks
//!   the protocol, maps guest memory from the frontend's file descriptors
//!   and keeps the vrings. [`VsockBackend`] answers its questions (features,
//!   config space with the guest CID) and hands the negotiated features to
//!   the register state; the vrings ([`vring`]) start and stop the device's
//!   queues as the frontend starts and stops them;
//! - **the data plane** is pier's own device loop
//!   ([`pier_device::DeviceThread`]), unchanged: on a kick
//!   vhost-user-backend's worker runs the loop's round itself when the
//!   loop sleeps (else notes or forwards the kick), and the loop answers
//!   on each queue's call eventfd;
//! - **the host side** is the same host stack and Unix-socket bridge as
//!   `pier boot`'s, with every socket path of `docs/host-sockets.md`; a
//!   [`router::Router`] lets the guests of one process reach each other by
//!   CID.
//!
//! What the frontend passes on is its choice: QEMU 7.2 hands a guest only
//! the SEQPACKET bit of the vsock features, so its guests have stream and
//! seqpacket sockets but no datagrams, whatever pier offers. The event
//! queue belongs to the frontend, so the backend cannot send
//! TRANSPORT_RESET; what that means when the backend restarts is in
//! `docs/vhost-user.md`.

pub mod router;
pub mod vring;

pub use pier_device::bridge::{PortPolicy, Ports};

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use pier_device::capture::CaptureHandle;
use pier_device::device::{CONFIG_SIZE, NUM_QUEUES, features};
use pier_device::queues::TxLending;
use pier_device::{
    Bus, CaptureSpec, DeviceEvents, DeviceSpec, DeviceStats, DeviceThread, GuestCid, SharedDevice,
    VsockConfig, VsockDevice,
};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

use crate::router::{RoutedBridge, Router, SiblingPort};
use crate::vring::{
    CallLines, CallNotify, GuestMemory, PierVring, SharedVsock, VringLink, bind_vrings,
};

/// Entries per queue that pier accepts at most; the frontend picks the
/// size (QEMU's vhost-user-vsock asks for 1,024 when the guest driver
/// takes the queue's maximum, as Linux's does).
pub const QUEUE_SIZE: u16 = 1024;

/// The vsock and transport features pier offers a vhost-user frontend.
/// INDIRECT_DESC is offered because Linux uses indirect tables for large
/// packets when it has them; DGRAM for frontends that pass it on.
pub const OFFERED_FEATURES: u64 = features::VERSION_1
    | features::EVENT_IDX
    | features::INDIRECT_DESC
    | features::STREAM
    | features::SEQPACKET
    | features::DGRAM;

/// One guest to serve: the `--vm` option of `pier vhost-user`, which takes
/// vhost-device-vsock's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// The guest's CID (`guest-cid`).
    pub guest_cid: GuestCid,
    /// The vhost-user socket the frontend connects to (`socket`).
    pub socket: PathBuf,
    /// The hybrid vsock socket host programs use (`uds-path`).
    pub uds_path: PathBuf,
    /// The sibling groups this guest belongs to (`groups`, `+`-separated):
    /// guests reach each other only within a group.
    pub groups: Vec<String>,
    /// Where this guest's packets are captured (`pcap`), if anywhere.
    pub pcap: Option<PathBuf>,
}

/// What is wrong with a `--vm` value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// A key without a value, or a value without a key.
    #[error("{0:?} is not KEY=VALUE")]
    NotKeyValue(String),
    /// A key this backend does not know.
    #[error(
        "unknown key {0:?} (known: guest-cid, socket, uds-path, groups, pcap, tx-buffer-size, queue-size)"
    )]
    UnknownKey(String),
    /// A required key is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// The CID is not a number above 2.
    #[error("guest-cid {0:?}: a CID is a number above 2")]
    BadCid(String),
}

impl std::str::FromStr for VmSpec {
    type Err = SpecError;

    /// Parses `guest-cid=3,socket=PATH,uds-path=PATH[,groups=a+b][,pcap=FILE]`.
    /// vhost-device-vsock's `tx-buffer-size` and `queue-size` are accepted
    /// and ignored: pier sizes its buffers by the guests' credit.
    fn from_str(text: &str) -> Result<Self, SpecError> {
        let (mut cid, mut socket, mut uds, mut groups, mut pcap) = (None, None, None, None, None);
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let Some((key, value)) =
                pair.split_once('=').filter(|(k, v)| !k.is_empty() && !v.is_empty())
            else {
                return Err(SpecError::NotKeyValue(pair.to_owned()));
            };
            match key {
                "guest-cid" => {
                    let n = value.parse::<GuestCid>().ok();
                    cid = Some(n.ok_or_else(|| SpecError::BadCid(value.to_owned()))?);
                }
                "socket" => socket = Some(PathBuf::from(value)),
                "uds-path" => uds = Some(PathBuf::from(value)),
                "groups" => groups = Some(value.split('+').map(str::to_owned).collect()),
                "pcap" => pcap = Some(PathBuf::from(value)),
                "tx-buffer-size" | "queue-size" => {}
                _ => return Err(SpecError::UnknownKey(key.to_owned())),
            }
        }
        Ok(VmSpec {
            guest_cid: cid.ok_or(SpecError::Missing("guest-cid"))?,
            socket: socket.ok_or(SpecError::Missing("socket"))?,
            uds_path: uds.ok_or(SpecError::Missing("uds-path"))?,
            groups: groups.unwrap_or_else(|| vec!["default".to_owned()]),
            pcap,
        })
    }
}

/// The vhost-user-backend side of one guest's device; see the [crate
/// documentation](crate).
#[derive(Debug)]
pub struct VsockBackend {
    link: VringLink,
    guest_cid: GuestCid,
}

impl VhostUserBackend for VsockBackend {
    type Bitmap = ();
    type Vring = PierVring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        usize::from(QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        OFFERED_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, acked: u64) {
        let kept = self.link.device.lock_device().accept_driver_features(acked);
        tracing::info!(
            cid = self.guest_cid.get(),
            features = format_args!("{kept:#x}"),
            seqpacket = kept & features::SEQPACKET != 0,
            datagram = kept & features::DGRAM != 0,
            event_idx = kept & features::EVENT_IDX != 0,
            "vhost-user: features negotiated"
        );
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&self, _enabled: bool) {
        // The device reads EVENT_IDX from the negotiated features when a
        // queue starts.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // A read that does not fit the config space answers nothing, as
        // vhost-user-backend expects of a bad request.
        let in_bounds =
            u64::from(offset).checked_add(u64::from(size)).is_some_and(|end| end <= CONFIG_SIZE);
        if !in_bounds {
            return Vec::new();
        }
        let mut config = vec![0; size as usize];
        self.link.device.lock_device().read_config(u64::from(offset), &mut config);
        config
    }

    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        // The device holds a clone of the same GuestMemoryAtomic, which the
        // daemon updates in place.
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        _vrings: &[PierVring],
        _thread_id: usize,
    ) -> io::Result<()> {
        // A kick: the device loop serves the queue. When the loop sleeps
        // this thread runs its round itself (and when it is awake, notes
        // the kick for one more round): the kick then wakes one thread,
        // this one, instead of this one and then the loop.
        let queue = usize::from(device_event);
        if queue < NUM_QUEUES && self.link.kick.try_round(1 << queue) {
            return Ok(());
        }
        match self.link.events.queue(queue) {
            Some(fd) => fd.write(1),
            None => Ok(()),
        }
    }
}

/// The vhost-user bus: the frontend's guest memory, shared as
/// vhost-user-backend maps it, and one call eventfd per queue for the
/// device's notifications. Kicks reach the device loop's round through
/// [`VsockBackend::handle_event`].
struct VhostUserBus {
    mem: GuestMemory,
    calls: Arc<CallLines>,
}

impl Bus for VhostUserBus {
    type Memory = GuestMemory;
    type Device = SharedVsock;

    fn memory(&self) -> GuestMemory {
        self.mem.clone()
    }

    fn attach(&mut self, config: VsockConfig, _: &DeviceEvents) -> io::Result<Arc<SharedVsock>> {
        let notify = Box::new(CallNotify(self.calls.clone()));
        let mut device = VsockDevice::new(self.memory(), config, notify).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "the queue size is not a power of two")
        })?;
        // Staged, not sent from guest memory as `pier boot` does: with a
        // Linux guest, sending from guest memory measured slower
        // (an AMD EPYC host: full-duplex echo at 64 KiB, five alternated
        // pairs, 103.3 MiB/s staged against 88.7, means), for a reason not
        // yet established; docs/benchmarks.md, the Linux guest section.
        device.set_tx_lending(TxLending::Copied);
        Ok(Arc::new(std::sync::Mutex::new(device)))
    }
}

/// Options that apply to every guest of one `pier vhost-user`.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Bytes of each packet a capture keeps (0: all).
    pub pcap_snaplen: u32,
    /// Which ports host programs and guests may reach.
    pub policy: PortPolicy,
    /// Where the guest's virtqueue events are recorded (`--ring-trace`,
    /// one guest only).
    pub ring_trace: Option<pier_device::RingTrace>,
}

/// One guest's device, served to whichever frontend connects to its
/// vhost-user socket, one after another.
pub struct VmServer {
    spec: VmSpec,
    mem: GuestMemory,
    link: VringLink,
    thread: Arc<DeviceThread>,
    capture: Option<CaptureHandle>,
    /// Taken by [`Self::serve`] for as long as it serves.
    listener: std::sync::Mutex<Listener>,
}

impl std::fmt::Debug for VmServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmServer").field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl VmServer {
    /// Creates the guest's device, binds its vhost-user socket and the
    /// bridge's sockets, and starts its device loop. The frontend may
    /// connect from now on.
    pub fn new(spec: VmSpec, router: Arc<Router>, options: &ServeOptions) -> io::Result<Self> {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let device = DeviceSpec {
            features: OFFERED_FEATURES,
            queue_size: QUEUE_SIZE,
            policy: options.policy.clone(),
            capture: spec
                .pcap
                .clone()
                .map(|path| CaptureSpec { path, snaplen: options.pcap_snaplen }),
            ring_trace: options.ring_trace.clone(),
            ..DeviceSpec::new(spec.guest_cid, &spec.uds_path)
        };
        let listener = Listener::new(&spec.socket, true).map_err(|e| {
            io::Error::other(format!("vhost-user socket {}: {e}", spec.socket.display()))
        })?;
        let calls = Arc::new(CallLines::default());
        let bus = VhostUserBus { mem: mem.clone(), calls: calls.clone() };
        let (cid, groups) = (spec.guest_cid.as_u64(), spec.groups.clone());
        let port_router = router.clone();
        let started = bus.start(&device, move |bridge, registry, token| {
            let router = SiblingPort::new(port_router, cid, groups, registry, token)?;
            Ok(RoutedBridge { host: bridge, router })
        })?;
        router.deliver_with(cid, started.thread.inline_kick());
        let link = VringLink {
            device: started.device,
            calls,
            events: started.events,
            kick: started.thread.inline_kick(),
        };
        Ok(Self {
            spec,
            mem,
            link,
            thread: started.thread,
            capture: started.capture,
            listener: std::sync::Mutex::new(listener),
        })
    }

    /// The guest this server is for.
    pub fn spec(&self) -> &VmSpec {
        &self.spec
    }

    /// A copy of the device's counters.
    pub fn stats(&self) -> Option<DeviceStats> {
        self.thread.stats()
    }

    /// The capture's handle, when this guest's packets are captured.
    pub fn capture(&self) -> Option<&CaptureHandle> {
        self.capture.as_ref()
    }

    /// Serves frontends for ever, one connection at a time: when a
    /// frontend goes away (QEMU exits, or reconnects), its queues stop,
    /// the guest's connections to host programs are reset, and the next
    /// frontend is awaited. Returns only on an error that a new connection
    /// would not cure (the socket cannot accept).
    pub fn serve(&self) -> io::Result<()> {
        let mut listener = self.listener.lock().expect("listener");
        loop {
            let mut daemon = {
                let _binding = bind_vrings(self.link.clone());
                let backend = Arc::new(VsockBackend {
                    link: self.link.clone(),
                    guest_cid: self.spec.guest_cid,
                });
                VhostUserDaemon::new(
                    format!("pier-vhost-user-{}", self.spec.guest_cid),
                    backend,
                    self.mem.clone(),
                )
                .map_err(|e| io::Error::other(format!("vhost-user daemon: {e}")))?
            };
            daemon
                .start(&mut listener)
                .map_err(|e| io::Error::other(format!("vhost-user accept: {e}")))?;
            tracing::info!(
                cid = self.spec.guest_cid.get(),
                socket = %self.spec.socket.display(),
                "vhost-user: frontend connected"
            );
            let ended = daemon.wait();
            for handler in daemon.get_epoll_handlers() {
                handler.send_exit_event();
            }
            self.frontend_gone();
            match ended {
                Ok(())
                | Err(vhost_user_backend::Error::HandleRequest(
                    VhostUserError::Disconnected
                    | VhostUserError::PartialMessage
                    | VhostUserError::SocketBroken(_),
                )) => tracing::info!(cid = self.spec.guest_cid.get(), "vhost-user: frontend left"),
                Err(e) => tracing::warn!(
                    cid = self.spec.guest_cid.get(),
                    "vhost-user: frontend connection ended: {e}"
                ),
            }
        }
    }

    /// Stops what the last frontend left running.
    fn frontend_gone(&self) {
        let mut device = self.link.device.lock_device();
        for q in 0..NUM_QUEUES {
            device.stop_queue(q);
            self.link.calls.set(q, None);
        }
        drop(device);
        let _ = self.link.events.control().write(1);
    }

    /// Stops the device loop (the bridge removes its socket files) and
    /// removes the vhost-user socket file.
    pub fn shutdown(&self) -> io::Result<()> {
        let result = self.thread.stop();
        let _ = std::fs::remove_file(&self.spec.socket);
        result
    }
}

/// The hybrid vsock socket paths and vhost-user sockets of `specs` must
/// all differ, and so must the CIDs.
pub fn check_specs(specs: &[VmSpec]) -> Result<(), String> {
    for (i, a) in specs.iter().enumerate() {
        for b in &specs[i + 1..] {
            if a.guest_cid == b.guest_cid {
                return Err(format!("two --vm with guest-cid={}", a.guest_cid));
            }
            if a.socket == b.socket || a.uds_path == b.uds_path {
                return Err(format!(
                    "--vm guest-cid={} and guest-cid={} share a socket path",
                    a.guest_cid, b.guest_cid
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_specs_take_vhost_device_vsock_keys() {
        let spec: VmSpec =
            "guest-cid=4,socket=/tmp/v.sock,uds-path=/tmp/u.vsock,tx-buffer-size=65536"
                .parse()
                .unwrap();
        assert_eq!(spec.guest_cid.get(), 4);
        assert_eq!(spec.socket, PathBuf::from("/tmp/v.sock"));
        assert_eq!(spec.uds_path, PathBuf::from("/tmp/u.vsock"));
        assert_eq!(spec.groups, vec!["default".to_owned()]);
        let grouped: VmSpec = "guest-cid=5,socket=s,uds-path=u,groups=a+b".parse().unwrap();
        assert_eq!(grouped.groups, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn bad_vm_specs_say_what_is_wrong() {
        let err = |s: &str| s.parse::<VmSpec>().unwrap_err();
        assert_eq!(err("socket=s,uds-path=u"), SpecError::Missing("guest-cid"));
        assert_eq!(err("guest-cid=2,socket=s,uds-path=u"), SpecError::BadCid("2".into()));
        assert_eq!(err("guest-cid=3,uds-path=u"), SpecError::Missing("socket"));
        assert_eq!(
            err("guest-cid=3,socket=s,uds-path=u,color=red"),
            SpecError::UnknownKey("color".into())
        );
        assert_eq!(err("guest-cid=3,socket"), SpecError::NotKeyValue("socket".into()));
    }

    #[test]
    fn specs_with_shared_paths_or_cids_are_refused() {
        let a: VmSpec = "guest-cid=3,socket=s3,uds-path=u3".parse().unwrap();
        let b: VmSpec = "guest-cid=4,socket=s4,uds-path=u4".parse().unwrap();
        assert!(check_specs(&[a.clone(), b.clone()]).is_ok());
        let same_cid = VmSpec { guest_cid: GuestCid::DEFAULT, ..b.clone() };
        assert!(check_specs(&[a.clone(), same_cid]).is_err());
        let same_uds = VmSpec { uds_path: "u3".into(), ..b };
        assert!(check_specs(&[a, same_uds]).is_err());
    }
}
