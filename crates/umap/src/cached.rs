//! libumap's default file store: what the page cache holds is copied from
//! it, what it does not hold is read with `O_DIRECT`, and dirty pages are
//! written back through the page cache.
//!
//! Why: a fault that copies from a shared mapping of the file makes the
//! kernel read the range into the page cache first, and with the file's
//! read-ahead (8 MiB on the virtio disks here) far more than the range:
//! allocating and filling page-cache pages that the region copies once
//! and that eviction's `pwrite` would allocate anyway. UMap reads with
//! `O_DIRECT` into its own buffer, which for a freshly allocated file is a
//! `memset` and no page cache at all; with 64 KiB pages that made UMap's
//! fills 2x cheaper than ours (UMap's `pfbenchmark`, RESULTS.md). Data
//! already in the page cache (written back by eviction, read before) is
//! cheapest straight from it. `umap()` uses this store for UMap pages of
//! [`DIRECT_MIN`] or more; smaller pages stay on the page cache, where the
//! kernel's read-around (one read for thousands of later faults, and
//! sequential streams read ahead) cost less than a direct read and a
//! `mincore` per fault (4 KiB rows of the same benchmark ran 0.6-0.9x
//! with uncached fills direct). So:
//!
//! ```text
//!   fault ─▶ view(off, len): every base page of the range in the page
//!              │ cache (mincore on the shared mapping)?
//!              ├─ yes ─▶ UFFDIO_COPY straight from the mapping
//!              └─ no ──▶ fill(off, scratch): pread(O_DIRECT) ─▶ UFFDIO_COPY
//!   evict ─▶ write_back_batch: pwritev through the page cache (buffered)
//! ```
//!
//! Direct and buffered I/O of one file stay coherent (the kernel writes
//! dirty page-cache pages of a range back before a direct read of it), so
//! a range that is only partly cached is still read right, only slower;
//! it is read directly (one request) rather than through the cache.

use faultline::store::{PageCacheFile, StoreError, WriteRange};
use faultline::{FileStore, PageStore};
use faultline_sys::mem::is_mapped;

use crate::direct::DirectFileStore;

/// Bytes one `mincore` call looks at (the stack vector `is_mapped` uses).
const PROBE: usize = 2 << 20;

/// The smallest UMap page `umap()` reads directly when the page cache
/// does not hold it.
pub const DIRECT_MIN: u64 = 64 << 10;

/// A buffered [`FileStore`] (page-cache view, write-back) with a
/// [`DirectFileStore`] of the same file for ranges the page cache does not
/// hold.
#[derive(Debug)]
pub struct CachedOrDirect {
    buffered: FileStore,
    direct: DirectFileStore,
}

impl CachedOrDirect {
    /// `buffered` and `direct` are the same file from the same byte.
    pub fn new(buffered: FileStore, direct: DirectFileStore) -> CachedOrDirect {
        CachedOrDirect { buffered, direct }
    }
}

/// Whether every base page of `view` is in the page cache.
fn cached(view: &faultline::StoreView<'_>) -> bool {
    let start = view.as_ptr() as u64;
    (0..view.len())
        .step_by(PROBE)
        .all(|at| is_mapped(start + at as u64, (view.len() - at).min(PROBE)))
}

impl PageStore for CachedOrDirect {
    fn describe(&self) -> &str {
        self.buffered.describe()
    }
    fn len(&self) -> Option<u64> {
        self.buffered.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        match self.view(offset, buf.len()) {
            Some(v) => {
                v.copy_to(buf);
                Ok(())
            }
            None => self.direct.fill(offset, buf),
        }
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.buffered.write_back(offset, data)
    }
    fn write_back_batch(&self, ranges: &[WriteRange<'_>], out: &mut [Result<(), StoreError>]) {
        self.buffered.write_back_batch(ranges, out)
    }
    /// The page-cache view, only when the page cache holds all of the
    /// range (else the fault path calls [`Self::fill`], which reads it
    /// directly).
    fn view(&self, offset: u64, len: usize) -> Option<faultline::StoreView<'_>> {
        self.buffered.view(offset, len).filter(cached)
    }
    fn will_need(&self, offset: u64, len: usize) {
        self.buffered.will_need(offset, len)
    }
    fn populate(&self, offset: u64, len: usize) {
        self.buffered.populate(offset, len)
    }
    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        None
    }
    fn signal_safe(&self) -> bool {
        true
    }
}
