//! The virtio half of pier's vsock device: everything between "the driver
//! wrote a register or published a descriptor" and "here is a raw packet".
//!
//! pier implements its virtio-vsock device once and plugs it into two
//! buses: a KVM VMM (MMIO exits, ioeventfd, irqfd over guest RAM) and the
//! Wasm host shim, where the guest driver runs inside the host process.
//! This crate is the part both share:
//!
//! * [`mmio`]: the virtio-mmio version 2 register file, feature
//!   negotiation and device lifecycle;
//! * [`queues`]: device-side split virtqueues that turn hostile descriptor
//!   chains into packets (44-byte header + payload) or precise errors;
//! * [`inprocess`]: virtio-drivers' `Transport` and `Hal` implemented for a
//!   process, so the very driver that runs in the unikernel can run against
//!   this device without a VM.
//!
//! It moves packets and nothing more. What a packet means (connections,
//! credit, resets) belongs to the protocol core, `pier-stack`, which sits on
//! top of these queues.

pub mod apps;
pub mod bridge;
pub mod chain;
pub mod endpoint;
pub mod inprocess;
pub mod mmio;
pub mod queues;
pub mod runner;

pub use endpoint::{EndpointStats, HostEndpoint, NoRelayHooks, RelayHooks};
pub use inprocess::{
    DeviceEvents, DmaRegion, DmaScope, EventWaiter, InProcessHal, InProcessTransport,
};
pub use mmio::{MmioBus, MmioEvent, VsockConfig, VsockMmio};
pub use queues::{DeviceQueue, DrainStats, HDR_LEN, QueueError, TxPacket};
