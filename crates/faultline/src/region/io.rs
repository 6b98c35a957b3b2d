//! The region's hooks for I/O into its memory, which the `faultline-io`
//! crate builds VPRI's device queues on:
//!
//! 1. **the presence check** before an I/O ([`Region::io_ready`], with
//!    [`Region::io_prefetch`] to load its words for a batch ahead);
//! 2. **per-page I/O references and pins** the evictor honours
//!    ([`Region::io_acquire`]/[`Region::io_release`],
//!    [`Region::pin`]/[`Region::unpin`]): take the reference, then check;
//! 3. **resolution from a worker thread** through the same resolve path as
//!    every fault ([`Region::resolve_pages`]), no uffd message, no kernel
//!    fault;
//! 4. **access hints** for the eviction policy ([`Region::access_hint`])
//!    and a watch on what the evictor takes ([`Region::watch_reclaims`]).

use std::time::Duration;

use super::handle::Region;
use crate::error::{Error, Result};
use crate::fault::resolve::{populate_where, Access};
use crate::residency::PageState;

/// Hooks for I/O into region memory (the `faultline-io` crate builds VPRI's
/// device queues on them): the presence check, per-page I/O references the
/// evictor honours, resolution from a worker thread, and access hints for
/// the eviction policy. Ranges are region page indices.
impl Region {
    /// The region pages overlapping the byte range `[offset, offset+len)`,
    /// or `None` if it is empty or leaves the region.
    pub fn page_range(&self, offset: usize, len: usize) -> Option<std::ops::Range<usize>> {
        self.state().pages.covering(offset, len)
    }

    /// Whether the region tracks clean pages (a budget region: pages are
    /// installed write-protected, so a kernel write into a clean page
    /// faults).
    pub fn tracks_dirty(&self) -> bool {
        self.state().budget.is_some()
    }

    /// The pre-I/O presence check (VPRI's PA-BITMAP lookup): whether the
    /// kernel can read (`write == false`) or write every page of `pages`
    /// without a fault. Returns the first page that is not ready. See
    /// [`Residency::io_ready`](crate::residency::Residency::io_ready).
    ///
    /// # Panics
    /// If `pages` runs past the region's last page.
    #[inline]
    pub fn io_ready(
        &self,
        pages: std::ops::Range<usize>,
        write: bool,
    ) -> std::result::Result<(), usize> {
        let s = self.state();
        assert!(pages.end <= s.pages.count(), "page range past the region");
        s.residency.io_ready(pages, write, s.budget.is_some())
    }

    /// Takes an I/O reference on every page of `pages`: the evictor will
    /// not evict them until [`io_release`](Self::io_release). Take it
    /// *before* checking [`io_ready`](Self::io_ready). A reference held
    /// for long is a pin.
    ///
    /// # Panics
    /// If `pages` runs past the region's last page.
    pub fn io_acquire(&self, pages: std::ops::Range<usize>) {
        let s = self.state();
        assert!(pages.end <= s.pages.count(), "page range past the region");
        s.residency.io_acquire(pages);
    }

    /// Starts loading the presence-check words of `pages` into the cache
    /// without waiting (see [`Residency::prefetch_io`]): call it for a
    /// batch of I/Os before checking them one by one. Pages past the
    /// region are ignored.
    ///
    /// [`Residency::prefetch_io`]: crate::residency::Residency::prefetch_io
    pub fn io_prefetch(&self, pages: std::ops::Range<usize>) {
        self.state().residency.prefetch_io(pages);
    }

    /// Drops the references [`io_acquire`](Self::io_acquire) took.
    ///
    /// # Panics
    /// If `pages` runs past the region's last page.
    pub fn io_release(&self, pages: std::ops::Range<usize>) {
        let s = self.state();
        assert!(pages.end <= s.pages.count(), "page range past the region");
        s.residency.io_release(pages);
    }

    /// Pins `pages`: the evictor leaves them resident until
    /// [`unpin`](Self::unpin) (pins nest; a pin does not install a page).
    pub fn pin(&self, pages: std::ops::Range<usize>) {
        let s = self.state();
        assert!(pages.end <= s.pages.count(), "page range past the region");
        s.residency.pin(pages);
    }

    /// Drops one pin [`pin`](Self::pin) took on every page of `pages`.
    pub fn unpin(&self, pages: std::ops::Range<usize>) {
        let s = self.state();
        assert!(pages.end <= s.pages.count(), "page range past the region");
        s.residency.unpin(pages);
    }

    /// Whether `page` is pinned.
    pub fn is_pinned(&self, page: usize) -> bool {
        self.state().residency.is_pinned(page)
    }

    /// Resolves the pages of `pages` that an I/O in direction `write`
    /// cannot touch yet, through the same resolve path as every fault,
    /// from the calling thread: absent pages are installed, and for a
    /// write, clean pages of a budget region are made writable (dirty).
    /// Waits up to `timeout` for pages other resolvers hold.
    pub fn resolve_pages(
        &self,
        pages: std::ops::Range<usize>,
        write: bool,
        timeout: Duration,
    ) -> Result<()> {
        let s = self.state();
        if pages.is_empty() || pages.end > s.pages.count() {
            return Err(Error::OutOfRange {
                start: s.pages.addr(pages.start.min(s.pages.count())),
                end: s.pages.base() + s.pages.bytes(pages.end) as u64,
                region_start: s.pages.base(),
                region_end: s.pages.end(),
            });
        }
        let ps = s.pages.size().bytes();
        let scratch_pages = pages.len().min(s.readahead.config().max).max(1);
        let mut scratch = vec![0u8; (scratch_pages * ps).min(self.engine.scratch_bytes().max(ps))];
        let dirty = write && s.budget.is_some();
        let access = Access { write, wp: false };
        populate_where(s, pages, access, &mut scratch, timeout, |st| {
            st == PageState::Absent || (dirty && st == PageState::ReadOnly)
        })
    }

    /// Tells the region's eviction policy that `page` was accessed (by an
    /// I/O the CPU-side fault path never sees). Lossy, never waits; a
    /// no-op without a budget.
    pub fn access_hint(&self, page: usize) {
        if let Some(b) = self.state().budget.as_ref() {
            b.hint(page);
        }
    }

    /// Records the pages the evictor takes from now on, in a lossy ring
    /// of `slots` pages (see [`crate::evict::ReclaimWatch`]); `None`
    /// without a budget (nothing is ever evicted).
    pub fn watch_reclaims(&self, slots: usize) -> Option<crate::evict::ReclaimWatch> {
        let b = self.state().budget.as_ref()?;
        Some(crate::evict::ReclaimWatch::new(b.watch_reclaims(slots)))
    }
}
