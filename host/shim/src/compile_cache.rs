//! Compiled components kept between runs, so that the second `pier run` of
//! a component starts without compiling it again.
//!
//! Cranelift turns a component into machine code on every
//! `Component::from_file`: for echo that is most of `pier run`'s start.
//! wasmtime can save that code (`Engine::precompile_component`) and load
//! it back (`Component::deserialize`). This module keeps one file per
//! component in a cache directory, named by a hash of the component's
//! bytes and of everything that decides whether saved code fits this
//! engine (`Engine::precompile_compatibility_hash`: wasmtime's version,
//! its configuration, the host CPU's features). A changed component, a
//! new pier or another machine's cache simply misses.
//!
//! Loading saved code is `unsafe` in wasmtime because a forged file could
//! run arbitrary code in this process: the cache lives in the user's own
//! cache directory, written only by pier, and wasmtime still checks the
//! file's header and compatibility before using it. Anything that goes
//! wrong with the cache (a directory that cannot be made, a file that does
//! not load) costs a compile and a warning, never the run.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The default cache directory: `$XDG_CACHE_HOME/pier/components`, or
/// `~/.cache/pier/components`; `None` without either.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("pier").join("components"))
}

/// The cache file for `bytes` under `dir`.
fn entry(engine: &Engine, dir: &Path, bytes: &[u8]) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    bytes.hash(&mut hasher);
    dir.join(format!("{:016x}.cwasm", hasher.finish()))
}

/// Loads the component at `wasm`: from the cache in `dir` when it holds
/// this component's code, otherwise compiled and then saved there. With
/// no `dir`, it is compiled as before.
pub fn load(engine: &Engine, wasm: &Path, dir: Option<&Path>) -> wasmtime::Result<Component> {
    let Some(dir) = dir else {
        return Component::from_file(engine, wasm);
    };
    let bytes = std::fs::read(wasm)
        .map_err(|e| wasmtime::format_err!("reading {}: {e}", wasm.display()))?;
    let path = entry(engine, dir, &bytes);
    if path.is_file() {
        // SAFETY: the file was written by `save` below from
        // `Engine::precompile_component` (see the module documentation);
        // wasmtime checks its header and compatibility before use.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => {
                tracing::debug!(cache = %path.display(), "loaded the compiled component");
                return Ok(component);
            }
            Err(e) => {
                tracing::warn!(cache = %path.display(), "compile cache entry unusable ({e}); compiling");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let code = engine.precompile_component(&bytes)?;
    if let Err(e) = save(dir, &path, &code) {
        tracing::warn!(dir = %dir.display(), "cannot keep the compiled component: {e:#}");
    }
    // SAFETY: `code` came from `precompile_component` on this very engine.
    unsafe { Component::deserialize(engine, &code) }
}

/// Writes `code` to `path` through a temporary file, so that a concurrent
/// `pier run` never reads half a file.
fn save(dir: &Path, path: &Path, code: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temp, code).with_context(|| format!("writing {}", temp.display()))?;
    std::fs::rename(&temp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
