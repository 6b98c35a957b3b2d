//! What the fault path tells a region's background threads, without
//! waiting for them.
//!
//! * [`BudgetFeed`] (regions with a memory budget): every install is
//!   appended to a lock-free log the evictor drains into its eviction
//!   policy, and the resident count tells a fault when the region is so far
//!   past its budget that it should wait for the evictor.
//! * [`RunAheadFeed`] (regions with run-ahead): the last fault, and a futex
//!   wake if the populator sleeps; the pages the populator installed are
//!   marked so users can count faults avoided.
//!
//! Posting to either is a few atomics and at most one system call:
//! async-signal-safe and wait-free.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::residency::{PageBits, PageState};
use faultline_sys::mem::{self, Advice};
use faultline_sys::thread::{futex_wait, futex_wake};

/// Eviction counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionStats {
    /// Pages evicted.
    pub evicted: u64,
    /// Dirty pages written back (by eviction or flush).
    pub written_back: u64,
    /// Write-backs that failed (the page stayed resident and dirty). The
    /// evictor retries them with backoff, so this stays small while a
    /// store refuses writes (see [`crate::evict`]).
    pub write_back_errors: u64,
    /// Dirty pages kept resident because their write-back failed, waiting
    /// for a retry. They do not count against the budget's fault limit:
    /// while this is non-zero the region may be resident past its budget
    /// (`resident` > budget), which is how that overrun is reported.
    pub unwritable: u64,
    /// Pages resident now (as counted by the runtime).
    pub resident: u64,
    /// Most pages resident at once. The evictor runs asynchronously, so
    /// the count can pass the budget while it catches up; a fault that
    /// finds the region past budget plus slack waits for it (see
    /// [`crate::evict`]).
    pub max_resident: u64,
    /// Victim candidates passed over because an I/O (or a pin) held a
    /// reference on them: by the victim scan, or after the claim (a race
    /// the evictor's second check caught; see [`crate::residency`]).
    pub skipped_io_busy: u64,
    /// Access hints handed to the eviction policy (from an I/O access log).
    pub access_hints: u64,
    /// Access hints dropped because the hint ring was full (lossy).
    pub access_hints_dropped: u64,
}

/// One resident budget for several regions (UMap's one buffer for every
/// region): each region built with
/// [`crate::RegionBuilder::shared_budget`] counts its resident pages here
/// as well as in its own [`EvictionStats`], and its evictor evicts its own
/// pages, by its own policy, while the regions *together* are past the
/// budget (down to the low-water mark once past it). Faults wait for the
/// evictors when the total is past the budget plus slack, as for one
/// region. There is no global victim order: while the total is past the
/// budget, every region's evictor gives up that region's pages, in its
/// own policy's order.
#[derive(Debug)]
pub struct SharedBudget {
    pages: usize,
    low_water: usize,
    resident: AtomicUsize,
    max_resident: AtomicUsize,
    unwritable: AtomicUsize,
}

impl SharedBudget {
    /// A budget of `pages` resident pages (at least 1), evicted down to
    /// `low_water` (at most `pages`) once past it.
    pub fn new(pages: usize, low_water: usize) -> SharedBudget {
        let pages = pages.max(1);
        SharedBudget {
            pages,
            low_water: low_water.min(pages),
            resident: AtomicUsize::new(0),
            max_resident: AtomicUsize::new(0),
            unwritable: AtomicUsize::new(0),
        }
    }

    /// The budget, in pages.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The low-water mark, in pages.
    pub fn low_water(&self) -> usize {
        self.low_water
    }

    /// Pages resident now in all its regions together.
    pub fn resident(&self) -> usize {
        self.resident.load(Relaxed)
    }

    /// Most pages resident at once in all its regions together.
    pub fn max_resident(&self) -> usize {
        self.max_resident.load(Relaxed)
    }
}

