//! What the fault path tells a region's background threads, and the
//! counters a memory budget is kept with.
//!
//! * [`BudgetFeed`] (regions with a memory budget): every install is
//!   appended to a lock-free log that eviction drains into its policy; the
//!   budget's count of charged pages is what a fault must find room in
//!   before it installs (see [`BudgetCore`]).
//! * [`RunAheadFeed`] (regions with run-ahead): the last fault, and a futex
//!   wake if the populator sleeps; the pages the populator installed are
//!   marked so users can count faults avoided.
//!
//! Posting to either is a few atomics and at most one system call:
//! async-signal-safe and wait-free. Charging a budget is a compare-and-swap
//! loop; a fault that finds no room makes room ([`super::reclaim`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use crate::policy::EvictionPolicy;
use crate::residency::{PageBits, PageState};
use faultline_sys::mem::{self, Advice};
use faultline_sys::thread::{futex_wait, futex_wake, futex_wake_all};

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
    /// for a retry. They do not count against the budget: while this is
    /// non-zero the region may be resident past its budget (`resident` >
    /// budget), which is how that overrun is reported.
    pub unwritable: u64,
    /// Pages resident now (as counted by the runtime).
    pub resident: u64,
    /// Most pages resident at once in this region. With a budget of its
    /// own, at most the budget (plus `unwritable` pages and `overruns`):
    /// a fault charges its pages before it installs them.
    pub max_resident: u64,
    /// Victim candidates passed over because an I/O (or a pin) held a
    /// reference on them: by the victim scan, or after the claim (a race
    /// the evictor's second check caught; see [`crate::residency`]).
    pub skipped_io_busy: u64,
    /// Access hints handed to the eviction policy (from an I/O access log).
    pub access_hints: u64,
    /// Access hints dropped because the hint ring was full (lossy).
    pub access_hints_dropped: u64,
    /// Faults (and populates) that found the budget full and had to make
    /// room: evict pages themselves, or wait for an evictor.
    pub full_faults: u64,
    /// Pages evicted by faulting threads themselves (the rest of `evicted`
    /// by the evictor thread).
    pub evicted_inline: u64,
    /// TSC cycles faults spent making room (evicting or waiting).
    pub room_cycles: u64,
    /// Times the evictor thread woke up (to a wake or its timeout).
    pub evictor_wakeups: u64,
    /// `madvise`/`process_madvise` calls that dropped evicted pages.
    pub zap_calls: u64,
    /// Faults that gave up waiting for room (nothing could be evicted for
    /// [`crate::evict::ROOM_STALL`]: every resident page pinned, say) and installed past
    /// the budget.
    pub overruns: u64,
}

/// How long a fault that finds the budget full and nothing to evict waits
/// (for evictors of other regions of its shared budget, for pins to go)
/// before it installs past the budget, counted in
/// [`EvictionStats::overruns`].
pub const ROOM_STALL: Duration = Duration::from_secs(2);

/// The marks and counters one budget is kept with: a region's own, or the
/// one of a [`SharedBudget`] all its regions count against.
///
/// ```text
///   0 ──────────── low ─────────── high ────────── max
///                   ▲ the evictor    ▲ the evictor   ▲ a fault that would
///                     stops here       wakes here      pass it makes room
///                                                      first (evicts, or
///                                                      waits for evictors)
/// ```
///
/// Pages are *charged* before they are installed (a compare-and-swap that
/// refuses to pass `max`) and uncharged when evicted, so the charged count
/// (resident pages plus those being installed) never exceeds `max`, except
/// for dirty pages whose write-back failed (held, not counted, see
/// [`crate::evict`]) and faults that gave up after ROOM_STALL.
#[derive(Debug)]
pub(crate) struct BudgetCore {
    max: usize,
    high: AtomicUsize,
    low: AtomicUsize,
    /// Pages charged: resident, plus reserved by faults installing now.
    charged: AtomicUsize,
    max_charged: AtomicUsize,
    /// Charged pages held resident because their write-back failed.
    unwritable: AtomicUsize,
    /// Faults waiting for room (they may not evict, or found nothing).
    waiting: AtomicUsize,
    /// A fault that may neither evict nor wait (a handler thread) found the
    /// budget full and deferred: the evictors make room.
    demand: AtomicBool,
    /// Pages uncharged so far (a waiting fault's sign of progress).
    uncharges: AtomicU64,
    /// Pages the evictors took on to evict down to the low-water mark and
    /// have not yet reported done (see [`Self::reserve_drain`]).
    draining: AtomicUsize,
    /// Times the count rose to the high-water mark from under it (see
    /// [`Self::drain_due`]).
    crossings: AtomicU64,
    /// The last of those crossings the evictors drained to the low-water
    /// mark after.
    drained: AtomicU64,
    /// Futex word the evictors sleep on; bumped to wake them.
    evict_seq: AtomicU32,
    evictors_asleep: AtomicU32,
    /// Futex word waiting faults sleep on; bumped when pages are uncharged.
    room_seq: AtomicU32,
    room_sleepers: AtomicU32,
}

