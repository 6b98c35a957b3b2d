//! systemd's file-descriptor store as the keeper (`--fd-store`): what the
//! keeper process holds, the service manager holds instead, and passes to
//! serve again when it restarts it (`Restart=always`).
//!
//! ```text
//!  serve ── sd_notify datagram to $NOTIFY_SOCKET, one per descriptor ──► systemd
//!           "FDSTORE=1\nFDNAME=<name>" + SCM_RIGHTS
//!    faultline-counter               a memfd: the highest connection number given
//!    faultline-listener-<dev>-<ino>  the listening socket (its path's identity)
//!    faultline-conn-<n>              connection n, right after accept
//!    faultline-uffd-<n>              its userfaultfd   ┐ its hand-off, in this
//!    faultline-journal-<n>           its journal       │ order; the handshake
//!    faultline-handshake-<n>         a memfd: its JSON ┘ last: "handed"
//!           "FDSTOREREMOVE=1\nFDNAME=<name>": each of peer n's, once done with
//!  kill -9 serve; systemd starts it again with the store at fd 3, 4, ...
//!    ($LISTEN_FDS, $LISTEN_FDNAMES, $LISTEN_PID): grouped by n; a peer
//!    whose handshake is there was handed, one without has its hand-off
//!    read again off its connection; one without a connection (systemd
//!    drops a descriptor that reports POLLHUP: its VMM is gone) is removed.
//! ```
//!
//! One datagram per descriptor, as `FDNAME=` names every descriptor of its
//! message alike; a datagram sent survives its sender. The ordering rule
//! is the keeper process's (see [`crate::keeper`]); the handshake is
//! stored last so a peer is "handed" only with its userfaultfd and journal
//! stored. Written from `sd_notify(3)`, `sd_listen_fds(3)` and
//! `systemd.service(5)`; tested against a service manager played by the
//! test as those pages describe (real systemd is not PID 1 where it was
//! written).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use faultline_sys::{mem, sock};

use super::taken::{Handed, Joined, KeeperError, Taken};

/// The environment variable naming the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

const PREFIX: &str = "faultline-";

/// The service manager's store.
#[derive(Debug)]
pub struct FdStore {
    notify: String,
    /// `faultline-counter`: a memfd in the store holding the highest
    /// connection number given (u64), written at each deposit, so a serve
    /// started again numbers on past peers already gone from the store
    /// (a `{peer}` path is never reused).
    counter: std::fs::File,
}

impl FdStore {
    /// The store of the service manager at `$NOTIFY_SOCKET`, and what it
    /// passed this process (`$LISTEN_FDS`): the peers and listener of the
    /// serve before it. `socket` is for messages only.
    pub fn join(socket: &Path) -> Result<(FdStore, Joined), KeeperError> {
        let notify = std::env::var(NOTIFY_SOCKET).map_err(|_| {
            KeeperError::Start(format!(
                "--fd-store: ${NOTIFY_SOCKET} is not set (serve {} is not run by a service manager)",
                socket.display()
            ))
        })?;
        let passed = sock::listen_fds()?;
        let mut counter = None;
        let mut listener = None;
        let mut peers: BTreeMap<usize, [Option<OwnedFd>; 4]> = BTreeMap::new();
        for (name, fd) in passed {
            let Some(rest) = name.strip_prefix(PREFIX) else {
                continue;
            };
            if rest == "counter" {
                counter = Some(std::fs::File::from(fd));
                continue;
            }
            if let Some(id) = rest.strip_prefix("listener-") {
                let mut it = id.split('-').map(|v| v.parse::<u64>().ok());
                if let (Some(Some(dev)), Some(Some(ino))) = (it.next(), it.next()) {
                    listener = Some((fd, (dev, ino)));
                }
                continue;
            }
            let Some((kind, n)) = rest.rsplit_once('-') else {
                continue;
            };
            let Ok(n) = n.parse::<usize>() else {
                continue;
            };
            let slot = match kind {
                "conn" => 0,
                "uffd" => 1,
                "journal" => 2,
                "handshake" => 3,
                _ => continue,
            };
            peers.entry(n).or_default()[slot] = Some(fd);
        }
        let store = match counter {
            Some(counter) => FdStore { notify, counter },
            None => {
                let memfd = mem::memfd("faultline-serve-counter", false)
                    .map_err(|e| KeeperError::Io(std::io::Error::other(e)))?;
                let store = FdStore {
                    notify,
                    counter: std::fs::File::from(memfd),
                };
                store.store("counter", store.counter.as_fd())?;
                store
            }
        };
        let mut word = [0u8; 8];
        let counted = match store.counter.read_at(&mut word, 0) {
            Ok(8) => u64::from_le_bytes(word) as usize,
            _ => 0,
        };
        let last_n = peers.keys().next_back().copied().unwrap_or(0).max(counted);
        let mut taken = Vec::new();
        for (n, [conn, uffd, journal, handshake]) in peers {
            let Some(conn) = conn else {
                // Its VMM hung up (systemd dropped the connection).
                store.forget(n as u64)?;
                continue;
            };
            let pid = sock::peer_cred(conn.as_fd()).map_or(0, |c| c.pid);
            let handed = match (uffd, journal, handshake) {
                (Some(uffd), Some(journal), Some(hs)) => Some(Handed {
                    handshake: read_memfd(hs)?,
                    uffd,
                    journal,
                }),
                _ => None,
            };
            taken.push(Taken {
                id: n as u64,
                n,
                pid,
                conn,
                handed,
            });
        }
        let joined = Joined {
            taken,
            listener,
            last_n,
        };
        Ok((store, joined))
    }

