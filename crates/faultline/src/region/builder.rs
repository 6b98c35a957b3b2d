//! The region builder: from a request to a published region.
//!
//! [`RegionBuilder::build`]:
//!
//! 1. validates the request (page size, length, store, what the engine
//!    and the kernel support) and picks what is not given: the memory
//!    kind, the resolve op and the read-ahead (`validate`, a `Plan`);
//! 2. maps the memory (private anonymous, a memfd with its unregistered
//!    alias view, or the store's own tmpfs file: `map_memory`) and
//!    registers it with the engine's userfaultfd, checking that REGISTER
//!    granted the resolve op's ioctl;
//! 3. builds the fault path's `RegionState` and publishes it in the
//!    region table, after which faults in the range reach the runtime;
//! 4. starts the region's background threads (run-ahead populator,
//!    evictor) last: if one cannot start, dropping the half-built region
//!    tears everything down.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use super::handle::Region;
use crate::caps::{capabilities, op_unusable};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::evict::{EvictionConfig, SharedBudget};
use crate::fault::feeds::{BudgetFeed, RunAheadFeed};
use crate::fault::readahead::Streams;
use crate::fault::state::Counters;
use crate::fault::{table, RegionState};
use crate::page::{MemoryKind, PageSize, Pages, ResolveOp};
use crate::policy::{PolicyKind, ReadaheadConfig};
use crate::pool::{FramePool, FramePoolConfig};
use crate::residency::{PageBits, Residency};
use crate::runahead::RunAheadConfig;
use crate::store::{PageStore, Tail, ZeroStore};
use faultline_sys::mem::{self, Advice, Mapping};
use faultline_sys::uffd::{feature, ioctl_bit, register_mode};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Where a region's pages may come from without a copy.
enum ZeroCopy {
    /// The store's page cache, when it has one and nothing else forbids it.
    Auto,
    /// Never: resolve from the store.
    Off,
    /// This file's page cache ([`RegionBuilder::page_cache_file`]).
    File(std::fs::File),
}

/// Builds a [`Region`]. See [the region docs](super) for the defaults.
#[must_use]
pub struct RegionBuilder {
    len: usize,
    page_size: Option<usize>,
    kind: Option<MemoryKind>,
    store: Arc<dyn PageStore>,
    readahead: Option<ReadaheadConfig>,
    op: ResolveOp,
    at: Option<u64>,
    pool: Option<FramePoolConfig>,
    run_ahead: Option<RunAheadConfig>,
    budget: Option<EvictionConfig>,
    low_water: Option<usize>,
    evictors: usize,
    shared_budget: Option<Arc<SharedBudget>>,
    drain_timeout: Duration,
    zero_copy: ZeroCopy,
}

/// What `validate` decided.
struct Plan {
    kind: MemoryKind,
    page_size: PageSize,
    op: ResolveOp,
    readahead: ReadaheadConfig,
    /// Map this tmpfs file privately and CONTINUE its page cache.
    page_cache: Option<(OwnedFd, u64)>,
}

impl Region {
    /// A builder for a region of `len` bytes.
    pub fn builder(len: usize) -> RegionBuilder {
        RegionBuilder::new(len)
    }
}

/// The smallest budget of a region's own (see [`Error::BudgetTooSmall`]):
/// `a[0:4096] = a[4096:8192]` in Python under a one-page budget never
/// finished.
pub const MIN_BUDGET_PAGES: usize = 4;

