//! Compiled components kept between runs, so that the second `pier run` of
//! a component starts without compiling it again, and a cache that another
//! tenant cannot use to run their code as someone else's component.
//!
//! Cranelift turns a component into machine code on every
//! `Component::from_file`: for echo that is most of `pier run`'s start.
//! wasmtime can save that code (`Engine::precompile_component`) and load
//! it back (`Component::deserialize`). This module keeps one entry per
//! component in a cache directory.
//!
//! Loading saved code is `unsafe` in wasmtime because it is machine code
//! that runs in this process: whoever can write an entry, or make a
//! component's entry name another component's code, runs their code as
//! that component. So the cache trusts nothing it has not checked:
//!
//! - **The key** is SHA-256 over a format tag, pier's version, everything
//!   that decides whether saved code fits this engine
//!   (`Engine::precompile_compatibility_hash`: the target, the compiler's
//!   flags and the CPU features it uses, the engine's configuration and
//!   wasmtime's version) and the component's bytes. It names the entry
//!   file. Unlike a 64-bit hash, nobody can make two components share one.
//! - **An entry is two files:** `<key>.cwasm`, wasmtime's code as it
//!   wrote it, and `<key>.sum`, which records the key and the code's
//!   SHA-256. A load opens both, checks the record and hashes the code
//!   file it holds open, then has wasmtime map that same open file
//!   (`/proc/self/fd/N`, so a file renamed into place meanwhile is not
//!   what runs). So an entry copied under another component's name, a
//!   truncated one, or one changed on disk is compiled again, never run,
//!   and the containers of one image still share the code's pages
//!   through the page cache, as a mapped file does.
//! - **Only this user writes the cache.** The directory is made with mode
//!   0700; an entry is used only when it and the directory belong to the
//!   user running pier and neither is writable by others, and is opened
//!   without following a symbolic link. Under the containerd shim that
//!   user is root, so the cache belongs to the node, not to a tenant.
//! - **Bounded:** after each write, code files without a record (which
//!   can never load) go, then the least recently used entries until the
//!   cache holds at most [`CACHE_LIMIT_BYTES`].
//!
//! Anything that goes wrong with the cache (a directory that cannot be
//! made or is not trusted, an entry that does not check out) costs a
//! compile and a warning, never the run.

use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The most the cache directory's entries may hold together. The guest
/// apps' compiled code is 0.4–0.7 MiB each and a large component's tens
/// of MiB, so this keeps hundreds of components.
pub const CACHE_LIMIT_BYTES: u64 = 512 << 20;

/// What a `.sum` file holds: the format's tag (a change of format changes
/// it, so old entries miss), then the entry's key, then the SHA-256 of
/// the `.cwasm` file beside it.
const ENTRY_MAGIC: &[u8; 8] = b"PIERCC02";
const DIGEST_LEN: usize = 32;
const SUM_LEN: usize = ENTRY_MAGIC.len() + 2 * DIGEST_LEN;
/// The code files end in this; nothing else in the directory is counted
/// or removed by the bound, except each one's `.sum`.
const ENTRY_EXTENSION: &str = "cwasm";
const SUM_EXTENSION: &str = "sum";

type Digest = [u8; DIGEST_LEN];

/// The default cache directory: `$XDG_CACHE_HOME/pier/components`, or
/// `~/.cache/pier/components`; `None` without either.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("pier").join("components"))
}

/// What a load found in the cache: the reason for a compile, for the log
/// and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The entry checked out and its code was used.
    Hit,
    /// No entry for this component yet.
    Missing,
    /// The entry is not this component's, or its code is not what was
    /// recorded (copied, truncated or changed on disk).
    Mismatch,
    /// The entry or the directory belongs to another user, is writable by
    /// others, or is not a plain file: not even read.
    Untrusted,
    /// The entry checked out but wasmtime would not load it (for example
    /// code from an older wasmtime).
    Unloadable,
}

