//! Regions: mappings whose faults the runtime resolves.
//!
//! ```text
//!   Region (user handle, owns the mapping)
//!     └── Shared (heap, stable address) ◄── TABLE entry [base, base+len)
//!           ├── residency: 2 bits/page + claim bits
//!           ├── store: Arc<dyn PageStore>
//!           ├── uffd: the engine's fd
//!           ├── alias view + page-cache bitmap   (shmem, hugetlb)
//!           └── MOVE pool of pre-touched pages   (ResolveOp::Move)
//! ```
//!
//! Every engine finds the region of a faulting address through the
//! process-wide `TABLE` (lock-free, so the SIGBUS handler can use it),
//! marks itself in flight on the region, drops the table guard and
//! resolves. Dropping a region:
//!
//! 1. removes it from the table (after the grace period no new handler
//!    can find it);
//! 2. waits, with a timeout, for in-flight resolutions to finish, so the
//!    faults already being handled complete with real data;
//! 3. poisons every page that is still absent (`UFFDIO_POISON`), then
//!    wakes and unregisters the range: a thread still blocked on a queued
//!    fault retries into a poison marker and gets SIGBUS. It never gets a
//!    zero page, which is what a plain UNREGISTER or close would hand it
//!    (silent data loss). Installed pages stay, so threads woken by the
//!    drained resolutions find their data;
//! 4. unmaps. A thread that touches the region after that gets SIGSEGV,
//!    as for any unmapped memory.

use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::caps::{capabilities, op_unusable};
use crate::engine::{Engine, EngineKind};
use crate::error::{Error, Result};
use crate::interval::SnapshotTable;
use crate::residency::{PageState, Residency};
use crate::store::{PageStore, Tail, ZeroStore};
use crate::sys::mem::{self, Mapping};
use crate::sys::uffd::{ioctl_bit, register_mode, Uffd};
use crate::sys::BASE_PAGE;
use crate::{MemoryKind, ResolveOp};

/// The process-wide region table: address interval -> `*const Shared`.
pub(crate) static TABLE: SnapshotTable<usize> = SnapshotTable::new();

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Counters of one region (all relaxed atomics).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub faults: AtomicU64,
    pub installed: AtomicU64,
    pub ioctls: AtomicU64,
    pub store_fills: AtomicU64,
    pub zero_copy_fills: AtomicU64,
    pub exists: AtomicU64,
    pub retries: AtomicU64,
    pub gone: AtomicU64,
    pub busy: AtomicU64,
    pub poisoned: AtomicU64,
    pub pool_misses: AtomicU64,
    pub handler_cycles: AtomicU64,
}

/// A snapshot of a region's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Faults delivered to the runtime for this region.
    pub faults: u64,
    /// Region pages installed (fault-around counts every page).
    pub installed: u64,
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
    /// TSC cycles spent inside the resolve path.
    pub handler_cycles: u64,
}

/// Lock-free sequential-stream detection for adaptive read-ahead: per
/// stream slot, the page where the last window ended and that window's
/// size. Each resolving thread uses its own slot (`streams` slots; a
/// thread's slot is fixed on its first fault), so threads scanning
/// different parts of a region do not reset each other's windows.
#[derive(Debug)]
pub(crate) struct ReadaheadState {
    initial: usize,
    max: usize,
    slots: Box<[(AtomicU64, AtomicUsize)]>,
}

thread_local! {
    /// This thread's read-ahead stream slot (const-initialised, no
    /// destructor: safe to read from a signal handler).
    static STREAM: std::cell::Cell<u32> = const { std::cell::Cell::new(u32::MAX) };
}
static NEXT_STREAM: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl ReadaheadState {
    fn new(cfg: crate::policy::ReadaheadConfig) -> ReadaheadState {
        let initial = cfg.initial.max(1);
        ReadaheadState {
            initial,
            max: cfg.max.max(initial),
            slots: (0..cfg.streams.max(1))
                .map(|_| (AtomicU64::new(u64::MAX), AtomicUsize::new(initial)))
                .collect(),
        }
    }

    /// The window for a fault at `page`, and record it. Async-signal-safe.
    /// Threads sharing a slot race benignly (a window may reset).
    pub fn window_for(&self, page: usize) -> usize {
        let me = STREAM.with(|s| {
            if s.get() == u32::MAX {
                s.set(NEXT_STREAM.fetch_add(1, Relaxed));
            }
            s.get()
        });
        let (next, window) = &self.slots[me as usize % self.slots.len()];
        let sequential = next.load(Relaxed) == page as u64;
        let w = if sequential {
            (window.load(Relaxed) * 2).min(self.max)
        } else {
            self.initial
        };
        window.store(w, Relaxed);
        next.store((page + w) as u64, Relaxed);
        w
    }
}

/// One bit per page, atomic.
#[derive(Debug)]
pub(crate) struct Bitset(Box<[AtomicU64]>);