impl BudgetCore {
    fn new(max: usize, high: usize, low: usize) -> BudgetCore {
        let max = max.max(1);
        let high = high.clamp(1, max);
        BudgetCore {
            max,
            high: AtomicUsize::new(high),
            low: AtomicUsize::new(low.min(high)),
            charged: AtomicUsize::new(0),
            max_charged: AtomicUsize::new(0),
            unwritable: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            demand: AtomicBool::new(false),
            uncharges: AtomicU64::new(0),
            draining: AtomicUsize::new(0),
            crossings: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            evict_seq: AtomicU32::new(0),
            evictors_asleep: AtomicU32::new(0),
            room_seq: AtomicU32::new(0),
            room_sleepers: AtomicU32::new(0),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn high(&self) -> usize {
        self.high.load(Relaxed)
    }

    pub fn low(&self) -> usize {
        self.low.load(Relaxed)
    }

    /// Charged pages, not counting those held for a write-back retry.
    pub fn counted(&self) -> usize {
        self.charged
            .load(SeqCst)
            .saturating_sub(self.unwritable.load(SeqCst))
    }

    /// Charges `n` pages if the count stays within `max`; wakes the
    /// evictors when it reaches the high-water mark. Async-signal-safe.
    pub fn try_charge(&self, n: usize) -> bool {
        let mut cur = self.charged.load(SeqCst);
        let before = loop {
            let stuck = self.unwritable.load(SeqCst);
            let before = cur.saturating_sub(stuck);
            if before + n > self.max {
                return false;
            }
            match self
                .charged
                .compare_exchange_weak(cur, cur + n, SeqCst, SeqCst)
            {
                Ok(_) => break before,
                Err(now) => cur = now,
            }
        };
        self.max_charged.fetch_max(cur + n, Relaxed);
        if before + n >= self.high() {
            self.rose(before, before + n);
            self.kick();
        }
        true
    }

    /// Charges `n` pages whatever the count (a fault that gave up waiting).
    pub fn force_charge(&self, n: usize) {
        let now = self.charged.fetch_add(n, SeqCst) + n;
        self.max_charged.fetch_max(now, Relaxed);
        let stuck = self.unwritable.load(SeqCst);
        self.rose(now.saturating_sub(stuck + n), now.saturating_sub(stuck));
        self.kick();
    }

    /// The count went from `before` to `after` pages: counts a crossing
    /// of the high-water mark (before the kick that follows it, so an
    /// evictor that looks at [`Self::high_crossings`] before it sleeps
    /// never misses one).
    fn rose(&self, before: usize, after: usize) {
        let high = self.high();
        if before < high && after >= high {
            self.crossings.fetch_add(1, SeqCst);
        }
    }

    /// Times the count rose to the high-water mark from under it.
    pub fn high_crossings(&self) -> u64 {
        self.crossings.load(SeqCst)
    }

    /// An evictor found the count at the high-water mark (it can get
    /// there without a charge: held pages written back count again):
    /// drains are due as after a crossing.
    pub fn at_high(&self) {
        self.crossings.fetch_add(1, SeqCst);
    }

    /// Whether the evictors drain toward the low-water mark: the count
    /// rose to the high-water mark since it was last down at the low one.
    /// So they drain also when a fault that found the budget full evicted
    /// a batch for itself and took the count back under the high-water
    /// mark before any evictor looked (UMap's hysteresis: from the high
    /// mark down to the low one, whoever else evicts meanwhile). The
    /// evictors share it: one that rested while the others finished does
    /// not start again below the high-water mark. Clears it at the
    /// low-water mark.
    pub fn drain_due(&self) -> bool {
        let seen = self.crossings.load(SeqCst);
        if self.drained.load(SeqCst) >= seen {
            return false;
        }
        if self.above_low() {
            return true;
        }
        // Down at the mark after every crossing up to `seen` (a later one
        // leaves `drained` behind it: still due).
        self.drained.fetch_max(seen, SeqCst);
        false
    }

    /// `n` charged pages left (evicted, or reserved and not installed):
    /// wakes faults waiting for room. Async-signal-safe.
    pub fn uncharge(&self, n: usize) {
        if n == 0 {
            return;
        }
        // Never below zero: a count that wrapped would refuse every
        // charge from then on (faults waiting for room for ever).
        let _ = self
            .charged
            .fetch_update(SeqCst, SeqCst, |c| Some(c.saturating_sub(n)));
        self.uncharges.fetch_add(n as u64, Relaxed);
        if self.room_sleepers.load(SeqCst) > 0 {
            self.room_seq.fetch_add(1, SeqCst);
            futex_wake_all(&self.room_seq);
        }
    }

    /// Wakes the evictors if any sleeps. Async-signal-safe.
    pub fn kick(&self) {
        if self.evictors_asleep.load(SeqCst) > 0 {
            self.evict_seq.fetch_add(1, SeqCst);
            futex_wake_all(&self.evict_seq);
        }
    }

    /// Whether the evictors have work: the count reached the high-water
    /// mark, or a fault waits for room.
    pub fn wants_eviction(&self) -> bool {
        self.counted() >= self.high() || self.waiting.load(SeqCst) > 0 || self.demand.load(SeqCst)
    }

    /// A fault that may neither evict nor wait found the budget full: the
    /// evictors make room for it (it is retried later).
    pub fn ask_for_room(&self) {
        self.demand.store(true, SeqCst);
        self.kick();
    }

    /// Whether a fault asked for room since the last call (the evictor).
    pub fn take_demand(&self) -> bool {
        self.demand.swap(false, SeqCst)
    }

    /// An evictor that drains toward the low-water mark takes on up to
    /// `batch` pages of what is above it and not yet taken on by another
    /// evictor, so that several evictors together stop at the mark instead
    /// of each evicting a batch past it. Returns the pages taken on (0:
    /// nothing left to do); [`Self::end_drain`] gives them back once
    /// evicted. A page evicted and not yet given back counts twice, so the
    /// evictors stop early rather than late.
    pub fn reserve_drain(&self, batch: usize) -> usize {
        let mut taken = self.draining.load(SeqCst);
        loop {
            let over = self.counted().saturating_sub(self.low() + taken);
            let want = over.min(batch);
            if want == 0 {
                return 0;
            }
            match self
                .draining
                .compare_exchange(taken, taken + want, SeqCst, SeqCst)
            {
                Ok(_) => return want,
                Err(now) => taken = now,
            }
        }
    }

    /// The end of a [`Self::reserve_drain`] of `n` pages.
    pub fn end_drain(&self, n: usize) {
        self.draining.fetch_sub(n, SeqCst);
    }

    /// Pages uncharged so far.
    pub fn uncharged(&self) -> u64 {
        self.uncharges.load(Relaxed)
    }

    /// Whether no page fits any more.
    pub fn is_full(&self) -> bool {
        self.counted() >= self.max
    }

    /// Whether the count is above the low-water mark.
    pub fn above_low(&self) -> bool {
        self.counted() > self.low()
    }

    /// Whether a fault waits for room.
    pub fn has_waiters(&self) -> bool {
        self.waiting.load(SeqCst) > 0
    }

    /// The evictor's sleep: until kicked, or `timeout`; not at all while
    /// there is work, unless `idle` (it just found nothing to evict), nor
    /// when the count crossed the high-water mark since the evictor saw
    /// [`Self::high_crossings`] at `crossings`.
    pub fn evictor_sleep(&self, timeout: Duration, idle: bool, crossings: u64) {
        self.evictors_asleep.fetch_add(1, SeqCst);
        let seq = self.evict_seq.load(SeqCst);
        if (idle || !self.wants_eviction()) && self.high_crossings() == crossings {
            futex_wait(&self.evict_seq, seq, timeout);
        }
        self.evictors_asleep.fetch_sub(1, SeqCst);
    }

    /// A fault that found no room: registers as waiting (the evictors see
    /// it) until [`Self::stop_waiting`].
    pub fn start_waiting(&self) {
        self.waiting.fetch_add(1, SeqCst);
        self.kick();
    }

    pub fn stop_waiting(&self) {
        self.waiting.fetch_sub(1, SeqCst);
    }

    /// Sleeps until pages are uncharged (or `timeout`), unless `n` pages
    /// fit already. Async-signal-safe (a futex wait).
    pub fn wait_for_room(&self, n: usize, timeout: Duration) {
        self.room_sleepers.fetch_add(1, SeqCst);
        let seq = self.room_seq.load(SeqCst);
        if self.counted() + n > self.max {
            futex_wait(&self.room_seq, seq, timeout);
        }
        self.room_sleepers.fetch_sub(1, SeqCst);
    }

    fn hold_unwritable(&self, held: bool) {
        if held {
            self.unwritable.fetch_add(1, SeqCst);
        } else {
            self.unwritable.fetch_sub(1, SeqCst);
        }
    }
}

/// One resident budget for several regions (UMap's one buffer for every
/// region): each region built with [`crate::RegionBuilder::shared_budget`]
/// charges its pages here (and counts them in its own [`EvictionStats`]),
/// so all of them together never hold more than [`pages`](Self::pages)
/// (see `BudgetCore`'s exceptions). From the high-water mark on, every
/// region's evictor evicts its own pages, by its own policy, until the
/// total is down to the low-water mark; a fault that finds the total at
/// the budget evicts pages of its own region first, or waits for the
/// evictors. There is no global victim order.
#[derive(Debug)]
pub struct SharedBudget {
    core: BudgetCore,
}

impl SharedBudget {
    /// A budget of `pages` resident pages (at least 1); evictors start
    /// when it is full and evict down to `low_water` (at most `pages`).
    pub fn new(pages: usize, low_water: usize) -> SharedBudget {
        Self::with_marks(pages, pages, low_water)
    }

    /// A budget of `pages` resident pages (at least 1) whose evictors
    /// start at `high_water` pages (1..=`pages`) and evict down to
    /// `low_water` (at most `high_water`): UMap's `UMAP_BUFSIZE` and its
    /// `UMAP_EVICT_HIGH_WATER_THRESHOLD`/`LOW_WATER` percentages.
    pub fn with_marks(pages: usize, high_water: usize, low_water: usize) -> SharedBudget {
        SharedBudget {
            core: BudgetCore::new(pages, high_water, low_water),
        }
    }

    /// The budget, in pages.
    pub fn pages(&self) -> usize {
        self.core.max()
    }

    /// Where the evictors start, in pages.
    pub fn high_water(&self) -> usize {
        self.core.high()
    }

    /// Where the evictors stop, in pages.
    pub fn low_water(&self) -> usize {
        self.core.low()
    }

    /// Pages charged now in all its regions together: resident, plus those
    /// being installed.
    pub fn resident(&self) -> usize {
        self.core.charged.load(Relaxed)
    }

    /// Most pages charged at once in all its regions together.
    pub fn max_resident(&self) -> usize {
        self.core.max_charged.load(Relaxed)
    }
}

/// What eviction decides with, shared by the evictor thread and the
/// faulting threads that evict for themselves: the policy, and the dirty
/// pages held back because their write-back failed (with when to retry).
/// Behind a mutex; sized when built so that, while the budget holds, no
/// operation allocates (faulting threads use it inside a signal handler).
pub(crate) struct VictimState {
    pub policy: Box<dyn EvictionPolicy>,
    /// Dirty pages whose write-back failed, oldest first.
    pub held: VecDeque<usize>,
    /// Backoff before the next retry of `held`.
    pub retry_delay: Duration,
    /// When the next retry is due; `Some` while the store is failing.
    pub retry_due: Option<Instant>,
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

/// How long the evictor waits for a handler to handle its zap's REMOVE
/// event (a handler thread descheduled that long is a machine in trouble;
/// the evictor then goes on, as before the handshake existed).
const ZAP_ACK_WAIT: Duration = Duration::from_secs(1);

/// The budget side of the fault path: the install log, the region's own
/// budget (or the shared one it charges), counters.
pub(crate) struct BudgetFeed {
    /// The region's own budget; unused when `shared` is set.
    own: BudgetCore,
    /// The budget this region shares with others, if any: pages are
    /// charged there.
    shared: Option<Arc<SharedBudget>>,
    log: Box<[AtomicU64]>,
    tail: AtomicU64,
    head: AtomicU64,
    /// Pages of this region resident now (installed, not yet evicted).
    pub resident: AtomicUsize,
    max_resident: AtomicUsize,
    pub evicted: AtomicU64,
    pub written_back: AtomicU64,
    pub write_back_errors: AtomicU64,
    /// Dirty pages of this region whose write-back failed, held resident
    /// for a retry.
    pub unwritable: AtomicUsize,
    pub skipped_io_busy: AtomicU64,
    pub full_faults: AtomicU64,
    pub evicted_inline: AtomicU64,
    pub room_cycles: AtomicU64,
    pub evictor_wakeups: AtomicU64,
    pub zap_calls: AtomicU64,
    pub overruns: AtomicU64,
    /// The run of pages the evictor is zapping, its first page plus one
    /// (0: none) and its end, and how many of its pages engines have
    /// handled REMOVE events for (see [`Self::zap`]).
    zap_start: AtomicUsize,
    zap_end: AtomicUsize,
    zap_handled: AtomicUsize,
    /// Access hints for the policy, lossy (eviction drains it).
    hints: PageRing,
    /// Rings of [`crate::evict::ReclaimWatch`]es: every evicted page is
    /// pushed to each (lossy); a ring nobody else holds is dropped.
    reclaim_watchers: Mutex<Vec<Arc<PageRing>>>,
    /// `reclaim_watchers.len()`, read without the lock by eviction.
    reclaim_watching: AtomicUsize,
    /// The policy and held pages, set when the evictor starts.
    pub victims: OnceLock<Mutex<VictimState>>,
}

impl std::fmt::Debug for BudgetFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetFeed")
            .field("core", self.core())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl BudgetFeed {
    /// For a region of `pages` pages with a budget of `budget` resident
    /// pages (its own, or `shared`). `_window` (the largest read-ahead
    /// window) is no longer needed: faults charge before they install.
    pub fn new(
        pages: usize,
        budget: usize,
        _window: usize,
        shared: Option<Arc<SharedBudget>>,
    ) -> BudgetFeed {
        // Every logged install is drained before its page can be evicted,
        // so at most `pages` entries are ever outstanding.
        let cap = pages.max(1024).next_power_of_two();
        BudgetFeed {
            own: BudgetCore::new(budget, budget, budget),
            shared,
            log: crate::residency::zeroed_words(cap),
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            resident: AtomicUsize::new(0),
            max_resident: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            write_back_errors: AtomicU64::new(0),
            unwritable: AtomicUsize::new(0),
            skipped_io_busy: AtomicU64::new(0),
            full_faults: AtomicU64::new(0),
            evicted_inline: AtomicU64::new(0),
            room_cycles: AtomicU64::new(0),
            evictor_wakeups: AtomicU64::new(0),
            zap_calls: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            zap_start: AtomicUsize::new(0),
            zap_end: AtomicUsize::new(0),
            zap_handled: AtomicUsize::new(0),
            hints: PageRing::new(HINT_SLOTS),
            reclaim_watchers: Mutex::new(Vec::new()),
            reclaim_watching: AtomicUsize::new(0),
            victims: OnceLock::new(),
        }
    }

    /// The budget pages are charged to: the shared one, or the region's.
    #[inline]
    pub fn core(&self) -> &BudgetCore {
        match &self.shared {
            Some(s) => &s.core,
            None => &self.own,
        }
    }

    /// The high-water mark of the region's own budget.
    pub fn own_high(&self) -> usize {
        self.own.high()
    }

    /// Sets the region's own low-water mark (no effect on a shared
    /// budget, whose marks are its own).
    pub fn set_low_water(&self, low: usize) {
        self.own.low.store(low.min(self.own.high()), Relaxed);
    }

    /// An eviction of one page of this region: uncharged, counted.
    pub fn evicted_one(&self) {
        self.resident.fetch_sub(1, SeqCst);
        self.evicted.fetch_add(1, Relaxed);
        self.core().uncharge(1);
    }

    /// A page of this region found dropped behind our back (the residency
    /// map said resident, the memory said otherwise): uncharged, not
    /// counted as an eviction.
    pub fn dropped_one(&self) {
        self.resident.fetch_sub(1, SeqCst);
        self.core().uncharge(1);
    }

    /// A dirty page held for a write-back retry (`held`) or released from
    /// it (`!held`).
    pub fn hold_unwritable(&self, held: bool) {
        if held {
            self.unwritable.fetch_add(1, SeqCst);
        } else {
            self.unwritable.fetch_sub(1, SeqCst);
        }
        self.core().hold_unwritable(held);
    }

    /// Posts an access hint for `page` (an I/O touched it). Never waits:
    /// when the ring is full the hint is dropped and counted.
    pub fn hint(&self, page: usize) {
        self.hints.push(page);
    }

    /// Hands every posted hint to `f` (eviction, under the victim lock).
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

    /// Eviction took `page`: tells the watchers (lossy, never waits on a
    /// consumer; without watchers one atomic load).
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

    /// Logs that `page` was installed (charged already). Async-signal-safe,
    /// wait-free.
    #[inline]
    pub fn installed(&self, page: usize) {
        // Wrapping: a fault that finds this page present but unmapped may
        // count it dropped (`dropped_one`) before its installer gets here,
        // so the counter can be one below zero for that moment; modular
        // arithmetic keeps the sum right once both have run.
        let now = self.resident.fetch_add(1, SeqCst).wrapping_add(1);
        self.max_resident.fetch_max(now, Relaxed);
        let i = self.tail.fetch_add(1, SeqCst) as usize & (self.log.len() - 1);
        self.log[i].store(page as u64 + 1, SeqCst);
    }

    /// Zaps the run `pages` for eviction (the caller holds their claims)
    /// of a region whose engine reads its events, and records them absent.
    /// Waits (at most [`ZAP_ACK_WAIT`]) until handlers have
    /// *handled* the REMOVE events the zap posts for every page of the
    /// run, not merely read them: `madvise` returns once an event is
    /// read, and with several handler threads the one that read it may
    /// run its `on_remove` only later. Had the claims been released before
    /// that, a fault could re-install a page and the late `on_remove` mark
    /// it absent while mapped, losing it from the map (and its dirty data
    /// from write-back). One run at a time (only the evictor thread zaps
    /// when events are read), one `madvise` and so one REMOVE round trip
    /// with the handler per run: a sequential scan's victims are one run
    /// per batch.
    pub fn zap(&self, r: &super::RegionState, pages: Range<usize>) {
        let len = pages.len();
        self.zap_handled.store(0, SeqCst);
        self.zap_end.store(pages.end, SeqCst);
        // Last: `removed` reads the start first and counts nothing while
        // it is 0.
        self.zap_start.store(pages.start + 1, SeqCst);
        let ps = r.pages.size().bytes();
        let _ = mem::madvise(r.pages.addr(pages.start), len * ps, Advice::DontNeed);
        self.zap_calls.fetch_add(1, Relaxed);
        let deadline = Instant::now() + ZAP_ACK_WAIT;
        while self.zap_handled.load(SeqCst) < len && Instant::now() <= deadline {
            std::thread::yield_now();
        }
        self.zap_start.store(0, SeqCst);
        r.residency.set_range(pages, PageState::Absent);
    }

    /// An engine has handled a REMOVE event for `pages` (and marked them
    /// absent): counts the pages of the evictor's zap among them.
    pub fn removed(&self, pages: Range<usize>) {
        let start = self.zap_start.load(SeqCst);
        if start == 0 {
            return;
        }
        let (start, end) = (start - 1, self.zap_end.load(SeqCst));
        let overlap = pages.end.min(end).saturating_sub(pages.start.max(start));
        if overlap > 0 {
            self.zap_handled.fetch_add(overlap, SeqCst);
        }
    }

    /// Hands every logged install to `f`, oldest first (eviction, under
    /// the victim lock).
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
            full_faults: self.full_faults.load(Relaxed),
            evicted_inline: self.evicted_inline.load(Relaxed),
            room_cycles: self.room_cycles.load(Relaxed),
            evictor_wakeups: self.evictor_wakeups.load(Relaxed),
            zap_calls: self.zap_calls.load(Relaxed),
            overruns: self.overruns.load(Relaxed),
        }
    }
}

impl Drop for BudgetFeed {
    /// The region is gone: its pages no longer count against the budget
    /// it shared.
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.core.uncharge(*self.resident.get_mut());
            s.core
                .unwritable
                .fetch_sub(*self.unwritable.get_mut(), SeqCst);
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
