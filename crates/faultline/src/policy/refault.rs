//! Re-fault aware eviction: a simplified 2Q (Johnson and Shasha, VLDB 1994).
//!
//! userfaultfd tells the runtime about the *first* touch of a page and
//! nothing after, so the best evidence that a page is hot is that it comes
//! back: it faults again soon after being evicted. This policy remembers
//! recently evicted page numbers (a bounded *ghost* list, no data) and
//! protects pages that re-fault while still remembered.
//!
//! How it works:
//!
//! 1. A page faulting for the first time (or after being forgotten) goes to
//!    the back of `probation`, a FIFO.
//! 2. Victims come from the front of `probation` while it holds more than
//!    `probation_target` pages (or `protected` is empty); its page numbers go
//!    to the back of `ghost`, which forgets its oldest entry beyond
//!    `ghost_capacity`.
//! 3. A page that faults while in `ghost` is a *re-fault*: it leaves the
//!    ghost list and enters `protected`, managed by CLOCK (access hints and
//!    faults on held pages set its referenced bit).
//! 4. Otherwise victims come from `protected` by a CLOCK sweep. Pages evicted
//!    from `protected` are not remembered (as in 2Q): if still hot, they
//!    re-fault through probation and the ghost list again.
//!
//! ```text
//!   new fault ─▶ probation (FIFO) ──evict──▶ ghost (page numbers only)
//!                                                │ re-fault
//!                protected (CLOCK) ◀─────────────┘
//!                    │ evict (forgotten)
//! ```
//!
//! A sequential scan larger than memory thus flows through probation
//! without displacing the protected working set. Defaults follow the 2Q
//! paper: probation target 25 % of capacity, ghost list 50 %.
//! Every operation is O(1) (amortised for the CLOCK sweep) plus one step per
//! pinned page passed; memory is O(resident pages + ghost capacity).

use super::list::{clock_sweep, PageList};
use super::EvictionPolicy;

/// 2Q-style policy protecting pages that re-fault soon after eviction.
pub struct RefaultAware {
    probation: PageList,
    protected: PageList,
    ghost: PageList,
    probation_target: usize,
    ghost_capacity: usize,
    refaults: u64,
}

impl RefaultAware {
    /// A policy for a budget of `capacity_pages` resident pages, with the
    /// default tuning (probation target `capacity / 4`, ghost list
    /// `capacity / 2`, both at least 1).
    pub fn new(capacity_pages: usize) -> Self {
        let mut p = Self::with_tuning((capacity_pages / 4).max(1), (capacity_pages / 2).max(1));
        // Room for every resident page in either list, and the ghosts,
        // without allocating.
        p.probation = PageList::with_capacity(capacity_pages);
        p.protected = PageList::with_capacity(capacity_pages);
        p.ghost = PageList::with_capacity(p.ghost_capacity + 1);
        p
    }

    /// A policy with explicit sizes: victims come from probation while it
    /// holds more than `probation_target` pages; the ghost list remembers
    /// at most `ghost_capacity` evicted pages (0 disables protection).
    pub fn with_tuning(probation_target: usize, ghost_capacity: usize) -> Self {
        Self {
            probation: PageList::new(),
            protected: PageList::new(),
            ghost: PageList::new(),
            probation_target,
            ghost_capacity,
            refaults: 0,
        }
    }

    /// Number of faults on pages found in the ghost list so far.
    pub fn refaults(&self) -> u64 {
        self.refaults
    }

    /// Whether `page` is held in the protected set.
    pub fn is_protected(&self, page: usize) -> bool {
        self.protected.contains(page)
    }

    /// Number of evicted page numbers currently remembered.
    pub fn ghost_len(&self) -> usize {
        self.ghost.len()
    }

    fn remember(&mut self, page: usize) {
        if self.ghost_capacity == 0 {
            return;
        }
        while self.ghost.len() >= self.ghost_capacity {
            self.ghost.pop_front();
        }
        self.ghost.push_back(page, false);
    }

