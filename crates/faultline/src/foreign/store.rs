//! A peer region's store: the shared store seen through one region.
//!
//! Every region of a peer gets its own [`RegionStore`] in front of the
//! store all peers share, so the one resolve path (which reads a region's
//! store from offset 0) serves it unchanged:
//!
//! ```text
//!   region page i ── fill(offset) ──► RegionStore ── fill(store_offset + offset) ──► store
//!                                       │ removed page? its bytes are zeros
//!                                       ▼
//!                                     Removed: 1 bit a page + "any removed yet"
//! ```
//!
//! 1. **Offset.** Reads (`fill`, `fill_batch`, `view`, the read hints)
//!    are moved by the region's store offset; a batch stays one batch (a
//!    remote store keeps its one round trip).
//! 2. **Removed pages read zeros.** A page the peer dropped with
//!    `MADV_DONTNEED` (a REMOVE event: its balloon) must read zeros when it
//!    faults again, never the store's bytes: the peer's handler marks it in
//!    [`Removed`], and the store zeros those pages after a fill and refuses
//!    a zero-copy view of a range that holds one (the resolve path then
//!    fills). Until the first REMOVE one relaxed load says "nothing to do".
//! 3. **Never written back.** A peer's memory is the peer's: no budget, no
//!    eviction, no write-back.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::page::Pages;
use crate::residency::PageBits;
use crate::store::{FillRange, PageStore, StoreError};

/// The pages of a region the peer removed (they read zeros), with a fast
/// "nothing removed yet" check.
#[derive(Debug)]
pub(super) struct Removed {
    bits: PageBits,
    any: AtomicBool,
}

impl Removed {
    /// None of `pages` pages removed.
    pub(super) fn new(pages: usize) -> Removed {
        Removed {
            bits: PageBits::new(pages),
            any: AtomicBool::new(false),
        }
    }

    /// The peer removed `pages`.
    pub(super) fn remove(&self, pages: Range<usize>) {
        for p in pages {
            self.bits.set(p);
        }
        self.any.store(true, Relaxed);
    }

    fn get(&self, page: usize) -> bool {
        self.bits.get(page)
    }
}

/// A region's store as the peer must see it: the store's bytes from the
/// region's offset, with removed pages reading as zeros. See the module
/// docs.
pub(super) struct RegionStore {
    inner: Arc<dyn PageStore>,
    /// Where the region's bytes start in `inner`.
    base: u64,
    /// The region's pages (their offsets are this store's).
    pages: Pages,
    removed: Arc<Removed>,
}

impl RegionStore {
    /// The region of `pages` whose bytes start at `base` in `inner`.
    pub(super) fn new(
        inner: Arc<dyn PageStore>,
        base: u64,
        pages: Pages,
        removed: Arc<Removed>,
    ) -> RegionStore {
        RegionStore {
            inner,
            base,
            pages,
            removed,
        }
    }

    /// The pages of `[offset, offset + len)` when one of them was removed.
    fn removed_in(&self, offset: u64, len: usize) -> Option<Range<usize>> {
        if !self.removed.any.load(Relaxed) {
            return None;
        }
        let pages = self.pages.covering(offset as usize, len)?;
        pages.clone().any(|p| self.removed.get(p)).then_some(pages)
    }

    /// Zeros the pages of `buf` (filled from region offset `offset`, a
    /// page boundary) that the peer removed.
    fn zero_removed(&self, offset: u64, buf: &mut [u8]) {
        if let Some(pages) = self.removed_in(offset, buf.len()) {
            let first = pages.start;
            for p in pages.filter(|&p| self.removed.get(p)) {
                let at = self.pages.bytes(p - first);
                let end = (at + self.pages.bytes(1)).min(buf.len());
                buf[at..end].fill(0);
            }
        }
    }
}

impl PageStore for RegionStore {
    fn describe(&self) -> &str {
        self.inner.describe()
    }
    fn len(&self) -> Option<u64> {
        Some(self.pages.len() as u64)
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.fill(self.base + offset, buf)?;
        self.zero_removed(offset, buf);
        Ok(())
    }
    fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
        for r in ranges.iter_mut() {
            r.offset += self.base;
        }
        self.inner.fill_batch(ranges, out);
        for (r, res) in ranges.iter_mut().zip(out.iter()) {
            r.offset -= self.base;
            if res.is_ok() {
                self.zero_removed(r.offset, r.buf);
            }
        }
    }
    fn batched(&self) -> bool {
        self.inner.batched()
    }
    fn write_back(&self, offset: u64, _data: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Failed {
            offset,
            reason: "a peer's memory is never written back".into(),
        })
    }
    fn view(&self, offset: u64, len: usize) -> Option<crate::StoreView<'_>> {
        if self.removed_in(offset, len).is_some() {
            return None;
        }
        self.inner.view(self.base + offset, len)
    }
    fn will_need(&self, offset: u64, len: usize) {
        self.inner.will_need(self.base + offset, len)
    }
    fn populate(&self, offset: u64, len: usize) {
        self.inner.populate(self.base + offset, len)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::page::PageSize;
    use crate::store::MemoryStore;

    /// A store that pays per request and counts its batched calls.
    struct CountingBatched {
        inner: MemoryStore,
        batches: AtomicUsize,
    }

    impl PageStore for CountingBatched {
        fn describe(&self) -> &str {
            "counting-batched"
        }
        fn len(&self) -> Option<u64> {
            self.inner.len()
        }
        fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            self.inner.fill(offset, buf)
        }
        fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
            self.batches.fetch_add(1, Relaxed);
            self.inner.fill_batch(ranges, out)
        }
        fn batched(&self) -> bool {
            true
        }
        fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
            self.inner.write_back(offset, data)
        }
    }

    #[test]
    fn region_store_forwards_batches_at_its_offset_and_zeros_removed_pages() {
        let page = PageSize::BASE.bytes();
        let data: Vec<u8> = (0..16 * page).map(|i| (i / page) as u8 + 1).collect();
        let inner = Arc::new(CountingBatched {
            inner: MemoryStore::new(data),
            batches: AtomicUsize::new(0),
        });
        let removed = Arc::new(Removed::new(8));
        removed.remove(2..3);
        let pages = Pages::new(0x7f00_0000_0000, 8 * page, PageSize::BASE).unwrap();
        let rs = RegionStore::new(inner.clone(), 8 * page as u64, pages, removed);
        assert!(
            rs.batched(),
            "a batched store stays batched behind a peer's region"
        );
        let (mut a, mut b) = (vec![0u8; page], vec![0u8; 2 * page]);
        let mut ranges = [
            FillRange {
                offset: 0,
                buf: &mut a,
            },
            FillRange {
                offset: page as u64,
                buf: &mut b,
            },
        ];
        let mut out = [Ok(()), Ok(())];
        rs.fill_batch(&mut ranges, &mut out);
        assert!(out.iter().all(|r| r.is_ok()));
        assert_eq!(
            inner.batches.load(Relaxed),
            1,
            "one round trip for both ranges"
        );
        // The ranges keep the caller's offsets.
        assert_eq!((ranges[0].offset, ranges[1].offset), (0, page as u64));
        // Region page 0 is store page 8; page 2 was removed by the peer.
        assert!(a.iter().all(|&x| x == 9));
        assert!(b[..page].iter().all(|&x| x == 10));
        assert!(
            b[page..].iter().all(|&x| x == 0),
            "a removed page reads as zeros"
        );
        assert!(
            rs.view(2 * page as u64, page).is_none(),
            "no zero-copy view of a removed page"
        );
    }
}
