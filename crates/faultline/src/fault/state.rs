//! [`RegionState`]: what the fault path knows of one region.
//!
//! ```text
//!   Region (user handle, owns the mapping and the background threads)
//!     └── RegionState (heap, stable address) ◄── table entry [base, base+len)
//!           ├── pages: geometry (base, page size, count)
//!           ├── residency: 2 bits/page + claim bits
//!           ├── store: Arc<dyn PageStore>
//!           ├── uffd: the engine's fd, and how the engine delivers faults
//!           ├── readahead: per-thread stream slots
//!           ├── alias view + page-cache bits     (shmem, hugetlb)
//!           ├── frame pool                       (ResolveOp::Move)
//!           ├── feeds: budget log, run-ahead     (background threads)
//!           ├── written: pages written since     (a peer's dirty tracking)
//!           └── copy gate                        (a peer's: see CopyGate)
//! ```
//!
//! Everything here is immutable after the region is built, or an atomic
//! (or, for a peer's region only, the peer's copy gate): the fault path
//! reads it from any thread and from signal handlers.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard};

use super::crew::Crew;

use super::feeds::{BudgetFeed, RunAheadFeed};
use super::readahead::Streams;
use super::report::StackWriter;
use super::Delivery;
use crate::background::{Background, StopFlag};
use crate::page::{MemoryKind, Pages, ResolveOp};
use crate::pool::FramePool;
use crate::residency::{PageBits, PageState, Residency};
use crate::store::PageStore;
use faultline_sys::mem::Mapping;
use faultline_sys::uffd::Uffd;

/// Counters of one region (all relaxed atomics).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub faults: AtomicU64,
    pub installed: AtomicU64,
    pub around: AtomicU64,
    pub ioctls: AtomicU64,
    pub store_fills: AtomicU64,
    pub zero_copy_fills: AtomicU64,
    pub exists: AtomicU64,
    pub retries: AtomicU64,
    pub gone: AtomicU64,
    pub busy: AtomicU64,
    pub poisoned: AtomicU64,
    pub pool_misses: AtomicU64,
    pub helped: AtomicU64,
    pub handler_cycles: AtomicU64,
}

/// A snapshot of a region's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Faults delivered to the runtime for this region.
    pub faults: u64,
    /// Region pages installed (fault-around counts every page).
    pub installed: u64,
    /// Of those, pages a fault installed beside its own (its fault-around
    /// or read-ahead window): what the window bet on. The ones never
    /// touched are wasted.
    pub around: u64,
    /// Resolve ioctls that installed something.
    pub ioctls: u64,
    /// Pages read through `PageStore::fill`.
    pub store_fills: u64,
    /// Pages copied straight from a store's zero-copy view.
    pub zero_copy_fills: u64,
    /// Resolutions that found the page already there (EEXIST).
    pub exists: u64,
    /// EAGAIN retries (pending events).
    pub retries: u64,
    /// Resolve ioctls that found the range gone (ENOENT/ESRCH).
    pub gone: u64,
    /// Faults that found another resolver busy on the page.
    pub busy: u64,
    /// Pages poisoned after store errors.
    pub poisoned: u64,
    /// MOVE resolutions that found the pool empty and fell back to COPY.
    pub pool_misses: u64,
    /// Pieces of a fault's window installed by a crew member (a peer's
    /// region: a prefetch helper) beside the thread resolving the fault.
    pub helped: u64,
    /// TSC cycles spent inside the resolve path.
    pub handler_cycles: u64,
}

impl Counters {
    pub fn snapshot(&self) -> RegionStats {
        RegionStats {
            faults: self.faults.load(Relaxed),
            installed: self.installed.load(Relaxed),
            around: self.around.load(Relaxed),
            ioctls: self.ioctls.load(Relaxed),
            store_fills: self.store_fills.load(Relaxed),
            zero_copy_fills: self.zero_copy_fills.load(Relaxed),
            exists: self.exists.load(Relaxed),
            retries: self.retries.load(Relaxed),
            gone: self.gone.load(Relaxed),
            busy: self.busy.load(Relaxed),
            poisoned: self.poisoned.load(Relaxed),
            pool_misses: self.pool_misses.load(Relaxed),
            helped: self.helped.load(Relaxed),
            handler_cycles: self.handler_cycles.load(Relaxed),
        }
    }
}

/// A peer's copy gate as its regions' fault path holds it
/// (`crate::foreign`). The kernel wakes a `madvise` that dropped a range
/// of the peer's memory once its REMOVE event is read, and then zaps the
/// range; a copy whose bytes were decided before that read (the removed
/// pages read zeros only after it) must therefore be in the memory before
/// the read. So every install holds the gate shared from the store read
/// that decides its bytes to the ioctl that maps them and the residency
/// map's update, and whoever reads the peer's userfaultfd holds it
/// exclusively around the read and the REMOVE bookkeeping that follows.
///
/// A hold is short: a window copied from the store goes in pieces of at
/// most `piece_pages`, a hold each, so a thread waiting to read waits for
/// one piece, not for another thread's whole window, and several threads
/// (workers, prefetch helpers) copy one peer's windows at once. The lock
/// is `parking_lot`'s: a waiting writer keeps new readers out. (With
/// std's, the unlock that wakes a writer lets the next reader in before
/// the writer runs: a thread copying piece after piece kept the other
/// from reading for its whole window, 1-2 ms, and workers were no faster
/// than one thread.)
pub(crate) struct CopyGate {
    pub lock: Arc<RwLock<()>>,
    /// Pages one hold installs at most, when a run can be cut (at least 1).
    pub piece_pages: usize,
    /// Threads that install a cut window's pieces beside the resolving
    /// thread (set when the peer is served: its engine's helpers).
    pub crew: OnceLock<Arc<Crew>>,
}