impl RegionBuilder {
    /// A region of `len` bytes: private anonymous memory (or the store's
    /// tmpfs file), pages of the memory kind's size, a zero store,
    /// adaptive read-ahead, resolve op chosen automatically.
    pub fn new(len: usize) -> RegionBuilder {
        RegionBuilder {
            len,
            page_size: None,
            kind: None,
            store: Arc::new(ZeroStore),
            readahead: None,
            op: ResolveOp::Auto,
            at: None,
            pool: None,
            run_ahead: None,
            budget: None,
            low_water: None,
            evictors: 1,
            shared_budget: None,
            drain_timeout: Duration::from_secs(10),
            zero_copy: ZeroCopy::Auto,
        }
    }
    /// Region page size: a power of two from 4 KiB (at least 2 MiB for
    /// hugetlb). Each fault resolves at least one region page. Default:
    /// the memory kind's page.
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = Some(bytes);
        self
    }
    /// Memory kind. Default: private anonymous, or shmem when the store's
    /// page cache is mapped (see [`zero_copy`](Self::zero_copy)).
    pub fn kind(mut self, kind: MemoryKind) -> Self {
        self.kind = Some(kind);
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
    /// A fixed fault-around depth: every fault resolves the absent pages of
    /// the aligned window of `pages` region pages holding it, in one
    /// ioctl. `fault_around(1)` resolves only the faulting page (read-ahead
    /// off). Replaces the adaptive default.
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.readahead = Some(ReadaheadConfig::fixed(pages));
        self
    }
    /// The read-ahead policy in full (see [`ReadaheadConfig`]): an aligned
    /// fault-around window for isolated faults, doubling on sequential
    /// streams up to a maximum. Replaces the adaptive default.
    pub fn readahead(mut self, cfg: ReadaheadConfig) -> Self {
        self.readahead = Some(cfg);
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
    /// (default: `max(64, 4 * window)`), refilled by the fault path.
    pub fn move_pool(mut self, pages: usize) -> Self {
        self.pool = Some(FramePoolConfig {
            pages,
            ..Default::default()
        });
        self
    }
    /// The frame pool of [`ResolveOp::Move`] in full: size, 2 MiB
    /// transparent huge frames, a background refill thread. See
    /// [`crate::pool`].
    pub fn frame_pool(mut self, cfg: FramePoolConfig) -> Self {
        self.pool = Some(cfg);
        self
    }
    /// Run-ahead population: a background thread installs the windows a
    /// sequential or strided stream of faults is about to reach (see
    /// [`crate::runahead`]).
    pub fn run_ahead(mut self, cfg: RunAheadConfig) -> Self {
        self.run_ahead = Some(cfg);
        self
    }
    /// A resident-memory budget: past it, an evictor thread writes dirty
    /// pages back to the store and drops pages the policy picks (see
    /// [`crate::evict`]). Private anonymous regions resolved with COPY.
    ///
    /// An evicted page reads what its store holds: over the default
    /// [`ZeroStore`], which discards writes, a page written and evicted
    /// reads zeros again (scratch memory with a cap); give a store that
    /// keeps writes (a [`FileStore`](crate::FileStore) opened read-write,
    /// a [`MemoryStore`](crate::MemoryStore)) for data that must survive
    /// eviction. A store that refuses writes ([`PageStore::writable`]
    /// false) keeps its dirty pages resident and `flush` says why.
    pub fn budget(mut self, cfg: EvictionConfig) -> Self {
        self.budget = Some(cfg);
        self
    }
    /// With a [`budget`](Self::budget): once the region goes past it, the
    /// evictor evicts down to `pages` (at most the budget; UMap's low-water
    /// mark) before it rests, instead of stopping just under the budget.
    /// Default: the budget on the signal engine, an eighth below it under
    /// handler threads (whose faults wait for the evictor when they find
    /// the budget full; see [`crate::evict`]).
    pub fn budget_low_water(mut self, pages: usize) -> Self {
        self.low_water = Some(pages);
        self
    }
    /// With a [`budget`](Self::budget): how many evictor threads the
    /// region runs (at least 1; default 1). They share the region's victim
    /// lock only to pick victims, so their write-backs and zaps run in
    /// parallel (UMap's `UMAP_PAGE_EVICTORS` evict workers). A region
    /// whose events handler threads read (the thread engines) runs one:
    /// its zaps wait for their REMOVE events one run of pages at a time.
    pub fn evictors(mut self, n: usize) -> Self {
        self.evictors = n.max(1);
        self
    }
    /// A budget shared with the other regions built with the same
    /// [`SharedBudget`] (UMap's one buffer): their resident pages count
    /// together, and each region's evictor (with `policy`) evicts its own
    /// pages while the total is past the budget. Replaces
    /// [`budget`](Self::budget) and [`budget_low_water`](Self::budget_low_water).
    pub fn shared_budget(mut self, shared: Arc<SharedBudget>, policy: PolicyKind) -> Self {
        self.budget = Some(EvictionConfig {
            budget_pages: shared.pages(),
            policy,
        });
        self.shared_budget = Some(shared);
        self
    }
    /// How long dropping the region waits for in-flight faults.
    pub fn drain_timeout(mut self, t: Duration) -> Self {
        self.drain_timeout = t;
        self
    }
    /// Whether the region may map the store's tmpfs file and install its
    /// page-cache pages without a copy ([`PageStore::page_cache`]).
    /// Default: yes, when the store offers it and the region is plain (no
    /// memory kind, resolve op, budget or frame pool asked for, the region
    /// no longer than the file).
    pub fn zero_copy(mut self, on: bool) -> Self {
        self.zero_copy = if on { ZeroCopy::Auto } else { ZeroCopy::Off };
        self
    }
    /// Maps this tmpfs/shmem file itself (privately) and treats its page
    /// cache as the data: pages in the page cache are installed with
    /// `UFFDIO_CONTINUE` (minor faults: no copy, no allocation), pages that
    /// are not (holes) are filled from the region's store (zeros by
    /// default). Writes stay private to the region (copy on write), as with
    /// the kernel's `mmap(MAP_PRIVATE)` of the same file, which is the
    /// baseline. The region may be shorter than the file, not longer.
    pub fn page_cache_file(mut self, file: std::fs::File) -> Self {
        self.zero_copy = ZeroCopy::File(file);
        self
    }

    /// The page cache the region maps, if any: `(file, offset, file bytes
    /// from offset)`.
    fn page_cache(&self) -> Result<Option<(OwnedFd, u64, u64)>> {
        let dup = |fd: std::os::fd::BorrowedFd<'_>| {
            fd.try_clone_to_owned().map_err(|e| Error::Io {
                op: "dup of the page-cache file",
                source: e,
            })
        };
        let (fd, offset, len) = match &self.zero_copy {
            ZeroCopy::Off => return Ok(None),
            ZeroCopy::File(f) => {
                if !mem::is_tmpfs(f)? {
                    return Err(Error::Unsupported {
                        what: "page_cache_file",
                        reason: "the file is not on tmpfs/shmem (minor faults and CONTINUE exist only for shmem and hugetlb)".into(),
                    });
                }
                let len = f
                    .metadata()
                    .map_err(|e| Error::Io {
                        op: "fstat",
                        source: e,
                    })?
                    .len();
                (dup(f.as_fd())?, 0, len)
            }
            ZeroCopy::Auto => {
                let plain = self.kind.is_none()
                    && self.op == ResolveOp::Auto
                    && self.budget.is_none()
                    && self.pool.is_none();
                match self.store.page_cache().filter(|_| plain) {
                    Some(pc) => (dup(pc.fd)?, pc.offset, pc.len),
                    None => return Ok(None),
                }
            }
        };
        Ok(Some((fd, offset, len)))
    }

    fn validate(&mut self, engine: &dyn Engine) -> Result<Plan> {
        if self.len == 0 {
            return Err(Error::ZeroLength);
        }
        let mut page_cache = self.page_cache()?;
        let explicit = matches!(self.zero_copy, ZeroCopy::File(_));
        let kind = match (self.kind, &page_cache) {
            (Some(k), None) => k,
            (Some(MemoryKind::Shmem) | None, Some(_)) => MemoryKind::Shmem,
            (Some(k), Some(_)) => {
                return Err(Error::Unsupported {
                    what: "page_cache_file",
                    reason: format!("the page cache is shmem memory, not {}", k.name()),
                })
            }
            (None, None) => MemoryKind::PrivateAnon,
        };
        let page_size =
            PageSize::for_kind(self.page_size.unwrap_or(kind.min_page_size().bytes()), kind)?;
        if !self.len.is_multiple_of(page_size.bytes()) {
            return Err(Error::LengthNotPageMultiple {
                len: self.len,
                page_size: page_size.bytes(),
            });
        }
        if let Some(a) = self.at {
            if a == 0 {
                return Err(Error::Unsupported {
                    what: "a region at address 0",
                    reason: "the null pointer: an access to it must stay a crash".into(),
                });
            }
            if !a.is_multiple_of(page_size.bytes() as u64) {
                return Err(Error::Unaligned {
                    addr: a,
                    align: page_size.bytes(),
                });
            }
        }
        if let Some((_, offset, file_len)) = page_cache {
            // The mapping may not pass the end of the file (an access there
            // is a SIGBUS no handler sees), nor may a region page.
            let fits = offset.is_multiple_of(PageSize::BASE.bytes() as u64)
                && self.len as u64 <= file_len.next_multiple_of(page_size.bytes() as u64)
                && (self.len as u64).next_multiple_of(PageSize::BASE.bytes() as u64)
                    <= file_len.next_multiple_of(PageSize::BASE.bytes() as u64);
            let usable = capabilities()
                .kind(MemoryKind::Shmem)
                .allows(ioctl_bit::CONTINUE);
            if explicit && !fits {
                return Err(Error::StoreTooShort {
                    store: "page_cache_file".into(),
                    store_len: file_len,
                    region_len: self.len as u64,
                });
            }
            if !fits || !usable {
                page_cache = None;
            }
        }
        // Auto mode fell back to copies: the memory is private anonymous.
        let kind = match (&page_cache, self.kind) {
            (None, None) => MemoryKind::PrivateAnon,
            _ => kind,
        };
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
        if engine.delivery().on_faulting_thread && !self.store.signal_safe() {
            return Err(Error::StoreNotSignalSafe {
                store: self.store.describe().to_string(),
            });
        }
        if let Err(why) = &capabilities().kind(kind).ioctls {
            return Err(Error::Unsupported {
                what: kind.name(),
                reason: why.clone(),
            });
        }
        let op = match (self.op, kind) {
            (ResolveOp::Auto, MemoryKind::PrivateAnon) => ResolveOp::Copy,
            (ResolveOp::Auto, _) => ResolveOp::Continue,
            (op, _) => op,
        };
        if op == ResolveOp::Continue && kind == MemoryKind::PrivateAnon {
            return Err(Error::Unsupported {
                what: "CONTINUE",
                reason: "minor faults exist only for shmem and hugetlb".into(),
            });
        }
        if let Some(why) = op_unusable(kind, op_bit(op)) {
            return Err(Error::Unsupported {
                what: op.name(),
                reason: format!("on {} memory: {why}", kind.name()),
            });
        }
        if let Some(b) = &self.budget {
            if kind != MemoryKind::PrivateAnon || op != ResolveOp::Copy {
                return Err(Error::Unsupported {
                    what: "a memory budget",
                    reason: format!(
                        "eviction supports private anonymous regions resolved with COPY (not {} with {})",
                        kind.name(),
                        op.name()
                    ),
                });
            }
            if b.budget_pages == 0 {
                return Err(Error::BudgetTooSmall {
                    pages: 0,
                    min: MIN_BUDGET_PAGES,
                });
            }
            // A budget of the whole region evicts nothing, however small;
            // a shared one (UMap's buffer) takes what UMap takes.
            let region_pages = self.len / page_size.bytes();
            if b.budget_pages < MIN_BUDGET_PAGES
                && b.budget_pages < region_pages
                && self.shared_budget.is_none()
            {
                return Err(Error::BudgetTooSmall {
                    pages: b.budget_pages,
                    min: MIN_BUDGET_PAGES,
                });
            }
            if !capabilities().has(feature::PAGEFAULT_FLAG_WP) {
                return Err(Error::Unsupported {
                    what: "a memory budget",
                    reason: "dirty tracking needs UFFD_FEATURE_PAGEFAULT_FLAG_WP".into(),
                });
            }
        }
        let copies = !self.store.is_zero() && (op != ResolveOp::Continue || page_cache.is_some());
        if copies && page_size.bytes() > engine.scratch_bytes() {
            return Err(Error::BadPageSize {
                page_size: page_size.bytes(),
                reason: "larger than the engine's scratch buffer (EngineConfig::scratch_bytes)",
            });
        }
        let readahead = self.readahead.unwrap_or_else(|| {
            // What one more page per fault costs (see the module docs).
            if page_cache.is_some() {
                ReadaheadConfig::adaptive(64, 512)
            } else if self.store.is_zero() || self.budget.is_some() {
                // Under a budget every page read ahead of a random access
                // is one more to evict: isolated faults take one page.
                ReadaheadConfig::adaptive(1, 64)
            } else {
                ReadaheadConfig::adaptive(16, 256)
            }
        });
        Ok(Plan {
            kind,
            page_size,
            op,
            readahead,
            page_cache: page_cache.map(|(fd, off, _)| (fd, off)),
        })
    }

    /// Maps the region, registers it with `engine` and publishes it.
    pub fn build<E: Engine>(self, engine: &Arc<E>) -> Result<Region> {
        let engine: Arc<dyn Engine> = engine.clone();
        self.build_dyn(engine)
    }

    /// [`build`](Self::build) for an engine chosen at run time.
    pub fn build_dyn(mut self, engine: Arc<dyn Engine>) -> Result<Region> {
        let plan = self.validate(&*engine)?;
        // (Also refuses an engine made before a fork.)
        engine.check_alive()?;
        crate::fault::zero_init()?;
        let (len, ps, op) = (self.len, plan.page_size, plan.op);
        if let Some(a) = self.at {
            table::check_free(a, len as u64)?;
        }
        let window = plan.readahead.max;
        let huge_frames = op == ResolveOp::Move && self.pool.as_ref().is_some_and(|p| p.huge);
        let (map, memfd, alias) =
            map_memory(plan.kind, len, ps, self.at, plan.page_cache, huge_frames)?;
        // A forked child gets no copy: its userfaultfd registration would
        // not follow (the kernel drops it in the child), so every page not
        // yet present would read zeros there. Touching one is SIGSEGV.
        map.advise(0, len, Advice::DontFork)?;
        let pages = Pages::new(map.addr(), len, ps)?;
        // Pages already in the page cache (a tmpfs file's data; nothing for a
        // fresh memfd) need no fill: mincore of a file mapping reports the
        // page cache.
        let cached = match plan.kind {
            MemoryKind::PrivateAnon => None,
            _ => {
                let bits = PageBits::new(pages.count());
                let resident = map.resident_map()?;
                let per = ps.base_pages();
                for p in 0..pages.count() {
                    if resident[p * per..(p + 1) * per].iter().all(|&r| r) {
                        bits.set(p);
                    }
                }
                Some(bits)
            }
        };
        let pool = match op {
            ResolveOp::Move => {
                let cfg = self.pool.clone().unwrap_or(FramePoolConfig {
                    pages: (4 * window).max(64),
                    ..Default::default()
                });
                Some(FramePool::new(cfg, ps, plan.readahead.initial)?)
            }
            _ => None,
        };
        let uffd = engine.uffd().clone();
        let mode = match plan.kind {
            MemoryKind::PrivateAnon if self.budget.is_some() => {
                register_mode::MISSING | register_mode::WP
            }
            MemoryKind::PrivateAnon => register_mode::MISSING,
            _ => register_mode::MISSING | register_mode::MINOR,
        };
        let granted = uffd.register(map.addr(), len as u64, mode)?;
        if granted & (1 << op_bit(op)) == 0 {
            let _ = uffd.unregister(map.addr(), len as u64);
            return Err(Error::Unsupported {
                what: op.name(),
                reason: format!(
                    "REGISTER on {} memory did not grant it (ioctls {granted:#x})",
                    plan.kind.name()
                ),
            });
        }
        let copies_zeros = self.store.is_zero() && (op != ResolveOp::Continue || alias.is_none());
        let state = Box::new(RegionState {
            id: NEXT_ID.fetch_add(1, Relaxed),
            pages,
            kind: plan.kind,
            op,
            zeropage_reads: self.store.is_zero()
                && self.op == ResolveOp::Auto
                && self.budget.is_none()
                && alias.is_none(),
            // A handler thread reads every application thread's faults:
            // streams are told apart by where they are, not by who
            // resolves them (the `workers` engine splits one stream over
            // its threads).
            readahead: if engine.delivery().on_faulting_thread {
                Streams::new(plan.readahead)
            } else {
                Streams::by_address(plan.readahead)
            },
            // Runs COPY'd from the shared zero buffer are capped by its
            // size; CONTINUE copies nothing.
            max_run_pages: if copies_zeros {
                (crate::fault::ZERO_BYTES / ps.bytes()).max(1)
            } else {
                usize::MAX
            },
            store: self.store,
            residency: Residency::new(pages.count()),
            cached,
            alias,
            pool,
            uffd,
            delivery: engine.delivery(),
            inflight: AtomicUsize::new(0),
            stats: Counters::default(),
            budget: self.budget.map(|b| {
                BudgetFeed::new(pages.count(), b.budget_pages, window, self.shared_budget)
            }),
            runahead: self.run_ahead.map(|_| RunAheadFeed::new(pages.count())),
            timing_start: AtomicU64::new(0),
            written: None,
            copy_gate: None,
            timing_resolved: AtomicU64::new(0),
        });
        if let Err(e) = table::publish(&state) {
            let _ = state.uffd.unregister(map.addr(), len as u64);
            return Err(e);
        }
        engine.region_added();
        let mut region = Region {
            state: Some(state),
            map: Some(map),
            _memfd: memfd,
            engine,
            populator: None,
            evictors: Vec::new(),
            drain_timeout: self.drain_timeout,
        };
        // Background threads start last: if one cannot, dropping `region`
        // tears everything down (stopping any thread already started).
        let spawn_err = |op| move |e| Error::Io { op, source: e };
        if let Some(cfg) = self.run_ahead {
            let scratch = region.engine.scratch_bytes();
            region.populator = Some(
                crate::runahead::start(region.state(), cfg, scratch)
                    .map_err(spawn_err("spawn run-ahead thread"))?,
            );
        }
        if let Some(cfg) = self.budget {
            region.evictors =
                crate::evict::start(region.state(), cfg, self.low_water, self.evictors)
                    .map_err(spawn_err("spawn evictor thread"))?;
        }
        Ok(region)
    }
}

