//! CLOCK (second chance): FIFO that spares pages used since the hand last
//! passed them.
//!
//! How it works:
//!
//! 1. Resident pages sit on a circle; the hand points at the oldest.
//! 2. A new page enters just behind the hand with its referenced bit clear.
//!    (userfaultfd reports only the first touch, so the bit is set only by
//!    later evidence: [`Clock::mark_referenced`], an access hint, or
//!    `on_fault` for a page already held.)
//! 3. To pick a victim the hand advances: a referenced page has its bit
//!    cleared and is passed (its second chance), a pinned page is passed,
//!    the first unreferenced unpinned page is the victim.
//!
//! ```text
//!        hand
//!         ▼
//!   ┌─▶ [a|1] ─▶ [b|0] ─▶ [c|1] ─┐     a: clear bit, pass; b: victim
//!   └────────────────────────────┘
//! ```
//!
//! Each bit clear is paid for by the hint that set it, so the cost is
//! amortised O(1) per operation plus one step per pinned page passed.

use super::list::{clock_sweep, PageList};
use super::EvictionPolicy;

/// CLOCK eviction with a referenced bit per page.
#[derive(Default)]
pub struct Clock {
    ring: PageList,
}

impl Clock {
    /// An empty clock.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty clock that holds `pages` pages without allocating.
    pub fn with_capacity(pages: usize) -> Self {
        Self {
            ring: PageList::with_capacity(pages),
        }
    }

    /// Sets the referenced bit of `page`; returns whether the page is held.
    pub fn mark_referenced(&mut self, page: usize) -> bool {
        self.ring.set_flag(page, true)
    }

    /// The referenced bit of `page`, if held.
    pub fn is_referenced(&self, page: usize) -> Option<bool> {
        self.ring.flag(page)
    }
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn on_fault(&mut self, page: usize) {
        if !self.ring.push_back(page, false) {
            self.ring.set_flag(page, true);
        }
    }

    fn on_access_hint(&mut self, page: usize) {
        self.mark_referenced(page);
    }

    fn on_evicted(&mut self, page: usize) {
        self.ring.remove(page);
    }

    fn pick_victim(&mut self, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        clock_sweep(&mut self.ring, is_pinned)
    }

    fn len(&self) -> usize {
        self.ring.len()
    }

    fn contains(&self, page: usize) -> bool {
        self.ring.contains(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_chance() {
        let mut c = Clock::new();
        for p in 0..4 {
            c.on_fault(p);
        }
        assert!(c.mark_referenced(0));
        assert!(!c.mark_referenced(42));
        c.on_access_hint(2);
        // 0 is referenced: spared (bit cleared), 1 is the victim.
        assert_eq!(c.pick_victim(&|_| false), Some(1));
        assert_eq!(c.is_referenced(0), Some(false));
        // Order now 2(ref) 3 0: 2 spared, 3 evicted.
        assert_eq!(c.pick_victim(&|_| false), Some(3));
        assert_eq!(c.pick_victim(&|_| false), Some(0));
        assert_eq!(c.pick_victim(&|_| false), Some(2));
        assert_eq!(c.pick_victim(&|_| false), None);
    }

    #[test]
    fn without_hints_behaves_like_fifo() {
        let mut c = Clock::new();
        for p in [7, 1, 4] {
            c.on_fault(p);
        }
        let order: Vec<_> = std::iter::from_fn(|| c.pick_victim(&|_| false)).collect();
        assert_eq!(order, vec![7, 1, 4]);
    }

    #[test]
    fn refault_of_held_page_counts_as_access() {
        let mut c = Clock::new();
        c.on_fault(1);
        c.on_fault(2);
        c.on_fault(1);
        assert_eq!(c.pick_victim(&|_| false), Some(2));
    }

    #[test]
    fn pinned_referenced_pages_are_passed() {
        let mut c = Clock::new();
        for p in 0..3 {
            c.on_fault(p);
            c.mark_referenced(p);
        }
        assert_eq!(c.pick_victim(&|p| p != 2), Some(2));
        assert_eq!(c.pick_victim(&|_| true), None);
        assert_eq!(c.len(), 2);
    }
}
