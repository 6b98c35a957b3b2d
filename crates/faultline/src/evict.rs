//! Eviction under a resident-memory budget, with write-back of dirty pages.
//!
//! A region built with [`crate::RegionBuilder::budget`] is registered for
//! MISSING and WP faults. A read fault installs its pages write-protected
//! (`UFFDIO_COPY` with `MODE_WP`): resident and *clean* (`ReadOnly` in the
//! residency map). The first write to a clean page takes a write-protect
//! fault (a message for thread engines, a SIGBUS for the signal engine);
//! the resolve path marks the page dirty (`Writable`) and un-protects it.
//! A write fault on a missing page installs that page writable and dirty
//! at once (one ioctl, no second fault).
//!
//! Synchronous WP faults or `WP_ASYNC` + `PAGEMAP_SCAN`? Measured here (C,
//! 20,000 pages, median cycles): the first write to a clean page costs
//! 12,800 with a synchronous WP fault resolved in a SIGBUS handler and 2,340
//! with `WP_ASYNC` (the kernel un-protects without telling anyone); finding
//! and re-protecting the dirty pages costs 155/page with one `PAGEMAP_SCAN`
//! (`PM_SCAN_WP_MATCHING`) and 260-340/page with `UFFDIO_WRITEPROTECT`.
//! `WP_ASYNC` is cheaper, but it cannot stop a write: a write landing
//! between "the scan says clean" and the zap would be lost. Synchronous WP
//! blocks that write in a fault that sees the evictor's claim, so eviction
//! is exact. It was picked for correctness; an async variant would have to
//! take the victim out atomically first (`UFFDIO_MOVE` to a staging area)
//! and compare it with the store.
//!
//! # The budget is a bound
//!
//! Every fault *charges* the pages it is about to install to the budget
//! first (a compare-and-swap that refuses to pass it), so the resident
//! count never exceeds the budget ([`SharedBudget`] documents the marks
//! and the two exceptions). A fault that finds it full makes room:
//!
//! * on the faulting thread (the signal engine), and from threads that
//!   populate, it evicts a batch of its region's pages itself, like the
//!   kernel's direct reclaim, and takes a slot;
//! * from a handler thread (the thread engines, which read the region's
//!   REMOVE events and must not zap themselves) the fault is deferred and
//!   the evictor asked to make room.
//!
//! How a batch is chosen and evicted is `fault::reclaim`'s: one
//! victim lock per region (the policy), batched write-back, one
//! `process_madvise` for the batch.
//!
//! # The evictor
//!
//! Each region has one evictor thread, or several
//! ([`crate::RegionBuilder::evictors`]: they take the victim lock only to
//! pick a batch, so their write-backs and zaps run side by side; one when
//! handler threads read the region's events, whose zaps wait for those
//! events one run of pages at a time). Each sleeps on the budget's futex
//! until the count reaches the high-water mark (or a fault asks for room),
//! then evicts batches until the count is down to the low-water mark
//! (UMap's hysteresis; [`crate::RegionBuilder::budget_low_water`]). By
//! default the mark is the budget itself on the signal engine (only faults
//! that find no room make it evict; they mostly evict for themselves) and
//! an eighth below it under handler threads, whose faults cannot evict and
//! would each wait for the evictor (`default_low_water`).
//!
//! The drain is the budget's, not each evictor's: a charge that takes the
//! count to the high-water mark counts a crossing, and the evictors drain
//! while a crossing is newer than the last time the count was down at
//! the low-water mark. So they drain also when a fault that found the
//! budget full evicted a batch for itself and took the count back under
//! the high-water mark before any of them looked, and an evictor that
//! rested while the others finished does not start again from below it:
//!
//! ```text
//!   count  ──▶ high: crossings += 1 ── kick ──▶ evictors drain (each
//!              takes on part of what is over low, reserve_drain) ──▶
//!              at low: drained = crossings, they rest
//! ```
//!
//! Regions built with [`crate::RegionBuilder::shared_budget`] share one
//! budget ([`SharedBudget`], UMap's one buffer for all regions): the
//! counts and marks are those of all its regions together; each region's
//! evictor evicts its own pages while the total is over, and a fault in a
//! region with nothing to evict waits (woken when any region's pages are
//! uncharged).
//!
//! A write-back that fails leaves the page resident and dirty, counted in
//! `write_back_errors`; nothing is dropped that the store does not hold.
//! Eviction says so once (one message naming region, offset, store and
//! cause), holds the page aside (`unwritable` in [`EvictionStats`]) and
//! the evictor retries it with backoff (10 ms doubling to 1 s); while a
//! retry is pending no other dirty page is tried (one probe per period,
//! not a storm), clean ones are still evicted. Held pages do not count
//! against the budget: faults go on past it instead of waiting for an
//! eviction the store refuses, and `resident` above the budget with
//! `unwritable` non-zero reports the overrun. When a retry succeeds the
//! evictor writes every
//! held page back and says so. [`crate::Region::flush`] returns the store's
//! error. Dropping the region stops the evictor and writes every dirty
//! page back (reporting pages it could not write).
//!
//! The policy sees the calls eviction makes (see
//! [`crate::policy::EvictionPolicy`]): `on_fault` for every install the
//! fault path logged (and again for a victim that could not be evicted),
//! and `pick_victim` with the claim bits as the pin predicate.

use std::sync::Arc;
use std::time::Duration;

use crate::background::{Background, StopFlag};
use crate::fault::reclaim;
use crate::fault::RegionState;
use crate::policy::PolicyKind;

use crate::fault::feeds::PageRing;
pub use crate::fault::feeds::{EvictionStats, SharedBudget, ROOM_STALL};
pub(crate) use crate::fault::reclaim::write_back_batch;