/// The ioctl an op resolves with.
fn op_bit(op: ResolveOp) -> u32 {
    match op {
        ResolveOp::Copy | ResolveOp::Auto => ioctl_bit::COPY,
        ResolveOp::Move => ioctl_bit::MOVE,
        ResolveOp::Continue => ioctl_bit::CONTINUE,
    }
}

/// What a hugetlb region's `mmap` failing with `ENOMEM` means.
const HUGETLB_POOL_SHORT: &str = "mmap of a hugetlb memfd (the pool has fewer free 2 MiB pages than the region: see HugePages_Free in /proc/meminfo, raise /proc/sys/vm/nr_hugepages)";

/// Maps a region's memory: the mapping, the memfd behind it (shmem,
/// hugetlb), and the unregistered alias view through which a memfd's page
/// cache is filled.
fn map_memory(
    kind: MemoryKind,
    len: usize,
    ps: PageSize,
    at: Option<u64>,
    page_cache: Option<(OwnedFd, u64)>,
    huge_frames: bool,
) -> Result<(Mapping, Option<OwnedFd>, Option<Mapping>)> {
    let huge = PageSize::HUGE_2M.bytes();
    if let Some((fd, offset)) = page_cache {
        let m = Mapping::file_private(at, &fd, len, offset)?;
        // A huge folio would hide the faults of its other subpages.
        m.advise(0, len, Advice::NoHugePage)?;
        return Ok((m, Some(fd), None));
    }
    match kind {
        MemoryKind::PrivateAnon => {
            // Huge frames move in at PMD level: a 2 MiB-aligned region.
            let m = match at {
                Some(a) if huge_frames && !a.is_multiple_of(huge as u64) => {
                    return Err(Error::Unaligned {
                        addr: a,
                        align: huge,
                    })
                }
                Some(a) => mem::anon_at(a, len)?,
                None if huge_frames => Mapping::anon_aligned(len, huge)?,
                None => Mapping::anon(len)?,
            };
            m.advise(0, len, Advice::NoHugePage)?;
            Ok((m, None, None))
        }
        MemoryKind::Shmem | MemoryKind::Hugetlb => {
            let hugetlb = kind == MemoryKind::Hugetlb;
            let fd = mem::memfd("faultline-region", hugetlb)?;
            mem::ftruncate(&fd, len as u64)?;
            // A hugetlb mapping reserves its pages from the pool when it
            // is made: ENOMEM here is a pool too small, not a lack of memory.
            let pool = |e: mem::MemError| match e.source.raw_os_error() {
                Some(n) if hugetlb && n == faultline_sys::Errno::ENOMEM.0 => mem::MemError {
                    op: HUGETLB_POOL_SHORT,
                    source: e.source,
                },
                _ => e,
            };
            let m = match at {
                Some(a) => mem::shared_at(a, &fd, len).map_err(pool)?,
                None => Mapping::shared(&fd, len, 0).map_err(pool)?,
            };
            let alias = Mapping::shared(&fd, len, 0)?;
            if !hugetlb {
                // shmem THP would map a whole 2 MiB folio behind one
                // subpage and hide the other faults.
                m.advise(0, len, Advice::NoHugePage)?;
                alias.advise(0, len, Advice::NoHugePage)?;
            }
            let _ = ps;
            Ok((m, Some(fd), Some(alias)))
        }
    }
}