/// Feeds `Hash` implementations into SHA-256, so that the engine's
/// compatibility hash (which wasmtime only offers as `impl Hash`) becomes
/// part of the key.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Not what the key uses (that is the whole digest, [`key`]); `Hasher`
    /// needs one, so it is the digest's first eight bytes.
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("a digest is longer than 8 bytes"))
    }
}

/// The key of `bytes` compiled by `engine`.
fn key(engine: &Engine, bytes: &[u8]) -> Digest {
    let mut hasher = Sha256Hasher(Sha256::new());
    hasher.write(ENTRY_MAGIC);
    hasher.write(env!("CARGO_PKG_VERSION").as_bytes());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.write(&(bytes.len() as u64).to_le_bytes());
    hasher.write(bytes);
    hasher.0.finalize().into()
}

fn hex(digest: &Digest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The code file for `key` under `dir` (its record is the same path with
/// [`SUM_EXTENSION`]).
fn entry_path(dir: &Path, key: &Digest) -> PathBuf {
    dir.join(format!("{}.{ENTRY_EXTENSION}", hex(key)))
}

/// Loads the component at `wasm`: from the cache in `dir` when it holds
/// this component's checked code, otherwise compiled and then saved there.
/// With no `dir`, it is compiled as before.
pub fn load(engine: &Engine, wasm: &Path, dir: Option<&Path>) -> wasmtime::Result<Component> {
    let Some(dir) = dir else {
        return Component::from_file(engine, wasm);
    };
    let bytes = std::fs::read(wasm)
        .map_err(|e| wasmtime::format_err!("reading {}: {e}", wasm.display()))?;
    load_bytes(engine, &bytes, dir).map(|(component, _)| component)
}

/// [`load`] for bytes already read, saying what the cache held.
pub fn load_bytes(
    engine: &Engine,
    bytes: &[u8],
    dir: &Path,
) -> wasmtime::Result<(Component, CacheOutcome)> {
    let key = key(engine, bytes);
    let path = entry_path(dir, &key);
    let outcome = match read_entry(dir, &path, &key) {
        Ok(Some(code)) => {
            let open = PathBuf::from(format!("/proc/self/fd/{}", code.as_raw_fd()));
            // SAFETY: the directory and both files belong to this user and
            // nobody else can write them, the record names this
            // component's key, and the open file is the very file whose
            // SHA-256 it recorded when `save` wrote code from
            // `Engine::precompile_component` (module documentation);
            // wasmtime checks the header and compatibility again.
            match unsafe { Component::deserialize_file(engine, &open) } {
                Ok(component) => {
                    touch(&path);
                    tracing::debug!(cache = %path.display(), "loaded the compiled component");
                    return Ok((component, CacheOutcome::Hit));
                }
                Err(e) => {
                    tracing::warn!(cache = %path.display(), "compile cache entry unusable ({e}); compiling");
                    CacheOutcome::Unloadable
                }
            }
        }
        Ok(None) => CacheOutcome::Missing,
        Err(Refused::Mismatch(why)) => {
            tracing::warn!(cache = %path.display(), "compile cache entry rejected: {why}; compiling");
            CacheOutcome::Mismatch
        }
        Err(Refused::Untrusted(why)) => {
            tracing::warn!(cache = %path.display(), "compile cache not trusted: {why}; compiling");
            CacheOutcome::Untrusted
        }
    };
    let code = engine.precompile_component(bytes)?;
    // `save` writes nothing into a directory it does not trust.
    if let Err(e) = save(dir, &path, &key, &code) {
        tracing::warn!(dir = %dir.display(), "cannot keep the compiled component: {e:#}");
    }
    // SAFETY: `code` came from `precompile_component` on this very engine.
    let component = unsafe { Component::deserialize(engine, &code) }?;
    Ok((component, outcome))
}

/// Why an entry was not used.
enum Refused {
    Mismatch(String),
    Untrusted(String),
}

/// Opens one of an entry's files without following a symbolic link and
/// checks who may write it; `Ok(None)` when it is not there.
fn open_trusted(path: &Path, what: &str) -> Result<Option<File>, Refused> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Refused::Untrusted(format!("opening the {what}: {e}"))),
    };
    let meta = file.metadata().map_err(|e| Refused::Untrusted(e.to_string()))?;
    trusted(&meta, false).map_err(|why| Refused::Untrusted(format!("the {what} {why}")))?;
    Ok(Some(file))
}

