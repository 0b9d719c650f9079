//! The shim binary: containerd finds it as `containerd-shim-pier-v1` on
//! its PATH for the runtime `io.containerd.pier.v1`.

use containerd_shimkit::sandbox::cli::shim_main;
use containerd_shimkit::shim_version;
use pier_containerd_shim::PierInstance;

fn main() {
    shim_main::<PierInstance>("pier", shim_version!(), None);
}
