//! Eviction under a resident-memory budget, with write-back of dirty pages.
//!
//! A region built with [`crate::RegionBuilder::budget`] is registered for
//! MISSING and WP faults and every page is installed write-protected
//! (`UFFDIO_COPY` with `MODE_WP`): resident and *clean* (`ReadOnly` in the
//! residency map). The first write takes a write-protect fault (a message
//! for thread engines, a SIGBUS for the signal engine); the resolve path
//! marks the page dirty (`Writable`) and un-protects it.
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
//! An evictor thread per region:
//!
//! 1. drains the install log (a lock-free ring the fault path appends to)
//!    into the eviction policy ([`crate::policy`]: FIFO, CLOCK, refault-aware);
//! 2. while more pages are resident than the budget (once past it: than
//!    the low-water mark, [`crate::RegionBuilder::budget_low_water`], UMap's
//!    hysteresis; by default the budget itself), takes the policy's
//!    victim and *claims* it (the same claim bit faults use, so no fault
//!    can install or dirty it meanwhile);
//! 3. for a dirty victim: write-protects it (writers now block in a WP
//!    fault, which sees the claim and waits), writes it back to the store;
//! 4. zaps it (`MADV_DONTNEED`), marks it absent and, when the engine
//!    reads events, waits until a handler has *handled* the zap's REMOVE
//!    event (several handler threads read the userfaultfd, and the one
//!    that read the event may handle it after a fault re-installed the
//!    page); then releases the claim. A thread that touches the page later
//!    faults and reads it back from the store.
//!
//! Regions built with [`crate::RegionBuilder::shared_budget`] share one
//! budget ([`SharedBudget`], UMap's one buffer for all regions): the
//! counts and marks of step 2 are those of all its regions together, and
//! each region's evictor evicts its own pages while the total is over.
//!
//! The evictor is asynchronous. A fault that finds the region well past
//! its budget (budget + max(budget/4, 4 read-ahead windows)) waits for it,
//! like the kernel's direct reclaim, so the budget holds approximately even
//! when faults outrun the evictor: a fault resolved on the faulting thread
//! (signal engine) yields in place, for at most 10 ms; a handler thread
//! defers the fault on its backoff queue instead, because the evictor's zap
//! needs that very thread to read its REMOVE event. Eviction therefore does
//! block faults, briefly, when they outrun it.
//!
//! A write-back that fails leaves the page resident and dirty, counted in
//! `write_back_errors`; nothing is dropped that the store does not hold.
//! The evictor says so once (one message naming region, offset, store and
//! cause), holds the page aside (`unwritable` in [`EvictionStats`]) and
//! retries it with backoff (10 ms doubling to 1 s); while a retry is
//! pending it writes no other dirty page (one probe per period, not a
//! storm) but still evicts clean ones. Held pages do not count against the
//! fault limit above: faults go on past the budget instead of waiting for
//! an eviction the store refuses, and `resident` > budget with
//! `unwritable` > 0 reports the overrun. When a retry succeeds the evictor
//! writes every held page back and says so. [`crate::Region::flush`]
//! returns the store's error. Dropping the region stops the evictor and
//! writes every dirty page back (reporting pages it could not write).
//!
//! The policy sees the calls the evictor makes (see
//! [`crate::policy::EvictionPolicy`]): `on_fault` for every install the
//! fault path logged (and again for a victim that could not be evicted),
//! and `pick_victim` with the claim bits as the pin predicate.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::background::{Background, StopFlag};
use crate::fault::report::report;
use crate::fault::RegionState;
use crate::policy::PolicyKind;
use crate::residency::PageState;
use crate::store::StoreError;
use faultline_sys::Errno;

use crate::fault::feeds::PageRing;
pub use crate::fault::feeds::{EvictionStats, SharedBudget};

/// The pages the evictor takes from a region from now on
/// ([`crate::Region::watch_reclaims`]), for a consumer that needs to know
/// (an I/O device's pinning policy derives its age threshold from them).
/// A lossy ring: when the consumer falls behind, evictions are dropped
/// and counted, the evictor never waits. Each watch sees every eviction;
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

/// Writes dirty `page` back: write-protect, copy to the store, mark clean.
/// The caller holds the page's claim. Returns the store error, if any (the
/// page is then un-protected again and stays dirty).
pub(crate) fn write_back(r: &RegionState, page: usize) -> Result<(), StoreError> {
    let mut out = [Ok(())];
    write_back_batch(r, &[page], &mut out);
    let [res] = out;
    res
}

