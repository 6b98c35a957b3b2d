//! The listening socket: what serve binds at `--socket`, and the one path
//! it removes.
//!
//! 1. What is at the path decides: nothing is bound over; a socket where
//!    a server answers (`connect` succeeds) is refused, "in use by pid N"
//!    (`SO_PEERCRED` of that connection, which the live server counts as
//!    no peer); a socket nobody answers (`ECONNREFUSED`: its server is
//!    gone) is stale and replaced; anything else (a file, a directory, a
//!    FIFO) is refused and never removed.
//! 2. Bound, the socket's identity (device, inode) is kept, and the path
//!    is registered with `faultline_cli_support::cleanup` (a second
//!    SIGTERM ends the process at once and removes it).
//! 3. With `--takeover` the keeper holds a dup of the listener
//!    ([`crate::keeper`]): a serve that dies leaves it bound, connections
//!    queue on it, and the next serve takes it from the keeper
//!    ([`Socket::adopt`]) rather than binding the path again.
//! 4. [`Socket::remove`] (at a stop, or on drop) removes the path only if
//!    it still names that socket: one another serve bound there meanwhile
//!    (after someone removed ours) is left to its owner.
//! 5. One descriptor is held in reserve (`/dev/null`): when serve runs out
//!    (`accept` fails with `EMFILE`), a connection left queued would leave
//!    its VMM hung, so the reserve is closed to accept it
//!    ([`Socket::accept_with_reserve`]), the peer is refused, and the
//!    reserve taken back ([`Socket::restock`]).

use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use faultline_cli_support::cleanup;

use super::error::ServeError;
use crate::log::say;
use crate::sockpath::{self, Removed, Taken};

/// The socket a server bound, and owns.
pub struct Socket {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file bound.
    id: (u64, u64),
    /// Removes the path if the process ends on a second signal.
    guard: Option<cleanup::Guard>,
    /// The descriptor held in reserve (step 5 of the module docs).
    reserve: Option<std::fs::File>,
    /// Whether no descriptor could be taken back in reserve (said once).
    short: bool,
}

impl Socket {
    /// Checks what is at `path` (step 1 of the module docs) without
    /// changing anything: whether a stale socket is there to replace.
    pub fn check(path: &Path) -> Result<bool, ServeError> {
        sockpath::probe(path).map_err(|t| match t {
            Taken::NotASocket => ServeError::NotASocket { path: path.into() },
            Taken::InUse(pid) => ServeError::InUse {
                path: path.into(),
                pid,
            },
            Taken::Probe(source) => ServeError::Probe {
                path: path.into(),
                source,
            },
        })
    }

    /// Binds `path` (non-blocking) as the module docs say.
    pub fn bind(path: &Path) -> Result<Socket, ServeError> {
        if Socket::check(path)? {
            say(format_args!(
                "{}: a stale socket (nothing answers on it): replaced",
                path.display()
            ));
            std::fs::remove_file(path).map_err(|source| ServeError::Bind {
                path: path.into(),
                source,
            })?;
        }
        let bind_err = |source| ServeError::Bind {
            path: path.into(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        let guard = cleanup::register(path);
        listener.set_nonblocking(true).map_err(bind_err)?;
        let id = sockpath::identity(path).map_err(bind_err)?;
        Ok(Socket {
            listener,
            path: path.into(),
            id,
            guard: Some(guard),
            reserve: reserve(),
            short: false,
        })
    }

    /// The listener a keeper held for a dead serve (`--takeover`), bound
    /// at `path` whose (device, inode) were `id`: taken on (connections
    /// queued on it are accepted as any other) if `path` still names that
    /// socket; `None` if not (removed at a stop, or replaced).
    pub fn adopt(listener: OwnedFd, path: &Path, id: (u64, u64)) -> Option<Socket> {
        let m = std::fs::symlink_metadata(path).ok()?;
        if (m.dev(), m.ino()) != id || !m.file_type().is_socket() {
            return None;
        }
        let listener = UnixListener::from(listener);
        listener.set_nonblocking(true).ok()?;
        let guard = cleanup::register(path);
        Some(Socket {
            listener,
            path: path.into(),
            id,
            guard: Some(guard),
            reserve: reserve(),
            short: false,
        })
    }

    /// The (device, inode) of the socket file bound.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// The listener.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    /// When serve is out of descriptors: closes the one held in reserve
    /// and accepts the connection at the head of the queue with it.
    /// `None` if no reserve is held; `WouldBlock` if nothing is queued
    /// (at the limit `accept` fails with `EMFILE` before it looks).
    pub fn accept_with_reserve(&mut self) -> Option<std::io::Result<UnixStream>> {
        drop(self.reserve.take()?);
        Some(self.listener.accept().map(|(conn, _)| conn))
    }

    /// Takes a descriptor back in reserve if none is held; whether one is.
    /// The first failure (after a success) is said.
    pub fn restock(&mut self) -> bool {
        if self.reserve.is_none() {
            self.reserve = reserve();
            if self.reserve.is_none() && !std::mem::replace(&mut self.short, true) {
                say(format_args!(
                    "out of file descriptors, with none left in reserve to refuse the connections queued with: they wait until one is free"
                ));
            }
        }
        if self.reserve.is_some() {
            self.short = false;
        }
        self.reserve.is_some()
    }

    /// Removes the path if it still names the socket bound (once; later
    /// calls do nothing). New connections fail from then on.
    pub fn remove(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        guard.disarm();
        match sockpath::remove_if_ours(&self.path, self.id) {
            Removed::Failed(e) => say(format_args!(
                "removing the socket {} failed: {e}",
                self.path.display()
            )),
            Removed::Another => say(format_args!(
                "{}: no longer the socket this serve bound (replaced by another); left in place",
                self.path.display()
            )),
            Removed::Yes | Removed::Gone => {}
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A descriptor to hold in reserve (`None` when none is free).
fn reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}