impl Bitset {
    fn new(n: usize) -> Bitset {
        Bitset((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    pub fn get(&self, i: usize) -> bool {
        self.0[i / 64].load(Acquire) & (1 << (i % 64)) != 0
    }
    pub fn set(&self, i: usize) {
        self.0[i / 64].fetch_or(1 << (i % 64), SeqCst);
    }
}

/// Source of zeros for COPY from a zero store: a read-only anonymous
/// mapping that is never written (every page is the shared zero page).
const ZERO_SOURCE_BYTES: usize = 4 << 20;
static ZERO_SOURCE: OnceLock<Mapping> = OnceLock::new();

fn zero_source_init() -> Result<()> {
    if ZERO_SOURCE.get().is_none() {
        let m = Mapping::anon(ZERO_SOURCE_BYTES)?;
        m.protect(libc::PROT_READ)?;
        let _ = ZERO_SOURCE.set(m);
    }
    Ok(())
}

/// A pointer to at least `bytes` zero bytes (bytes <= 4 MiB).
pub(crate) fn zero_source(bytes: usize) -> *const u8 {
    debug_assert!(bytes <= ZERO_SOURCE_BYTES);
    ZERO_SOURCE
        .get()
        .expect("initialised by RegionBuilder::build")
        .as_ptr()
}

/// The region state the fault path reads. Lives at a stable heap address
/// referenced by [`TABLE`].
pub(crate) struct Shared {
    pub id: u64,
    pub base: u64,
    pub len: u64,
    pub page_size: usize,
    pub pages: usize,
    pub kind: MemoryKind,
    pub op: ResolveOp,
    pub zeropage_reads: bool,
    pub fault_around: usize,
    pub max_run_pages: usize,
    pub store: Arc<dyn PageStore>,
    pub residency: Residency,
    pub cached: Option<Bitset>,
    pub alias: Option<Mapping>,
    pub pool: Option<crate::pool::FramePool>,
    pub uffd: Arc<Uffd>,
    pub signal_mode: bool,
    pub inflight: AtomicUsize,
    pub stats: Counters,
    pub feed: Option<crate::runahead::Feed>,
    /// Adaptive read-ahead state (see [`ReadaheadState`]).
    pub readahead: Option<ReadaheadState>,
    /// Eviction state of a region with a budget (pages installed
    /// write-protected, dirtied by WP faults).
    pub evict: Option<crate::evict::EvictState>,
    pub ahead: Option<Bitset>,
    pub timing_start: AtomicU64,
    pub timing_resolved: AtomicU64,
    pub last_poisoned: AtomicU64,
}

impl Shared {
    #[inline]
    pub fn page_addr(&self, page: usize) -> u64 {
        self.base + (page * self.page_size) as u64
    }
    /// Whether the copy path may need the caller's scratch buffer.
    pub fn needs_scratch(&self) -> bool {
        !self.store.is_zero() && self.op != ResolveOp::Continue
    }
    /// Writes "region #id [base, end) offset 0x.. (store ...)" into `w`.
    pub fn describe_page(&self, page: usize, w: &mut crate::engine::StackWriter) {
        use std::fmt::Write;
        let _ = write!(
            w,
            "region #{} [{:#x}, {:#x}) offset {:#x} (store {})",
            self.id,
            self.base,
            self.base + self.len,
            page * self.page_size,
            self.store.describe()
        );
    }
}

/// A background thread working on one region's [`Shared`] (the run-ahead
/// populator, the evictor). The region stops it (`stop`) before its state
/// is freed, which is what keeps the borrowed pointer valid.
pub(crate) struct RegionThread {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct SharedPtr(*const Shared);
// SAFETY: `Shared` is Sync (atomics and data immutable after build); the
// pointer stays valid until `RegionThread::stop` has joined the thread, which
// `Region::drop` does before freeing anything.
unsafe impl Send for SharedPtr {}

impl RegionThread {
    /// Runs `body(shared, stop_flag)` on a new thread named `name`.
    pub fn spawn(
        name: &str,
        shared: &Shared,
        body: impl FnOnce(&Shared, &AtomicBool) + Send + 'static,
    ) -> std::io::Result<RegionThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, ptr) = (stop.clone(), SharedPtr(shared));
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let ptr = ptr;
                // SAFETY: see `SharedPtr`.
                body(unsafe { &*ptr.0 }, &flag)
            })?;
        Ok(RegionThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Sets the stop flag, calls `wake` to interrupt whatever the thread
    /// waits on (it is also unparked), and joins it.
    pub fn stop(&mut self, wake: impl FnOnce()) {
        self.stop.store(true, SeqCst);
        wake();
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// A region in flight: the table guard is dropped, the region cannot be
/// torn down until this is dropped.
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
}

impl std::ops::Deref for InFlight<'_> {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        self.shared
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.inflight.fetch_sub(1, SeqCst);
    }
}

/// Finds the region holding `addr` and marks a resolution in flight on it.
/// Async-signal-safe.
#[inline]
pub(crate) fn enter(addr: u64) -> Option<InFlight<'static>> {
    let g = TABLE.read();
    let ptr = g.lookup(addr)?.value as *const Shared;
    // SAFETY: the table only holds pointers to live `Shared`s; the entry
    // is removed (with a grace period) before its `Shared` is freed, and
    // the drop path waits for `inflight` to reach zero before freeing, so
    // incrementing it inside the read guard keeps it alive.
    let shared: &'static Shared = unsafe { &*ptr };
    shared.inflight.fetch_add(1, SeqCst);
    drop(g);
    Some(InFlight { shared })
}

