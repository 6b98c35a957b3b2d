//! Dirty sets (`--track-dirty FILE`): which peers are tracked, where
//! their sets go, and writing them.
//!
//! 1. **Who** ([`claim`]): with `{peer}` in FILE every peer handed over is
//!    tracked, each to its own file; without, the first one only (a second
//!    peer would overwrite its set). A peer taken over from a keeper is
//!    tracked when its journal says it was ([`claim_taken`]).
//! 2. **Taken over** ([`written_before`]): the kernel keeps what the dead
//!    serve knew. Every page it installed went in write-protected, and a
//!    first write un-protected it: the pages of the peer present (or
//!    swapped) *without* their uffd-wp bit are those written before the
//!    takeover (`PAGEMAP_SCAN`, `PAGE_IS_WRITTEN`, of its page tables).
//!    They are read before the new serve arms the peer again (which
//!    write-protects every page); its journal's REMOVE'd ranges are
//!    replayed into the new bits; the set written is both, merged. A write
//!    between the scan and the new protection hits a page already
//!    un-protected, so already counted.
//! 3. **When** ([`write`]): at the peer's hang-up (its final set, [`at_end`]),
//!    and on request for every tracked peer still served
//!    ([`super::RequestHandle`]: SIGUSR1, or `POST /dirty` on the metrics
//!    endpoint): the set so far,
//!    read while the peer runs (see `faultline::foreign`'s dirty module). A
//!    peer whose userfaultfd has `WP_ASYNC` is tracked through its page
//!    tables, which its exit takes away: its set is written on request
//!    only (a platform asks while the VM is paused for its snapshot).
//! 4. **How**: [`crate::dirty_set`]'s format, through
//!    [`OutputPath`] (a temporary sibling, renamed into place: a reader
//!    never sees half a set).

use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

use faultline::{ForeignPeer, ForeignRegionSpec};
use faultline_sys::pagemap::{category, Pagemap};

use super::state::State;
use crate::dirty_set::{DirtySet, PAGE};
use crate::log::say;

/// Whether every peer is tracked (`{peer}` in the path).
fn every(state: &State) -> bool {
    state
        .config
        .track_dirty
        .as_ref()
        .is_some_and(|p| p.to_string_lossy().contains("{peer}"))
}

/// Claims tracking for a peer being set up: whether it is tracked.
pub fn claim(state: &State) -> bool {
    state.config.track_dirty.is_some() && (every(state) || !state.dirty_claimed.swap(true, SeqCst))
}

/// Claims tracking for a peer taken over whose journal says it was
/// tracked: whether it is tracked on (`--track-dirty` given).
pub fn claim_taken(state: &State) -> bool {
    state.config.track_dirty.is_some() && {
        state.dirty_claimed.store(true, SeqCst);
        true
    }
}

/// The pages peer `pid` (regions `specs`) wrote before it was taken over
/// (see the module docs): store offsets of 4 KiB pages.
pub fn written_before(pid: i32, specs: &[ForeignRegionSpec]) -> Result<Vec<u64>, String> {
    if pid <= 0 {
        return Err("its pid is unknown (another pid namespace)".into());
    }
    let map = Pagemap::open(pid).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for s in specs {
        let end = s.base + s.len as u64;
        let written = map
            .scan(
                s.base,
                end,
                category::WRITTEN,
                category::PRESENT | category::SWAPPED,
            )
            .map_err(|e| e.to_string())?;
        for r in written {
            let at = s.store_offset + (r.start - s.base);
            out.extend((0..(r.end - r.start) / PAGE).map(|i| at + i * PAGE));
        }
    }
    Ok(out)
}

/// A claim came to nothing (the peer could not be built): the next peer
/// may take it.
pub fn release(state: &State) {
    if !every(state) {
        state.dirty_claimed.store(false, SeqCst);
    }
}

/// Where peer `n`'s dirty set goes.
fn path(state: &State, n: usize) -> Option<PathBuf> {
    let p = state.config.track_dirty.as_ref()?;
    Some(PathBuf::from(
        p.to_string_lossy().replace("{peer}", &n.to_string()),
    ))
}

/// Writes the dirty set of `peer` (connection `n`) now, if it is tracked;
/// `when` says why in the message. Gives its pages (`None`: not written).
pub fn write(state: &State, peer: &ForeignPeer, n: usize, when: &str) -> Option<usize> {
    let set = match peer.dirty_set() {
        Ok(set) => set?,
        Err(e) => {
            say(format_args!("peer {n}: {when}: no dirty set written: {e}"));
            return None;
        }
    };
    let (Some(path), Some(identity)) = (path(state, n), state.identity) else {
        return None;
    };
    let mut offsets = set.offsets;
    let before = state.dirty_before.lock().expect("dirty_before");
    if let Some((_, prior)) = before.iter().find(|(id, _)| *id == peer.id()) {
        offsets.extend_from_slice(prior);
        offsets.sort_unstable();
        offsets.dedup();
    }
    drop(before);
    let file = DirtySet { identity, offsets };
    let written = state
        .protected
        .check(&path, "--track-dirty")
        .and_then(|o| o.write(|w| file.encode(w)));
    match written {
        Ok(()) => {
            say(format_args!(
                "peer {n}: {when}: {} dirty pages ({:.1} MiB in {} runs) to {}",
                file.offsets.len(),
                (file.offsets.len() as u64 * PAGE) as f64 / (1 << 20) as f64,
                file.runs(),
                path.display()
            ));
            Some(file.offsets.len())
        }
        Err(e) => {
            say(format_args!(
                "peer {n}: writing its dirty set failed: {e:#}"
            ));
            None
        }
    }
}

/// Writes the final dirty set of `peer` (connection `n`), which hung up
/// (`outcome`). A `WP_ASYNC` peer's written pages live in its page tables,
/// gone with it: its set is not written (it would lack them), and serve
/// says so.
pub fn at_end(state: &State, peer: &ForeignPeer, n: usize, outcome: &str) {
    if peer.dirty_async() {
        say(format_args!(
            "peer {n}: {outcome}: its dirty set is not written: with UFFD_FEATURE_WP_ASYNC the pages it wrote are known from its page tables only, gone with it (ask with SIGUSR1 or POST /dirty while it runs)"
        ));
        return;
    }
    write(state, peer, n, outcome);
}

/// Tracked peer `peer` (connection `n`) failed or was killed: its dirty
/// set is not written (the VM it describes is gone), and without
/// `{peer}` the next peer is tracked.
pub fn left(state: &State, peer: &ForeignPeer, n: usize) {
    if !peer.tracks_dirty() {
        return;
    }
    say(format_args!(
        "peer {n}: it did not run to its end: its dirty set is not written"
    ));
    release(state);
}

/// Writes the dirty sets of every tracked peer being served (on request):
/// how many were written.
pub fn write_all(state: &State) -> usize {
    state
        .engine
        .peers()
        .iter()
        .filter(|p| p.tracks_dirty())
        // One that hung up meanwhile wrote its own set.
        .filter_map(|p| write(state, p, state.find(p.id())?.n, "asked"))
        .count()
}
