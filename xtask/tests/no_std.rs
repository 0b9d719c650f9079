//! The protocol core and the driver run on bare metal, so they must build
//! for `x86_64-unknown-none` with nothing but `core` and `alloc`. A `std`
//! import (even through a dependency's default features) fails this test.
//!
//! The build goes through the same code as `cargo xtask`, which installs
//! the bare-metal target first when the toolchain lacks it.

#[test]
fn stack_and_driver_build_for_bare_metal() {
    let target = pier_testkit::cache_dir("bare-metal-target");
    if let Err(e) = pier_testkit::build_bare_metal(
        &["pier-stack", "pier-driver"],
        &target,
        pier_testkit::Output::OnFailure,
    ) {
        panic!("{e}");
    }
}
