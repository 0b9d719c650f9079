//! Fuzz target: `pier run --config FILE`'s parser (`host/cli/src/config.rs`,
//! compiled here from its own source with the size parser it uses), on any
//! text: the TOML, then the components with their paths resolved and their
//! grants, folders and memory limits parsed.
//!
//! Invariants, besides never panicking:
//! - a socket path and every component's wasm file and host folder are
//!   absolute (relative ones start at the config file's folder);
//! - a file whose components parse has at least one;
//! - every grant prints as text that parses back to the same grant, so
//!   what the parser accepted is what the logs and `--stats` name.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pier_shim::{ConnectGrant, PortGrant};

#[allow(dead_code)]
#[path = "../../host/cli/src/size.rs"]
mod size;

#[allow(dead_code)]
#[path = "../../host/cli/src/config.rs"]
mod config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let dir = Path::new("/etc/pier");
    let Ok(file) = config::ConfigFile::parse(text, dir) else { return };
    if let Some(uds) = &file.uds {
        assert!(uds.is_absolute(), "{uds:?}");
    }
    let Ok(components) = file.components() else { return };
    assert!(!components.is_empty());
    for c in &components {
        assert!(c.wasm.is_absolute(), "{:?}", c.wasm);
        assert!(c.dirs.iter().all(|d| d.host.is_absolute()), "{:?}", c.dirs);
        for grant in &c.grants.listen {
            assert_eq!(grant.to_string().parse::<PortGrant>().as_ref(), Ok(grant));
        }
        for grant in &c.grants.connect {
            assert_eq!(grant.to_string().parse::<ConnectGrant>().as_ref(), Ok(grant));
        }
    }
});