/// Builds a [`Region`].
#[must_use]
pub struct RegionBuilder {
    len: usize,
    page_size: usize,
    kind: MemoryKind,
    store: Arc<dyn PageStore>,
    fault_around: usize,
    op: ResolveOp,
    at: Option<u64>,
    pool: Option<crate::pool::FramePoolConfig>,
    run_ahead: Option<crate::runahead::RunAheadConfig>,
    readahead: Option<crate::policy::ReadaheadConfig>,
    budget: Option<crate::evict::EvictionConfig>,
    drain_timeout: Duration,
    page_cache_file: Option<std::fs::File>,
}

impl RegionBuilder {
    /// A region of `len` bytes: private anonymous, 4 KiB pages, zero store,
    /// no fault-around, resolve op chosen automatically.
    pub fn new(len: usize) -> RegionBuilder {
        RegionBuilder {
            len,
            page_size: BASE_PAGE,
            kind: MemoryKind::PrivateAnon,
            store: Arc::new(ZeroStore),
            fault_around: 1,
            op: ResolveOp::Auto,
            at: None,
            pool: None,
            run_ahead: None,
            readahead: None,
            budget: None,
            drain_timeout: Duration::from_secs(10),
            page_cache_file: None,
        }
    }
    /// Region page size: a non-zero multiple of 4 KiB (2 MiB for hugetlb).
    /// Each fault resolves at least one region page.
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self
    }
    /// Memory kind.
    pub fn kind(mut self, kind: MemoryKind) -> Self {
        self.kind = kind;
        if kind == MemoryKind::Hugetlb && self.page_size < (2 << 20) {
            self.page_size = 2 << 20;
        }
        self
    }
    /// Backing store.
    pub fn store(mut self, store: impl PageStore) -> Self {
        self.store = Arc::new(store);
        self
    }
    /// Backing store, shared with the caller.
    pub fn shared_store(mut self, store: Arc<dyn PageStore>) -> Self {
        self.store = store;
        self
    }
    /// Resolve up to `pages` contiguous absent region pages (the aligned
    /// window around the fault) per fault, in one ioctl.
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.fault_around = pages.max(1);
        self
    }
    /// How faults are resolved (see [`ResolveOp`]).
    pub fn resolve_op(mut self, op: ResolveOp) -> Self {
        self.op = op;
        self
    }
    /// Map at this fixed address (must be free and page aligned).
    pub fn at(mut self, addr: u64) -> Self {
        self.at = Some(addr);
        self
    }
    /// Number of pre-touched pages kept for [`ResolveOp::Move`]
    /// (default: `max(64, 4 * fault_around)`), refilled by the fault path.
    pub fn move_pool(mut self, pages: usize) -> Self {
        self.pool = Some(crate::pool::FramePoolConfig {
            pages,
            ..Default::default()
        });
        self
    }
    /// The frame pool of [`ResolveOp::Move`] in full: size, 2 MiB
    /// transparent huge frames, a background refill thread. See
    /// [`crate::pool`].
    pub fn frame_pool(mut self, cfg: crate::pool::FramePoolConfig) -> Self {
        self.pool = Some(cfg);
        self
    }
    /// Run-ahead population: a background thread installs the windows a
    /// sequential or strided stream of faults is about to reach (see
    /// [`crate::runahead`]).
    pub fn run_ahead(mut self, cfg: crate::runahead::RunAheadConfig) -> Self {
        self.run_ahead = Some(cfg);
        self
    }
    /// Adaptive read-ahead instead of a fixed fault-around: a fault right
    /// where the same thread's previous window ended doubles the window
    /// (up to `cfg.max` region pages); any other fault starts again at
    /// `cfg.initial` (the kernel's on-demand read-ahead, with `cfg.streams`
    /// per-thread stream slots, lock-free for the SIGBUS handler).
    pub fn readahead(mut self, cfg: crate::policy::ReadaheadConfig) -> Self {
        self.readahead = Some(cfg);
        self
    }
    /// A resident-memory budget: past it, an evictor thread writes dirty
    /// pages back to the store and drops pages the policy picks (see
    /// [`crate::evict`]). Private anonymous regions resolved with COPY.
    pub fn budget(mut self, cfg: crate::evict::EvictionConfig) -> Self {
        self.budget = Some(cfg);
        self
    }
    /// How long dropping the region waits for in-flight faults.
    pub fn drain_timeout(mut self, t: Duration) -> Self {
        self.drain_timeout = t;
        self
    }

    /// Maps this tmpfs/shmem file itself (`MAP_SHARED`) instead of a fresh
    /// memfd, and treats its page cache as the store: pages already in the
    /// page cache are installed with `UFFDIO_CONTINUE` (minor faults, no
    /// copy, no allocation), pages that are not (holes) are filled from the
    /// region's store (zeros by default) through the alias view. This is the
    /// zero-copy path for data that already lives in memory, e.g. a file in
    /// `/dev/shm`; the kernel's `mmap` of the same file is the baseline.
    /// Implies [`MemoryKind::Shmem`]; the region may be shorter than the
    /// file, not longer. The file must be opened read-write (userfaultfd
    /// registers only shared mappings that may be written); writes go to it.
    pub fn page_cache_file(mut self, file: std::fs::File) -> Self {
        self.kind = MemoryKind::Shmem;
        self.page_cache_file = Some(file);
        self
    }

    fn validate(&self, engine: &dyn Engine) -> Result<ResolveOp> {
        let ps = self.page_size;
        if self.len == 0 {
            return Err(Error::ZeroLength);
        }
        if ps == 0 || !ps.is_multiple_of(BASE_PAGE) {
            return Err(Error::BadPageSize {
                page_size: ps,
                reason: "must be a non-zero multiple of 4096",
            });
        }
        if self.kind == MemoryKind::Hugetlb && !ps.is_multiple_of(2 << 20) {
            return Err(Error::BadPageSize {
                page_size: ps,
                reason: "hugetlb regions need a multiple of 2 MiB",
            });
        }
        if !self.len.is_multiple_of(ps) {
            return Err(Error::LengthNotPageMultiple {
                len: self.len,
                page_size: ps,
            });
        }
        if let Some(a) = self.at {
            if a % ps as u64 != 0 {
                return Err(Error::Unaligned { addr: a, align: ps });
            }
        }
        if self.store.tail() == Tail::Refuse {
            if let Some(sl) = self.store.len() {
                if sl < self.len as u64 {
                    return Err(Error::StoreTooShort {
                        store: self.store.describe().to_string(),
                        store_len: sl,
                        region_len: self.len as u64,
                    });
                }
            }
        }
        if engine.kind() == EngineKind::Signal && !self.store.signal_safe() {
            return Err(Error::StoreNotSignalSafe {
                store: self.store.describe().to_string(),
            });
        }
        if let Err(why) = &capabilities().kind(self.kind).ioctls {
            return Err(Error::Unsupported {
                what: self.kind.name(),
                reason: why.clone(),
            });
        }
        let op = match (self.op, self.kind) {
            (ResolveOp::Auto, MemoryKind::PrivateAnon) => ResolveOp::Copy,
            (ResolveOp::Auto, _) => ResolveOp::Continue,
            (op, _) => op,
        };
        let bit = match op {
            ResolveOp::Copy | ResolveOp::Auto => ioctl_bit::COPY,
            ResolveOp::Move => ioctl_bit::MOVE,
            ResolveOp::Continue => ioctl_bit::CONTINUE,
        };
        if let Some(why) = op_unusable(self.kind, bit) {
            return Err(Error::Unsupported {
                what: op.name(),
                reason: format!("on {} memory: {why}", self.kind.name()),
            });
        }
        if op == ResolveOp::Continue && self.kind == MemoryKind::PrivateAnon {
            return Err(Error::Unsupported {
                what: "CONTINUE",
                reason: "minor faults exist only for shmem and hugetlb".into(),
            });
        }
        if let Some(b) = &self.budget {
            if self.kind != MemoryKind::PrivateAnon || op != ResolveOp::Copy {
                return Err(Error::Unsupported {
                    what: "a memory budget",
                    reason: format!(
                        "eviction supports private anonymous regions resolved with COPY (not {} with {})",
                        self.kind.name(),
                        op.name()
                    ),
                });
            }
            if b.budget_pages == 0 {
                return Err(Error::ZeroLength);
            }
            if !capabilities().has(crate::sys::uffd::feature::PAGEFAULT_FLAG_WP) {
                return Err(Error::Unsupported {
                    what: "a memory budget",
                    reason: "dirty tracking needs UFFD_FEATURE_PAGEFAULT_FLAG_WP".into(),
                });
            }
        }
        if self.store.is_zero() || op == ResolveOp::Continue {
            // No scratch needed.
        } else if ps > engine.scratch_bytes() {
            return Err(Error::BadPageSize {
                page_size: ps,
                reason: "larger than the engine's scratch buffer (EngineConfig::scratch_bytes)",
            });
        }
        Ok(op)
    }

    /// Maps the region, registers it with `engine` and publishes it.
    pub fn build<E: Engine>(self, engine: &Arc<E>) -> Result<Region> {
        let engine: Arc<dyn Engine> = engine.clone();
        self.build_dyn(engine)
    }

    /// [`build`](Self::build) for an engine chosen at run time.
    pub fn build_dyn(mut self, engine: Arc<dyn Engine>) -> Result<Region> {
        let op = self.validate(&*engine)?;
        engine.check_alive()?;
        zero_source_init()?;
        let len = self.len;
        let ps = self.page_size;
        let pages = len / ps;
        if let Some(a) = self.at {
            if let Some(o) = TABLE
                .read()
                .items()
                .iter()
                .find(|i| i.start < a + len as u64 && i.end > a)
            {
                return Err(Error::Overlap(crate::interval::IntervalError::Overlap {
                    start: a,
                    end: a + len as u64,
                    other_start: o.start,
                    other_end: o.end,
                }));
            }
        }
        let (map, memfd) = match self.kind {
            MemoryKind::PrivateAnon => {
                // Huge frames move in at PMD level: 2 MiB-aligned region.
                let huge = self.pool.as_ref().is_some_and(|p| p.huge) && op == ResolveOp::Move;
                let m = match self.at {
                    Some(a) if huge && a % crate::pool::HUGE as u64 != 0 => {
                        return Err(Error::Unaligned {
                            addr: a,
                            align: crate::pool::HUGE,
                        })
                    }
                    Some(a) => mem::anon_at(a, len)?,
                    None if huge => Mapping::anon_aligned(len, crate::pool::HUGE)?,
                    None => Mapping::anon(len)?,
                };
                m.advise(0, len, libc::MADV_NOHUGEPAGE)?;
                (m, None)
            }
            MemoryKind::Shmem if self.page_cache_file.is_some() => {
                let file = self.page_cache_file.take().expect("checked");
                if !mem::is_tmpfs(&file)? {
                    return Err(Error::Unsupported {
                        what: "page_cache_file",
                        reason: "the file is not on tmpfs/shmem (minor faults and CONTINUE exist only for shmem and hugetlb)".into(),
                    });
                }
                // SAFETY: F_GETFL only reads the fd's status flags.
                let fl =
                    unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_GETFL) };
                if fl & libc::O_ACCMODE != libc::O_RDWR {
                    return Err(Error::Unsupported {
                        what: "page_cache_file",
                        reason: "the file must be opened read-write (userfaultfd registers only shared mappings that may be written)".into(),
                    });
                }
                let file_len = file
                    .metadata()
                    .map_err(|e| Error::Io {
                        op: "fstat",
                        source: e,
                    })?
                    .len();
                if (len as u64) > file_len.next_multiple_of(BASE_PAGE as u64) {
                    return Err(Error::StoreTooShort {
                        store: "page_cache_file".into(),
                        store_len: file_len,
                        region_len: len as u64,
                    });
                }
                let fd: std::os::fd::OwnedFd = file.into();
                let m = match self.at {
                    Some(a) => mem::shared_at(a, &fd, len)?,
                    None => Mapping::shared(&fd, len, 0)?,
                };
                (m, Some(fd))
            }
            MemoryKind::Shmem | MemoryKind::Hugetlb => {
                let huge = self.kind == MemoryKind::Hugetlb;
                let fd = mem::memfd("faultline-region", huge)?;
                mem::ftruncate(&fd, len as u64)?;
                let m = match self.at {
                    Some(a) => mem::shared_at(a, &fd, len)?,
                    None => Mapping::shared(&fd, len, 0)?,
                };
                if !huge {
                    // shmem THP would map a whole 2 MiB folio behind one
                    // subpage and hide the other faults.
                    m.advise(0, len, libc::MADV_NOHUGEPAGE)?;
                }
                (m, Some(fd))
            }
        };
        let alias = match &memfd {
            Some(fd) => {
                let a = Mapping::shared(fd, len, 0)?;
                if self.kind == MemoryKind::Shmem {
                    a.advise(0, len, libc::MADV_NOHUGEPAGE)?;
                }
                Some(a)
            }
            None => None,
        };
        // Pages already in the file's page cache (a page_cache_file's data;
        // nothing for a fresh memfd) need no fill.
        let cached = memfd.as_ref().map(|_| Bitset::new(pages));
        if let (Some(c), Some(a)) = (&cached, &alias) {
            let resident = a.resident_map()?;
            let per = ps / BASE_PAGE;
            for p in 0..pages {
                if resident[p * per..(p + 1) * per].iter().all(|&r| r) {
                    c.set(p);
                }
            }
        }
        let pool = if op == ResolveOp::Move {
            let cfg = self.pool.clone().unwrap_or(crate::pool::FramePoolConfig {
                pages: (4 * self.fault_around).max(64),
                ..Default::default()
            });
            Some(crate::pool::FramePool::new(cfg, ps, self.fault_around)?)
        } else {
            None
        };
        let uffd = engine.uffd().clone();
        let mode = match self.kind {
            MemoryKind::PrivateAnon if self.budget.is_some() => {
                register_mode::MISSING | register_mode::WP
            }
            MemoryKind::PrivateAnon => register_mode::MISSING,
            _ => register_mode::MISSING | register_mode::MINOR,
        };
        let granted = uffd.register(map.addr(), len as u64, mode)?;
        let need = match op {
            ResolveOp::Move => ioctl_bit::MOVE,
            ResolveOp::Continue => ioctl_bit::CONTINUE,
            _ => ioctl_bit::COPY,
        };
        if granted & (1 << need) == 0 {
            let _ = uffd.unregister(map.addr(), len as u64);
            return Err(Error::Unsupported {
                what: op.name(),
                reason: format!(
                    "REGISTER on {} memory did not grant it (ioctls {granted:#x})",
                    self.kind.name()
                ),
            });
        }
        let zero_len_pages = (ZERO_SOURCE_BYTES / ps).max(1);
        let shared = Box::new(Shared {
            id: NEXT_ID.fetch_add(1, Relaxed),
            base: map.addr(),
            len: len as u64,
            page_size: ps,
            pages,
            kind: self.kind,
            op,
            zeropage_reads: self.kind == MemoryKind::PrivateAnon
                && self.op == ResolveOp::Auto
                && self.budget.is_none(),
            fault_around: self.fault_around,
            // Runs COPY'd from the shared zero buffer are capped by its
            // size; CONTINUE copies nothing.
            max_run_pages: if self.store.is_zero() && op != ResolveOp::Continue {
                zero_len_pages
            } else {
                usize::MAX
            },
            store: self.store,
            residency: Residency::new(pages),
            cached,
            alias,
            pool,
            uffd,
            signal_mode: engine.kind() == EngineKind::Signal,
            inflight: AtomicUsize::new(0),
            stats: Counters::default(),
            feed: self.run_ahead.map(|_| crate::runahead::Feed::default()),
            readahead: self.readahead.map(ReadaheadState::new),
            evict: self
                .budget
                .map(|b| crate::evict::EvictState::new(pages, b.budget_pages, self.fault_around)),
            ahead: self.run_ahead.map(|_| Bitset::new(pages)),
            timing_start: AtomicU64::new(0),
            timing_resolved: AtomicU64::new(0),
            last_poisoned: AtomicU64::new(u64::MAX),
        });
        let ptr = &*shared as *const Shared as usize;
        if let Err(e) = TABLE.insert(map.addr(), map.addr() + len as u64, ptr) {
            let _ = shared.uffd.unregister(map.addr(), len as u64);
            return Err(Error::Overlap(e));
        }
        engine.region_added();
        let mut region = Region {
            shared: Some(shared),
            map: Some(map),
            _memfd: memfd,
            engine,
            populator: None,
            evictor: None,
            drain_timeout: self.drain_timeout,
        };
        // Background threads start last: if one cannot, dropping `region`
        // tears everything down (stopping any thread already started).
        let spawn_err = |op| move |e| Error::Io { op, source: e };
        if let Some(cfg) = self.run_ahead {
            let scratch = region.engine.scratch_bytes();
            region.populator = Some(
                crate::runahead::start(region.shared(), cfg, scratch)
                    .map_err(spawn_err("spawn run-ahead thread"))?,
            );
        }
        if let Some(cfg) = self.budget {
            region.evictor = Some(
                crate::evict::start(region.shared(), cfg)
                    .map_err(spawn_err("spawn evictor thread"))?,
            );
        }
        Ok(region)
    }
}

