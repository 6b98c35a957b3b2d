//! The region handle: what a built region offers its user (geometry,
//! state, counters, `flush`, `populate`), and how it goes away.
//!
//! Dropping a region, in this order:
//!
//! 1. stops the run-ahead populator (it reads the region's state);
//! 2. stops the evictor, then writes every dirty page back (`flush`; a
//!    failure is reported, the region is dropped anyway);
//! 3. retires the state from the region table: remaining faults fail
//!    closed (SIGBUS, never a zero page; see `fault/table.rs`), in-flight
//!    resolutions are waited for, the range is unregistered;
//! 4. unmaps.

use std::fmt::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::background::Background;
use crate::engine::{made_here, Engine};
use crate::error::{Error, Result};
use crate::evict::EvictionStats;
use crate::fault::report::report;
use crate::fault::resolve::populate;
use crate::fault::{table, RegionState, RegionStats};
use crate::page::{MemoryKind, ResolveOp};
use crate::policy::ReadaheadConfig;
use crate::pool::FramePoolStats;
use crate::residency::{PageState, Residency};
use crate::runahead::RunAheadStats;
use crate::store::PageStore;
use faultline_sys::mem::Mapping;

/// A mapping whose page faults faultline resolves. See [the region
/// docs](super).
pub struct Region {
    /// `None` only while dropping.
    pub(super) state: Option<Box<RegionState>>,
    pub(super) map: Option<Mapping>,
    pub(super) _memfd: Option<OwnedFd>,
    pub(super) engine: Arc<dyn Engine>,
    pub(super) populator: Option<Background>,
    pub(super) evictors: Vec<Background>,
    pub(super) drain_timeout: Duration,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("Region")
            .field("id", &s.id)
            .field("base", &format_args!("{:#x}", s.pages.base()))
            .field("len", &s.pages.len())
            .field("page_size", &s.pages.size())
            .field("kind", &s.kind)
            .field("op", &s.op)
            .field("readahead", &s.readahead.config())
            .field("engine", &self.engine.kind())
            .finish()
    }
}