impl CopyGate {
    /// Holds the gate shared (one install).
    pub fn hold(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read()
    }
}

/// The region state the fault path reads. Lives at a stable heap address
/// referenced by the region table. See the module docs.
pub(crate) struct RegionState {
    pub id: u64,
    pub pages: Pages,
    pub kind: MemoryKind,
    pub op: ResolveOp,
    /// Read faults on a zero store install the shared zero page.
    pub zeropage_reads: bool,
    pub readahead: Streams,
    /// Longest run one ioctl installs (the zero source's size for COPY
    /// from zeros; unbounded otherwise).
    pub max_run_pages: usize,
    pub store: Arc<dyn PageStore>,
    pub residency: Residency,
    /// shmem/hugetlb: pages whose page-cache page exists (CONTINUE needs
    /// no fill).
    pub cached: Option<PageBits>,
    /// shmem/hugetlb: a second, unregistered view of the memory, through
    /// which the page cache is filled.
    pub alias: Option<Mapping>,
    pub pool: Option<FramePool>,
    pub uffd: Arc<Uffd>,
    pub delivery: Delivery,
    pub inflight: AtomicUsize,
    pub stats: Counters,
    pub budget: Option<BudgetFeed>,
    pub runahead: Option<RunAheadFeed>,
    /// Dirty tracking (a peer's, `crate::foreign::dirty`): the pages
    /// written since tracking began. With it, pages are installed
    /// write-protected, as a budget region's clean pages are, and a fault's
    /// write un-protects its page and sets its bit.
    pub written: Option<PageBits>,
    /// A peer's region: the peer's copy gate (`None` for our own memory).
    pub copy_gate: Option<CopyGate>,
    pub timing_start: AtomicU64,
    pub timing_resolved: AtomicU64,
}

impl RegionState {
    /// Whether the copy path may need the caller's scratch buffer.
    pub fn needs_scratch(&self) -> bool {
        !self.store.is_zero() && self.op != ResolveOp::Continue
    }

    /// Whether pages are installed write-protected, so that their first
    /// write faults: a budget region (to tell clean pages from dirty
    /// ones) or a tracked one (its dirty set).
    #[inline]
    pub fn write_protects(&self) -> bool {
        self.budget.is_some() || self.written.is_some()
    }

    /// The state a page installed clean (not the page of a write fault)
    /// is recorded in: read-only where [`Self::write_protects`].
    #[inline]
    pub fn clean_state(&self) -> PageState {
        if self.write_protects() {
            PageState::ReadOnly
        } else {
            PageState::Writable
        }
    }

    /// A fault's write reached `page` (un-protected, or installed
    /// writable): set its bit in the dirty set, if tracked.
    #[inline]
    pub fn note_write(&self, page: usize) {
        if let Some(w) = &self.written {
            w.set(page);
        }
    }

    /// Whether faults gather a window's holes into one batched fill: a
    /// store that pays per request, installed by COPY from scratch.
    pub fn batches_fills(&self) -> bool {
        self.store.batched()
            && !self.store.is_zero()
            && matches!(self.op, ResolveOp::Copy | ResolveOp::Auto)
            && self.cached.is_none()
    }

    /// Writes "region #id [base, end) offset 0x.. (store ...)" into `w`.
    pub fn describe_page(&self, page: usize, w: &mut StackWriter) {
        let _ = write!(
            w,
            "region #{} [{:#x}, {:#x}) offset {:#x} (store {})",
            self.id,
            self.pages.base(),
            self.pages.end(),
            self.pages.offset(page),
            self.store.describe()
        );
    }

    /// Number of resident (mapped) pages.
    pub fn resident_pages(&self) -> usize {
        let all = 0..self.pages.count();
        self.residency.count(all.clone(), PageState::ReadOnly)
            + self.residency.count(all, PageState::Writable)
    }

    /// Runs `body(state, stop)` on a new background thread named `name`.
    /// The region stops it before this state is freed, which is what keeps
    /// the borrowed reference valid: callers must stop the returned
    /// [`Background`] before dropping the state.
    pub fn spawn_worker(
        &self,
        name: &str,
        body: impl FnOnce(&RegionState, &StopFlag) + Send + 'static,
    ) -> std::io::Result<Background> {
        struct Ptr(*const RegionState);
        // SAFETY: `RegionState` is Sync (atomics, and data immutable after
        // build); the pointer stays valid until the `Background` is
        // stopped, which `Region::drop` does before freeing the state.
        unsafe impl Send for Ptr {}
        let ptr = Ptr(self);
        Background::spawn(name, move |stop| {
            let ptr = ptr;
            // SAFETY: see `Ptr`.
            body(unsafe { &*ptr.0 }, stop)
        })
    }

    /// Records the start of a fault's handling (stats, timing, run-ahead).
    /// Async-signal-safe.
    #[inline]
    pub fn fault_seen(&self, page: usize, t0: u64) {
        self.timing_start.store(t0, Relaxed);
        self.stats.faults.fetch_add(1, Relaxed);
        if let Some(feed) = &self.runahead {
            feed.post(page);
        }
    }

    /// Adds `cycles` of handler time.
    #[inline]
    pub fn add_cycles(&self, cycles: u64) {
        self.stats.handler_cycles.fetch_add(cycles, Relaxed);
    }

    /// Counts a resolution in flight (see `table::enter`).
    pub(super) fn enter(&self) {
        self.inflight.fetch_add(1, SeqCst);
    }

    pub(super) fn exit(&self) {
        self.inflight.fetch_sub(1, SeqCst);
    }
}
