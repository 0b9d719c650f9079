//! Each Pod's folder of sockets, `<root>/<namespace>/<pod>/`, made and
//! checked so that no Pod can make the shim (root) touch anything else.
//!
//! The rules, and what each one stops:
//! - The root is the operator's ([`crate::node_config`]); it, and every
//!   namespace folder in it, must be a real folder (not a symlink) that
//!   belongs to the shim's user and that no group or other user can
//!   write, or nothing is made: otherwise someone else could swap a name
//!   on the way for a symlink to a folder of the node's.
//! - Every step is opened from the one above it with `openat2` and
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and made with `mkdirat`,
//!   so a symlink planted anywhere on the way is refused, not followed.
//! - The namespace and Pod names come from containerd (under Kubernetes,
//!   from the kubelet's Pod metadata), never from an annotation; an
//!   annotation names only a file in its own Pod's folder
//!   ([`crate::annotations`]), so one Pod cannot reach another's folder.
//! - A Pod folder gets the configured group and mode; its sockets get
//!   read and write for whoever may enter the folder (`connect` needs
//!   write permission on a socket file).
//! - Nothing is ever deleted that this shim did not make: a socket name
//!   that is taken fails the create, even when the file looks stale (a
//!   shim that died leaves its sockets, and the operator decides), and a
//!   Pod folder is removed only when empty, by the Pod that made it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use pier_hybrid::paths;

use crate::confined_fs::{
    make_folder_at, open_at, remove_empty_folder_at, set_owner_and_mode, stat_at, stat_fd,
};
use crate::node_config::SocketSettings;

/// Namespace folders: anyone may look up a name in them, only the shim
/// writes.
const NAMESPACE_FOLDER_MODE: u32 = 0o755;
/// The walk from one folder to the next may not leave it, follow a
/// symlink, or cross into another mount.
const CONFINED: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// A Pod's socket folder, open.
#[derive(Debug)]
pub struct PodFolder {
    path: PathBuf,
    namespace_folder: OwnedFd,
    folder: OwnedFd,
    pod: String,
}

impl PodFolder {
    /// Opens (making what is missing) `<root>/<namespace>/<pod>/`.
    pub fn open(settings: &SocketSettings, namespace: &str, pod: &str) -> Result<Self, String> {
        let root_path = &settings.root;
        std::fs::create_dir_all(root_path)
            .map_err(|e| format!("making the socket root {}: {e}", root_path.display()))?;
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(root_path)
            .map_err(|e| refused_folder(root_path, &e))?;
        let root = OwnedFd::from(root);
        check_owned_folder(&root, root_path, None)?;

        let namespace_path = root_path.join(namespace);
        let namespace_folder =
            open_or_make(&root, namespace, NAMESPACE_FOLDER_MODE, &namespace_path)?.0;
        check_owned_folder(&namespace_folder, &namespace_path, None)?;

        let path = namespace_path.join(pod);
        let (folder, made) = open_or_make(&namespace_folder, pod, 0o700, &path)?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let stat = stat_fd(&folder).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if made || stat.st_uid == euid {
            let gid = settings.group.unwrap_or(stat.st_gid);
            set_owner_and_mode(&folder, euid, gid, settings.folder_mode)
                .map_err(|e| format!("setting the owner and mode of {}: {e}", path.display()))?;
        }
        check_owned_folder(&folder, &path, Some(settings.folder_mode))?;
        if made {
            log::info!("made the Pod folder {}", path.display());
        }
        Ok(Self { path, namespace_folder, folder, pod: pod.to_owned() })
    }

    /// The folder's path on the node.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fails if any name the bridge binds for the socket `name` is taken:
    /// the shim does not remove a file it did not make.
    pub fn check_free(&self, name: &str) -> Result<(), String> {
        for taken in paths::backend_paths(name) {
            let taken = taken.to_string_lossy();
            let found = stat_at(&self.folder, &taken)
                .map_err(|e| format!("looking at {}: {e}", self.path.join(&*taken).display()))?;
            if found.is_some() {
                return Err(format!(
                    "{} exists already: another container's socket, or one a shim that stopped \
                     without cleaning up left behind; pier removes only files it made, so remove \
                     it or choose another name",
                    self.path.join(&*taken).display()
                ));
            }
        }
        Ok(())
    }

