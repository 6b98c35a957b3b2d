//! Step 3 of a connection: build the peer and hand it to the engine.
//!
//! 1. Claim the record (`--record`: the first peer only; a peer taken
//!    over claims it when its journal says it recorded).
//! 2. `ForeignPeer::new`: its regions checked against the store, shared
//!    mode's MINOR registration made sure of.
//! 3. `--takeover`: a new peer gets a journal (REMOVE'd ranges, and its
//!    record's pages when it records); its hand-off (peeked, its
//!    connection deposited at accept) is deposited with the keeper (its
//!    userfaultfd and journal), then read off the connection; a peer taken over has its
//!    journal's ranges replayed (they read zeros) and its record so far
//!    logged again (the record goes on). Either way the journal hooks are
//!    set before the engine reads its userfaultfd.
//!    Its connection becomes its hang-up watch.
//! 4. The recorded set is prepared (once, for the first peer served by
//!    copy) and its plan queued for this peer.
//! 5. `ForeignEngine::add`: a handler thread serves it from now on.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use faultline::policy::WindowTuning;
use faultline::{
    ForeignError, ForeignOptions, ForeignPeer, ForeignRegionSpec, ForeignUffd, ReadaheadConfig,
    RunAheadConfig, SharedSnapshot,
};

use super::dirty;
use super::receive;
use super::setup::prepare;
use super::state::{Recorder, State};
use crate::keeper::{Journal, KeeperError};
use crate::log::say;
use crate::summary::Handoff;

/// Where a peer comes from.
pub enum Origin<'a> {
    /// Its hand-off, as it came (deposited with the keeper, if any).
    Handed {
        /// The handshake's text.
        raw: &'a str,
        /// Its pid.
        pid: i32,
        /// Its connection's id at the keeper (its hand-off was peeked:
        /// deposited here, then read off).
        kept: Option<u64>,
    },
    /// A keeper, which held it for a serve that died.
    Adopted {
        /// Its REMOVE journal.
        journal: Journal,
        /// Its id at the keeper.
        id: u64,
        /// Its pid (0: unknown).
        pid: i32,
    },
}

/// A peer ready to be served, not yet handed to the engine.
pub struct Built {
    /// The peer, not yet the engine's: its queued prefetch starts when
    /// it is (the served list must hold it by then, or events about it,
    /// such as its prefetch's end, find no name).
    pub peer: ForeignPeer,
    /// Whether it records its touches.
    pub record: bool,
    /// Pages of the recorded set queued for it.
    pub queued: Option<usize>,
    /// Its id at the keeper.
    pub kept: Option<u64>,
    /// REMOVE'd ranges replayed from its journal (a peer taken over).
    pub replayed: usize,
    /// Record entries replayed from its journal (a peer taken over that
    /// recorded).
    pub recorded: usize,
    /// Handed back to the kernel (`--hand-back`): its faults are the
    /// kernel's.
    pub handed_back: bool,
}

