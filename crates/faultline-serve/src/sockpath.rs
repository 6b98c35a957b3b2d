//! A unix socket's path as serve uses one (its VMMs' socket, its metrics
//! socket, the keeper for a dead serve): what is there before it binds
//! ([`probe`]: nothing, a stale socket to replace, or something it must
//! not touch), and its removal only while the path still names the
//! socket bound ([`remove_if_ours`]), never one another process bound
//! there since.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

use faultline_sys::sock;

/// What is at a socket path that serve must not replace.
#[derive(Debug)]
pub enum Taken {
    /// Something that is not a socket (a file, a directory, a device).
    NotASocket,
    /// A socket a process listens on (its pid from `SO_PEERCRED`: the one
    /// that called `listen`; 0 when out of this pid namespace).
    InUse(i32),
    /// Connecting to tell failed otherwise.
    Probe(std::io::Error),
}

/// What is at `path`: `Ok(false)` nothing, `Ok(true)` a stale socket
/// (nothing answers on it: to replace), else what must be left alone.
/// Changes nothing.
pub fn probe(path: &Path) -> Result<bool, Taken> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(Taken::NotASocket),
        Ok(_) => match UnixStream::connect(path) {
            Ok(conn) => Err(Taken::InUse(
                sock::peer_cred(conn.as_fd()).map_or(0, |c| c.pid),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(true),
            Err(e) => Err(Taken::Probe(e)),
        },
        Err(_) => Ok(false),
    }
}

/// The (device, inode) of what `path` names (not following a link).
pub fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Removes `path` if it still names the socket whose identity is `id`
/// (what it did: [`Removed`]).
pub fn remove_if_ours(path: &Path, id: (u64, u64)) -> Removed {
    match identity(path) {
        Ok(now) if now == id => match std::fs::remove_file(path) {
            Ok(()) => Removed::Yes,
            Err(e) => Removed::Failed(e),
        },
        Ok(_) => Removed::Another,
        Err(_) => Removed::Gone,
    }
}

/// What [`remove_if_ours`] did.
#[derive(Debug)]
pub enum Removed {
    /// The path named our socket: removed.
    Yes,
    /// Removing it failed.
    Failed(std::io::Error),
    /// The path names another file now (bound again since): left.
    Another,
    /// Nothing is there any more.
    Gone,
}