    /// Gives the sockets the bridge just bound for `name` the folder's
    /// group and the mode that lets whoever may enter the folder connect.
    pub fn share_sockets(&self, name: &str, settings: &SocketSettings) -> Result<(), String> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let folder_gid = stat_fd(&self.folder).map_err(|e| e.to_string())?.st_gid;
        for socket in paths::backend_paths(name) {
            let path = self.path.join(&socket);
            let fd = open_at(&self.folder, &socket, libc::O_PATH | libc::O_NOFOLLOW, CONFINED)
                .map_err(|e| format!("opening {}: {e}", path.display()))?;
            let stat = stat_fd(&fd).map_err(|e| format!("reading {}: {e}", path.display()))?;
            if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK || stat.st_uid != euid {
                return Err(format!("{} is not the socket the shim bound", path.display()));
            }
            set_owner_and_mode(
                &fd,
                euid,
                settings.group.unwrap_or(folder_gid),
                settings.socket_mode(),
            )
            .map_err(|e| format!("setting the mode of {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Removes the folder if it is empty; whatever is left in it stays.
    pub fn remove_if_empty(&self) {
        match remove_empty_folder_at(&self.namespace_folder, &self.pod) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => log::warn!("the Pod folder {} stays: {e}", self.path.display()),
        }
    }
}

/// Opens folder `name` in `dir`, making it with `mode` if missing; says
/// whether it made it.
fn open_or_make(
    dir: &impl AsFd,
    name: &str,
    mode: u32,
    path: &Path,
) -> Result<(OwnedFd, bool), String> {
    let made =
        make_folder_at(dir, name, mode).map_err(|e| format!("making {}: {e}", path.display()))?;
    let folder = open_at(dir, Path::new(name), libc::O_RDONLY | libc::O_DIRECTORY, CONFINED)
        .map_err(|e| refused_folder(path, &e))?;
    Ok((folder, made))
}

fn refused_folder(path: &Path, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => format!(
            "{} is a symlink or not a folder; pier makes sockets only in real folders it owns",
            path.display()
        ),
        Some(libc::EXDEV) => {
            format!("{} is another mount; pier does not cross into it", path.display())
        }
        _ => format!("opening {}: {e}", path.display()),
    }
}

/// A folder on the way must be the shim user's and writable by nobody
/// else; a Pod folder must also have the configured permission bits.
fn check_owned_folder(folder: &impl AsFd, path: &Path, mode: Option<u32>) -> Result<(), String> {
    let stat = stat_fd(folder).map_err(|e| format!("reading {}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let bits = stat.st_mode & 0o7777;
    let group_write_allowed = mode.is_some_and(|m| m & 0o020 != 0);
    let others_can_write = bits & 0o002 != 0 || (bits & 0o020 != 0 && !group_write_allowed);
    if stat.st_mode & libc::S_IFMT != libc::S_IFDIR || stat.st_uid != euid || others_can_write {
        return Err(format!(
            "{} belongs to uid {} with mode {bits:o}; pier makes sockets only below folders that \
             belong to the shim's user (uid {euid}) and that no one else can write",
            path.display(),
            stat.st_uid
        ));
    }
    if let Some(mode) = mode
        && bits & 0o777 != mode
    {
        return Err(format!("{} has mode {bits:o}, not the configured {mode:o}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn settings(root: &Path) -> SocketSettings {
        SocketSettings { root: root.to_path_buf(), group: Some(0), folder_mode: 0o750 }
    }

    #[test]
    fn a_pod_folder_is_made_with_the_configured_mode_and_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pier");
        let folder = PodFolder::open(&settings(&root), "shop", "web-0").unwrap();
        let meta = std::fs::metadata(root.join("shop/web-0")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o750);
        assert_eq!(meta.gid(), 0);
        std::fs::set_permissions(root.join("shop/web-0"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        PodFolder::open(&settings(&root), "shop", "web-0").unwrap();
        let meta = std::fs::metadata(root.join("shop/web-0")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o750, "a folder found gets the mode again");
        std::fs::write(root.join("shop/web-0/left"), b"").unwrap();
        folder.remove_if_empty();
        assert!(root.join("shop/web-0/left").exists(), "a folder with a file in it stays");
        std::fs::remove_file(root.join("shop/web-0/left")).unwrap();
        folder.remove_if_empty();
        assert!(!root.join("shop/web-0").exists());
    }

    #[test]
    fn a_symlink_planted_in_the_root_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pier");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("shop")).unwrap();
        let e = PodFolder::open(&settings(&root), "shop", "web-0").unwrap_err();
        assert!(e.contains("is a symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was made there");
        std::fs::create_dir_all(root.join("web")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("web/pod")).unwrap();
        let e = PodFolder::open(&settings(&root), "web", "pod").unwrap_err();
        assert!(e.contains("is a symlink"), "{e}");
        let link = dir.path().join("link-root");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        let e = PodFolder::open(&settings(&link), "web", "pod2").unwrap_err();
        assert!(e.contains("is a symlink"), "{e}");
    }

    #[test]
    fn a_root_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pier");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = PodFolder::open(&settings(&root), "shop", "web-0").unwrap_err();
        assert!(e.contains("no one else can write"), "{e}");
        assert!(!root.join("shop").exists());
    }

    #[test]
    fn a_taken_socket_name_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pier");
        let folder = PodFolder::open(&settings(&root), "shop", "web-0").unwrap();
        folder.check_free("echo.sock").unwrap();
        let stale = root.join("shop/web-0/echo.sock_dgram");
        drop(std::os::unix::net::UnixDatagram::bind(&stale).unwrap());
        let e = folder.check_free("echo.sock").unwrap_err();
        assert!(e.contains("echo.sock_dgram exists already"), "{e}");
        assert!(stale.exists(), "the stale socket is left for its owner");
    }
}