/// The budget side of the fault path: the install log and resident count.
#[derive(Debug)]
pub(crate) struct BudgetFeed {
    /// Resident pages past which faults wait for the evictor.
    limit: usize,
    log: Box<[AtomicU64]>,
    tail: AtomicU64,
    head: AtomicU64,
    pub resident: AtomicUsize,
    max_resident: AtomicUsize,
    pub evicted: AtomicU64,
    pub written_back: AtomicU64,
    pub write_back_errors: AtomicU64,
    /// Dirty pages whose write-back failed, held resident for a retry.
    pub unwritable: AtomicUsize,
    pub skipped_io_busy: AtomicU64,
    /// The page the evictor is zapping, plus one (0: none), and whether an
    /// engine has handled the REMOVE event of that zap (see [`Self::zap`]).
    zapping: AtomicUsize,
    zap_handled: AtomicBool,
    /// Access hints for the policy, lossy (the evictor drains it).
    hints: PageRing,
    /// Rings of [`crate::evict::ReclaimWatch`]es: every evicted page is
    /// pushed to each (lossy); a ring nobody else holds is dropped.
    reclaim_watchers: Mutex<Vec<Arc<PageRing>>>,
    /// `reclaim_watchers.len()`, read without the lock by the evictor.
    reclaim_watching: AtomicUsize,
    /// The budget this region shares with others, if any: `resident` and
    /// `unwritable` are mirrored into it, and the limits apply to it.
    shared: Option<Arc<SharedBudget>>,
}

/// A lossy ring of page indices: producers never wait (a push into a full
/// ring is dropped and counted); one consumer at a time drains it.
#[derive(Debug)]
pub struct PageRing {
    /// page + 1; 0 = empty.
    slots: Box<[AtomicU64]>,
    tail: AtomicU64,
    head: AtomicU64,
    taken: AtomicU64,
    dropped: AtomicU64,
}

