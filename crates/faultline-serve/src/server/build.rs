//! Step 3 of a connection: build the peer and hand it to the engine.
//!
//! 1. Claim the record (`--record`: the first peer only; a peer taken
//!    over claims it when its journal says it recorded).
//! 2. `ForeignPeer::new`: its regions checked against the store, shared
//!    mode's MINOR registration made sure of.
//! 3. `--takeover`: a new peer gets a journal (REMOVE'd ranges, and its
//!    record's pages when it records) and is deposited with the keeper
//!    (its userfaultfd, connection and journal); a peer taken over has its
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

use faultline::{
    ForeignError, ForeignOptions, ForeignPeer, ForeignRegionSpec, ForeignUffd, ReadaheadConfig,
    SharedSnapshot,
};

use super::dirty;
use super::log::say;
use super::setup::prepare;
use super::state::{Recorder, State};
use crate::keeper::{Journal, KeeperError};
use crate::summary::Handoff;

/// Where a peer comes from.
pub enum Origin<'a> {
    /// Its hand-off, as it came (deposited with the keeper, if any).
    Handed {
        /// The handshake's text.
        raw: &'a str,
        /// Its pid.
        pid: i32,
    },
    /// A keeper, which held it for a serve that died.
    Adopted {
        /// Its REMOVE journal.
        journal: Journal,
        /// Its id at the keeper.
        id: u64,
    },
}

/// A peer being served.
pub struct Built {
    /// The peer, as the engine holds it.
    pub peer: Arc<ForeignPeer>,
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
}

/// Builds peer `n` on `uffd` with `specs` (from `snapshot` in shared mode)
/// and hands it to the engine; stamps `built_ns`, `queued_ns` and
/// `serving_ns` of `handoff`.
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
    let track_dirty = matches!(origin, Origin::Handed { .. }) && dirty::claim(state);
    let pages: usize = specs.iter().map(|s| s.len / 4096).sum();
    let opts = ForeignOptions {
        readahead: if record {
            ReadaheadConfig::off()
        } else {
            state.config.readahead()
        },
        record,
        shared: snapshot,
        phase_samples: state.config.phase_samples,
        wake_first: state.config.wake_first,
        track_dirty,
        pid: match origin {
            Origin::Handed { pid, .. } => Some(pid),
            Origin::Adopted { .. } => None,
        },
        ..Default::default()
    };
    let built = ForeignPeer::new(format!("peer {n}"), uffd, specs, state.store.clone(), &opts)
        .map_err(BuildError::Peer)
        .and_then(|peer| journal(state, n, &conn, peer, origin, record.then_some(pages)));
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
    let peer = peer.with_hangup(OwnedFd::from(conn));
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
    let peer = state.engine.add(peer);
    handoff.serving_ns = faultline_sys::monotonic_ns();
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
    })
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
) -> Result<Journaled, BuildError> {
    let (journal, id, replayed) = match (origin, &state.keeper) {
        (Origin::Handed { .. }, None) => return Ok((peer, None, (0, 0))),
        (Origin::Handed { raw, pid }, Some(keeper)) => {
            let journal = Journal::create(record.unwrap_or(0)).map_err(BuildError::Journal)?;
            let fds = [peer.uffd().as_fd(), conn.as_fd(), journal.fd()];
            let id = keeper
                .deposit(n, pid, raw, fds)
                .map_err(BuildError::Deposit)?;
            // Deposited, not yet served: the next serve takes it over.
            faultline_sys::failpoint::hit("handoff-deposited");
            (journal, id, (0, 0))
        }
        (Origin::Adopted { journal, id }, _) => {
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
            (journal, id, (ranges.len(), recorded))
        }
    };
    let journal = Arc::new(journal);
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
    Ok((peer, Some(id), replayed))
}
