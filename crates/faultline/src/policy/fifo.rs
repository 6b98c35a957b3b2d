//! First in, first out: evict the page that became resident first.
//!
//! This is UMap's policy. It ignores accesses entirely, so a hot page is
//! evicted as readily as a cold one; its merits are that it costs O(1) and
//! needs no access information, which userfaultfd does not provide.

use super::list::PageList;
use super::EvictionPolicy;

/// FIFO eviction: victims in the order pages became resident.
///
/// A pinned page keeps its place in the queue; the victim is the oldest
/// unpinned page (cost: one step per pinned page in front of it).
#[derive(Default)]
pub struct Fifo {
    queue: PageList,
}

impl Fifo {
    /// An empty FIFO.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty FIFO that holds `pages` pages without allocating.
    pub fn with_capacity(pages: usize) -> Self {
        Self {
            queue: PageList::with_capacity(pages),
        }
    }
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn on_fault(&mut self, page: usize) {
        // A page already queued keeps its original position.
        self.queue.push_back(page, false);
    }

    fn on_evicted(&mut self, page: usize) {
        self.queue.remove(page);
    }

    fn pick_victim(&mut self, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
        let victim = self.queue.find_from_front(|p| !is_pinned(p))?;
        self.queue.remove(victim);
        Some(victim)
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn contains(&self, page: usize) -> bool {
        self.queue.contains(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn evicts_in_insertion_order_skipping_pinned() {
        let mut f = Fifo::new();
        for p in [5, 3, 9, 1] {
            f.on_fault(p);
        }
        f.on_fault(5); // re-fault does not move it
        f.on_access_hint(5);
        assert_eq!(f.pick_victim(&|p| p == 3), Some(5));
        assert_eq!(f.pick_victim(&|p| p == 3), Some(9));
        f.on_evicted(1);
        assert_eq!(f.pick_victim(&|p| p == 3), None);
        assert_eq!(f.pick_victim(&|_| false), Some(3));
        assert!(f.is_empty());
    }

    proptest! {
        #[test]
        fn drains_in_first_insertion_order(pages in proptest::collection::vec(0usize..200, 0..300)) {
            let mut f = Fifo::new();
            let mut expected = Vec::new();
            for &p in &pages {
                if !expected.contains(&p) {
                    expected.push(p);
                }
                f.on_fault(p);
            }
            let mut got = Vec::new();
            while let Some(v) = f.pick_victim(&|_| false) {
                got.push(v);
            }
            prop_assert_eq!(got, expected);
        }
    }
}
