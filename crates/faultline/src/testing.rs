//! Test support, usable by users to test their own programs: a store that
//! injects failures, ([`child`]) tests run in child processes with
//! deadlines, a pool of free hugetlb pages ([`HugePool`]), and a process's
//! threads with their CPUs ([`threads`]).
//!
//! [`FaultyStore`] wraps any [`PageStore`] and, following the [`Fault`]
//! rules it was built with, makes `fill` or `write_back` fail, panic,
//! stall or run slowly: at chosen pages or page ranges, at a seeded
//! random rate, after N calls, and for a while (N injections or a
//! duration) before it recovers. [`FaultyStore::heal`] stops every
//! injection at once; [`FaultyStore::injected`] counts what it did.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use faultline::testing::{Action, Fault, FaultyStore};
//! use faultline::MemoryStore;
//!
//! let store = Arc::new(
//!     FaultyStore::builder(MemoryStore::new(vec![7; 64 * 4096]))
//!         // Page 9's data is unreadable.
//!         .rule(Fault::fill(Action::Fail).pages(9..10))
//!         // One write-back in ten fails, for the first five failures only.
//!         .rule(Fault::write_back(Action::Fail).rate(0.1).seed(42).times(5))
//!         // Every fill of pages 32.. takes 2 ms.
//!         .rule(Fault::fill(Action::Slow(Duration::from_millis(2))).pages(32..))
//!         .build(),
//! );
//! # let _ = store;
//! ```
//!
//! # Signal safety
//! A `FaultyStore` is as signal-safe as its inner store
//! ([`PageStore::signal_safe`]) for the actions [`Action::Fail`],
//! [`Action::Stall`] and [`Action::Slow`]: the rules are fixed when the
//! store is built, matching a call is a few atomics, a failure is a
//! [`StoreError::Failed`] with a static reason (no allocation), and a stall
//! or a slow call sleeps in a loop of bounded `nanosleep`s (checking
//! [`heal`](FaultyStore::heal) between them), never longer than its
//! duration. [`Action::Panic`] unwinds, which allocates: it exists to test
//! the runtime's fail-closed path, which aborts the process anyway.

pub mod child;
mod hugepool;
mod threads;
pub use hugepool::HugePool;
pub use threads::{threads, ProcThread};

use std::ops::{Bound, Range, RangeBounds};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use crate::store::{FillRange, PageCacheFile, PageStore, StoreError, Tail};

/// Which store call a [`Fault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// [`PageStore::fill`] (and [`PageStore::view`], which is turned off
    /// for a store with fill rules so every read goes through `fill`).
    Fill,
    /// [`PageStore::write_back`].
    WriteBack,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Return [`StoreError::Failed`] with the reason "injected failure".
    Fail,
    /// Panic (not signal-safe; see the module docs).
    Panic,
    /// Block for this long, then fail with "injected stall" (a store that
    /// hangs and then times out). [`FaultyStore::heal`] ends it early.
    Stall(Duration),
    /// Sleep this long, then do the real call (a slow store).
    Slow(Duration),
}

impl Action {
    fn index(self) -> usize {
        match self {
            Action::Fail => 0,
            Action::Panic => 1,
            Action::Stall(_) => 2,
            Action::Slow(_) => 3,
        }
    }
}

/// One injection rule: an [`Op`], an [`Action`], and when it applies. A
/// call matches when it is of the rule's op, its byte range overlaps the
/// rule's pages, and (with a rate) the seeded draw says so; the rule
/// injects from its `after`-th matching call on, at most `times` times and
/// for at most `for_duration` after its first injection, then the store
/// recovers.
#[derive(Debug, Clone)]
pub struct Fault {
    op: Op,
    action: Action,
    pages: Range<u64>,
    /// Probability in parts per 2^32 (None: always).
    rate: Option<u64>,
    seed: u64,
    after: u64,
    times: Option<u64>,
    for_duration: Option<Duration>,
}

impl Fault {
    /// A rule for `fill` calls.
    pub fn fill(action: Action) -> Fault {
        Fault::new(Op::Fill, action)
    }

    /// A rule for `write_back` calls.
    pub fn write_back(action: Action) -> Fault {
        Fault::new(Op::WriteBack, action)
    }

    /// A rule for `op` calls: every call, from the first, for ever.
    pub fn new(op: Op, action: Action) -> Fault {
        Fault {
            op,
            action,
            pages: 0..u64::MAX,
            rate: None,
            seed: 0x9E37_79B9_7F4A_7C15,
            after: 0,
            times: None,
            for_duration: None,
        }
    }