/// How long the evictor sleeps when nothing wakes it (it still retries
/// held write-backs and drains the install log that often).
const IDLE_WAIT: Duration = Duration::from_millis(10);

/// The pages the evictor takes from a region from now on
/// ([`crate::Region::watch_reclaims`]), for a consumer that needs to know
/// (an I/O device's pinning policy derives its age threshold from them).
/// A lossy ring: when the consumer falls behind, evictions are dropped
/// and counted, eviction never waits. Each watch sees every eviction;
/// dropping it stops the recording.
pub struct ReclaimWatch {
    ring: Arc<PageRing>,
}

impl std::fmt::Debug for ReclaimWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReclaimWatch")
            .field("taken", &self.ring.taken())
            .field("dropped", &self.ring.dropped())
            .finish()
    }
}

impl ReclaimWatch {
    pub(crate) fn new(ring: Arc<PageRing>) -> ReclaimWatch {
        ReclaimWatch { ring }
    }

    /// Hands every page evicted since the last call to `f`, oldest first.
    pub fn drain(&mut self, f: impl FnMut(usize)) {
        self.ring.drain(f);
    }

    /// Evictions dropped because this watch's ring was full.
    pub fn dropped(&self) -> u64 {
        self.ring.dropped()
    }
}

/// Budget settings.
#[derive(Debug, Clone, Copy)]
pub struct EvictionConfig {
    /// Most region pages resident at once.
    pub budget_pages: usize,
    /// Which policy picks victims.
    pub policy: PolicyKind,
}

/// Starts the `threads` evictor threads of `state` (a region with a
/// budget; at least one, and one when handler threads read the region's
/// events). Of a budget of its own, the evictor starts when it is full
/// and evicts down to `low_water` pages (at most the budget), UMap's
/// low-water mark; a shared budget has its own marks. The default is
/// [`default_low_water`].
pub(crate) fn start(
    state: &RegionState,
    cfg: EvictionConfig,
    low_water: Option<usize>,
    threads: usize,
) -> std::io::Result<Vec<Background>> {
    let feed = state
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    feed.set_low_water(low_water.unwrap_or_else(|| {
        default_low_water(
            feed.own_high(),
            state.pages.count(),
            state.delivery.reads_events,
        )
    }));
    // The policy holds at most the budget's pages (plus held ones).
    // (A shared budget may be larger than this region.)
    let capacity = feed
        .core()
        .max()
        .min(state.pages.count())
        .saturating_add(reclaim::BATCH);
    reclaim::init(state, cfg.policy, capacity);
    // When handler threads read the region's events, a zap waits for its
    // REMOVE events to be handled, one run at a time through one slot
    // (`BudgetFeed::zap`): one evictor.
    let threads = if state.delivery.reads_events {
        1
    } else {
        threads.max(1)
    };
    (0..threads)
        .map(|_| state.spawn_worker("fl-evictor", run))
        .collect()
}

/// The low-water mark of a budget of `high` pages, in a region of `pages`,
/// when none is given.
///
/// A budget that holds the whole region (one that only tracks dirty
/// pages, as `mode="r+"` without a budget does in Python) evicts nothing:
/// the budget itself. Where faults are resolved on the faulting thread
/// (the signal engine), the budget itself too: a fault that finds the
/// budget full evicts a batch for itself, at no more cost than the
/// evictor's, and nothing is evicted that no fault needed room for. Where
/// handler threads resolve them (`handler_threads`: the thread engines),
/// an eighth below it: a handler must not evict (its zaps would wait for
/// REMOVE events only it reads), so a fault that finds the budget full is
/// put aside until the evictor has made room, a round trip of wake-ups
/// per fault once the budget is reached; draining an eighth ahead makes
/// those rare. Measured (RESULTS.md, "A budget under handler threads"): a
/// sequential scan of 4x its budget with the poll engine took 3.5-4.2x
/// less time with the mark an eighth down than at the budget.
pub(crate) fn default_low_water(high: usize, pages: usize, handler_threads: bool) -> usize {
    if handler_threads && high < pages {
        high - high / 8
    } else {
        high
    }
}

fn run(r: &RegionState, stop: &StopFlag) {
    let feed = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    let core = feed.core();
    let batch = reclaim::batch_for(core.max(), r.pages.size().bytes());
    let mut idle = false;
    let mut crossings = core.high_crossings();
    while !stop.is_set() {
        core.evictor_sleep(IDLE_WAIT, idle, crossings);
        feed.evictor_wakeups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        reclaim::retry_held(r);
        // At the mark now, with or without a crossing (held pages written
        // back count again): drain. Then the crossings seen, so a new one
        // keeps the next sleep short.
        if core.counted() >= core.high() {
            core.at_high();
        }
        crossings = core.high_crossings();
        // A deferred fault asked for room: make some, unless other
        // evictions already did.
        let mut asked = core.take_demand();
        let mut progress = false;
        loop {
            asked &= core.is_full();
            if stop.is_set() || !(asked || core.has_waiters() || core.drain_due()) {
                break;
            }
            // Room for a fault: a batch; draining: down to low, not past
            // (with what the region's other evictors took on counted).
            let got = if asked || core.has_waiters() {
                reclaim::reclaim(r, batch, true)
            } else {
                let want = core.reserve_drain(batch);
                if want == 0 {
                    break;
                }
                let got = reclaim::reclaim(r, want, true);
                core.end_drain(want);
                got
            };
            if got == 0 {
                break;
            }
            progress = true;
            asked = false;
        }
        idle = !progress;
    }
}
