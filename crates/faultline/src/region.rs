//! Regions: the user's handle on a mapping whose page faults faultline
//! resolves, and the builder that makes one.
//!
//! Building a region
//!
//! 1. validates the request (page size, length, store, what the engine
//!    and the kernel support) and picks what is not given: the memory
//!    kind, the resolve op and the read-ahead;
//! 2. maps the memory (private anonymous, a memfd, or the store's own
//!    tmpfs file) and registers it with the engine's userfaultfd;
//! 3. builds the fault path's `RegionState` and publishes it in the
//!    region table, after which faults in the range reach the runtime;
//! 4. starts the region's background threads (run-ahead populator,
//!    evictor).
//!
//! Dropping it stops the background threads, writes dirty pages back,
//! then retires the state from the table (remaining faults fail closed:
//! SIGBUS, never a zero page; see `fault/table.rs`) and unmaps.
//!
//! # Defaults
//!
//! With no tuning, a region resolves faults the fast way:
//!
//! * **Read-ahead is adaptive.** A fault installs the aligned
//!   fault-around window of its page, and a thread that keeps faulting
//!   where its last window ended doubles its window, up to a maximum
//!   ([`crate::policy::ReadaheadConfig`]). The initial window follows what
//!   an extra page costs: 1 page for a zero store (random writers allocate
//!   nothing they do not touch), 16 for a store with data (the kernel's
//!   fault-around), 64 when pages are mapped from the page cache without a
//!   copy. [`RegionBuilder::fault_around`] fixes the window,
//!   [`RegionBuilder::readahead`] sets the policy,
//!   `fault_around(1)` turns it off.
//! * **Data already in memory is not copied.** When the store's data is a
//!   file on tmpfs ([`PageStore::page_cache`], e.g. a [`crate::FileStore`]
//!   over a file in `/dev/shm`), the region maps that file privately and
//!   installs its page-cache pages with `UFFDIO_CONTINUE`: no allocation,
//!   no copy, and writes stay private (copy on write), exactly as with the
//!   kernel's `mmap(MAP_PRIVATE)`. [`RegionBuilder::zero_copy`] turns this
//!   off.

use std::fmt::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::background::Background;
use crate::caps::{capabilities, op_unusable};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::evict::{EvictionConfig, EvictionStats, SharedBudget};
use crate::fault::feeds::{BudgetFeed, RunAheadFeed};
use crate::fault::readahead::Streams;
use crate::fault::report::report;
use crate::fault::resolve::{populate, populate_where, Access};
use crate::fault::state::Counters;
use crate::fault::{table, RegionState, RegionStats};
use crate::page::{MemoryKind, PageSize, Pages, ResolveOp};
use crate::policy::{PolicyKind, ReadaheadConfig};
use crate::pool::{FramePool, FramePoolConfig, FramePoolStats};
use crate::residency::{PageBits, PageState, Residency};
use crate::runahead::{RunAheadConfig, RunAheadStats};
use crate::store::{PageStore, Tail, ZeroStore};
use crate::sys::mem::{self, Advice, Mapping};
use crate::sys::uffd::{feature, ioctl_bit, register_mode};

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

/// Builds a [`Region`]. See the [module docs](self) for the defaults.
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
    pub fn budget(mut self, cfg: EvictionConfig) -> Self {
        self.budget = Some(cfg);
        self
    }
    /// With a [`budget`](Self::budget): once the region goes past it, the
    /// evictor evicts down to `pages` (at most the budget; UMap's low-water
    /// mark) before it rests, instead of stopping just under the budget.
    /// Default: the budget.
    pub fn budget_low_water(mut self, pages: usize) -> Self {
        self.low_water = Some(pages);
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
                return Err(Error::ZeroLength);
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
            readahead: Streams::new(plan.readahead),
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
            evictor: None,
            drain_timeout: self.drain_timeout,
        };
        // Background threads start last: if one cannot, dropping `region`
        // tears everything down (stopping any thread already started).
        let spawn_err = |op| move |e| Error::Io { op, source: e };
        if let Some(cfg) = self.run_ahead {
            let scratch = region.engine.scratch_bytes();
            region.populator = Some(
                crate::runahead::start(region.state(), cfg, scratch, None)
                    .map_err(spawn_err("spawn run-ahead thread"))?,
            );
        }
        if let Some(cfg) = self.budget {
            region.evictor = Some(
                crate::evict::start(region.state(), cfg, self.low_water)
                    .map_err(spawn_err("spawn evictor thread"))?,
            );
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
            let m = match at {
                Some(a) => mem::shared_at(a, &fd, len)?,
                None => Mapping::shared(&fd, len, 0)?,
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

/// A mapping whose page faults faultline resolves. See the module docs.
pub struct Region {
    state: Option<Box<RegionState>>,
    map: Option<Mapping>,
    _memfd: Option<OwnedFd>,
    engine: Arc<dyn Engine>,
    populator: Option<Background>,
    evictor: Option<Background>,
    drain_timeout: Duration,
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
    /// A builder for a region of `len` bytes.
    pub fn builder(len: usize) -> RegionBuilder {
        RegionBuilder::new(len)
    }

    fn state(&self) -> &RegionState {
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
    /// copying them (see [`RegionBuilder::zero_copy`]).
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
    pub fn page_state(&self, page: usize) -> PageState {
        self.state().residency.get(page)
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
                end: s.pages.base() + (offset + len) as u64,
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
    /// [`Residency::io_ready`].
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
        // Stop evicting, then write every dirty page back.
        if let Some(e) = self.evictor.as_mut() {
            e.stop(|| ());
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
        table::retire(state, self.drain_timeout);
        self.engine.region_removed();
        drop(self.map.take());
    }
}