    fn evict_probation(&mut self, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        let victim = self.probation.find_from_front(|p| !is_pinned(p))?;
        self.probation.remove(victim);
        self.remember(victim);
        Some(victim)
    }
}

impl EvictionPolicy for RefaultAware {
    fn name(&self) -> &'static str {
        "refault"
    }

    fn on_fault(&mut self, page: usize) {
        if self.probation.contains(page) {
            // 2Q ignores repeated touches during probation (correlated
            // references).
        } else if self.protected.contains(page) {
            self.protected.set_flag(page, true);
        } else if self.ghost.remove(page) {
            self.refaults += 1;
            self.protected.push_back(page, false);
        } else {
            self.probation.push_back(page, false);
        }
    }

    fn on_access_hint(&mut self, page: usize) {
        self.protected.set_flag(page, true);
    }

    fn on_evicted(&mut self, page: usize) {
        if !self.probation.remove(page) {
            self.protected.remove(page);
        }
    }

    fn pick_victim(&mut self, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        if self.probation.len() > self.probation_target || self.protected.len() == 0 {
            self.evict_probation(is_pinned)
                .or_else(|| clock_sweep(&mut self.protected, is_pinned))
        } else {
            clock_sweep(&mut self.protected, is_pinned).or_else(|| self.evict_probation(is_pinned))
        }
    }

    fn len(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    fn contains(&self, page: usize) -> bool {
        self.probation.contains(page) || self.protected.contains(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Simulates a memory of `capacity` pages driven by `refs`; returns the
    /// number of faults.
    fn simulate(policy: &mut dyn EvictionPolicy, capacity: usize, refs: &[usize]) -> usize {
        let mut faults = 0;
        for &p in refs {
            if policy.contains(p) {
                policy.on_access_hint(p);
                continue;
            }
            faults += 1;
            if policy.len() == capacity {
                policy.pick_victim(&|_| false).expect("a victim");
            }
            policy.on_fault(p);
        }
        faults
    }

    #[test]
    fn refault_is_protected() {
        let mut r = RefaultAware::with_tuning(1, 4);
        r.on_fault(1);
        r.on_fault(2);
        assert_eq!(r.pick_victim(&|_| false), Some(1));
        assert_eq!(r.ghost_len(), 1);
        r.on_fault(1);
        assert!(r.is_protected(1));
        assert_eq!(r.refaults(), 1);
        r.on_fault(3);
        // probation {2, 3} exceeds its target: victims come from it first.
        assert_eq!(r.pick_victim(&|_| false), Some(2));
        assert_eq!(r.pick_victim(&|_| false), Some(1));
        assert_eq!(r.pick_victim(&|_| false), Some(3));
        assert_eq!(r.pick_victim(&|_| false), None);
    }

    #[test]
    fn ghost_is_bounded() {
        let mut r = RefaultAware::with_tuning(1, 3);
        for p in 0..100 {
            r.on_fault(p);
            r.pick_victim(&|_| false);
        }
        assert_eq!(r.ghost_len(), 3);
        assert!(r.is_empty());
    }

    #[test]
    fn hot_set_survives_scans_better_than_fifo() {
        // A hot set of 8 pages touched between long one-off scans.
        let mut refs = Vec::new();
        let mut cold = 1000;
        for _ in 0..200 {
            refs.extend(0..8);
            for _ in 0..12 {
                refs.push(cold);
                cold += 1;
            }
        }
        let capacity = 16;
        let fifo = simulate(&mut super::super::Fifo::new(), capacity, &refs);
        let refault = simulate(&mut RefaultAware::new(capacity), capacity, &refs);
        assert!(refault < fifo, "refault {refault} vs fifo {fifo}");
    }

    proptest! {
        #[test]
        fn ghost_never_exceeds_capacity(
            refs in proptest::collection::vec(0usize..100, 0..400),
            capacity in 1usize..32,
        ) {
            let mut r = RefaultAware::new(capacity);
            simulate(&mut r, capacity, &refs);
            prop_assert!(r.ghost_len() <= (capacity / 2).max(1));
            prop_assert!(r.len() <= capacity);
        }
    }
}