    /// Only calls touching these store pages (of the store's page size,
    /// [`FaultyStoreBuilder::page_size`], 4 KiB by default).
    pub fn pages(mut self, pages: impl RangeBounds<u64>) -> Fault {
        let start = match pages.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match pages.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        self.pages = start..end;
        self
    }

    /// Only a fraction `p` (0..=1) of the matching calls, drawn from a
    /// generator seeded with [`seed`](Self::seed): the same seed and the
    /// same sequence of calls inject at the same calls.
    pub fn rate(mut self, p: f64) -> Fault {
        self.rate = Some((p.clamp(0.0, 1.0) * (1u64 << 32) as f64) as u64);
        self
    }

    /// The seed of the [`rate`](Self::rate) draw.
    pub fn seed(mut self, seed: u64) -> Fault {
        self.seed = seed | 1;
        self
    }

    /// Let the first `n` matching calls through untouched.
    pub fn after_calls(mut self, n: u64) -> Fault {
        self.after = n;
        self
    }

    /// Inject at most `n` times, then recover.
    pub fn times(mut self, n: u64) -> Fault {
        self.times = Some(n);
        self
    }

    /// Inject for `d` after the first injection, then recover.
    pub fn for_duration(mut self, d: Duration) -> Fault {
        self.for_duration = Some(d);
        self
    }

    /// The op this rule applies to.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The action it injects.
    pub fn action(&self) -> Action {
        self.action
    }
}

/// A rule and its run-time state (all atomics: matched from any thread,
/// including a signal handler).
#[derive(Debug)]
struct Rule {
    fault: Fault,
    rng: AtomicU64,
    matched: AtomicU64,
    injected: AtomicU64,
    /// Nanoseconds after the store's epoch of the first injection, + 1.
    first: AtomicU64,
}

/// Counts of what a [`FaultyStore`] saw and injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected {
    /// `fill` calls (all of them).
    pub fill_calls: u64,
    /// `write_back` calls (all of them).
    pub write_back_calls: u64,
    /// Injected into `fill`: failures, panics, stalls, slow calls.
    pub fill: ActionCounts,
    /// Injected into `write_back`.
    pub write_back: ActionCounts,
}

/// Injections per [`Action`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActionCounts {
    /// [`Action::Fail`].
    pub failed: u64,
    /// [`Action::Panic`].
    pub panicked: u64,
    /// [`Action::Stall`].
    pub stalled: u64,
    /// [`Action::Slow`].
    pub slowed: u64,
}

impl ActionCounts {
    /// Failures, panics and stalls (slow calls succeed).
    pub fn errors(&self) -> u64 {
        self.failed + self.panicked + self.stalled
    }
}

/// Builds a [`FaultyStore`].
#[derive(Debug)]
pub struct FaultyStoreBuilder<S> {
    inner: S,
    page_size: u64,
    rules: Vec<Fault>,
}

impl<S: PageStore> FaultyStoreBuilder<S> {
    /// The unit of [`Fault::pages`] in bytes (default 4096).
    pub fn page_size(mut self, bytes: u64) -> Self {
        self.page_size = bytes.max(1);
        self
    }

    /// Adds a rule. The first rule that injects into a call decides it.
    pub fn rule(mut self, fault: Fault) -> Self {
        self.rules.push(fault);
        self
    }

    /// The store.
    pub fn build(self) -> FaultyStore<S> {
        let name = format!("faulty {}", self.inner.describe());
        FaultyStore {
            name,
            page_size: self.page_size,
            rules: self
                .rules
                .into_iter()
                .map(|f| Rule {
                    rng: AtomicU64::new(f.seed),
                    fault: f,
                    matched: AtomicU64::new(0),
                    injected: AtomicU64::new(0),
                    first: AtomicU64::new(0),
                })
                .collect(),
            inner: self.inner,
            epoch: Instant::now(),
            healed: AtomicBool::new(false),
            calls: [AtomicU64::new(0), AtomicU64::new(0)],
            counts: Default::default(),
        }
    }
}

/// A store that injects failures into another. See the module docs.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    name: String,
    page_size: u64,
    rules: Box<[Rule]>,
    epoch: Instant,
    healed: AtomicBool,
    /// Calls per op (fill, write-back).
    calls: [AtomicU64; 2],
    /// Injections per op and action.
    counts: [[AtomicU64; 4]; 2],
}

/// The longest single sleep of a stall or slow call, so `heal` ends it
/// promptly.
const SLEEP_SLICE: Duration = Duration::from_millis(5);