impl Region {
    /// The fault path's state of the region.
    pub(super) fn state(&self) -> &RegionState {
        self.state.as_ref().expect("live region")
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.state().pages.base() as *mut u8
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.state().pages.base()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.state().pages.len()
    }
    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Region page size in bytes.
    pub fn page_size(&self) -> usize {
        self.state().pages.size().bytes()
    }
    /// Number of region pages.
    pub fn pages(&self) -> usize {
        self.state().pages.count()
    }
    /// Memory kind.
    pub fn kind(&self) -> MemoryKind {
        self.state().kind
    }
    /// The resolve op in use (never `Auto`).
    pub fn resolve_op(&self) -> ResolveOp {
        self.state().op
    }
    /// The read-ahead policy in use.
    pub fn readahead(&self) -> ReadaheadConfig {
        self.state().readahead.config()
    }
    /// Whether the region maps page-cache pages of a tmpfs file without
    /// copying them (see
    /// [`RegionBuilder::zero_copy`](super::RegionBuilder::zero_copy)).
    pub fn is_zero_copy(&self) -> bool {
        let s = self.state();
        s.op == ResolveOp::Continue && s.alias.is_none()
    }
    /// The engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn PageStore> {
        &self.state().store
    }
    /// Process-unique id, as printed in messages.
    pub fn id(&self) -> u64 {
        self.state().id
    }

    /// State of region page `page`.
    ///
    /// # Panics
    /// If `page` is not a page of the region (`page >= pages()`).
    pub fn page_state(&self, page: usize) -> PageState {
        let s = self.state();
        assert!(
            page < s.pages.count(),
            "page {page} of a region of {} pages",
            s.pages.count()
        );
        s.residency.get(page)
    }

    /// Whether every page overlapping the byte range `[offset, offset+len)`
    /// is mapped (VPRI's presence check before a device-style access).
    pub fn is_resident(&self, offset: usize, len: usize) -> bool {
        let s = self.state();
        s.pages
            .covering(offset, len)
            .is_some_and(|r| s.residency.is_resident(r))
    }

    /// Number of resident pages.
    pub fn resident_pages(&self) -> usize {
        self.state().resident_pages()
    }

    /// Counters.
    pub fn stats(&self) -> RegionStats {
        self.state().stats.snapshot()
    }

    /// Counters of eviction, for regions with a budget.
    pub fn eviction_stats(&self) -> Option<EvictionStats> {
        self.state().budget.as_ref().map(|e| e.stats())
    }

    /// Writes every dirty page back to the store (they stay resident,
    /// clean and write-protected). Regions without a budget do not track
    /// dirtiness: `Ok(0)`. Returns the pages written; on a store error the
    /// remaining pages are still attempted and the first error returned.
    pub fn flush(&self) -> Result<usize> {
        const CLAIM_WAIT: Duration = Duration::from_secs(10);
        let s = self.state();
        if s.budget.is_none() {
            return Ok(0);
        }
        // A forked child's copy of a parent's region is not mapped here.
        made_here(self.engine.uffd())?;
        // Claimed dirty pages go back in batches: one store call (one round
        // trip for a remote store) per batch.
        const BATCH: usize = 64;
        let mut written = 0;
        let mut first_err = None;
        let mut batch = Vec::with_capacity(BATCH);
        let mut flush_batch = |batch: &mut Vec<usize>| {
            let mut out = vec![Ok(()); batch.len()];
            crate::evict::write_back_batch(s, batch, &mut out);
            for (&p, res) in batch.iter().zip(out) {
                match res {
                    Ok(()) => written += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
                s.residency.release(p..p + 1);
            }
            batch.clear();
        };
        for p in 0..s.pages.count() {
            if s.residency.get(p) != PageState::Writable {
                continue;
            }
            // Wait for a fault or the evictor to let go of the page, and
            // for I/O in flight on it (write-protecting it would fault a
            // device write).
            let deadline = Instant::now() + CLAIM_WAIT;
            while !claim_idle(&s.residency, p) {
                if Instant::now() > deadline {
                    // Write back (and let go of) the pages already claimed.
                    flush_batch(&mut batch);
                    return Err(Error::Io {
                        op: "flush: claiming a page",
                        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                    });
                }
                std::thread::yield_now();
            }
            if s.residency.get(p) == PageState::Writable {
                batch.push(p);
                if batch.len() == BATCH {
                    flush_batch(&mut batch);
                }
            } else {
                s.residency.release(p..p + 1);
            }
        }
        flush_batch(&mut batch);
        match first_err {
            Some(e) => Err(Error::Store(e)),
            None => Ok(written),
        }
    }

    /// Counters of run-ahead population, if enabled.
    pub fn run_ahead_stats(&self) -> Option<RunAheadStats> {
        self.state().runahead.as_ref().map(|f| f.stats())
    }

    /// Whether run-ahead population installed region page `page` (before
    /// any fault on it).
    pub fn populated_ahead(&self, page: usize) -> bool {
        self.state()
            .runahead
            .as_ref()
            .is_some_and(|f| f.ahead.get(page))
    }

    /// Counters of the frame pool ([`ResolveOp::Move`] regions).
    pub fn frame_pool_stats(&self) -> Option<FramePoolStats> {
        self.state().pool.as_ref().map(|p| p.stats())
    }

    /// TSC stamps of the most recent fault: when its handler started and
    /// when its resolve ioctl returned (for phase breakdowns).
    pub fn last_fault_tsc(&self) -> (u64, u64) {
        let s = self.state();
        (s.timing_start.load(SeqCst), s.timing_resolved.load(SeqCst))
    }

    /// Installs every absent page of `[offset, offset+len)` from the
    /// calling thread, without faulting.
    ///
    /// With the `signal` engine, a system call that touches an unpopulated
    /// page of the region (`read(2)` into it, `O_DIRECT`, `io_uring`,
    /// `process_vm_readv`) fails with EFAULT instead of raising SIGBUS:
    /// populate the range before handing it to the kernel.
    pub fn populate(&self, offset: usize, len: usize) -> Result<()> {
        const POPULATE_WAIT: Duration = Duration::from_secs(30);
        // A forked child's copy of a parent's region is not mapped here.
        made_here(self.engine.uffd())?;
        let s = self.state();
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        let ps = s.pages.size().bytes();
        if !offset.is_multiple_of(ps) {
            return Err(Error::Unaligned {
                addr: s.pages.base() + offset as u64,
                align: ps,
            });
        }
        let Some(range) = s.pages.covering(offset, len) else {
            return Err(Error::OutOfRange {
                start: s.pages.base() + offset as u64,
                end: (s.pages.base() + offset as u64).saturating_add(len as u64),
                region_start: s.pages.base(),
                region_end: s.pages.end(),
            });
        };
        let scratch_pages = range.len().min(s.readahead.config().max).max(1);
        let mut scratch = vec![0u8; (scratch_pages * ps).min(self.engine.scratch_bytes().max(ps))];
        populate(s, range, &mut scratch, POPULATE_WAIT)
    }
}

/// Claims `page` if no I/O holds it (releasing the claim otherwise).
fn claim_idle(r: &Residency, page: usize) -> bool {
    if !r.try_claim(page) {
        return false;
    }
    if r.io_inflight(page) {
        r.release(page..page + 1);
        return false;
    }
    true
}

impl Drop for Region {
    fn drop(&mut self) {
        // The populator reads the region's state: stop it first.
        if let (Some(p), Some(s)) = (self.populator.as_mut(), self.state.as_ref()) {
            p.stop(|| {
                s.runahead
                    .as_ref()
                    .expect("run-ahead regions have a feed")
                    .wake_all()
            });
        }
        // Stop evicting, then write every dirty page back (not from a
        // forked child's copy: the parent writes its pages back itself).
        let inherited = self.engine.uffd().inherited();
        if !self.evictors.is_empty() && !inherited {
            self.evictors.iter_mut().for_each(|e| e.stop(|| ()));
            if let Err(err) = self.flush() {
                report(|w| {
                    let _ = write!(
                        w,
                        "region #{}: dropped with dirty pages that could not be written back: {err}",
                        self.id()
                    );
                });
            }
        }
        let state = self.state.take().expect("live region");
        let drained = table::retire(state, self.drain_timeout);
        self.engine.region_removed();
        if inherited {
            // Not mapped in this forked child (`MADV_DONTFORK`): the range
            // may hold a region of the child's own by now.
            std::mem::forget(self.map.take());
        } else if !drained {
            // A resolution still runs (its store has not answered): the
            // range stays mapped, unregistered and inaccessible, so its
            // copy fails (no userfaultfd range there) instead of landing
            // in a region mapped at the same address next.
            if let Some(m) = self.map.take() {
                let _ = m.protect(faultline_sys::mem::Prot::NONE);
                std::mem::forget(m);
            }
            std::mem::forget(self._memfd.take());
        } else {
            drop(self.map.take());
        }
    }
}