impl PageRing {
    /// A ring of `slots` pages.
    pub fn new(slots: usize) -> PageRing {
        PageRing {
            slots: (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect(),
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Appends `page`, or drops it (counted) when the ring is full.
    pub fn push(&self, page: usize) {
        let n = self.slots.len() as u64;
        let tail = self.tail.load(SeqCst);
        if tail - self.head.load(SeqCst) >= n
            || self
                .tail
                .compare_exchange(tail, tail + 1, SeqCst, Relaxed)
                .is_err()
        {
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        self.slots[(tail % n) as usize].store(page as u64 + 1, SeqCst);
    }

    /// Hands every page pushed so far to `f`, oldest first. One consumer
    /// at a time (callers serialise).
    pub fn drain(&self, mut f: impl FnMut(usize)) {
        let n = self.slots.len() as u64;
        let tail = self.tail.load(SeqCst);
        let mut head = self.head.load(Relaxed);
        while head < tail {
            let v = self.slots[(head % n) as usize].swap(0, SeqCst);
            if v == 0 {
                break; // its producer has not written it yet
            }
            f(v as usize - 1);
            self.taken.fetch_add(1, Relaxed);
            head += 1;
        }
        self.head.store(head, SeqCst);
    }

    /// Pages drained so far.
    pub fn taken(&self) -> u64 {
        self.taken.load(Relaxed)
    }

    /// Pages dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// Slots of the access-hint ring.
const HINT_SLOTS: usize = 4096;

/// How long a fault on the faulting thread waits for the evictor before it
/// goes on past the budget (the kernel's direct reclaim also gives up).
const BUDGET_WAIT: Duration = Duration::from_millis(10);

/// How long the evictor waits for a handler to handle its zap's REMOVE
/// event (a handler thread descheduled that long is a machine in trouble;
/// the evictor then goes on, as before the handshake existed).
const ZAP_ACK_WAIT: Duration = Duration::from_secs(1);

impl BudgetFeed {
    /// For a region of `pages` pages with `budget` resident pages (of
    /// `shared`, when given), whose faults install up to `window` pages at
    /// once.
    pub fn new(
        pages: usize,
        budget: usize,
        window: usize,
        shared: Option<Arc<SharedBudget>>,
    ) -> BudgetFeed {
        // Every logged install is drained before its page can be evicted,
        // so at most `pages` entries are ever outstanding.
        let cap = pages.max(1024).next_power_of_two();
        BudgetFeed {
            limit: budget + (budget / 4).max(4 * window),
            log: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            resident: AtomicUsize::new(0),
            max_resident: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            write_back_errors: AtomicU64::new(0),
            unwritable: AtomicUsize::new(0),
            skipped_io_busy: AtomicU64::new(0),
            zapping: AtomicUsize::new(0),
            zap_handled: AtomicBool::new(false),
            hints: PageRing::new(HINT_SLOTS),
            reclaim_watchers: Mutex::new(Vec::new()),
            reclaim_watching: AtomicUsize::new(0),
            shared,
        }
    }

    /// The budget this region shares, if any.
    pub fn shared(&self) -> Option<&SharedBudget> {
        self.shared.as_deref()
    }

    /// An eviction: one page fewer resident.
    pub fn evicted_one(&self) {
        self.resident.fetch_sub(1, SeqCst);
        if let Some(s) = &self.shared {
            s.resident.fetch_sub(1, SeqCst);
        }
        self.evicted.fetch_add(1, Relaxed);
    }

    /// A dirty page held for a write-back retry (`held`) or released from
    /// it (`!held`).
    pub fn hold_unwritable(&self, held: bool) {
        let count = |c: &AtomicUsize| {
            if held {
                c.fetch_add(1, SeqCst);
            } else {
                c.fetch_sub(1, SeqCst);
            }
        };
        count(&self.unwritable);
        if let Some(s) = &self.shared {
            count(&s.unwritable);
        }
    }

    /// Whether more than `limit` pages are resident, not counting pages
    /// held for a write-back retry: in this region, or in all regions of
    /// its shared budget.
    pub fn over(&self, limit: usize) -> bool {
        let (resident, stuck) = match &self.shared {
            Some(s) => (&s.resident, &s.unwritable),
            None => (&self.resident, &self.unwritable),
        };
        resident.load(SeqCst).saturating_sub(stuck.load(SeqCst)) > limit
    }

    /// Posts an access hint for `page` (an I/O touched it). Never waits:
    /// when the ring is full the hint is dropped and counted.
    pub fn hint(&self, page: usize) {
        self.hints.push(page);
    }

    /// Hands every posted hint to `f` (the evictor).
    pub fn drain_hints(&self, f: impl FnMut(usize)) {
        self.hints.drain(f);
    }

    /// A new ring that every page evicted from now on is pushed to.
    pub fn watch_reclaims(&self, slots: usize) -> Arc<PageRing> {
        let ring = Arc::new(PageRing::new(slots));
        let mut w = self.reclaim_watchers.lock().expect("reclaim watchers");
        w.push(ring.clone());
        self.reclaim_watching.store(w.len(), SeqCst);
        ring
    }

    /// The evictor took `page`: tells the watchers (lossy, never waits on
    /// a consumer; without watchers one atomic load).
    pub fn reclaimed(&self, page: usize) {
        if self.reclaim_watching.load(Relaxed) == 0 {
            return;
        }
        let mut w = self.reclaim_watchers.lock().expect("reclaim watchers");
        // A watch that was dropped is only held here.
        w.retain(|r| Arc::strong_count(r) > 1);
        self.reclaim_watching.store(w.len(), SeqCst);
        for r in w.iter() {
            r.push(page);
        }
    }

    /// Logs that `page` was installed. Async-signal-safe, wait-free.
    #[inline]
    pub fn installed(&self, page: usize) {
        let now = self.resident.fetch_add(1, SeqCst) + 1;
        self.max_resident.fetch_max(now, Relaxed);
        if let Some(s) = &self.shared {
            let now = s.resident.fetch_add(1, SeqCst) + 1;
            s.max_resident.fetch_max(now, Relaxed);
        }
        let i = self.tail.fetch_add(1, SeqCst) as usize & (self.log.len() - 1);
        self.log[i].store(page as u64 + 1, SeqCst);
    }

    /// Whether the region (or its shared budget) is past budget + slack,
    /// not counting pages the evictor cannot write back (a fault must not
    /// wait for an eviction the store refuses).
    #[inline]
    pub fn over_limit(&self) -> bool {
        self.over(self.limit)
    }

    /// A fault resolved on the faulting thread, past the limit: wait
    /// (yielding, at most [`BUDGET_WAIT`]) for the evictor to catch up, as
    /// the kernel's direct reclaim makes an allocating thread wait.
    /// Async-signal-safe (`clock_gettime` and `sched_yield`). Thread
    /// engines defer the fault instead; see `resolve`.
    pub fn wait_below_limit(&self) {
        let deadline = Instant::now() + BUDGET_WAIT;
        while self.over_limit() && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }

    /// Zaps `page` for the evictor, which holds its claim, and records it
    /// absent. When an engine reads the region's events (`events`), waits
    /// (at most [`ZAP_ACK_WAIT`]) until a handler has *handled* the REMOVE
    /// event the zap posts, not merely read it: `madvise` returns once the
    /// event is read, and with several handler threads the one that read
    /// it may run its `on_remove` only later. Had the claim been released
    /// before that, a fault could re-install the page and the late
    /// `on_remove` mark it absent while mapped, losing it from the map
    /// (and its dirty data from write-back). Returns whether the wait
    /// timed out.
    pub fn zap(&self, r: &super::RegionState, page: usize, events: bool) -> bool {
        self.zap_handled.store(false, SeqCst);
        self.zapping.store(page + 1, SeqCst);
        let _ = mem::madvise(r.pages.addr(page), r.pages.size().bytes(), Advice::DontNeed);
        let deadline = Instant::now() + ZAP_ACK_WAIT;
        let mut timed_out = false;
        while events && !self.zap_handled.load(SeqCst) {
            if Instant::now() > deadline {
                timed_out = true;
                break;
            }
            std::thread::yield_now();
        }
        self.zapping.store(0, SeqCst);
        r.residency.set(page, PageState::Absent);
        timed_out
    }

    /// An engine has handled a REMOVE event for `pages` (and marked them
    /// absent): acknowledges the evictor's zap if it is among them.
    pub fn removed(&self, pages: Range<usize>) {
        let z = self.zapping.load(SeqCst);
        if z != 0 && pages.contains(&(z - 1)) {
            self.zap_handled.store(true, SeqCst);
        }
    }

    /// Hands every logged install to `f`, oldest first (the evictor).
    pub fn drain(&self, mut f: impl FnMut(usize)) {
        let tail = self.tail.load(SeqCst);
        let mut head = self.head.load(Relaxed);
        while head < tail {
            let slot = &self.log[head as usize & (self.log.len() - 1)];
            let v = slot.swap(0, SeqCst);
            if v == 0 {
                break; // its producer has not written it yet
            }
            f(v as usize - 1);
            head += 1;
        }
        self.head.store(head, Relaxed);
    }

    pub fn stats(&self) -> EvictionStats {
        EvictionStats {
            evicted: self.evicted.load(Relaxed),
            written_back: self.written_back.load(Relaxed),
            write_back_errors: self.write_back_errors.load(Relaxed),
            unwritable: self.unwritable.load(Relaxed) as u64,
            resident: self.resident.load(Relaxed) as u64,
            max_resident: self.max_resident.load(Relaxed) as u64,
            skipped_io_busy: self.skipped_io_busy.load(Relaxed),
            access_hints: self.hints.taken(),
            access_hints_dropped: self.hints.dropped(),
        }
    }
}

impl Drop for BudgetFeed {
    /// The region is gone: its pages no longer count against the budget
    /// it shared.
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.resident.fetch_sub(*self.resident.get_mut(), SeqCst);
            s.unwritable.fetch_sub(*self.unwritable.get_mut(), SeqCst);
        }
    }
}

/// Run-ahead counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunAheadStats {
    /// Faults the populator looked at.
    pub faults_seen: u64,
    /// Windows it predicted.
    pub windows_predicted: u64,
    /// Pages it installed.
    pub pages_populated: u64,
}

/// Where faults are posted for the run-ahead populator.
#[derive(Debug)]
pub(crate) struct RunAheadFeed {
    seq: AtomicU32,
    page: AtomicU64,
    sleeping: AtomicBool,
    /// Pages the populator installed (before any fault on them).
    pub ahead: PageBits,
    pub faults_seen: AtomicU64,
    pub windows: AtomicU64,
    pub populated: AtomicU64,
}

impl RunAheadFeed {
    pub fn new(pages: usize) -> RunAheadFeed {
        RunAheadFeed {
            seq: AtomicU32::new(0),
            page: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            ahead: PageBits::new(pages),
            faults_seen: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            populated: AtomicU64::new(0),
        }
    }

    /// Posts a fault at `page`. Async-signal-safe.
    #[inline]
    pub fn post(&self, page: usize) {
        self.page.store(page as u64, SeqCst);
        self.seq.fetch_add(1, SeqCst);
        if self.sleeping.load(SeqCst) {
            futex_wake(&self.seq);
        }
    }

    /// Wakes the populator whatever it waits for (to stop it).
    pub fn wake_all(&self) {
        self.seq.fetch_add(1, SeqCst);
        futex_wake(&self.seq);
    }

    /// The populator's wait: returns the newest posted fault once the
    /// sequence moves past `seen` (updating it), or `None` after `timeout`
    /// (or a wake without a new fault).
    pub fn next_fault(&self, seen: &mut u32, timeout: Duration) -> Option<usize> {
        let s = self.seq.load(SeqCst);
        if s == *seen {
            self.sleeping.store(true, SeqCst);
            if self.seq.load(SeqCst) == s {
                futex_wait(&self.seq, s, timeout);
            }
            self.sleeping.store(false, SeqCst);
            return None;
        }
        *seen = s;
        self.faults_seen.fetch_add(1, Relaxed);
        Some(self.page.load(SeqCst) as usize)
    }

    /// The current sequence number (a populator starts from it).
    pub fn seq(&self) -> u32 {
        self.seq.load(SeqCst)
    }

    pub fn stats(&self) -> RunAheadStats {
        RunAheadStats {
            faults_seen: self.faults_seen.load(Relaxed),
            windows_predicted: self.windows.load(Relaxed),
            pages_populated: self.populated.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ring_is_fifo_and_drops_when_full() {
        let r = PageRing::new(4);
        for p in 10..15 {
            r.push(p);
        }
        assert_eq!(r.dropped(), 1);
        let mut got = vec![];
        r.drain(|p| got.push(p));
        assert_eq!(got, [10, 11, 12, 13]);
        r.push(7);
        r.drain(|p| got.push(p));
        assert_eq!((got.last(), r.taken()), (Some(&7), 5));
    }

    /// Every watch sees every eviction; a dropped watch is forgotten.
    #[test]
    fn reclaim_watchers_each_see_every_eviction() {
        let feed = BudgetFeed::new(64, 16, 1, None);
        feed.reclaimed(1); // nobody watches: nothing kept
        let a = feed.watch_reclaims(8);
        let b = feed.watch_reclaims(8);
        feed.reclaimed(2);
        drop(b);
        feed.reclaimed(3);
        assert_eq!(feed.reclaim_watching.load(SeqCst), 1);
        let mut got = vec![];
        a.drain(|p| got.push(p));
        assert_eq!(got, [2, 3]);
    }
}
