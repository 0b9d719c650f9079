//! The Linux test guest: Debian's own kernel and an initramfs holding
//! busybox, the kernel's vsock modules and `guest-linux/vsock-test`, for
//! checking a vhost-user vsock backend against the guest driver everyone
//! else runs (`crate::linux_vm` boots it).
//!
//! Everything comes from Debian packages, fetched with `apt-get download`
//! and unpacked with `dpkg-deb -x` into the cache
//! (`cache_dir("linux-guest")`); nothing is installed on the host. The
//! kernel is the version Debian's `linux-image-amd64` depends on, so the
//! guest is the stock kernel of the release the machine runs.
//!
//! The guest boots like this (`/init`, a busybox shell script):
//!
//! 1. mount `/proc`, `/sys` and `/dev` (devtmpfs: Debian's kernel does not
//!    mount it itself), install busybox's applets;
//! 2. load the vsock modules, in dependency order: `virtio_ring`,
//!    `virtio`, `virtio_mmio`, `vsock`, `vmw_vsock_virtio_transport_common`,
//!    `vmw_vsock_virtio_transport` (any the kernel has built in are
//!    skipped). Debian builds virtio-mmio without its command-line device
//!    list, so the guest finds the device through ACPI: QEMU's microvm
//!    with `acpi=on` describes it;
//! 3. run `/vsock-test` (its crate documentation lists its ports and
//!    commands), and power off when it exits.
//!
//! The initramfs is packed here (cpio "newc", uncompressed: the kernel
//! takes it as is) on every build: it is a few megabytes, and packing is
//! cheaper than deciding whether to.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Output, cache_dir, cargo, ensure_target, repo_root, run};

/// The target the guest program builds for: static, so the initramfs
/// needs no C library.
pub const LINUX_GUEST_TARGET: &str = "x86_64-unknown-linux-musl";

/// The kernel modules the guest loads, in load order (each needs the ones
/// before it).
pub const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
];

/// What the guest program prints once every listener is up.
pub const READY: &str = "vsock-test: ready";

/// The guest program's ports (`guest-linux/vsock-test`'s documentation).
pub mod ports {
    /// Stream echo.
    pub const STREAM_ECHO: u32 = 1234;
    /// Seqpacket echo.
    pub const SEQPACKET_ECHO: u32 = 1235;
    /// The half-close probe.
    pub const HALF_CLOSE: u32 = 1236;
    /// The reset probe.
    pub const RESET: u32 = 1237;
    /// The control port.
    pub const CONTROL: u32 = 9999;
}

/// A built guest: what QEMU's `-kernel` and `-initrd` take.
#[derive(Clone, Debug)]
pub struct LinuxGuest {
    /// The kernel image (`vmlinuz-<version>`).
    pub kernel: PathBuf,
    /// The uncompressed cpio initramfs.
    pub initrd: PathBuf,
    /// The kernel's release (`6.1.0-57-amd64`).
    pub kernel_release: String,
}

/// The kernel package `apt` would install for `linux-image-amd64`
/// (`linux-image-6.1.0-57-amd64`), refreshing apt's lists once if it
/// knows no such package yet.
pub(crate) fn kernel_package(apt: Apt) -> Result<String, String> {
    let ask = || -> Result<Option<String>, String> {
        let out = apt
            .command("apt-cache")
            .args(["depends", "linux-image-amd64"])
            .output()
            .map_err(|e| {
                format!(
                    "running apt-cache: {e}. The Linux test guest is built from Debian packages; \
                     it needs apt (Debian or a derivative)"
                )
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().find_map(|line| {
            let name = line.trim().strip_prefix("Depends:")?.trim();
            name.starts_with("linux-image-").then(|| name.to_owned())
        }))
    };
    if let Some(package) = ask()? {
        return Ok(package);
    }
    apt.update()?;
    ask()?.ok_or_else(|| {
        "apt-cache depends linux-image-amd64 names no kernel package, even after apt-get \
         update; the Linux test guest needs Debian's amd64 kernel packages in apt's sources"
            .to_owned()
    })
}

/// Which apt `apt-get download` asks: the host's own, or a private state
/// (`APT_CONFIG`) that reaches a suite the host's sources lack.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Apt<'a> {
    Host,
    Private(&'a Path),
}

impl Apt<'_> {
    /// `program` (an apt command) asking this apt.
    pub(crate) fn command(self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        if let Self::Private(config) = self {
            cmd.env("APT_CONFIG", config);
        }
        cmd
    }

    /// Refreshes this apt's lists.
    pub(crate) fn update(self) -> Result<(), String> {
        match self {
            Self::Host => crate::tools::apt_update(),
            Self::Private(config) => run(
                self.command("apt-get").args(["update", "-q"]),
                &format!("apt-get update with APT_CONFIG={}", config.display()),
                Output::OnFailure,
            ),
        }
    }
}