/// [`write_back`] of every page of `pages` (claimed by the caller) with
/// one [`PageStore::write_back_batch`](crate::PageStore::write_back_batch)
/// call: one round trip for a remote store. `out[i]` is `pages[i]`'s
/// result.
pub(crate) fn write_back_batch(
    r: &RegionState,
    pages: &[usize],
    out: &mut [Result<(), StoreError>],
) {
    let budget = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    let ps = r.pages.size().bytes();
    let mut ranges = Vec::with_capacity(pages.len());
    let mut which = Vec::with_capacity(pages.len());
    for (i, &page) in pages.iter().enumerate() {
        match write_protect(r, page) {
            Ok(()) => {
                // SAFETY: the page is resident (dirty) and write-protected;
                // we only read it.
                let data =
                    unsafe { std::slice::from_raw_parts(r.pages.addr(page) as *const u8, ps) };
                ranges.push(crate::store::WriteRange {
                    offset: r.pages.offset(page),
                    data,
                });
                which.push(i);
            }
            Err(e) => out[i] = Err(e),
        }
    }
    let mut res = vec![Ok(()); ranges.len()];
    if !ranges.is_empty() {
        r.store.write_back_batch(&ranges, &mut res);
    }
    for (i, res) in which.into_iter().zip(res) {
        let page = pages[i];
        match res {
            Ok(()) => {
                r.residency.set(page, PageState::ReadOnly);
                budget.written_back.fetch_add(1, Relaxed);
            }
            Err(e) => {
                budget.write_back_errors.fetch_add(1, Relaxed);
                let _ = r
                    .uffd
                    .writeprotect(r.pages.addr(page), ps as u64, false, false);
                out[i] = Err(e);
            }
        }
    }
}

/// Write-protects `page` for its write-back. (DONTWAKE is only valid when
/// clearing protection.) EAGAIN: an event is pending (thread engines read
/// it soon); retry, bounded.
fn write_protect(r: &RegionState, page: usize) -> Result<(), StoreError> {
    let (addr, ps) = (r.pages.addr(page), r.pages.size().bytes());
    let mut tries = 0;
    loop {
        match r.uffd.writeprotect(addr, ps as u64, true, false) {
            Ok(()) => return Ok(()),
            Err(e) if e.is(Errno::EAGAIN) && tries < 2000 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => {
                return Err(StoreError::Failed {
                    offset: r.pages.offset(page),
                    reason: format!("write-protecting for write-back: {e}").into(),
                })
            }
        }
    }
}

/// What became of a victim.
enum Victim {
    /// Written back if dirty, zapped, absent now.
    Evicted,
    /// Claimed by someone else, or not resident: not evicted.
    Skipped,
    /// Dirty, and its write-back failed (or was not tried because the
    /// store is failing): resident and dirty still.
    Unwritable(Option<StoreError>),
}

/// Evicts `page` if it is resident and can be claimed. A dirty page is
/// written back first, unless `try_dirty` is false (the store is failing
/// and its retry is not due): then it is left alone, `Unwritable(None)`.
fn evict(r: &RegionState, page: usize, try_dirty: bool) -> Victim {
    let budget = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    if !r.residency.try_claim(page) {
        return Victim::Skipped;
    }
    if r.residency.io_busy(page) {
        // An I/O is in flight on it, or it is pinned: never zap under it.
        budget.skipped_io_busy.fetch_add(1, Relaxed);
        r.residency.release(page..page + 1);
        return Victim::Skipped;
    }
    let out = match r.residency.get(page) {
        PageState::Writable if !try_dirty => Victim::Unwritable(None),
        PageState::Writable => match write_back(r, page) {
            Ok(()) => Victim::Evicted,
            Err(e) => Victim::Unwritable(Some(e)),
        },
        PageState::ReadOnly => Victim::Evicted,
        _ => Victim::Skipped,
    };
    if let Victim::Evicted = out {
        budget.zap(r, page, r.delivery.reads_events);
        budget.evicted_one();
        budget.reclaimed(page);
    }
    r.residency.release(page..page + 1);
    out
}

/// First and longest wait before the evictor retries a failed write-back.
const RETRY_MIN: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Dirty pages whose write-back failed, and when to try again. While the
/// store is failing (a retry is pending) the evictor does not try to write
/// any other dirty page either: one probe per backoff period, doubling up
/// to [`RETRY_MAX`], so a store that refuses writes sees a handful of
/// attempts per second, not a storm. Held pages are counted in
/// `BudgetFeed::unwritable`, which faults do not wait for.
struct Unwritable {
    pages: VecDeque<usize>,
    delay: Duration,
    due: Option<Instant>,
}

impl Unwritable {
    fn failing(&self) -> bool {
        self.due.is_some()
    }

