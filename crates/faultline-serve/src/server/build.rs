//! Step 3 of a connection: build the peer and hand it to the engine.
//!
//! 1. Claim the record (`--record`: the first peer only).
//! 2. `ForeignPeer::new`: its regions checked against the store, shared
//!    mode's MINOR registration made sure of.
//! 3. Its connection becomes its hang-up watch.
//! 4. The recorded set is prepared (once, for the first peer served by
//!    copy) and its plan queued for this peer.
//! 5. `ForeignEngine::add`: a handler thread serves it from now on.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use faultline::{
    ForeignError, ForeignOptions, ForeignPeer, ForeignRegionSpec, ForeignUffd, ReadaheadConfig,
    SharedSnapshot,
};

use super::log::say;
use super::setup::prepare;
use super::state::{Recorder, State};
use crate::summary::Handoff;

/// A peer being served.
pub struct Built {
    /// The peer, as the engine holds it.
    pub peer: Arc<ForeignPeer>,
    /// Whether it records its touches.
    pub record: bool,
    /// Pages of the recorded set queued for it.
    pub queued: Option<usize>,
}

/// Why a peer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Its regions or its userfaultfd cannot be served.
    #[error(transparent)]
    Peer(ForeignError),
}

/// Builds peer `n` on `uffd` with `specs` (from `snapshot` in shared mode)
/// and hands it to the engine; stamps `built_ns`, `queued_ns` and
/// `serving_ns` of `handoff`.
pub fn build(
    state: &State,
    n: usize,
    conn: UnixStream,
    uffd: ForeignUffd,
    specs: &[ForeignRegionSpec],
    snapshot: Option<Arc<SharedSnapshot>>,
    handoff: &mut Handoff,
) -> Result<Built, BuildError> {
    let record = state.claim_record();
    let opts = ForeignOptions {
        readahead: if record {
            ReadaheadConfig::off()
        } else {
            state.config.readahead()
        },
        record,
        shared: snapshot,
        ..Default::default()
    };
    let peer = ForeignPeer::new(format!("peer {n}"), uffd, specs, state.store.clone(), &opts)
        .map_err(|e| {
            if record {
                // Leave the record to the next peer.
                state.set_recorder(Recorder::Free);
            }
            BuildError::Peer(e)
        })?;
    handoff.built_ns = faultline_sys::monotonic_ns();
    let peer = peer.with_hangup(OwnedFd::from(conn));
    if let (Some(offs), false) = (&state.prefetch, peer.is_shared()) {
        state.prepared.call_once(|| {
            if let Err(e) = prepare(&state.store, offs) {
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
    if record {
        state.set_recorder(Recorder::Peer(peer.id()));
    }
    Ok(Built {
        peer,
        record,
        queued,
    })
}