/// Downloads `package`'s .deb into `debs` (once) and returns its path.
/// `package` may pin a version (`name=version`).
pub(crate) fn download(package: &str, debs: &Path, apt: Apt) -> Result<PathBuf, String> {
    let name = package.split('=').next().unwrap_or(package);
    let find = || {
        fs::read_dir(debs).ok().and_then(|dir| {
            dir.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
            })
        })
    };
    if let Some(deb) = find() {
        return Ok(deb);
    }
    fs::create_dir_all(debs).map_err(|e| format!("creating {}: {e}", debs.display()))?;
    let fetch = || {
        apt.command("apt-get")
            .args(["download", "-q", package])
            .current_dir(debs)
            .output()
            .map_err(|e| format!("running apt-get download {package}: {e}"))
    };
    let mut out = fetch()?;
    if !out.status.success() {
        // A fresh machine's lists may be missing or name a superseded
        // version the mirror no longer has.
        apt.update()?;
        out = fetch()?;
    }
    if !out.status.success() {
        return Err(format!(
            "apt-get download {package} failed ({}): {}\nCheck that apt can reach its \
             sources (`apt-get update`), then run the command again.",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    find().ok_or_else(|| format!("apt-get download {package} left no .deb in {}", debs.display()))
}

/// Unpacks `package` (downloading it first) into `<cache>/<package>/`,
/// once: a marker file says the unpacking finished.
pub(crate) fn unpack(package: &str, cache: &Path, apt: Apt) -> Result<PathBuf, String> {
    let dest = cache.join(package);
    let done = dest.join(".unpacked");
    if done.is_file() {
        return Ok(dest);
    }
    let deb = download(package, &cache.join("debs"), apt)?;
    let _ = fs::remove_dir_all(&dest);
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dest),
        &format!("unpacking {} (dpkg-deb -x)", deb.display()),
        Output::OnFailure,
    )?;
    File::create(&done).map_err(|e| format!("creating {}: {e}", done.display()))?;
    Ok(dest)
}

