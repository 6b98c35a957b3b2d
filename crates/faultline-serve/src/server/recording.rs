//! Records (`--record FILE`): writing a peer's first-touch order.
//!
//! 1. **At hang-up** ([`at_end`]): the pages the peer touched from its
//!    restore to its end.
//! 2. **The last cycle** ([`cut_all`], on SIGUSR2 or `POST /record` on the
//!    metrics endpoint): every recording peer still served gets its record
//!    written *now*, and that is its record: nothing it touches later is
//!    written (its hang-up says so). A platform that pauses a VM to
//!    snapshot it cuts at the pause, so the set is what the VM touched
//!    between its restore and the pause, not the reads of the VMM writing
//!    the snapshot (which fault every page). To extend a prefetch set with
//!    what its cycle faulted on demand: `record merge -k 1 -o NEW OLD CUT`.
//!
//! A cut is not journaled: a serve that takes the peer over records it
//! again from where the journal's record ended and writes it at hang-up.

use faultline::ForeignPeer;

use super::state::State;
use crate::log::say;
use crate::record;

/// Writes recording peer `peer`'s (connection `n`) record so far,
/// taking it; `why` is said with it. Returns the pages written (`None`:
/// the write failed, said).
fn write(state: &State, peer: &ForeignPeer, n: usize, why: &str) -> Option<usize> {
    let (Some(path), Some(id)) = (state.record_path(n), state.identity) else {
        return None;
    };
    let rec = record::Record::of_restore(id, &peer.take_record_timed());
    let written = state
        .protected
        .check(&path, "--record")
        .and_then(|o| o.write(|w| record::encode(&rec, w)));
    match written {
        Ok(()) => {
            say(format_args!(
                "peer {n}: recorded {} pages to {} ({why})",
                rec.pages.len(),
                path.display()
            ));
            Some(rec.pages.len())
        }
        Err(e) => {
            say(format_args!("peer {n}: writing the record failed: {e:#}"));
            None
        }
    }
}

/// Whether peer `id`'s record is still to be written; claims it.
fn claim(state: &State, id: u64) -> bool {
    state
        .records_written
        .lock()
        .expect("records written")
        .insert(id)
}

/// Peer `peer` (connection `n`) hung up: writes its record unless it was
/// cut (then says where that went).
pub(super) fn at_end(state: &State, peer: &ForeignPeer, n: usize) {
    if !state.records(peer.id()) {
        return;
    }
    if claim(state, peer.id()) {
        write(state, peer, n, "at its hang-up");
    } else if state
        .records_lost
        .lock()
        .expect("records lost")
        .contains(&peer.id())
    {
        say(format_args!(
            "peer {n}: its record was cut when asked and could not be written (said then): nothing is recorded for it"
        ));
    } else if let Some(path) = state.record_path(n) {
        say(format_args!(
            "peer {n}: its record was cut when asked and is in {}; what it touched after is not recorded",
            path.display()
        ));
    }
}

/// Peer `peer` (connection `n`) failed or was killed: its record is not
/// written (a partial restore's order would replace a good set), and
/// without `{peer}` the next peer records.
pub(super) fn left(state: &State, peer: &ForeignPeer, n: usize) {
    if !state.records(peer.id()) || !claim(state, peer.id()) {
        return;
    }
    say(format_args!(
        "peer {n}: its restore did not run to its end: its record is not written"
    ));
    if !state.record_every() {
        state.set_recorder(super::state::Recorder::Free);
    }
}

/// Cuts the record of every recording peer still served: written now,
/// not again at its hang-up (one hanging up meanwhile writes its own, as
/// it would have). Returns how many were written.
pub fn cut_all(state: &State) -> usize {
    state
        .engine
        .peers()
        .iter()
        .filter(|p| state.records(p.id()) && claim(state, p.id()))
        .filter_map(|p| {
            let written = write(state, p, state.find(p.id())?.n, "cut when asked");
            if written.is_none() {
                state
                    .records_lost
                    .lock()
                    .expect("records lost")
                    .insert(p.id());
            }
            written
        })
        .count()
}