    /// Holds `page` (whose write-back failed with `err`, or was not
    /// tried) for a retry; says so once per failing period.
    fn hold(&mut self, r: &RegionState, budget: usize, page: usize, err: Option<StoreError>) {
        let feed = r
            .budget
            .as_ref()
            .expect("budget regions have a budget feed");
        feed.hold_unwritable(true);
        self.pages.push_back(page);
        let Some(err) = err else { return };
        if self.due.is_none() {
            report(|w| {
                let _ = w.write_str("write-back failed at ");
                r.describe_page(page, w);
                let _ = write!(
                    w,
                    ": {err}; the page stays resident and dirty, write-backs are retried with \
                     backoff (up to {RETRY_MAX:?}), and the region may stay resident past its \
                     budget of {budget} pages until the store takes writes again"
                );
            });
        }
        self.backoff();
    }

    fn backoff(&mut self) {
        self.delay = match self.due {
            None => RETRY_MIN,
            Some(_) => (self.delay * 2).min(RETRY_MAX),
        };
        self.due = Some(Instant::now() + self.delay);
    }

    /// When a retry is due, tries the held pages oldest first until one
    /// fails again; pages written back go back to `policy`.
    fn retry(&mut self, r: &RegionState, policy: &mut dyn crate::policy::EvictionPolicy) {
        let feed = r
            .budget
            .as_ref()
            .expect("budget regions have a budget feed");
        if self.due.is_none_or(|d| Instant::now() < d) {
            return;
        }
        while let Some(p) = self.pages.pop_front() {
            if !r.residency.try_claim(p) {
                // A fault or flush holds it: look again next round.
                self.pages.push_front(p);
                self.backoff();
                return;
            }
            let res = match r.residency.get(p) {
                PageState::Writable => write_back(r, p),
                // Written back by `flush`, or dropped: not held any more.
                _ => Ok(()),
            };
            r.residency.release(p..p + 1);
            match res {
                Ok(()) => {
                    feed.hold_unwritable(false);
                    if r.residency.get(p) != PageState::Absent {
                        policy.on_fault(p);
                    }
                }
                Err(_) => {
                    self.pages.push_front(p);
                    self.backoff();
                    return;
                }
            }
        }
        if self.due.take().is_some() {
            report(|w| {
                let _ = write!(
                    w,
                    "region #{}: write-back works again; every held page was written back",
                    r.id
                );
            });
        }
        self.delay = RETRY_MIN;
    }
}

/// Starts the evictor thread of `state` (a region with a budget). Past the
/// budget it evicts down to `low_water` pages (default and most: the
/// budget), UMap's low-water mark.
pub(crate) fn start(
    state: &RegionState,
    cfg: EvictionConfig,
    low_water: Option<usize>,
) -> std::io::Result<Background> {
    state.spawn_worker("faultline-evictor", move |r, stop| {
        run(r, cfg, low_water, stop)
    })
}

fn run(r: &RegionState, cfg: EvictionConfig, low_water: Option<usize>, stop: &StopFlag) {
    let budget_feed = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    let mut policy = cfg.policy.build(cfg.budget_pages);
    // A shared budget's marks apply to the total of its regions.
    let (budget, low) = match budget_feed.shared() {
        Some(s) => (s.pages(), s.low_water()),
        None => {
            let budget = cfg.budget_pages.max(1);
            (budget, low_water.unwrap_or(budget).min(budget))
        }
    };
    // Set when the region goes past the budget, cleared at `low`.
    let mut draining = false;
    let mut held = Unwritable {
        pages: VecDeque::new(),
        delay: RETRY_MIN,
        due: None,
    };
    while !stop.is_set() {
        budget_feed.drain(|p| policy.on_fault(p));
        held.retry(r, policy.as_mut());
        budget_feed.drain_hints(|p| policy.on_access_hint(p));
        let mut progress = false;
        let mut tries = 0;
        draining |= budget_feed.over(budget);
        while draining && budget_feed.over(low) && tries < 4 * budget {
            tries += 1;
            // Pages whose claim is held (being faulted or dirtied) or that
            // an I/O holds are skipped this round and handed back.
            let held_by_io = |p| {
                let busy = r.residency.io_busy(p);
                if busy {
                    budget_feed.skipped_io_busy.fetch_add(1, Relaxed);
                }
                busy
            };
            match policy.pick_victim(&|p| r.residency.is_claimed(p) || held_by_io(p)) {
                Some(v) => match evict(r, v, !held.failing()) {
                    Victim::Evicted => progress = true,
                    Victim::Unwritable(err) => held.hold(r, budget, v, err),
                    Victim::Skipped => {
                        if r.residency.get(v) != PageState::Absent {
                            policy.on_fault(v);
                        }
                    }
                },
                None => {
                    budget_feed.drain(|p| policy.on_fault(p));
                    break;
                }
            }
        }
        draining &= budget_feed.over(low);
        if !progress {
            std::thread::park_timeout(Duration::from_micros(200));
        }
    }
}
