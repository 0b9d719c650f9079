//! File system calls that cannot be led out of a folder.
//!
//! The shim runs as root on the node, and the paths it resolves pass
//! through folders other people fill: a container image, or a node-wide
//! socket root. A path resolved the usual way follows whatever symlink or
//! `..` someone planted on it, so every open here goes through `openat2`
//! from a folder already open, with the kernel's `RESOLVE_*` rules saying
//! what the walk may not do, and creation uses the `*at` calls on that
//! folder's descriptor, which never follow a symlink in the last place.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Opens `path` below the folder `dir` with `openat2`: `flags` are
/// `open`'s, `resolve` the `RESOLVE_*` rules of the walk. A leading `/`
/// is dropped, so an absolute path is taken relative to `dir` too.
pub fn open_at(dir: &impl AsFd, path: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let relative: PathBuf =
        path.components().filter(|c| !matches!(c, Component::RootDir)).collect();
    let relative = if relative.as_os_str().is_empty() { PathBuf::from(".") } else { relative };
    let c_path = c_string(&relative)?;
    // SAFETY: open_how is plain data; all zero is "no flags".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: every pointer is valid for the call; the kernel copies `how`.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_fd().as_raw_fd(),
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Makes folder `name` in `dir` with `mode` (less the umask). Returns
/// whether this call made it: false if something named so was there.
pub fn make_folder_at(dir: &impl AsFd, name: &str, mode: u32) -> io::Result<bool> {
    let c_name = c_string(Path::new(name))?;
    // SAFETY: the name is a valid C string; mkdirat does not follow a
    // symlink in the last place, it fails with EEXIST.
    let rc = unsafe { libc::mkdirat(dir.as_fd().as_raw_fd(), c_name.as_ptr(), mode) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) { Ok(false) } else { Err(e) }
}

/// Removes the empty folder `name` from `dir`; a folder with anything in
/// it stays, with its contents.
pub fn remove_empty_folder_at(dir: &impl AsFd, name: &str) -> io::Result<()> {
    let c_name = c_string(Path::new(name))?;
    // SAFETY: the name is a valid C string.
    let rc =
        unsafe { libc::unlinkat(dir.as_fd().as_raw_fd(), c_name.as_ptr(), libc::AT_REMOVEDIR) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// What `name` in `dir` is, without following a symlink; None if nothing
/// is there.
pub fn stat_at(dir: &impl AsFd, name: &str) -> io::Result<Option<libc::stat>> {
    let c_name = c_string(Path::new(name))?;
    // SAFETY: stat is plain data the call fills.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the pointers are valid for the call.
    let rc = unsafe {
        libc::fstatat(
            dir.as_fd().as_raw_fd(),
            c_name.as_ptr(),
            &mut stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        return Ok(Some(stat));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) { Ok(None) } else { Err(e) }
}

/// What an open file is.
pub fn stat_fd(fd: &impl AsFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data the call fills.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the pointers are valid for the call.
    let rc = unsafe { libc::fstat(fd.as_fd().as_raw_fd(), &mut stat) };
    if rc == 0 { Ok(stat) } else { Err(io::Error::last_os_error()) }
}

/// Sets an open file's owner, group and mode. It works on an `O_PATH`
/// descriptor too (a socket file cannot be opened otherwise), through
/// `AT_EMPTY_PATH` and the descriptor's `/proc/self/fd` entry, so no
/// path is resolved again.
pub fn set_owner_and_mode(fd: &impl AsFd, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: an empty C string with AT_EMPTY_PATH names the descriptor itself.
    let rc = unsafe { libc::fchownat(raw, c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let proc_path = c_string(Path::new(&format!("/proc/self/fd/{raw}")))?;
    // SAFETY: a valid C string; the magic link is the descriptor's file.
    let rc = unsafe { libc::chmod(proc_path.as_ptr(), mode) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

fn c_string(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
}