    fn send(&self, state: &str, fds: &[BorrowedFd<'_>]) -> Result<(), KeeperError> {
        sock::notify(&self.notify, state, fds).map_err(KeeperError::Io)
    }

    fn store(&self, name: &str, fd: BorrowedFd<'_>) -> Result<(), KeeperError> {
        self.send(&format!("FDSTORE=1\nFDNAME={PREFIX}{name}"), &[fd])
    }

    /// Tells the service manager serve is ready (`READY=1`).
    pub fn ready(&self) -> Result<(), KeeperError> {
        self.send("READY=1", &[])
    }

    /// Stores the listener (bound at the path whose (device, inode) are `id`).
    pub fn listen(&self, listener: BorrowedFd<'_>, id: (u64, u64)) -> Result<(), KeeperError> {
        self.store(&format!("listener-{}-{}", id.0, id.1), listener)
    }

    /// Stores connection `n`; its id is `n`.
    pub fn deposit(&self, n: usize, conn: BorrowedFd<'_>) -> Result<u64, KeeperError> {
        // Deposits come from the listener's thread, in number order.
        self.counter.write_all_at(&(n as u64).to_le_bytes(), 0)?;
        self.store(&format!("conn-{n}"), conn)?;
        Ok(n as u64)
    }

    /// Stores the hand-off of connection `id`: its userfaultfd, its
    /// journal, then its handshake (a memfd).
    pub fn hand(
        &self,
        id: u64,
        handshake: &str,
        [uffd, journal]: [BorrowedFd<'_>; 2],
    ) -> Result<(), KeeperError> {
        let memfd = mem::memfd("faultline-serve-handshake", false)
            .map_err(|e| KeeperError::Io(std::io::Error::other(e)))?;
        let mut file = std::fs::File::from(memfd);
        file.write_all(handshake.as_bytes())?;
        self.store(&format!("uffd-{id}"), uffd)?;
        self.store(&format!("journal-{id}"), journal)?;
        self.store(&format!("handshake-{id}"), file.as_fd())
    }

    /// Removes peer `id`'s descriptors from the store.
    pub fn forget(&self, id: u64) -> Result<(), KeeperError> {
        for kind in ["conn", "uffd", "journal", "handshake"] {
            self.send(&format!("FDSTOREREMOVE=1\nFDNAME={PREFIX}{kind}-{id}"), &[])?;
        }
        Ok(())
    }
}

/// The text a handshake memfd holds.
fn read_memfd(fd: OwnedFd) -> Result<String, KeeperError> {
    use std::io::Seek;
    let mut file = std::fs::File::from(fd);
    file.rewind()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}