impl<S: PageStore> FaultyStore<S> {
    /// A builder wrapping `inner`, with no rules yet.
    pub fn builder(inner: S) -> FaultyStoreBuilder<S> {
        FaultyStoreBuilder {
            inner,
            page_size: 4096,
            rules: Vec::new(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Stops every injection from now on (and ends stalls in progress):
    /// the store has recovered.
    pub fn heal(&self) {
        self.healed.store(true, SeqCst);
    }

    /// Whether [`heal`](Self::heal) was called.
    pub fn is_healed(&self) -> bool {
        self.healed.load(SeqCst)
    }

    /// What the store saw and injected so far.
    pub fn injected(&self) -> Injected {
        let c = |op: usize| ActionCounts {
            failed: self.counts[op][0].load(Relaxed),
            panicked: self.counts[op][1].load(Relaxed),
            stalled: self.counts[op][2].load(Relaxed),
            slowed: self.counts[op][3].load(Relaxed),
        };
        Injected {
            fill_calls: self.calls[0].load(Relaxed),
            write_back_calls: self.calls[1].load(Relaxed),
            fill: c(0),
            write_back: c(1),
        }
    }

    fn has_rules(&self, op: Op) -> bool {
        self.rules.iter().any(|r| r.fault.op == op)
    }

    /// The action to inject into this call, if any. Async-signal-safe.
    fn pick(&self, op: Op, offset: u64, len: usize) -> Option<Action> {
        let opi = op as usize;
        self.calls[opi].fetch_add(1, Relaxed);
        if self.is_healed() {
            return None;
        }
        let first = offset / self.page_size;
        let last = (offset + len.max(1) as u64 - 1) / self.page_size;
        for rule in self.rules.iter() {
            let f = &rule.fault;
            if f.op != op || last < f.pages.start || first >= f.pages.end {
                continue;
            }
            if let Some(rate) = f.rate {
                // xorshift64*, one step per matching call.
                let x = rule
                    .rng
                    .fetch_update(SeqCst, SeqCst, |mut x| {
                        x ^= x >> 12;
                        x ^= x << 25;
                        x ^= x >> 27;
                        Some(x)
                    })
                    .expect("always Some");
                let draw = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32;
                if draw >= rate {
                    continue;
                }
            }
            if rule.matched.fetch_add(1, SeqCst) < f.after {
                continue;
            }
            let now = self.epoch.elapsed().as_nanos() as u64 + 1;
            if let Some(d) = f.for_duration {
                let _ = rule.first.compare_exchange(0, now, SeqCst, SeqCst);
                let since = rule.first.load(SeqCst);
                if now.saturating_sub(since) > d.as_nanos() as u64 {
                    continue;
                }
            }
            if let Some(n) = f.times {
                if rule
                    .injected
                    .fetch_update(SeqCst, SeqCst, |i| (i < n).then_some(i + 1))
                    .is_err()
                {
                    continue;
                }
            } else {
                rule.injected.fetch_add(1, SeqCst);
            }
            self.counts[opi][f.action.index()].fetch_add(1, Relaxed);
            return Some(f.action);
        }
        None
    }

    /// Sleeps `d` in bounded slices; false if healed meanwhile.
    fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        loop {
            if self.is_healed() {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            std::thread::sleep((end - now).min(SLEEP_SLICE));
        }
    }

    /// Applies `action`; `Ok(())` means do the real call.
    fn inject(&self, op: Op, action: Action, offset: u64) -> Result<(), StoreError> {
        let failed = |reason: &'static str| StoreError::Failed {
            offset,
            reason: std::borrow::Cow::Borrowed(reason),
        };
        match action {
            Action::Fail => Err(failed("injected failure")),
            Action::Panic => panic!("faulty store: injected panic in {op:?} at offset {offset:#x}"),
            Action::Stall(d) => {
                self.sleep(d);
                Err(failed("injected stall"))
            }
            Action::Slow(d) => {
                self.sleep(d);
                Ok(())
            }
        }
    }
}

impl<S: PageStore> PageStore for FaultyStore<S> {
    fn describe(&self) -> &str {
        &self.name
    }

    fn len(&self) -> Option<u64> {
        self.inner.len()
    }

    fn tail(&self) -> Tail {
        self.inner.tail()
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if let Some(a) = self.pick(Op::Fill, offset, buf.len()) {
            self.inject(Op::Fill, a, offset)?;
        }
        self.inner.fill(offset, buf)
    }

    fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
        if !self.has_rules(Op::Fill) {
            return self.inner.fill_batch(ranges, out);
        }
        // Each range through the rules, one by one.
        for (range, res) in ranges.iter_mut().zip(out.iter_mut()) {
            *res = self.fill(range.offset, range.buf);
        }
    }

    fn batched(&self) -> bool {
        self.inner.batched()
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        if let Some(a) = self.pick(Op::WriteBack, offset, data.len()) {
            self.inject(Op::WriteBack, a, offset)?;
        }
        self.inner.write_back(offset, data)
    }

    fn view(&self, offset: u64, len: usize) -> Option<crate::StoreView<'_>> {
        // A zero-copy view would bypass `fill` and its rules.
        if self.has_rules(Op::Fill) {
            None
        } else {
            self.inner.view(offset, len)
        }
    }

    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        if self.has_rules(Op::Fill) {
            None
        } else {
            self.inner.page_cache()
        }
    }

    fn is_zero(&self) -> bool {
        // A zero store never calls `fill`: keep the calls coming when
        // there are rules for them.
        !self.has_rules(Op::Fill) && self.inner.is_zero()
    }

    fn signal_safe(&self) -> bool {
        self.inner.signal_safe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn store(rule: Fault) -> FaultyStore<MemoryStore> {
        FaultyStore::builder(MemoryStore::new(vec![1; 16 * 4096]))
            .rule(rule)
            .build()
    }

    #[test]
    fn pages_select_calls_by_overlap() {
        let s = store(Fault::fill(Action::Fail).pages(4..6));
        let mut b = vec![0; 4096];
        assert!(s.fill(3 * 4096, &mut b).is_ok());
        assert!(s.fill(4 * 4096, &mut b).is_err());
        assert!(s.fill(5 * 4096, &mut b).is_err());
        assert!(s.fill(6 * 4096, &mut b).is_ok());
        // A two-page read reaching page 4 fails.
        let mut b2 = vec![0; 8192];
        assert!(s.fill(3 * 4096, &mut b2).is_err());
        let i = s.injected();
        assert_eq!((i.fill_calls, i.fill.failed), (5, 3));
        assert_eq!(b[0], 1);
    }

    #[test]
    fn after_and_times_recover() {
        let s = store(Fault::write_back(Action::Fail).after_calls(2).times(3));
        let d = vec![9; 4096];
        let r: Vec<bool> = (0..8).map(|_| s.write_back(0, &d).is_ok()).collect();
        assert_eq!(
            r,
            [true, true, false, false, false, true, true, true],
            "two through, three failures, then recovered"
        );
        assert_eq!(s.injected().write_back.failed, 3);
        assert_eq!(s.inner().snapshot()[0], 9);
    }

    #[test]
    fn rate_is_seeded_and_roughly_right() {
        let run = |seed| {
            let s = store(Fault::fill(Action::Fail).rate(0.25).seed(seed));
            let mut b = vec![0; 4096];
            (0..4000)
                .map(|_| s.fill(0, &mut b).is_err())
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7), "same seed, same injections");
        assert_ne!(a, run(8));
        let n = a.iter().filter(|&&x| x).count();
        assert!((800..1200).contains(&n), "{n} of 4000 at rate 0.25");
    }

    #[test]
    fn duration_and_heal_recover() {
        let s = store(Fault::fill(Action::Fail).for_duration(Duration::from_millis(30)));
        let mut b = vec![0; 4096];
        assert!(s.fill(0, &mut b).is_err());
        std::thread::sleep(Duration::from_millis(40));
        assert!(s.fill(0, &mut b).is_ok(), "recovered after the duration");

        let s = store(Fault::fill(Action::Stall(Duration::from_secs(60))));
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let mut b = vec![0; 4096];
                s.fill(0, &mut b)
            });
            while s.injected().fill.stalled == 0 {
                std::thread::yield_now();
            }
            s.heal();
            let e = h.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("injected stall"), "{e}");
        });
        assert!(s.fill(0, &mut b).is_ok());
    }

    #[test]
    fn slow_calls_succeed_and_fill_rules_turn_views_off() {
        let s = store(Fault::fill(Action::Slow(Duration::from_millis(2))));
        let mut b = vec![0; 4096];
        assert!(s.fill(0, &mut b).is_ok());
        assert_eq!(s.injected().fill.slowed, 1);
        assert!(s.view(0, 4096).is_none());
        let w = store(Fault::write_back(Action::Fail));
        assert!(w.view(0, 4096).is_some());
        assert!(w.signal_safe() && w.describe().starts_with("faulty "));
    }
}
