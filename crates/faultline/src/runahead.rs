//! Run-ahead population: a background thread installs the pages a stream
//! of faults is about to touch, so those faults never happen (seed 004's
//! "parallelise the page allocation ahead of fault time", done in user
//! space).
//!
//! 1. Every fault delivered for the region (any engine) is posted to the
//!    region's feed: the page, a sequence number, and a futex wake if
//!    the populator sleeps. Posting is two atomics and at most one syscall,
//!    async-signal-safe.
//! 2. The populator thread feeds the faults to a
//!    [`crate::policy::StreamPredictor`] (sequential and
//!    strided streams) and resolves the predicted windows itself, through
//!    the same resolve path, from its own CPU. The budget bounds how far
//!    ahead of the last fault it goes.
//! 3. Pages it installs are marked in the region's `ahead` bitmap, so users
//!    can count faults avoided (`ahead` pages that were touched) and waste
//!    (`ahead` pages never touched).

use std::ops::Range;
use std::time::Duration;

use crate::background::{Background, StopFlag};
use crate::fault::resolve::{resolve, Access, Origin};
use crate::fault::RegionState;
use crate::policy::StreamPredictor;
use crate::residency::PageState;

pub use crate::fault::feeds::RunAheadStats;

/// Run-ahead settings.
#[derive(Debug, Clone, Copy)]
pub struct RunAheadConfig {
    /// Most pages populated ahead of the last fault.
    pub budget_pages: usize,
}

impl Default for RunAheadConfig {
    fn default() -> Self {
        RunAheadConfig { budget_pages: 1024 }
    }
}

/// Starts the populator thread of `state` (a region with a run-ahead
/// feed). On a peer's memory each install holds the peer's copy gate
/// (the resolve path takes it: `CopyGate`), so no REMOVE is read while
/// an install is in flight.
pub(crate) fn start(
    state: &RegionState,
    cfg: RunAheadConfig,
    scratch_bytes: usize,
) -> std::io::Result<Background> {
    state.spawn_worker("fl-run-ahead", move |r, stop| {
        run(r, cfg, stop, scratch_bytes)
    })
}

/// Predicted windows merged into one span for a batched store.
const SPAN_WINDOWS: usize = 4;

/// Merges consecutive contiguous windows into spans of at most `span`
/// pages.
fn merge(windows: Vec<Range<usize>>, span: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::with_capacity(windows.len());
    for w in windows {
        match out.last_mut() {
            Some(last) if last.end == w.start && w.end - last.start <= span => last.end = w.end,
            _ => out.push(w),
        }
    }
    out
}

fn run(r: &RegionState, cfg: RunAheadConfig, stop: &StopFlag, scratch_bytes: usize) {
    let feed = r.runahead.as_ref().expect("run-ahead regions have a feed");
    // Predict in windows of the largest read-ahead window: what one fault
    // of a sequential stream installs.
    let ra = r.readahead.config();
    let mut predictor = StreamPredictor::new(ra.max, ra.initial, cfg.budget_pages);
    let window = ra.max.clamp(1, cfg.budget_pages.max(1));
    // A store that pays per request gets contiguous predicted windows
    // merged into spans of up to SPAN_WINDOWS, each one batched fill.
    let span = if r.batches_fills() {
        SPAN_WINDOWS * window
    } else {
        window
    };
    let mut scratch = vec![0u8; scratch_bytes.max(r.pages.bytes(span))];
    let mut seen = feed.seq();
    while !stop.is_set() {
        let Some(page) = feed.next_fault(&mut seen, Duration::from_millis(50)) else {
            continue;
        };
        let follows = predictor.follows(page, |p| r.residency.get(p) != PageState::Absent);
        let windows = predictor.on_fault(page, r.pages.count(), follows);
        feed.windows
            .fetch_add(windows.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for w in merge(windows, span) {
            if stop.is_set() {
                break;
            }
            // The first absent page anchors the span (a window whose first
            // page is there is skipped unless its store batches fills).
            let first = if span > window {
                w.clone().find(|&p| r.residency.get(p) == PageState::Absent)
            } else {
                Some(w.start).filter(|&p| r.residency.get(p) == PageState::Absent)
            };
            let Some(first) = first else { continue };
            // Installs the window (claims keep it exclusive with the
            // application's own faults) and marks it installed ahead.
            let _ = resolve(r, first, Access::WRITE, &Origin::RunAhead(w), &mut scratch);
        }
    }
}
