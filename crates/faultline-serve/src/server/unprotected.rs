//! VMMs served that the keeper does not hold: their deposit failed (a
//! keeper that answered late or refused, systemd's store full). Each is
//! served with a journal all the same (its REMOVEs logged from its first),
//! and deposited again, hand-off and all, every [`RETRY`] until the keeper
//! takes it (`accept::deposit_again`): from then on a kill of serve no
//! longer loses it.
//!
//! The deposit is two requests (the connection, then its hand-off), as at
//! accept; a serve killed between the two leaves the keeper a connection
//! whose hand-off was read already (the next serve finds it silent and
//! leaves it): the same microsecond window as at accept.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::keeper::Journal;

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

    /// Every peer waiting, when [`RETRY`] has passed since they were last
    /// taken (to be tried, and given back with [`Waiting::give_back`]).
    pub fn take_due(&mut self) -> Vec<(u64, Unprotected)> {
        if self.peers.is_empty() || self.tried.is_some_and(|t| t.elapsed() < RETRY) {
            return Vec::new();
        }
        self.tried = Some(Instant::now());
        std::mem::take(&mut self.peers)
    }

    /// Peers taken and not deposited: they wait on.
    pub fn give_back(&mut self, left: Vec<(u64, Unprotected)>) {
        self.peers.extend(left);
    }
}