/// Builds `guest-linux/vsock-test` (static, musl) into the cache and
/// returns the binary.
pub fn build_test_program(output: Output) -> Result<PathBuf, String> {
    ensure_target(LINUX_GUEST_TARGET)?;
    let target_dir = cache_dir("linux-guest").join("target");
    run(
        cargo()
            .current_dir(repo_root().join("guest-linux/vsock-test"))
            .args(["build", "--release", "--locked", "--target", LINUX_GUEST_TARGET])
            .env("CARGO_TARGET_DIR", &target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
        "building guest-linux/vsock-test",
        output,
    )?;
    Ok(target_dir.join(LINUX_GUEST_TARGET).join("release/vsock-test"))
}

/// Builds the guest: fetches the kernel and busybox (once), builds the
/// test program, packs the initramfs. Safe to call from several processes
/// at once: they take turns on a lock file in the cache.
pub fn build(output: Output) -> Result<LinuxGuest, String> {
    let cache = cache_dir("linux-guest");
    fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let lock_path = cache.join(".lock");
    let lock =
        File::create(&lock_path).map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;

    let program = build_test_program(output)?;
    let package = kernel_package(Apt::Host)?;
    let kernel_root = unpack(&package, &cache, Apt::Host)?;
    let busybox_root = unpack("busybox-static", &cache, Apt::Host)?;

    let kernel = DebianKernel::find(&package, &[kernel_root])?;
    let modules = kernel.modules(MODULES)?;
    let mut cpio = base_initramfs(&busybox_root, &modules)?;
    cpio.file("vsock-test", 0o755, &read(&program)?);
    let mut init = init_prologue(&modules, "The Linux test guest's init");
    init.push_str(
        "/vsock-test\n\
         echo \"init: vsock-test exited with $?\"\n\
         poweroff -f\n",
    );
    cpio.file("init", 0o755, init.as_bytes());
    let initrd = cache.join("initrd.cpio");
    cpio.write(&initrd)?;
    Ok(LinuxGuest { kernel: kernel.image, initrd, kernel_release: kernel.release })
}

/// A Debian kernel unpacked: its image and its modules.
#[derive(Clone, Debug)]
pub(crate) struct DebianKernel {
    /// The package named for it (`linux-image-<release>`).
    pub package: String,
    /// `vmlinuz-<release>`.
    pub image: PathBuf,
    /// `lib/modules/<release>`.
    pub modules_dir: PathBuf,
    /// The kernel's release (`6.1.0-57-amd64`).
    pub release: String,
}

impl DebianKernel {
    /// Finds the image and the modules of `package` in `roots`, the
    /// unpacked packages that make it up: Debian 12 ships both in
    /// `linux-image-<release>` (`/boot`, `/lib/modules`), Debian 13 splits
    /// them across `linux-binary-` and `linux-modules-<release>` under
    /// `/usr/lib/modules/<release>`.
    pub(crate) fn find(package: &str, roots: &[PathBuf]) -> Result<Self, String> {
        let release = package.strip_prefix("linux-image-").unwrap_or(package).to_owned();
        let first = |candidates: &[String]| {
            roots
                .iter()
                .flat_map(|root| candidates.iter().map(move |c| root.join(c)))
                .find(|p| p.exists())
        };
        let image = first(&[
            format!("boot/vmlinuz-{release}"),
            format!("usr/lib/modules/{release}/vmlinuz"),
        ])
        .ok_or_else(|| format!("{package} holds no vmlinuz-{release}"))?;
        let modules_dir = first(&[
            format!("lib/modules/{release}/kernel"),
            format!("usr/lib/modules/{release}/kernel"),
        ])
        .and_then(|kernel| kernel.parent().map(Path::to_path_buf))
        .ok_or_else(|| format!("{package} holds no lib/modules/{release}/kernel"))?;
        Ok(Self { package: package.to_owned(), image, modules_dir, release })
    }

    /// The modules `names` (in load order) as insmod takes them,
    /// decompressed when Debian ships them as `.ko.xz` (busybox's insmod
    /// loads only plain ones). A module the kernel builds in is left out:
    /// `modules.builtin` says which, and a kernel shipped without that
    /// list is taken to build in whatever it has no file for (Debian 13's
    /// `virtio` and `virtio_ring`); a guest that then lacks one fails to
    /// find its device, and its console says so.
    pub(crate) fn modules<'n>(&self, names: &[&'n str]) -> Result<Vec<(&'n str, Vec<u8>)>, String> {
        let builtin = fs::read_to_string(self.modules_dir.join("modules.builtin")).ok();
        let mut modules = Vec::new();
        for &name in names {
            match find_module(&self.modules_dir.join("kernel"), name) {
                Some(path) if path.extension().is_some_and(|e| e == "xz") => {
                    modules.push((name, decompress_xz(&path)?));
                }
                Some(path) => modules.push((name, read(&path)?)),
                None if builtin
                    .as_ref()
                    .is_none_or(|b| b.lines().any(|l| module_name(l) == Some(name))) => {}
                None => {
                    return Err(format!(
                        "{} has no module {name}.ko under {} and does not build it in; \
                         the guest cannot reach its devices without it",
                        self.package,
                        self.modules_dir.display()
                    ));
                }
            }
        }
        Ok(modules)
    }
}

/// `xz -dc path`.
fn decompress_xz(path: &Path) -> Result<Vec<u8>, String> {
    let xz = crate::tools::ensure(crate::tools::XZ)?;
    let out = Command::new(xz)
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|e| format!("running xz -dc {}: {e}", path.display()))?;
    let why = || String::from_utf8_lossy(&out.stderr).trim().to_owned();
    out.status
        .success()
        .then(|| out.stdout.clone())
        .ok_or_else(|| format!("xz -dc {} failed ({}): {}", path.display(), out.status, why()))
}

