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
//! message alike; a datagram sent survives its sender. The service manager
//! keeps at most `FileDescriptorStoreMax=` descriptors (it says how many in
//! `$FDSTORE`, systemd 254 and later) and drops, with no word to the
//! sender, those past it: serve counts its own ([`OWN`], and [`PER_PEER`]
//! for each peer from its deposit on) and deposits no peer past the
//! room, so a peer is either stored whole or said to be served without
//! takeover ([`KeeperError::Full`]), never stored in part. The ordering rule
//! is the keeper process's (see [`crate::keeper`]); the handshake is
//! stored last so a peer is "handed" only with its userfaultfd and journal
//! stored. Written from `sd_notify(3)`, `sd_listen_fds(3)` and
//! `systemd.service(5)`; tested against a service manager played by the
//! test as those pages describe (real systemd is not PID 1 where it was
//! written).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use faultline_sys::{mem, sock};

use super::taken::{Handed, Joined, KeeperError, Taken};

/// The environment variable naming the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The environment variable in which systemd (254 and later) gives the
/// unit's `FileDescriptorStoreMax=` (unset when it is 0).
pub const FDSTORE: &str = "FDSTORE";

/// The store's descriptors serve keeps whatever it serves: the counter and
/// the listener.
pub const OWN: usize = 2;

/// The store's descriptors a peer takes: its connection, userfaultfd,
/// journal and handshake.
pub const PER_PEER: usize = 4;

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
    /// `$FDSTORE`: the most descriptors the service manager keeps for
    /// serve (`None`: not said).
    max: Option<usize>,
    /// The peers stored now (by id), each counted as [`PER_PEER`]
    /// descriptors from its deposit on.
    held: Mutex<BTreeSet<u64>>,
    /// The name the listener is stored under (the old one is removed when
    /// another is stored).
    listener: Mutex<Option<String>>,
}

impl FdStore {
    /// The store of the service manager at `$NOTIFY_SOCKET`, and what it
    /// passed this process (`$LISTEN_FDS`): the peers and listener of the
    /// serve before it. `socket` is for messages only.
    pub fn join(socket: &Path) -> Result<(FdStore, Joined), KeeperError> {
        let notify = std::env::var(NOTIFY_SOCKET).map_err(|_| {
            KeeperError::Start(format!(
                "${NOTIFY_SOCKET} is not set (serve {} is not run by a service manager)",
                socket.display()
            ))
        })?;
        let max = store_max()?;
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
        let stored_counter = counter.is_some();
        let counter = match counter {
            Some(counter) => counter,
            None => std::fs::File::from(
                mem::memfd("faultline-serve-counter", false)
                    .map_err(|e| KeeperError::Io(std::io::Error::other(e)))?,
            ),
        };
        let store = FdStore {
            notify,
            counter,
            max,
            held: Mutex::default(),
            listener: Mutex::new(listener.as_ref().map(|(_, id)| listener_name(*id))),
        };
        if !stored_counter {
            store.store("counter", store.counter.as_fd())?;
        }
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
            store.held.lock().expect("held").insert(n as u64);
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
        sock::notify(&self.notify, state, fds).map_err(|source| KeeperError::Notify {
            socket: self.notify.clone(),
            source,
        })
    }

    fn store(&self, name: &str, fd: BorrowedFd<'_>) -> Result<(), KeeperError> {
        self.send(&format!("FDSTORE=1\nFDNAME={PREFIX}{name}"), &[fd])
    }

    /// Tells the service manager serve is ready (`READY=1`).
    pub fn ready(&self) -> Result<(), KeeperError> {
        self.send("READY=1", &[])
    }

    /// How many peers the store has room for at once (`None`: the
    /// service manager did not say how many descriptors it keeps).
    pub fn room(&self) -> Option<usize> {
        self.max.map(|m| m.saturating_sub(OWN) / PER_PEER)
    }

    /// The peers stored now.
    pub fn peers(&self) -> usize {
        self.held.lock().expect("held").len()
    }

    /// What serve says of the store at start.
    pub fn describe(&self) -> String {
        match (self.max, self.room()) {
            (Some(max), Some(room)) => format!(
                "--fd-store: the service manager keeps up to {max} descriptors for serve (${FDSTORE}, FileDescriptorStoreMax=): room for {room} VMM(s) at once ({OWN} for serve, {PER_PEER} a VMM); VMMs past that are served without takeover (said)"
            ),
            _ => format!(
                "--fd-store: warning: ${FDSTORE} is not set: either the unit sets no FileDescriptorStoreMax= (then the service manager keeps nothing, and a restart of serve loses every VMM) or systemd is older than 254 (it does not say); size it {OWN} + {PER_PEER} x the VMMs served at once"
            ),
        }
    }

    /// Stores the listener (bound at the path whose (device, inode) are
    /// `id`), and removes the one stored before (bound at a path since
    /// replaced) from the store.
    pub fn listen(&self, listener: BorrowedFd<'_>, id: (u64, u64)) -> Result<(), KeeperError> {
        let name = listener_name(id);
        self.store(&name, listener)?;
        let old = self
            .listener
            .lock()
            .expect("listener")
            .replace(name.clone());
        match old {
            Some(old) if old != name => self.remove(&old),
            _ => Ok(()),
        }
    }

    /// Stores connection `n`; its id is `n`. Refused ([`KeeperError::Full`])
    /// when the store has no room for another peer's descriptors.
    pub fn deposit(&self, n: usize, conn: BorrowedFd<'_>) -> Result<u64, KeeperError> {
        let mut held = self.held.lock().expect("held");
        if let (Some(max), Some(room)) = (self.max, self.room()) {
            if held.len() >= room {
                return Err(KeeperError::Full {
                    max,
                    peers: room,
                    own: OWN,
                    per: PER_PEER,
                });
            }
        }
        // Deposits come from the listener's thread, in number order.
        self.counter.write_all_at(&(n as u64).to_le_bytes(), 0)?;
        self.store(&format!("conn-{n}"), conn)?;
        held.insert(n as u64);
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
            self.remove(&format!("{kind}-{id}"))?;
        }
        self.held.lock().expect("held").remove(&id);
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), KeeperError> {
        self.send(&format!("FDSTOREREMOVE=1\nFDNAME={PREFIX}{name}"), &[])
    }
}

/// The name the listener bound at the path whose (device, inode) are `id`
/// is stored under (without [`PREFIX`]).
fn listener_name((dev, ino): (u64, u64)) -> String {
    format!("listener-{dev}-{ino}")
}

/// `$FDSTORE` (`None`: unset); a store with no room for one peer is an
/// error.
fn store_max() -> Result<Option<usize>, KeeperError> {
    let Some(v) = std::env::var_os(FDSTORE) else {
        return Ok(None);
    };
    let max: usize = v
        .to_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| KeeperError::Start(format!("--fd-store: ${FDSTORE}={v:?}: not a number")))?;
    if max < OWN + PER_PEER {
        return Err(KeeperError::Start(format!(
            "--fd-store: the service manager keeps {max} descriptor(s) for serve (${FDSTORE}, FileDescriptorStoreMax=): no room for one VMM (serve keeps {OWN} there, each VMM {PER_PEER}); set FileDescriptorStoreMax= to {OWN} + {PER_PEER} x the VMMs served at once"
        )));
    }
    Ok(Some(max))
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