/// A mapping whose page faults faultline resolves. See the module docs.
pub struct Region {
    shared: Option<Box<Shared>>,
    map: Option<Mapping>,
    _memfd: Option<std::os::fd::OwnedFd>,
    engine: Arc<dyn Engine>,
    populator: Option<RegionThread>,
    evictor: Option<RegionThread>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared();
        f.debug_struct("Region")
            .field("id", &s.id)
            .field("base", &format_args!("{:#x}", s.base))
            .field("len", &s.len)
            .field("page_size", &s.page_size)
            .field("kind", &s.kind)
            .field("op", &s.op)
            .field("engine", &self.engine.kind())
            .finish()
    }
}

impl Region {
    /// A builder for a region of `len` bytes.
    pub fn builder(len: usize) -> RegionBuilder {
        RegionBuilder::new(len)
    }

    pub(crate) fn shared(&self) -> &Shared {
        self.shared.as_ref().expect("live region")
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared().base as *mut u8
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.shared().base
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.shared().len as usize
    }
    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Region page size.
    pub fn page_size(&self) -> usize {
        self.shared().page_size
    }
    /// Number of region pages.
    pub fn pages(&self) -> usize {
        self.shared().pages
    }
    /// Memory kind.
    pub fn kind(&self) -> MemoryKind {
        self.shared().kind
    }
    /// The resolve op in use (never `Auto`).
    pub fn resolve_op(&self) -> ResolveOp {
        self.shared().op
    }
    /// The engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn PageStore> {
        &self.shared().store
    }
    /// Process-unique id, as printed in messages.
    pub fn id(&self) -> u64 {
        self.shared().id
    }

    /// State of region page `page`.
    pub fn page_state(&self, page: usize) -> PageState {
        self.shared().residency.get(page)
    }

    /// Whether every page overlapping the byte range `[offset, offset+len)`
    /// is mapped (VPRI's presence check before a device-style access).
    pub fn is_resident(&self, offset: usize, len: usize) -> bool {
        let s = self.shared();
        if len == 0 || offset + len > s.len as usize {
            return false;
        }
        let first = offset / s.page_size;
        let last = (offset + len - 1) / s.page_size;
        s.residency.is_resident(first..last + 1)
    }

    /// Number of resident pages.
    pub fn resident_pages(&self) -> usize {
        let s = self.shared();
        s.residency.count(0..s.pages, PageState::ReadOnly)
            + s.residency.count(0..s.pages, PageState::Writable)
    }

    /// Counters.
    pub fn stats(&self) -> RegionStats {
        let c = &self.shared().stats;
        RegionStats {
            faults: c.faults.load(Relaxed),
            installed: c.installed.load(Relaxed),
            ioctls: c.ioctls.load(Relaxed),
            store_fills: c.store_fills.load(Relaxed),
            zero_copy_fills: c.zero_copy_fills.load(Relaxed),
            exists: c.exists.load(Relaxed),
            retries: c.retries.load(Relaxed),
            gone: c.gone.load(Relaxed),
            busy: c.busy.load(Relaxed),
            poisoned: c.poisoned.load(Relaxed),
            pool_misses: c.pool_misses.load(Relaxed),
            handler_cycles: c.handler_cycles.load(Relaxed),
        }
    }

    /// Counters of eviction, for regions with a budget.
    pub fn eviction_stats(&self) -> Option<crate::evict::EvictionStats> {
        self.shared().evict.as_ref().map(|e| e.stats())
    }

    /// Writes every dirty page back to the store (they stay resident,
    /// clean and write-protected). Regions without a budget do not track
    /// dirtiness: `Ok(0)`. Returns the pages written; on a store error the
    /// remaining pages are still attempted and the first error returned.
    pub fn flush(&self) -> Result<usize> {
        let s = self.shared();
        if s.evict.is_none() {
            return Ok(0);
        }
        let mut written = 0;
        let mut first_err = None;
        for p in 0..s.pages {
            if s.residency.get(p) != PageState::Writable {
                continue;
            }
            // Wait for a fault or the evictor to let go of the page.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !s.residency.try_claim(p) {
                if Instant::now() > deadline {
                    return Err(Error::Io {
                        op: "flush: claiming a page",
                        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                    });
                }
                std::thread::yield_now();
            }
            if s.residency.get(p) == PageState::Writable {
                match crate::evict::write_back(s, p) {
                    Ok(()) => written += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            s.residency.release(p..p + 1);
        }
        match first_err {
            Some(e) => Err(Error::Store(e)),
            None => Ok(written),
        }
    }

    /// Counters of run-ahead population, if enabled.
    pub fn run_ahead_stats(&self) -> Option<crate::runahead::RunAheadStats> {
        self.shared().feed.as_ref().map(|f| f.stats())
    }

    /// Whether run-ahead population installed region page `page` (before
    /// any fault on it).
    pub fn populated_ahead(&self, page: usize) -> bool {
        self.shared().ahead.as_ref().is_some_and(|a| a.get(page))
    }

    /// Counters of the frame pool ([`ResolveOp::Move`] regions).
    pub fn frame_pool_stats(&self) -> Option<crate::pool::FramePoolStats> {
        self.shared().pool.as_ref().map(|p| p.stats())
    }

    /// TSC stamps of the most recent fault: when its handler started and
    /// when its resolve ioctl returned (for phase breakdowns).
    pub fn last_fault_tsc(&self) -> (u64, u64) {
        let s = self.shared();
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
        let s = self.shared();
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        if !offset.is_multiple_of(s.page_size) {
            return Err(Error::Unaligned {
                addr: s.base + offset as u64,
                align: s.page_size,
            });
        }
        if offset + len > s.len as usize {
            return Err(Error::OutOfRange {
                start: s.base + offset as u64,
                end: s.base + (offset + len) as u64,
                region_start: s.base,
                region_end: s.base + s.len,
            });
        }
        let mut scratch = vec![
            0u8;
            (s.fault_around.max(1) * s.page_size)
                .min(self.engine.scratch_bytes().max(s.page_size))
        ];
        let first = offset / s.page_size;
        let last = (offset + len).div_ceil(s.page_size);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut p = first;
        while p < last {
            if s.residency.get(p) == PageState::Absent {
                use crate::resolve::{resolve, Resolution};
                match resolve(s, s.page_addr(p), true, false, true, &mut scratch, None) {
                    Resolution::Resolved => {}
                    Resolution::Busy | Resolution::Retry => {
                        if Instant::now() > deadline {
                            return Err(Error::Io {
                                op: "populate",
                                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                            });
                        }
                        std::thread::yield_now();
                        continue;
                    }
                    Resolution::Gone => {
                        return Err(Error::Io {
                            op: "populate",
                            source: std::io::Error::from_raw_os_error(libc::ENOENT),
                        })
                    }
                    Resolution::Poisoned => {
                        return Err(Error::Store(crate::store::StoreError::Failed {
                            offset: (p * s.page_size) as u64,
                            reason: "page was poisoned by an earlier store error".into(),
                        }))
                    }
                    Resolution::StoreFailed(e) => return Err(Error::Store(e)),
                    Resolution::Failed(e) => return Err(Error::Uffd(e)),
                }
            }
            p += 1;
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // 0. The populator reads the region's state: stop it first.
        if let (Some(p), Some(s)) = (self.populator.as_mut(), self.shared.as_ref()) {
            p.stop(|| {
                s.feed
                    .as_ref()
                    .expect("run-ahead regions have a feed")
                    .wake_all()
            });
        }
        // 0b. Stop evicting, then write every dirty page back.
        if let Some(e) = self.evictor.as_mut() {
            e.stop(|| ());
            if let Err(err) = self.flush() {
                crate::engine::report(|w| {
                    use std::fmt::Write;
                    let _ = write!(w, "region #{}: dropped with dirty pages that could not be written back: {err}", self.id());
                });
            }
        }
        let shared = self.shared.take().expect("live region");
        let map = self.map.take().expect("live region");
        let (base, len) = (shared.base, shared.len);
        // 1. Unpublish: after the grace period no handler can find it.
        TABLE.remove(base, base + len);
        // 2. Drain the resolutions already in flight (they complete with
        //    real data).
        let deadline = Instant::now() + self.drain_timeout;
        let mut drained = true;
        while shared.inflight.load(SeqCst) != 0 {
            if Instant::now() > deadline {
                drained = false;
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // 3. Fail closed for threads still blocked on queued faults: poison
        //    every page that is still absent, then wake. They retry into a
        //    poison marker and get SIGBUS. A plain UNREGISTER would let them
        //    retry without userfaultfd and hand them zero pages. Installed
        //    pages stay, so a thread woken by an in-flight resolution that
        //    has not yet re-executed its access still finds its page.
        poison_absent(&shared);
        let _ = shared.uffd.wake(base, len);
        let _ = shared.uffd.unregister(base, len);
        self.engine.region_removed();
        drop(map);
        if drained {
            drop(shared);
        } else {
            let mut w = crate::engine::StackWriter::new();
            use std::fmt::Write;
            let _ = writeln!(
                w,
                "faultline: region #{} dropped with a resolution still in flight after {:?}; leaking its state",
                shared.id, self.drain_timeout
            );
            crate::sys::write_stderr(w.as_bytes());
            std::mem::forget(shared);
        }
    }
}

/// Poisons every absent page of the region (runs of absent pages in one
/// ioctl each). A page the map thinks absent but that exists is skipped.
fn poison_absent(s: &Shared) {
    let ps = s.page_size as u64;
    let mut p = 0;
    while p < s.pages {
        if s.residency.get(p) != PageState::Absent {
            p += 1;
            continue;
        }
        let start = p;
        while p < s.pages && s.residency.get(p) == PageState::Absent {
            p += 1;
        }
        let mut a = s.page_addr(start);
        let end = s.page_addr(p);
        let mut retries = 0;
        while a < end {
            use crate::sys::uffd::{mode, Outcome};
            match s.uffd.poison(a, end - a, mode::POISON_DONTWAKE) {
                Ok(Outcome::Done(_)) | Ok(Outcome::Gone(_)) | Err(_) => break,
                // Stopped at a page that exists: skip it.
                Ok(Outcome::Partial { done, .. }) => a += (done as u64).next_multiple_of(ps) + ps,
                Ok(Outcome::Exists) => a += ps,
                // An event is pending; it clears when its thread runs.
                Ok(Outcome::Retry) if retries < 1000 => {
                    retries += 1;
                    std::thread::sleep(Duration::from_micros(50));
                }
                Ok(Outcome::Retry) => a += ps,
            }
        }
    }
}
