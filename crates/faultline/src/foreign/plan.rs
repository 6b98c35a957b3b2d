//! The prefetch plan: a recorded working set made into the runs prefetch
//! installs, and the queue each peer keeps of them.
//!
//! ```text
//!   record (store offsets, first-touch order)
//!     │ PrefetchPlan::new: O(set), once for any number of peers
//!     ▼
//!   runs: (store offset, pages), in install order   40..43 | 3 | 5 | 30..34
//!     │ ForeignPeer::prefetch_plan: O(runs) per peer, split at its regions
//!     ▼
//!   PrefetchQueue: (region, pages) ── taken by the peer's handler thread and
//!                                     the prefetch helpers (prefetch.rs)
//! ```
//!
//! 1. In the set's order, around each page not yet in a run, the run is
//!    the longest contiguous stretch of set pages not yet in a run: a
//!    cluster is one run whatever order its pages were touched in, and the
//!    pages needed first come first.
//! 2. Holes between set pages are never bridged: a page costs more to copy
//!    than an ioctl.
//! 3. [`prepare_store`] reads and maps the set's store ranges before any
//!    peer connects, so an install only copies.

use std::collections::VecDeque;
use std::ops::Range;

use crate::page::PageSize;
use crate::residency::PageBits;
use crate::store::PageStore;

/// Prefetch runs (region index, pages) waiting, and how many runs were
/// taken out and are being installed.
#[derive(Debug, Default)]
pub(super) struct PrefetchQueue {
    /// (region index, region pages), in install order.
    pub runs: VecDeque<(usize, Range<usize>)>,
    /// Runs taken out by prefetchers and not yet put back or installed.
    pub taken: usize,
}

/// The page size of a [`PrefetchPlan`]'s runs (a record names base pages).
pub(super) const PLAN_PAGE: PageSize = PageSize::BASE;

/// A working set (store offsets of 4 KiB pages, in the order they were
/// first touched: a record) made into the runs prefetch installs, once,
/// for any number of peers ([`ForeignPeer::prefetch_plan`](super::ForeignPeer::prefetch_plan)). In the set's
/// order, around each page not yet in a run, the run is the longest
/// contiguous stretch of set pages not yet in a run: a cluster is one run
/// whatever order its pages were touched in, and the pages needed first
/// come first. Holes between set pages are never bridged (a page costs
/// more to copy than an ioctl). Building costs O(set); each peer's queue
/// then O(runs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefetchPlan {
    /// (store offset, 4 KiB pages), in install order.
    runs: Vec<(u64, u32)>,
    pages: usize,
}

impl PrefetchPlan {
    /// The plan of the set at `offsets` (store offsets, any alignment:
    /// each names its 4 KiB page; repeats are ignored).
    pub fn new(offsets: &[u64]) -> PrefetchPlan {
        let Some(max) = offsets.iter().max() else {
            return PrefetchPlan::default();
        };
        let count = PLAN_PAGE.index_of(*max) as usize + 1;
        let in_set = PageBits::new(count);
        let mut order: Vec<u32> = Vec::with_capacity(offsets.len());
        for &off in offsets {
            let p = PLAN_PAGE.index_of(off) as usize;
            if !in_set.get(p) {
                in_set.set(p);
                order.push(p as u32);
            }
        }
        let queued = PageBits::new(count);
        let mut runs = Vec::new();
        for &p in &order {
            let p = p as usize;
            if queued.get(p) {
                continue;
            }
            let mut start = p;
            while start > 0 && in_set.get(start - 1) && !queued.get(start - 1) {
                start -= 1;
            }
            let mut end = p + 1;
            while end < count && in_set.get(end) && !queued.get(end) {
                end += 1;
            }
            (start..end).for_each(|x| queued.set(x));
            runs.push((PLAN_PAGE.offset_of(start as u64), (end - start) as u32));
        }
        PrefetchPlan {
            runs,
            pages: order.len(),
        }
    }

    /// Pages in the set.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Its runs, as (store offset, bytes), in install order.
    pub fn runs(&self) -> impl ExactSizeIterator<Item = (u64, usize)> + '_ {
        self.runs
            .iter()
            .map(|&(o, n)| (o, PLAN_PAGE.offset_of(u64::from(n)) as usize))
    }
}

