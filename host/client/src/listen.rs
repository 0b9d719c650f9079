//! Socket files a host program creates (listeners at `<uds>_<port>`,
//! datagram receivers at `<uds>_dgram_<port>`): taking the name, and
//! giving it back.
//!
//! The rules are pier's own for its socket files (`docs/host-sockets.md`):
//! a socket file nobody answers on is stale (a crashed program left it)
//! and is replaced; one a live process answers on is in use and is left
//! alone (binding fails with `AddrInUse`); a file that is not a socket is
//! never touched. When the bound socket goes, its file goes too, unless
//! someone else's socket has taken the name since.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};

use socket2::{Domain, SockAddr, Socket, Type};

use crate::handshake::at;

/// The socket file of a bound socket, removed when this is dropped if it
/// is still the same file (device and inode).
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl SocketFile {
    /// Binds with `bind` at `path`; if the name is taken by a stale
    /// socket of type `ty`, removes it and binds once more.
    pub(crate) fn bind<T>(
        path: &Path,
        ty: Type,
        mut bind: impl FnMut(&Path) -> io::Result<T>,
    ) -> io::Result<(T, SocketFile)> {
        let bound = match bind(path) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && is_stale(path, ty) => {
                std::fs::remove_file(path).map_err(|e| at(path, e))?;
                bind(path)
            }
            other => other,
        }
        .map_err(|e| at(path, e))?;
        let id = std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()));
        Ok((bound, SocketFile { path: path.to_owned(), id }))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets the file: it stays when the socket goes (for a caller who
    /// took the bare socket with `into_inner`).
    pub(crate) fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(id) = self.id
            && let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && (meta.dev(), meta.ino()) == id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `path` is a socket file that nobody answers on, probed with a
/// socket of the type that would bind there.
fn is_stale(path: &Path, ty: Type) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.file_type().is_socket() {
        return false;
    }
    let probe = if ty == Type::STREAM {
        UnixStream::connect(path).map(drop)
    } else if ty == Type::DGRAM {
        UnixDatagram::unbound().and_then(|s| s.connect(path))
    } else {
        Socket::new(Domain::UNIX, ty, None)
            .and_then(|s| SockAddr::unix(path).and_then(|addr| s.connect(&addr)))
    };
    matches!(probe, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused)
}