/// The code file at `path`, open, when the entry is there, trusted and
/// checks out against `key`; `Ok(None)` when there is no entry.
fn read_entry(dir: &Path, path: &Path, key: &Digest) -> Result<Option<File>, Refused> {
    let Some(mut sum) = open_trusted(&path.with_extension(SUM_EXTENSION), "record")? else {
        return Ok(None);
    };
    trusted_dir(dir).map_err(Refused::Untrusted)?;
    let mut record = Vec::with_capacity(SUM_LEN);
    (&mut sum)
        .take(SUM_LEN as u64 + 1)
        .read_to_end(&mut record)
        .map_err(|e| Refused::Mismatch(format!("reading the record: {e}")))?;
    let recorded_code = check_record(&record, key).map_err(Refused::Mismatch)?;
    let Some(mut code) = open_trusted(path, "code file")? else {
        return Err(Refused::Mismatch("its code file is missing".into()));
    };
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match code.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => hasher.update(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Refused::Mismatch(format!("reading the code: {e}"))),
        }
    }
    if hasher.finalize()[..] != recorded_code {
        return Err(Refused::Mismatch(
            "its code is not the code it recorded (truncated or changed)".into(),
        ));
    }
    Ok(Some(code))
}

/// The code's SHA-256 that `record` holds, if it is a whole record of
/// `key`.
fn check_record(record: &[u8], key: &Digest) -> Result<Digest, String> {
    if record.len() != SUM_LEN || &record[..ENTRY_MAGIC.len()] != ENTRY_MAGIC {
        return Err("not a pier compile cache record, or cut short".into());
    }
    if &record[ENTRY_MAGIC.len()..ENTRY_MAGIC.len() + DIGEST_LEN] != key {
        return Err("it records another component's key".into());
    }
    Ok(record[ENTRY_MAGIC.len() + DIGEST_LEN..].try_into().expect("a digest's length"))
}

/// Whether files under `meta` can be trusted: they belong to this user, and
/// nobody else may write them (`dir`: a directory, else a plain file).
fn trusted(meta: &std::fs::Metadata, dir: bool) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!("belongs to user {}, not to this one ({me})", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("is writable by others (mode {:o})", meta.mode() & 0o7777));
    }
    if dir != meta.is_dir() || (!dir && !meta.is_file()) {
        return Err(if dir { "is not a directory" } else { "is not a plain file" }.into());
    }
    Ok(())
}

/// Whether the cache directory itself can be trusted (not a symbolic link,
/// ours, written by nobody else).
fn trusted_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    trusted(&meta, true).map_err(|why| format!("{} {why}", dir.display()))
}

/// Marks an entry as used now, for the bound's least-recently-used order.
/// A failure only makes the entry look older.
fn touch(path: &Path) {
    if let Ok(file) = File::options().write(true).custom_flags(libc::O_NOFOLLOW).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Writes `code` as `key`'s entry at `path` through a temporary file, so
/// that a concurrent `pier run` never reads half an entry, then keeps the
/// directory within [`CACHE_LIMIT_BYTES`].
fn save(dir: &Path, path: &Path, key: &Digest, code: &[u8]) -> Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    if let Err(why) = trusted_dir(dir) {
        bail!("not writing to the cache: {why}");
    }
    // The code first, then its record: a load that comes between finds
    // a record that does not match the new code, and compiles.
    write_new(path, &[code])?;
    write_new(&path.with_extension(SUM_EXTENSION), &[ENTRY_MAGIC, key, &Sha256::digest(code)])?;
    bound(dir, CACHE_LIMIT_BYTES, path);
    Ok(())
}