/// Gets `store` ready for the installs of a recorded working set before
/// any peer connects: the pages at `offsets` (store offsets of pages of
/// `page_bytes`) are coalesced into ranges, the store is asked to read
/// them all ([`PageStore::will_need`]: for a file, the kernel's
/// asynchronous reads, all queued at once; holes of up to 4 pages are read
/// too, fewer and larger requests), then to map exactly the set's ranges
/// ([`PageStore::populate`]), so a copy into a peer never waits for the
/// disk nor faults on its source. Blocking: run it on a thread of its own.
/// Returns the bytes mapped.
///
/// # Panics
/// If `page_bytes` is not a page size (a power of two from 4 KiB to
/// 1 GiB: [`PageSize::new`]).
pub fn prepare_store(store: &dyn PageStore, offsets: &[u64], page_bytes: u64) -> u64 {
    prepare_store_until(store, offsets, page_bytes, &|| false)
}

/// [`prepare_store`] that stops mapping once `served()` says a peer is
/// being served: from then on the installs' own copies map the source
/// pages they read (a fault of this process each 16 pages or so), and
/// mapping the rest meanwhile only takes a CPU and the mapping's locks
/// from the prefetch that needs them (at 30% of 1 GiB the mapping ran
/// 205 ms beside the restore, on the same two CPUs). The reads asked for
/// first ([`PageStore::will_need`], asynchronous) are all issued.
/// Returns the bytes mapped.
///
/// # Panics
/// As [`prepare_store`].
pub fn prepare_store_until(
    store: &dyn PageStore,
    offsets: &[u64],
    page_bytes: u64,
    served: &dyn Fn() -> bool,
) -> u64 {
    let page = usize::try_from(page_bytes)
        .ok()
        .and_then(|b| PageSize::new(b).ok())
        .unwrap_or_else(|| {
            panic!("prepare_store: {page_bytes} bytes is not a page size (a power of two from 4 KiB to 1 GiB)")
        });
    let mut sorted: Vec<u64> = offsets.iter().map(|&o| page.index_of(o)).collect();
    sorted.sort_unstable();
    sorted.dedup();
    // Runs of pages (first, end), joining runs at most `bridge` pages apart.
    let coalesce = |bridge: u64| {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &p in &sorted {
            match runs.last_mut() {
                Some((_, end)) if p <= *end + bridge => *end = p + 1,
                _ => runs.push((p, p + 1)),
            }
        }
        runs
    };
    let bytes = |(first, end): (u64, u64)| (page.offset_of(first), page.offset_of(end - first));
    for (at, len) in coalesce(4).into_iter().map(bytes) {
        store.will_need(at, len as usize);
    }
    let mut mapped = 0;
    for (at, len) in coalesce(0).into_iter().map(bytes) {
        if served() {
            break;
        }
        store.populate(at, len as usize);
        mapped += len;
    }
    mapped
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::Mutex;

    use super::*;
    use crate::store::StoreError;

    /// A store that notes the reads asked for and the ranges mapped.
    #[derive(Default)]
    struct Noting {
        will_need: Mutex<Vec<(u64, usize)>>,
        populated: Mutex<Vec<(u64, usize)>>,
    }

    impl PageStore for Noting {
        fn describe(&self) -> &str {
            "noting"
        }
        fn len(&self) -> Option<u64> {
            None
        }
        fn fill(&self, _: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            buf.fill(0);
            Ok(())
        }
        fn write_back(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
        fn will_need(&self, offset: u64, len: usize) {
            self.will_need.lock().unwrap().push((offset, len));
        }
        fn populate(&self, offset: u64, len: usize) {
            self.populated.lock().unwrap().push((offset, len));
        }
    }

    #[test]
    fn preparing_asks_every_read_and_stops_mapping_once_a_peer_is_served() {
        const P: u64 = 4096;
        // Three runs 10 pages apart: three reads, three mappings.
        let offs = [0, P, 20 * P, 40 * P, 41 * P];
        let all = Noting::default();
        assert_eq!(prepare_store(&all, &offs, P), 5 * P);
        assert_eq!(all.will_need.lock().unwrap().len(), 3);
        assert_eq!(
            *all.populated.lock().unwrap(),
            vec![
                (0, 2 * P as usize),
                (20 * P, P as usize),
                (40 * P, 2 * P as usize)
            ]
        );
        // A peer is served after the first mapping: every read is still
        // asked for, the rest is not mapped.
        let cut = Noting::default();
        let asked = Cell::new(0);
        let served = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        assert_eq!(prepare_store_until(&cut, &offs, P, &served), 2 * P);
        assert_eq!(cut.will_need.lock().unwrap().len(), 3);
        assert_eq!(*cut.populated.lock().unwrap(), vec![(0, 2 * P as usize)]);
    }
}