/// Why a peer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Its regions or its userfaultfd cannot be served.
    #[error(transparent)]
    Peer(ForeignError),
    /// Its REMOVE journal could not be made or read.
    #[error("its REMOVE journal: {0}")]
    Journal(#[source] faultline_sys::mem::MemError),
    /// Its journal overflowed: which ranges read zeros is not known.
    #[error("its REMOVE journal overflowed: which of its ranges must read zeros is not known")]
    JournalFull,
    /// Depositing it with the keeper failed.
    #[error("depositing it with the keeper: {0}")]
    Deposit(#[source] KeeperError),
    /// Reading its hand-off off the connection, once deposited, failed.
    #[error("reading its hand-off off the connection: {0}")]
    Consume(#[source] std::io::Error),
}

/// Builds peer `n` on `uffd` with `specs` (from `snapshot` in shared mode)
/// and queues its prefetch; stamps `built_ns` and `queued_ns` of
/// `handoff`.
#[allow(
    clippy::too_many_arguments,
    reason = "the steps' inputs, each used once"
)]
pub fn build(
    state: &State,
    n: usize,
    conn: UnixStream,
    uffd: ForeignUffd,
    specs: &[ForeignRegionSpec],
    snapshot: Option<Arc<SharedSnapshot>>,
    handoff: &mut Handoff,
    origin: Origin<'_>,
) -> Result<Built, BuildError> {
    // A peer taken over records on when its journal has a record (the
    // dead serve's recorder); its entries are logged again below.
    let record = match &origin {
        Origin::Handed { .. } => state.claim_record(),
        Origin::Adopted { journal, .. } => journal.records() && state.claim_record(),
    };
    let (track_dirty, before) = match &origin {
        Origin::Handed { .. } => (dirty::claim(state), None),
        Origin::Adopted { journal, pid, .. }
            if journal.tracks_dirty() && dirty::claim_taken(state) =>
        {
            // Read before the peer is armed again (see dirty.rs).
            match dirty::written_before(*pid, specs) {
                Ok(b) => {
                    say(format_args!(
                        "peer {n}: tracked on: {} page(s) written before the takeover, read from its page tables",
                        b.len()
                    ));
                    (true, Some(b))
                }
                Err(why) => {
                    say(format_args!(
                        "peer {n}: not tracked on: the pages it wrote before the takeover cannot be read from its page tables ({why}): no dirty set is written for it"
                    ));
                    (false, None)
                }
            }
        }
        Origin::Adopted { .. } => (false, None),
    };
    let pages: usize = specs.iter().map(|s| s.len / 4096).sum();
    let opts = ForeignOptions {
        readahead: if record {
            ReadaheadConfig::off()
        } else {
            state.config.readahead_for(snapshot.is_some())
        },
        window_tuning: (state.config.adaptive_window && !record).then(|| {
            if snapshot.is_some() {
                WindowTuning::SHARED
            } else {
                WindowTuning::COPY
            }
        }),
        // One fault, one huge page, while recording (as `readahead`).
        huge_window: Some(if record {
            1
        } else {
            state.config.fault_around_huge
        }),
        run_ahead: (!record && state.config.run_ahead > 0).then_some(RunAheadConfig {
            budget_pages: state.config.run_ahead / 4096,
        }),
        record,
        shared: snapshot,
        phase_samples: state.config.phase_samples,
        wake_first: state.config.wake_first,
        track_dirty,
        pid: match origin {
            Origin::Handed { pid, .. } | Origin::Adopted { pid, .. } => Some(pid),
        },
        ..Default::default()
    };
    let built = ForeignPeer::new(format!("peer {n}"), uffd, specs, state.store.clone(), &opts)
        .map_err(BuildError::Peer)
        .and_then(|peer| {
            if let Some(b) = before {
                state
                    .dirty_before
                    .lock()
                    .expect("dirty_before")
                    .push((peer.id(), b));
            }
            journal(
                state,
                n,
                &conn,
                peer,
                origin,
                record.then_some(pages),
                track_dirty,
            )
        });
    let (peer, kept, (replayed, recorded)) = built.inspect_err(|_| {
        if record {
            // Leave the record to the next peer.
            state.set_recorder(Recorder::Free);
        }
        if track_dirty {
            dirty::release(state);
        }
    })?;
    handoff.built_ns = faultline_sys::monotonic_ns();
    // --hand-back: a peer mapping the shared copy is the kernel's from
    // here on (one served by copy is served as without the flag).
    let handed_back = state.config.hand_back && peer.is_shared();
    if handed_back {
        peer.hand_back().map_err(BuildError::Peer)?;
    }
    let peer = peer.with_hangup(OwnedFd::from(conn));
    let peer = on_its_cpus(state, n, opts.pid, peer);
    if let (Some(offs), false) = (&state.prefetch, peer.is_shared()) {
        state.prepared.call_once(|| {
            if let Err(e) = prepare(&state.store, offs, &state.served_one) {
                say(format_args!("preparing the recorded set failed: {e}"));
            }
        });
    }
    // The store was prepared with the record (`prepare`), or needs no
    // preparation (shared mode).
    let queued = state
        .plan
        .as_ref()
        .map(|plan| peer.prefetch_plan(plan, false));
    handoff.queued_ns = faultline_sys::monotonic_ns();
    state.served_one.store(true, SeqCst);
    if record {
        state.set_recorder(Recorder::Peer(peer.id()));
    }
    Ok(Built {
        peer,
        record,
        queued,
        kept,
        replayed,
        recorded,
        handed_back,
    })
}

