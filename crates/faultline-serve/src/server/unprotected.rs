//! VMMs served that the keeper does not hold: their deposit failed (a
//! keeper that answered late or refused, systemd's store full). Each is
//! served with a journal all the same (its REMOVEs logged from its first),
//! and deposited again, hand-off and all, every [`RETRY`] until the keeper
//! takes it: from then on a kill of serve no longer loses it.
//!
//! The deposit is two requests (the connection, then its hand-off), as at
//! accept; a serve killed between the two leaves the keeper a connection
//! whose hand-off was read already (the next serve finds it silent and
//! leaves it): the same microsecond window as at accept.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::keeper::Journal;
use crate::log::say;

use super::state::State;

/// How often the deposit is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// A VMM served without the keeper holding it: what depositing it takes.
pub struct Unprotected {
    /// Its connection number and pid.
    pub n: usize,
    pub pid: i32,
    /// Its handshake, as it came.
    pub raw: String,
    /// Duplicates of its connection and userfaultfd.
    pub conn: OwnedFd,
    pub uffd: OwnedFd,
    /// Its journal (the peer writes it).
    pub journal: std::sync::Arc<Journal>,
}

/// The VMMs served unprotected (by engine id), and when depositing them
/// was last tried.
#[derive(Default)]
pub struct Waiting {
    peers: Vec<(u64, Unprotected)>,
    tried: Option<Instant>,
}

impl Waiting {
    /// Peer `id`, served unprotected, to deposit again.
    pub fn add(&mut self, id: u64, u: Unprotected) {
        self.peers.push((id, u));
    }

    /// Peer `id` is done with.
    pub fn forget(&mut self, id: u64) {
        self.peers.retain(|(p, _)| *p != id);
    }
}

/// Tries again, every [`RETRY`], to deposit each VMM served unprotected;
/// one deposited is protected from then on (said, and its keeper id kept
/// for its end).
pub fn retry(state: &State) {
    let Some(keeper) = &state.keeper else { return };
    // Out of the lock while the keeper is asked (a request may take its
    // timeout): a peer set up meanwhile is added beside them.
    let batch = {
        let mut w = state.unprotected.lock().expect("unprotected");
        if w.peers.is_empty() || w.tried.is_some_and(|t| t.elapsed() < RETRY) {
            return;
        }
        w.tried = Some(Instant::now());
        std::mem::take(&mut w.peers)
    };
    let mut left = Vec::new();
    for (id, u) in batch {
        let fds = [u.uffd.as_fd(), u.journal.fd()];
        let done = keeper
            .deposit(u.n, u.pid, u.conn.as_fd())
            .and_then(|kept| keeper.hand(kept, &u.raw, fds).map(|()| kept));
        match done {
            Ok(kept) => {
                say(format_args!(
                    "peer {} (pid {}): deposited with the keeper at last: a kill of this serve no longer loses it",
                    u.n, u.pid
                ));
                state.set_kept(id, kept);
            }
            // Still served: tried again later.
            Err(_) if state.find(id).is_some() => left.push((id, u)),
            Err(_) => {}
        }
    }
    state
        .unprotected
        .lock()
        .expect("unprotected")
        .peers
        .extend(left);
}