/// Writes `parts` to a new file (0600) renamed to `path` once whole.
fn write_new(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .with_context(|| format!("creating {}", temp.display()))?;
    let written = parts.iter().try_for_each(|part| file.write_all(part));
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

/// Removes the least recently used entries of `dir` until the rest hold at
/// most `limit` bytes; `keep` (the entry just written) goes last, so that
/// one component larger than the limit is still kept for its next run.
/// A code file without its record can never be loaded (an older pier's
/// entry, or a save cut short), so it goes first, whatever the total.
fn bound(dir: &Path, limit: u64, keep: &Path) {
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<(bool, SystemTime, u64, PathBuf)> = listing
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == ENTRY_EXTENSION))
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            let path = e.path();
            let loadable = path.with_extension(SUM_EXTENSION).is_file();
            Some((loadable, meta.modified().ok()?, meta.len(), path))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|(_, _, len, _)| len).sum();
    entries.sort_by_key(|(loadable, used, _, path)| (path == keep, *loadable, *used));
    for (loadable, _, len, path) in entries {
        if path == keep || (loadable && total <= limit) {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::debug!(cache = %path.display(), "compile cache full: removed the oldest entry");
                let _ = std::fs::remove_file(path.with_extension(SUM_EXTENSION));
                total -= len;
            }
            Err(e) => tracing::warn!(cache = %path.display(), "cannot remove a cache entry: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    fn component_bytes(name: &str) -> Vec<u8> {
        std::fs::read(pier_testkit::guest_component(name)).unwrap()
    }

    /// The names a component imports: what tells two components' code
    /// apart in these tests.
    fn imports(engine: &Engine, component: &Component) -> Vec<String> {
        component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect()
    }

    /// Loads `name` once, so that `dir` holds its entry; returns its bytes
    /// and the entry's path.
    fn cached(engine: &Engine, dir: &Path, name: &str) -> (Vec<u8>, PathBuf) {
        let bytes = component_bytes(name);
        load_bytes(engine, &bytes, dir).unwrap();
        let entry = entry_path(dir, &key(engine, &bytes));
        (bytes, entry)
    }

    fn cache() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("components");
        (root, dir)
    }

    #[test]
    fn the_second_load_uses_the_entry_the_first_wrote() {
        let engine = engine();
        let (_root, dir) = cache();
        let hello = component_bytes("hello");
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Missing);
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Hit);
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700, "the cache directory is the user's alone");
    }

    #[test]
    fn an_entry_copied_under_another_components_key_is_compiled_again_not_run() {
        let engine = engine();
        let (_root, dir) = cache();
        let (hello, echo) = (component_bytes("hello"), component_bytes("echo"));
        let (echo_component, _) = load_bytes(&engine, &echo, &dir).unwrap();
        // Forge a collision: echo's entry, under the name hello's key gives.
        let echo_entry = entry_path(&dir, &key(&engine, &echo));
        let hello_entry = entry_path(&dir, &key(&engine, &hello));
        for extension in [ENTRY_EXTENSION, SUM_EXTENSION] {
            std::fs::copy(
                echo_entry.with_extension(extension),
                hello_entry.with_extension(extension),
            )
            .unwrap();
        }
        let (loaded, outcome) = load_bytes(&engine, &hello, &dir).unwrap();
        assert_eq!(outcome, CacheOutcome::Mismatch);
        let fresh = Component::new(&engine, &hello).unwrap();
        assert_eq!(imports(&engine, &loaded), imports(&engine, &fresh), "hello runs hello's code");
        assert_ne!(imports(&engine, &loaded), imports(&engine, &echo_component));
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Hit, "rewritten");
    }

    #[test]
    fn an_entry_whose_code_changed_or_was_cut_short_is_compiled_again() {
        let engine = engine();
        let (_root, dir) = cache();
        let (hello, entry) = cached(&engine, &dir, "hello");
        let good = std::fs::read(&entry).unwrap();

        let mut changed = good.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        std::fs::write(&entry, &changed).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Mismatch);
        assert_eq!(std::fs::read(&entry).unwrap(), good, "the entry was written again");

        std::fs::write(&entry, &good[..good.len() / 2]).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Mismatch);
        let record = entry.with_extension(SUM_EXTENSION);
        let whole = std::fs::read(&record).unwrap();
        std::fs::write(&record, &whole[..SUM_LEN - 1]).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Mismatch);
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Hit);
    }

    /// Needs root, as the suite runs (it installs packages): chown to
    /// another user is refused to anyone else, and the test fails then.
    #[test]
    fn an_entry_or_directory_of_another_user_or_writable_by_others_is_not_read() {
        use std::os::unix::fs::PermissionsExt as _;
        let engine = engine();
        let (_root, dir) = cache();
        let (hello, entry) = cached(&engine, &dir, "hello");
        let nobody = 65534;
        std::os::unix::fs::chown(&entry, Some(nobody), Some(nobody))
            .expect("chown needs root: run the suite as root, as its set-up does");
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Untrusted);
        assert_ne!(std::fs::metadata(&entry).unwrap().uid(), nobody, "replaced by our own entry");
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Hit);

        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Untrusted);
        load_bytes(&engine, &hello, &dir).unwrap();

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Untrusted);
        assert_eq!(
            load_bytes(&engine, &hello, &dir).unwrap().1,
            CacheOutcome::Untrusted,
            "nothing is written to a directory others can write"
        );
    }

    #[test]
    fn a_symbolic_link_in_place_of_an_entry_is_not_followed() {
        let engine = engine();
        let (root, dir) = cache();
        let (hello, entry) = cached(&engine, &dir, "hello");
        let elsewhere = root.path().join("planted");
        std::fs::rename(&entry, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert_eq!(load_bytes(&engine, &hello, &dir).unwrap().1, CacheOutcome::Untrusted);
    }

    #[test]
    fn the_bound_removes_the_least_recently_used_entries_first() {
        let (_root, dir) = cache();
        std::fs::create_dir(&dir).unwrap();
        let now = SystemTime::now();
        let names = ["old", "middle", "new"];
        for (age, name) in names.iter().enumerate() {
            let path = dir.join(format!("{name}.{ENTRY_EXTENSION}"));
            std::fs::write(&path, vec![0u8; 1000]).unwrap();
            std::fs::write(path.with_extension(SUM_EXTENSION), [0u8; SUM_LEN]).unwrap();
            let used = now - std::time::Duration::from_secs(100 * (3 - age as u64));
            File::options().write(true).open(&path).unwrap().set_modified(used).unwrap();
        }
        std::fs::write(dir.join("not-an-entry"), vec![0u8; 5000]).unwrap();
        let keep = dir.join(format!("old.{ENTRY_EXTENSION}"));
        bound(&dir, 2000, &keep);
        let left: Vec<bool> =
            names.iter().map(|n| dir.join(format!("{n}.{ENTRY_EXTENSION}")).exists()).collect();
        assert_eq!(left, [true, false, true], "the oldest but the kept one went");
        assert!(!dir.join(format!("middle.{SUM_EXTENSION}")).exists(), "with its record");
        assert!(dir.join("not-an-entry").exists(), "only entries count");
    }

    #[test]
    fn a_code_file_without_its_record_is_removed_even_under_the_bound() {
        let (_root, dir) = cache();
        std::fs::create_dir(&dir).unwrap();
        let orphan = dir.join(format!("0123456789abcdef.{ENTRY_EXTENSION}"));
        std::fs::write(&orphan, vec![0u8; 1000]).unwrap();
        let kept = dir.join(format!("kept.{ENTRY_EXTENSION}"));
        std::fs::write(&kept, vec![0u8; 1000]).unwrap();
        std::fs::write(kept.with_extension(SUM_EXTENSION), [0u8; SUM_LEN]).unwrap();
        let written = dir.join(format!("written.{ENTRY_EXTENSION}"));
        std::fs::write(&written, vec![0u8; 1000]).unwrap();
        bound(&dir, 1 << 20, &written);
        assert!(!orphan.exists(), "an older pier's entry, never loadable, went");
        assert!(kept.exists() && written.exists(), "the rest is under the bound");
    }
}