/// `--engine per-cpu`: the handler threads on the CPUs the peer's threads
/// may use (read now from /proc) are the ones that read its faults, so a
/// fault of a VM held to a few CPUs wakes the handlers there, not every
/// one (see `ForeignPeer::with_cpus`).
fn on_its_cpus(state: &State, n: usize, pid: Option<i32>, peer: ForeignPeer) -> ForeignPeer {
    let Some(pid) = pid.filter(|&p| state.config.pin && p > 0) else {
        return peer;
    };
    match faultline_sys::process::allowed_cpus(pid) {
        Ok(cpus) if !cpus.is_empty() => {
            let mine = faultline_sys::thread::allowed_cpus().unwrap_or_default();
            if mine.iter().any(|c| !cpus.contains(c)) {
                say(format_args!(
                    "peer {n} (pid {pid}): its threads may run on CPUs {}: the handlers there read its faults",
                    super::cpu_list(&cpus)
                ));
            }
            peer.with_cpus(cpus)
        }
        _ => peer,
    }
}

/// What [`journal`] gives: the peer, its id at the keeper, and the
/// REMOVE'd ranges and record entries replayed.
type Journaled = (ForeignPeer, Option<u64>, (usize, usize));

/// Step 3 (`--takeover`): the peer's journal, new (and the peer deposited)
/// or replayed; `record`: the peer records, its regions' pages. Gives the
/// peer, its id at the keeper and the REMOVE'd ranges and record entries
/// replayed.
fn journal(
    state: &State,
    n: usize,
    conn: &UnixStream,
    peer: ForeignPeer,
    origin: Origin<'_>,
    record: Option<usize>,
    track_dirty: bool,
) -> Result<Journaled, BuildError> {
    let new_journal = || -> Result<Journal, BuildError> {
        let journal = Journal::create(record.unwrap_or(0)).map_err(BuildError::Journal)?;
        if track_dirty {
            journal.set_tracks_dirty();
        }
        if let Some(id) = state.served_from {
            journal.set_identity(id);
        }
        Ok(journal)
    };
    let (journal, id, replayed) = match (origin, &state.keeper) {
        (
            Origin::Handed {
                raw,
                kept: Some(id),
                ..
            },
            Some(keeper),
        ) => {
            let journal = new_journal()?;
            let fds = [peer.uffd().as_fd(), journal.fd()];
            keeper.hand(id, raw, fds).map_err(BuildError::Deposit)?;
            // Deposited, not yet read off nor served: the next serve
            // takes it over.
            faultline_sys::failpoint::hit("handoff-deposited");
            receive::consume(conn, raw.len()).map_err(BuildError::Consume)?;
            (Arc::new(journal), Some(id), (0, 0))
        }
        // Its deposit failed: journaled all the same, and deposited again
        // later (see `unprotected.rs`).
        (
            Origin::Handed {
                raw,
                kept: None,
                pid,
            },
            Some(_),
        ) => {
            let journal = Arc::new(new_journal()?);
            let dup = |fd: std::os::fd::BorrowedFd<'_>| {
                fd.try_clone_to_owned().map_err(BuildError::Consume)
            };
            let waiting = super::unprotected::Unprotected {
                n,
                pid,
                raw: raw.to_string(),
                conn: dup(conn.as_fd())?,
                uffd: dup(peer.uffd().as_fd())?,
                journal: journal.clone(),
            };
            state
                .unprotected
                .lock()
                .expect("unprotected")
                .add(peer.id(), waiting);
            (journal, None, (0, 0))
        }
        (Origin::Handed { .. }, None) => return Ok((peer, None, (0, 0))),
        (Origin::Adopted { journal, id, .. }, _) => {
            let (ranges, full) = journal.entries();
            if full {
                return Err(BuildError::JournalFull);
            }
            for &(start, end) in &ranges {
                peer.replay_remove(start, end);
            }
            let (entries, full) = journal.record_entries();
            if full {
                say(format_args!(
                    "peer {n}: note: its record's journal overflowed: the record goes on without the pages past it"
                ));
            }
            let recorded = peer.replay_record(&entries);
            (Arc::new(journal), Some(id), (ranges.len(), recorded))
        }
    };
    let peer = match record.is_some() && journal.records() {
        true => {
            let j = journal.clone();
            peer.with_record_journal(Arc::new(move |off, ns| j.append_record(off, ns)))
        }
        false => peer,
    };
    let peer = peer.with_journal(Arc::new(move |start, end| {
        journal.append(start, end);
        // Journaled, not yet acted on.
        faultline_sys::failpoint::hit("remove-journaled");
    }));
    Ok((peer, id, replayed))
}