/// The initramfs every Linux test guest starts from: the folders, the
/// console node, busybox (from the unpacked `busybox-static` at
/// `busybox_root`) and `modules` under `/lib/modules/<name>.ko`.
pub(crate) fn base_initramfs(
    busybox_root: &Path,
    modules: &[(&str, Vec<u8>)],
) -> Result<Cpio, String> {
    let busybox = busybox_root.join("bin/busybox");
    if !busybox.is_file() {
        return Err(format!("busybox-static holds no {}", busybox.display()));
    }
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "tmp", "sbin", "usr", "usr/bin", "usr/sbin", "lib"] {
        cpio.dir(dir);
    }
    cpio.dir("lib/modules");
    // The kernel opens /dev/console for init's stdio before /init can
    // mount devtmpfs; without the node the program's output is lost.
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &read(&busybox)?);
    cpio.symlink("bin/sh", "busybox");
    for (name, data) in modules {
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, data);
    }
    Ok(cpio)
}

/// The start of a guest's `/init` (a busybox shell script, `what` in its
/// first comment): busybox's applets, `/proc`, `/sys` and `/dev`
/// (devtmpfs: Debian's kernel does not mount it itself), then `modules`
/// loaded in order.
pub(crate) fn init_prologue(modules: &[(&str, Vec<u8>)], what: &str) -> String {
    let mut script = format!(
        "#!/bin/sh\n\
         # {what} (built by pier-testkit).\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n",
    );
    for (name, _) in modules {
        script.push_str(&format!(
            "insmod /lib/modules/{name}.ko || echo \"init: insmod {name} failed\"\n"
        ));
    }
    script
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// `kernel/net/vmw_vsock/vsock.ko` → `vsock`, for `modules.builtin` lines.
fn module_name(line: &str) -> Option<&str> {
    line.rsplit('/').next()?.strip_suffix(".ko")
}

/// `<name>.ko`, or else `<name>.ko.xz`, anywhere under `dir`.
fn find_module(dir: &Path, name: &str) -> Option<PathBuf> {
    let plain = format!("{name}.ko");
    let compressed = format!("{name}.ko.xz");
    let mut stack = vec![dir.to_path_buf()];
    let mut found_compressed = None;
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            let file_name = entry.file_name();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if file_name.to_str() == Some(plain.as_str()) {
                return Some(path);
            } else if file_name.to_str() == Some(compressed.as_str()) {
                found_compressed = Some(path);
            }
        }
    }
    found_compressed
}

/// A cpio archive in the "newc" format the kernel unpacks into its
/// initramfs: per entry a 110-byte ASCII header (`070701` and thirteen
/// 8-digit hex fields), the name with its NUL, the data, each padded to 4
/// bytes; `TRAILER!!!` ends it.
#[derive(Debug, Default)]
pub(crate) struct Cpio {
    out: Vec<u8>,
    next_inode: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.next_inode += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so the archive depends only on its contents
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check (unused by newc)
        ];
        self.out.extend_from_slice(b"070701");
        for field in fields {
            self.out.extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub(crate) fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    pub(crate) fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), data);
    }

    pub(crate) fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, (0, 0), target.as_bytes());
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    /// Writes the finished archive to `path` (through a temporary file,
    /// so a reader never sees half of one).
    pub(crate) fn write(self, path: &Path) -> Result<(), String> {
        let partial = path.with_extension("partial");
        File::create(&partial)
            .and_then(|mut f| f.write_all(&self.finish()))
            .and_then(|()| fs::rename(&partial, path))
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn finish(mut self) -> Vec<u8> {
        self.next_inode = 0;
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        // The kernel reads the archive in 512-byte blocks, like cpio(1)
        // writes it.
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_newc_header_layout() {
        let mut cpio = Cpio::default();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        let out = cpio.finish();
        assert_eq!(&out[..6], b"070701");
        // ino 1, mode 0100755, filesize 10, namesize 5.
        assert_eq!(&out[6..14], b"00000001");
        assert_eq!(&out[14..22], b"000081ed");
        assert_eq!(&out[54..62], b"0000000a");
        assert_eq!(&out[94..102], b"00000005");
        // Header (110) + "init\0" (5) = 115, padded to 116; data at 116.
        assert_eq!(&out[110..115], b"init\0");
        assert_eq!(&out[116..126], b"#!/bin/sh\n");
        let trailer = out.windows(10).position(|w| w == b"TRAILER!!!").expect("trailer");
        assert_eq!(trailer, 128 + 110);
        assert_eq!(out.len() % 512, 0);
    }

    #[test]
    fn builtin_lines_name_modules() {
        assert_eq!(module_name("kernel/net/vmw_vsock/vsock.ko"), Some("vsock"));
        assert_eq!(module_name("kernel/fs/ext4/ext4.ko.xz"), None);
    }
}
