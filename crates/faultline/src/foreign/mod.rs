//! Foreign memory: serving the page faults of *another process* through a
//! userfaultfd it handed us (the VM snapshot hand-off: Firecracker's `Uffd`
//! memory backend).
//!
//! ```text
//!   peer process (VMM)                       this process
//!   ─────────────────                        ────────────
//!   userfaultfd + UFFDIO_API(EVENT_REMOVE)
//!   mmap guest memory, REGISTER (MISSING)
//!   ── fd over a UNIX socket (SCM_RIGHTS) ──► ForeignUffd::adopt(fd)
//!                                             ForeignPeer::new(uffd, regions, store)
//!   vCPU touches a page ─► kernel queues msg  ForeignEngine thread: poll ─► read
//!   vCPU sleeps                               fault::resolve(RegionState of the peer range)
//!                                               UFFDIO_COPY into the peer's mm, WAKE
//! ```
//!
//! The resolve ioctls act on the mm the userfaultfd was created in, whoever
//! calls them, so the one resolution path (`fault::resolve`) serves a peer
//! unchanged: each peer range gets its own `RegionState` whose base is the
//! *peer's* address. Those states are **not** in the process-wide region
//! table (keyed by our own addresses; a peer's addresses may overlap ours
//! and other peers'): each [`ForeignPeer`] looks its faults up in its own
//! small sorted vector.
//!
//! # What carries over, what is refused
//! Fault-around/read-ahead, run-ahead, the residency map, statistics and
//! prefetch (below) work on foreign memory. Refused with
//! [`ForeignError::Refused`]: a resident budget with eviction (evicting
//! means `MADV_DONTNEED` on the pages, which only the peer can do to its
//! own mm), the page-cache zero-copy mode (it maps the store's file into
//! the region, and we cannot map anything into the peer), and the
//! `signal` engine (the faults happen on the peer's threads, which never
//! run our signal handler). Page sizes: 4 KiB (anonymous memory) and
//! 2 MiB (hugetlb).
//!
//! # Shared (zero-copy) mode
//! Copy mode must allocate and copy every page it installs
//! (`UFFDIO_COPY`), while the kernel maps page-cache pages of a file without
//! copying. A peer that maps its guest memory `MAP_PRIVATE` from a
//! [`SharedSnapshot`] (a tmpfs file holding the store's bytes; one page
//! cache for every clone) and registers it MISSING|MINOR with
//! `UFFD_FEATURE_MINOR_SHMEM` is served with `UFFDIO_CONTINUE`
//! ([`ForeignOptions::shared`]): a fault (MINOR: the page cache holds the
//! page) maps the page-cache page read-only into the peer, no store read,
//! no allocation, no copy; the peer's first write to it copies it in the
//! kernel (private COW, no userfaultfd fault), so writes stay private to
//! that peer and never reach the file. Prefetch is `UFFDIO_CONTINUE` of
//! the queued runs. A page the peer removed reads zeros (`UFFDIO_COPY` of
//! zeros installs a private anonymous page in a `MAP_PRIVATE` vma); a
//! MISSING fault (a hole in the snapshot) is copied from the store.
//! REMOVE, EAGAIN, EEXIST, the residency map, statistics and record work
//! as in copy mode.
//!
//! # The peer's handshake
//! `UFFDIO_API` can be done once per userfaultfd, and the peer did it: we
//! read the features it chose from `/proc/self/fdinfo`
//! ([`ForeignUffd::features`]) and work with them.
//! * With `UFFD_FEATURE_EVENT_REMOVE` (Firecracker asks for it, and only
//!   it) the peer's `MADV_DONTNEED` (its balloon) reaches us as a REMOVE
//!   event: the residency map forgets the pages, and later faults there
//!   are served **zeros** (the store wrapper masks removed pages), never
//!   the store's data again.
//! * Without it, a dropped page is invisible until it faults again: a fault
//!   on a page the map records as present is taken as "dropped behind our
//!   back" and the page is installed again, from the store (we cannot know
//!   it should read zeros).
//! * While a REMOVE is unread every resolve ioctl returns `EAGAIN`: the
//!   fault is deferred with bounded backoff and retried after the event.
//!
//! # Threads
//! A [`ForeignEngine`] runs `threads` poll-style handler threads; each
//! peer is served by exactly one of them (the least loaded when it is
//! added), which reads its events, its faults and runs its prefetch. One
//! reader per userfaultfd is what keeps REMOVE ordered against copies: the
//! copy of a fault read before a REMOVE finishes before the REMOVE is read
//! (and the peer's `madvise` released), so a removed range never gets the
//! store's bytes installed after the fact. Peers are added and removed at
//! run time ([`ForeignEngine::add`], [`ForeignEngine::remove`]); a peer that
//! hangs up (its hang-up descriptor, e.g. the socket it connected with,
//! reports `POLLHUP`/`POLLRDHUP`) or whose resolution fails is dropped and
//! reported as a [`PeerEvent`]; the others are served on.
//!
//! # Record and prefetch
//! A peer built with [`ForeignOptions::record`] logs the store offset of
//! every page in the order it first faulted ([`ForeignPeer::take_record`]).
//! [`ForeignPeer::prefetch`] queues a set of store offsets in the order
//! given (a record's first-touch order: the pages the peer needs first go
//! first), as runs of contiguous set pages (holes are never bridged). The
//! store is told to read them ([`PageStore::will_need`], large sequential
//! reads in the background); [`prepare_store`] does that and maps them
//! ([`PageStore::populate`]) ahead of any handshake. The peer's handler
//! thread installs up to [`ForeignEngineConfig::prefetch_chunk_bytes`] of
//! runs per poll round, after the faults read in that round: demand faults
//! go first. [`ForeignEngineConfig::prefetch_helpers`] helper threads
//! install runs beside it, each piece under the peer's copy gate (shared;
//! the handler thread holds it exclusively while it reads events), so a
//! REMOVE is never read while a helper copy is in flight. Pages outside the
//! set are served on demand.

use std::collections::VecDeque;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::background::Background;
use crate::engine::handler::{poll_timeout, settle, Action, Attempt, Handler, Serve, BACKOFF_MIN};
use crate::engine::EngineKind;
use crate::evict::EvictionConfig;
use crate::fault::readahead::Streams;
use crate::fault::resolve::{resolve, Access, Origin, Resolution};
use crate::fault::{Delivery, RegionState, RegionStats};
use crate::page::{MemoryKind, PageSize, Pages, ResolveOp};
use crate::policy::ReadaheadConfig;
use crate::residency::{PageBits, PageState, Residency};
use crate::runahead::RunAheadConfig;
use crate::snapshot::SharedSnapshot;
use crate::store::{FillRange, PageStore, StoreError};
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::sock;
use faultline_sys::thread::EventFd;
use faultline_sys::uffd::{feature, pagefault_flag, Msg, Uffd, UffdError};

/// Why a foreign region, peer or engine could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    /// Reading the received descriptor's fdinfo failed.
    #[error("inspecting the received descriptor: {0}")]
    Inspect(#[source] std::io::Error),
    /// The descriptor is not a userfaultfd whose `UFFDIO_API` is done.
    #[error("the received descriptor is not a userfaultfd whose handshake (UFFDIO_API) is done")]
    NotUserfaultfd,
    /// A feature that cannot work on another process's memory.
    #[error("{what} cannot serve another process's memory: {why}")]
    Refused {
        /// The feature.
        what: &'static str,
        /// Why.
        why: &'static str,
    },
    /// A page size other than 4 KiB and 2 MiB.
    #[error("region {index}: page size {bytes} is not served (4096 or 2097152 bytes)")]
    PageSize {
        /// Region index.
        index: usize,
        /// The size asked for.
        bytes: u64,
    },
    /// A region's geometry is invalid.
    #[error("region {index}: {source}")]
    Geometry {
        /// Region index.
        index: usize,
        /// Why.
        #[source]
        source: crate::error::Error,
    },
    /// Two regions overlap in the peer's address space.
    #[error("regions {a} and {b} overlap in the peer's address space")]
    Overlap {
        /// First region.
        a: usize,
        /// Second region.
        b: usize,
    },
    /// A region runs past the end of the store.
    #[error("region {index} (store bytes {offset:#x}..{end:#x}) runs past the end of the store ({store_len:#x} bytes)")]
    PastEnd {
        /// Region index.
        index: usize,
        /// Its store offset.
        offset: u64,
        /// One past its last store byte.
        end: u64,
        /// The store's length.
        store_len: u64,
    },
    /// The shared snapshot is not the store's size.
    #[error("the shared snapshot {path} holds {snapshot} bytes, the store {store}")]
    SharedLength {
        /// The snapshot file.
        path: std::path::PathBuf,
        /// Its length.
        snapshot: u64,
        /// The store's length.
        store: u64,
    },
    /// Registering a region for minor faults (shared mode) failed.
    #[error(
        "region {index}: registering it MISSING|MINOR through the peer's userfaultfd: {source}"
    )]
    Register {
        /// Region index.
        index: usize,
        /// The error.
        #[source]
        source: faultline_sys::uffd::UffdError,
    },
    /// A thread could not be started.
    #[error("spawning {what}: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A userfaultfd received from another process. See the module docs.
#[derive(Debug, Clone)]
pub struct ForeignUffd {
    uffd: Arc<Uffd>,
    features: u64,
}

impl ForeignUffd {
    /// Adopts `fd`, which must be a userfaultfd whose handshake its creator
    /// has done.
    pub fn adopt(fd: OwnedFd) -> Result<ForeignUffd, ForeignError> {
        let uffd = Uffd::adopt(fd);
        let features = uffd
            .fdinfo_features()
            .map_err(ForeignError::Inspect)?
            .ok_or(ForeignError::NotUserfaultfd)?;
        Ok(ForeignUffd {
            uffd: Arc::new(uffd),
            features,
        })
    }

    /// The features the peer enabled with `UFFDIO_API`.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether the peer's `MADV_DONTNEED`/`MADV_REMOVE` reach us as REMOVE
    /// events (`UFFD_FEATURE_EVENT_REMOVE`).
    pub fn reports_removes(&self) -> bool {
        self.features & feature::EVENT_REMOVE != 0
    }

    /// The enabled features by name ("EVENT_REMOVE").
    pub fn feature_names(&self) -> Vec<&'static str> {
        feature::ALL
            .iter()
            .filter(|(bit, _)| self.features & bit != 0)
            .map(|&(_, name)| name)
            .collect()
    }

    /// The descriptor number (for messages).
    pub fn raw_fd(&self) -> i32 {
        self.uffd.as_raw_fd()
    }
}

/// One range of the peer's memory and where its bytes are in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignRegionSpec {
    /// Start in the peer's address space.
    pub base: u64,
    /// Bytes.
    pub len: usize,
    /// Page size (4 KiB: anonymous memory; 2 MiB: hugetlb).
    pub page_size: u64,
    /// Where the region's bytes start in the store.
    pub store_offset: u64,
}

/// How a peer's regions are served.
#[derive(Debug, Clone, Default)]
pub struct ForeignOptions {
    /// Fault-around / read-ahead (default: the runtime's default).
    pub readahead: ReadaheadConfig,
    /// A run-ahead populator per region (default: none).
    pub run_ahead: Option<RunAheadConfig>,
    /// A resident budget: refused (see the module docs).
    pub budget: Option<EvictionConfig>,
    /// The page-cache zero-copy mode of local regions: refused (see the
    /// module docs; [`ForeignOptions::shared`] is its foreign form).
    pub zero_copy: bool,
    /// Shared (zero-copy) mode: the peer maps its regions `MAP_PRIVATE`
    /// from this snapshot at their store offsets, registered MISSING and
    /// MINOR (`UFFD_FEATURE_MINOR_SHMEM`; `MINOR_HUGETLBFS` for a snapshot
    /// on hugetlbfs, whose regions have 2 MiB pages); check that with
    /// [`SharedSnapshot::check_peer`] first. Minor faults and prefetch are
    /// answered with `UFFDIO_CONTINUE` (no store read, no copy); pages the
    /// peer removed read zeros (a private page, `UFFDIO_COPY`) and pages
    /// the page cache lacks are copied from the store. Default: none (copy
    /// mode).
    pub shared: Option<Arc<SharedSnapshot>>,
    /// Record the order in which pages first fault.
    pub record: bool,
}

/// Counters of one peer (relaxed atomics).
#[derive(Debug, Default)]
struct PeerCounters {
    faults: AtomicU64,
    removes: AtomicU64,
    removed_pages: AtomicU64,
    other_events: AtomicU64,
    deferred: AtomicU64,
    prefetched: AtomicU64,
    prefetch_ioctls: AtomicU64,
    outside: AtomicU64,
}

/// When serving a peer reached its milestones, in `CLOCK_MONOTONIC`
/// nanoseconds ([`faultline_sys::monotonic_ns`], comparable with the peer's
/// own clock readings); `None`: not (yet). What `faultline bench restore`
/// breaks a restore's hand-off down with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerTimes {
    /// The first fault message read.
    pub first_fault_ns: Option<u64>,
    /// The first prefetch ioctl finished.
    pub first_prefetch_ns: Option<u64>,
    /// The prefetch queue ran dry (the last prefetch ioctl finished).
    pub prefetch_done_ns: Option<u64>,
}

#[derive(Debug, Default)]
struct PeerClock {
    first_fault: OnceLock<u64>,
    first_prefetch: OnceLock<u64>,
    prefetch_done: OnceLock<u64>,
}

/// A snapshot of a peer's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Fault messages read.
    pub faults: u64,
    /// REMOVE events read.
    pub removes: u64,
    /// Whole pages those events dropped.
    pub removed_pages: u64,
    /// Other events (unexpected for a Firecracker peer).
    pub other_events: u64,
    /// Faults deferred after EAGAIN.
    pub deferred: u64,
    /// Pages installed by prefetch.
    pub prefetched: u64,
    /// Prefetch ioctls.
    pub prefetch_ioctls: u64,
    /// Pages installed by run-ahead populators
    /// ([`ForeignOptions::run_ahead`]).
    pub run_ahead_pages: u64,
    /// Faults outside every region of the peer.
    pub outside: u64,
    /// Bytes read from the store (pages filled or viewed, at each
    /// region's page size).
    pub bytes_read: u64,
    /// The regions' counters, summed.
    pub regions: RegionStats,
}

/// Store offsets of pages masked to zeros (removed by the peer), with a
/// fast "nothing removed yet" check.
#[derive(Debug)]
struct Removed {
    bits: PageBits,
    any: AtomicBool,
}

/// A region's store as the peer must see it: the store's bytes from the
/// region's offset, with removed pages reading as zeros.
struct RegionStore {
    inner: Arc<dyn PageStore>,
    base: u64,
    len: u64,
    shift: u32,
    removed: Arc<Removed>,
}

impl RegionStore {
    fn removed_in(&self, offset: u64, len: usize) -> Option<Range<usize>> {
        if !self.removed.any.load(Relaxed) || len == 0 {
            return None;
        }
        let first = (offset >> self.shift) as usize;
        let last = ((offset + len as u64 - 1) >> self.shift) as usize;
        (first..=last)
            .any(|p| self.removed.bits.get(p))
            .then_some(first..last + 1)
    }

    /// Zeros the pages of `buf` (filled from region offset `offset`) that
    /// the peer removed.
    fn zero_removed(&self, offset: u64, buf: &mut [u8]) {
        if let Some(pages) = self.removed_in(offset, buf.len()) {
            let ps = 1usize << self.shift;
            let first = pages.start;
            for p in pages.filter(|&p| self.removed.bits.get(p)) {
                let at = (p - first) * ps;
                let end = (at + ps).min(buf.len());
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
        Some(self.len)
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
    fn view(&self, offset: u64, len: usize) -> Option<&[u8]> {
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

/// Prefetch runs (region index, pages) waiting, and how many runs were
/// taken out and are being installed.
#[derive(Default)]
struct PrefetchQueue {
    runs: VecDeque<(usize, Range<usize>)>,
    taken: usize,
}

/// The page size of a [`PrefetchPlan`]'s runs.
const PLAN_PAGE: u64 = 4096;

/// A working set (store offsets of 4 KiB pages, in the order they were
/// first touched: a record) made into the runs prefetch installs, once,
/// for any number of peers ([`ForeignPeer::prefetch_plan`]). In the set's
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
        let count = (max / PLAN_PAGE) as usize + 1;
        let in_set = PageBits::new(count);
        let mut order: Vec<u32> = Vec::with_capacity(offsets.len());
        for &off in offsets {
            let p = (off / PLAN_PAGE) as usize;
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
            runs.push((start as u64 * PLAN_PAGE, (end - start) as u32));
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
    pub fn runs(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.runs
            .iter()
            .map(|&(o, n)| (o, n as usize * PLAN_PAGE as usize))
    }
}

struct ForeignRegion {
    state: Box<RegionState>,
    removed: Arc<Removed>,
    /// Pages that have faulted (record mode).
    seen: Option<PageBits>,
    /// Pages that faulted once while the map called them present (see
    /// `Worker::on_fault`); only the peer's handler thread touches them.
    suspect: PageBits,
    store_offset: u64,
}

/// A peer: its userfaultfd, its regions and what it asked for. Built with
/// [`ForeignPeer::new`], served once added to a [`ForeignEngine`].
pub struct ForeignPeer {
    id: u64,
    label: String,
    uffd: ForeignUffd,
    /// Run-ahead populators; stopped before the regions are freed.
    populators: Mutex<Vec<Background>>,
    regions: Vec<ForeignRegion>,
    hangup: Option<OwnedFd>,
    record: Option<Mutex<Vec<u64>>>,
    /// Queued prefetch runs, and how many were taken out and are being
    /// installed.
    prefetch: Mutex<PrefetchQueue>,
    prefetch_pending: AtomicBool,
    /// Prefetch helpers installing this peer's runs now.
    helpers: AtomicUsize,
    /// Held shared by prefetch helpers around each install, exclusively
    /// by the peer's handler thread around each read of its userfaultfd
    /// (and the REMOVE bookkeeping that follows): a REMOVE is never read
    /// while a helper's copy is in flight, so none can put the store's
    /// bytes into a range after the peer dropped it.
    copy_gate: Arc<RwLock<()>>,
    store: Arc<dyn PageStore>,
    stats: PeerCounters,
    clock: PeerClock,
}

impl std::fmt::Debug for ForeignPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignPeer")
            .field("id", &self.id)
            .field("label", &self.label)
            .field("regions", &self.regions.len())
            .finish()
    }
}

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);
static NEXT_REGION: AtomicU64 = AtomicU64::new(1 << 40);

impl ForeignPeer {
    /// A peer whose `specs` (in the peer's address space) are backed by
    /// `store` at each spec's store offset. `label` names it in messages.
    pub fn new(
        label: impl Into<String>,
        uffd: ForeignUffd,
        specs: &[ForeignRegionSpec],
        store: Arc<dyn PageStore>,
        opts: &ForeignOptions,
    ) -> Result<ForeignPeer, ForeignError> {
        if opts.budget.is_some() {
            return Err(ForeignError::Refused {
                what: "a resident budget (eviction)",
                why: "evicting drops pages with MADV_DONTNEED, which only the peer can do to its own memory",
            });
        }
        if opts.zero_copy {
            return Err(ForeignError::Refused {
                what: "the page-cache zero-copy mode",
                why: "it maps the store's file into the region, and nothing can be mapped into another process (the peer maps a shared snapshot itself: ForeignOptions::shared)",
            });
        }
        check_layout(specs, store.len())?;
        if let Some(snap) = &opts.shared {
            let huge = snap.page_bytes() != 4096;
            let minor = if huge {
                feature::MINOR_HUGETLBFS
            } else {
                feature::MINOR_SHMEM
            };
            if uffd.features & minor == 0 {
                return Err(ForeignError::Refused {
                    what: "shared (zero-copy) mode",
                    why: "the peer's userfaultfd lacks UFFD_FEATURE_MINOR_SHMEM (tmpfs snapshot) or UFFD_FEATURE_MINOR_HUGETLBFS (hugetlbfs snapshot): its minor faults never reach us",
                });
            }
            if specs.iter().any(|s| s.page_size != snap.page_bytes()) {
                return Err(ForeignError::Refused {
                    what: "shared (zero-copy) mode",
                    why: "the regions' page size must be the shared snapshot's (4 KiB on tmpfs, 2 MiB on hugetlbfs)",
                });
            }
            if store.len().is_some_and(|l| l != snap.len()) {
                return Err(ForeignError::SharedLength {
                    path: snap.path().to_owned(),
                    snapshot: snap.len(),
                    store: store.len().unwrap_or(0),
                });
            }
            register_minor(&uffd, specs)?;
        }
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|&i| specs[i].base);
        let mut regions = Vec::with_capacity(specs.len());
        for i in order {
            let s = specs[i];
            let geometry = |source| ForeignError::Geometry { index: i, source };
            let (size, kind) = match s.page_size {
                4096 => (PageSize::BASE, MemoryKind::PrivateAnon),
                0x20_0000 => (PageSize::HUGE_2M, MemoryKind::Hugetlb),
                bytes => return Err(ForeignError::PageSize { index: i, bytes }),
            };
            if !s.base.is_multiple_of(size.bytes() as u64) {
                return Err(geometry(crate::error::Error::Unaligned {
                    addr: s.base,
                    align: size.bytes(),
                }));
            }
            let pages = Pages::new(s.base, s.len, size).map_err(geometry)?;
            let removed = Arc::new(Removed {
                bits: PageBits::new(pages.count()),
                any: AtomicBool::new(false),
            });
            let rstore: Arc<dyn PageStore> = Arc::new(RegionStore {
                inner: store.clone(),
                base: s.store_offset,
                len: s.len as u64,
                shift: size.shift(),
                removed: removed.clone(),
            });
            let readahead = Streams::new(opts.readahead);
            // Shared mode: which pages the snapshot's page cache holds
            // (CONTINUE); the others (holes, and later removed pages) are
            // copied, at most 2 MiB per ioctl (the handler threads'
            // scratch holds that much).
            let (kind, op, cached, max_run_pages) = match &opts.shared {
                Some(snap) => (
                    if size == PageSize::BASE {
                        MemoryKind::Shmem
                    } else {
                        MemoryKind::Hugetlb
                    },
                    ResolveOp::Continue,
                    Some(snap.cached_bits(s.store_offset, pages.count())),
                    (PageSize::HUGE_2M.bytes() / size.bytes()).max(1),
                ),
                None => (kind, ResolveOp::Copy, None, usize::MAX),
            };
            let state = Box::new(RegionState {
                id: NEXT_REGION.fetch_add(1, Relaxed),
                pages,
                kind,
                op,
                zeropage_reads: false,
                readahead,
                max_run_pages,
                store: rstore,
                residency: Residency::new(pages.count()),
                cached,
                alias: None,
                pool: None,
                uffd: uffd.uffd.clone(),
                // We read the events when the peer enabled them; without
                // them the fault path below treats a fault on a recorded
                // page as a dropped page (never `mincore`, which would look
                // at our own address space).
                delivery: Delivery::PEER_HANDLER,
                inflight: AtomicUsize::new(0),
                stats: Default::default(),
                budget: None,
                runahead: opts
                    .run_ahead
                    .map(|_| crate::fault::feeds::RunAheadFeed::new(pages.count())),
                timing_start: AtomicU64::new(0),
                timing_resolved: AtomicU64::new(0),
            });
            regions.push(ForeignRegion {
                state,
                removed,
                seen: opts.record.then(|| PageBits::new(pages.count())),
                suspect: PageBits::new(pages.count()),
                store_offset: s.store_offset,
            });
        }
        let peer = ForeignPeer {
            id: NEXT_PEER.fetch_add(1, Relaxed),
            label: label.into(),
            uffd,
            populators: Mutex::new(Vec::new()),
            regions,
            hangup: None,
            record: opts.record.then(|| Mutex::new(Vec::new())),
            prefetch: Mutex::new(PrefetchQueue::default()),
            prefetch_pending: AtomicBool::new(false),
            helpers: AtomicUsize::new(0),
            copy_gate: Arc::new(RwLock::new(())),
            store,
            stats: PeerCounters::default(),
            clock: PeerClock::default(),
        };
        if let Some(cfg) = opts.run_ahead {
            let mut pop = peer.populators.lock().expect("populators");
            for r in &peer.regions {
                pop.push(
                    crate::runahead::start(&r.state, cfg, 4 << 20, Some(peer.copy_gate.clone()))
                        .map_err(|source| ForeignError::Spawn {
                            what: "a run-ahead thread",
                            source,
                        })?,
                );
            }
        }
        Ok(peer)
    }

    /// Watches `fd` (the connection the peer handed its userfaultfd over):
    /// when it reports a hang-up the peer is dropped and reported gone.
    pub fn with_hangup(mut self, fd: OwnedFd) -> ForeignPeer {
        self.hangup = Some(fd);
        self
    }

    /// The peer's id (unique in this process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The label given at creation.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether the peer is served in shared (zero-copy) mode.
    pub fn is_shared(&self) -> bool {
        self.regions.iter().any(|r| r.state.cached.is_some())
    }

    /// The peer's userfaultfd.
    pub fn uffd(&self) -> &ForeignUffd {
        &self.uffd
    }

    /// Number of regions.
    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    /// Bytes of this peer's own bookkeeping: per region the residency map
    /// (3 bits a page), the removed, suspect, the record's seen and shared
    /// mode's page-cache bits (1 bit a page each), plus the record log and
    /// the prefetch queue. What one
    /// more peer costs the handler, beside the store it shares.
    pub fn bookkeeping_bytes(&self) -> usize {
        let bits: usize = self
            .regions
            .iter()
            .map(|r| {
                let n = r.state.pages.count();
                let bitmaps =
                    3 + usize::from(r.seen.is_some()) + usize::from(r.state.cached.is_some());
                let words = n.div_ceil(32) + n.div_ceil(64) * bitmaps;
                words * 8
            })
            .sum();
        let log = self
            .record
            .as_ref()
            .map_or(0, |m| m.lock().expect("record log").capacity() * 8);
        let queue = self
            .prefetch
            .lock()
            .expect("prefetch queue")
            .runs
            .capacity()
            * std::mem::size_of::<(usize, Range<usize>)>();
        bits + log + queue
    }

    /// Pages of all regions the residency map records as installed.
    pub fn resident_pages(&self) -> usize {
        self.regions.iter().map(|r| r.state.resident_pages()).sum()
    }

    /// What the map records for the page holding the peer address `addr`
    /// (`None`: outside every region).
    pub fn page_state(&self, addr: u64) -> Option<PageState> {
        let r = self.find(addr)?;
        Some(r.state.residency.get(r.state.pages.index(addr)))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PeerStats {
        let c = &self.stats;
        let mut regions = RegionStats::default();
        let mut bytes_read = 0;
        let mut run_ahead_pages = 0;
        for r in &self.regions {
            if let Some(feed) = &r.state.runahead {
                run_ahead_pages += feed.stats().pages_populated;
            }
            let s = r.state.stats.snapshot();
            bytes_read += (s.store_fills + s.zero_copy_fills) * r.state.pages.size().bytes() as u64;
            regions.faults += s.faults;
            regions.installed += s.installed;
            regions.ioctls += s.ioctls;
            regions.store_fills += s.store_fills;
            regions.zero_copy_fills += s.zero_copy_fills;
            regions.exists += s.exists;
            regions.retries += s.retries;
            regions.gone += s.gone;
            regions.busy += s.busy;
            regions.poisoned += s.poisoned;
            regions.handler_cycles += s.handler_cycles;
        }
        PeerStats {
            faults: c.faults.load(Relaxed),
            removes: c.removes.load(Relaxed),
            removed_pages: c.removed_pages.load(Relaxed),
            other_events: c.other_events.load(Relaxed),
            deferred: c.deferred.load(Relaxed),
            prefetched: c.prefetched.load(Relaxed),
            prefetch_ioctls: c.prefetch_ioctls.load(Relaxed),
            run_ahead_pages,
            outside: c.outside.load(Relaxed),
            bytes_read,
            regions,
        }
    }

    /// When its first fault, first and last prefetch install happened.
    pub fn times(&self) -> PeerTimes {
        let c = &self.clock;
        PeerTimes {
            first_fault_ns: c.first_fault.get().copied(),
            first_prefetch_ns: c.first_prefetch.get().copied(),
            prefetch_done_ns: c.prefetch_done.get().copied(),
        }
    }

    /// The store offsets of the pages that faulted, in the order they
    /// first did (record mode; empty otherwise). Takes the log.
    pub fn take_record(&self) -> Vec<u64> {
        self.record
            .as_ref()
            .map(|m| std::mem::take(&mut *m.lock().expect("record log")))
            .unwrap_or_default()
    }

    /// Queues the pages at these store offsets for eager installation (see
    /// the module docs), in the order given: a record lists pages in the
    /// order they first faulted, so the pages the peer needs first are
    /// installed first. Around each page not yet queued, the queue gets the
    /// longest contiguous run of set pages not yet queued (one ioctl for a
    /// cluster, whatever order its pages were touched in); holes between
    /// set pages are never bridged (a page costs more to copy than an
    /// ioctl). A helper thread asks the store to start reading the runs
    /// ([`PageStore::will_need`]); when the store was made ready with
    /// [`prepare_store`], [`ForeignPeer::prefetch_prepared`] skips that.
    /// Offsets outside every region are ignored; returns the number of
    /// pages queued.
    pub fn prefetch(&self, offsets: &[u64]) -> usize {
        self.prefetch_plan(&PrefetchPlan::new(offsets), true)
    }

    /// [`ForeignPeer::prefetch`] of a set whose store ranges
    /// [`prepare_store`] already read and mapped (no read hints).
    pub fn prefetch_prepared(&self, offsets: &[u64]) -> usize {
        self.prefetch_plan(&PrefetchPlan::new(offsets), false)
    }

    /// [`ForeignPeer::prefetch`] of a set made into runs once
    /// ([`PrefetchPlan::new`]), for any number of peers: this peer's share
    /// costs O(runs), not O(set). `read_hints`: ask the store to start
    /// reading the runs (false when [`prepare_store`] did).
    pub fn prefetch_plan(&self, plan: &PrefetchPlan, read_hints: bool) -> usize {
        let mut runs: VecDeque<(usize, Range<usize>)> = VecDeque::with_capacity(plan.runs.len());
        // Regions of pages larger than the plan's: several runs fall in one
        // page; it is queued once.
        let queued: Vec<Option<PageBits>> = self
            .regions
            .iter()
            .map(|r| {
                (r.state.pages.size().bytes() as u64 > PLAN_PAGE)
                    .then(|| PageBits::new(r.state.pages.count()))
            })
            .collect();
        let mut n = 0;
        for &(off, len) in &plan.runs {
            let (lo, hi) = (off, off + len as u64 * PLAN_PAGE);
            for (i, r) in self.regions.iter().enumerate() {
                let (so, end) = (r.store_offset, r.store_offset + r.state.pages.len() as u64);
                let (a, b) = (lo.max(so), hi.min(end));
                if a >= b {
                    continue;
                }
                let ps = r.state.pages.size().bytes() as u64;
                let (first, last) = (((a - so) / ps) as usize, (b - so).div_ceil(ps) as usize);
                match &queued[i] {
                    None => {
                        runs.push_back((i, first..last));
                        n += last - first;
                    }
                    Some(q) => {
                        let mut p = first;
                        while p < last {
                            if q.get(p) {
                                p += 1;
                                continue;
                            }
                            let s = p;
                            while p < last && !q.get(p) {
                                q.set(p);
                                p += 1;
                            }
                            runs.push_back((i, s..p));
                            n += p - s;
                        }
                    }
                }
            }
        }
        // Ask the store to start reading every run now, in the background
        // (a file: the kernel's large asynchronous reads), in the order the
        // runs will be installed.
        if read_hints {
            let hints: Vec<(u64, usize)> = runs
                .iter()
                .map(|(i, run)| {
                    let r = &self.regions[*i];
                    (
                        r.store_offset + r.state.pages.offset(run.start),
                        r.state.pages.bytes(run.len()),
                    )
                })
                .collect();
            let store = self.store.clone();
            let _ = std::thread::Builder::new()
                .name("faultline-prefetch-read".into())
                .spawn(move || hints.into_iter().for_each(|(o, l)| store.will_need(o, l)));
        }
        let mut q = self.prefetch.lock().expect("prefetch queue");
        q.runs.extend(runs);
        self.prefetch_pending
            .store(!q.runs.is_empty() || q.taken > 0, Relaxed);
        n
    }

    /// Whether queued prefetch work remains.
    pub fn prefetch_pending(&self) -> bool {
        self.prefetch_pending.load(Relaxed)
    }

    fn find(&self, addr: u64) -> Option<&ForeignRegion> {
        let i = self
            .regions
            .partition_point(|r| r.state.pages.base() <= addr)
            .checked_sub(1)?;
        let r = &self.regions[i];
        r.state.pages.contains(addr).then_some(r)
    }
}

impl Drop for ForeignPeer {
    fn drop(&mut self) {
        // The populators borrow the region states: stop them first.
        for mut b in self.populators.lock().expect("populators").drain(..) {
            b.stop(|| ());
        }
    }
}

/// Shared mode needs the peer's minor faults, and its registration does
/// not show in its memory map (only in smaps' `ui` flag, which costs a
/// page-table walk of every vma of the peer): the regions are registered
/// MISSING|MINOR here, through the peer's userfaultfd (the ioctl acts on
/// the peer's mm). For a VMM that registered them so (as shared mode asks)
/// that changes nothing; one that registered MISSING only gets the
/// registration that makes its dropped pages read zeros. A registration
/// replaces the range's modes, so a peer that enabled write-protection
/// (which it may have registered) is refused instead. The kernel must
/// allow CONTINUE on the range.
fn register_minor(uffd: &ForeignUffd, specs: &[ForeignRegionSpec]) -> Result<(), ForeignError> {
    use faultline_sys::uffd::{ioctl_bit, register_mode};
    const WP: u64 = feature::PAGEFAULT_FLAG_WP
        | feature::WP_HUGETLBFS_SHMEM
        | feature::WP_UNPOPULATED
        | feature::WP_ASYNC;
    if uffd.features & WP != 0 {
        return Err(ForeignError::Refused {
            what: "shared (zero-copy) mode",
            why: "the peer enabled write-protect features: registering its regions MISSING|MINOR would drop a WP registration",
        });
    }
    for (index, s) in specs.iter().enumerate() {
        let ioctls = uffd
            .uffd
            .register(
                s.base,
                s.len as u64,
                register_mode::MISSING | register_mode::MINOR,
            )
            .map_err(|source| ForeignError::Register { index, source })?;
        if ioctls & (1 << ioctl_bit::CONTINUE) == 0 {
            return Err(ForeignError::Refused {
                what: "shared (zero-copy) mode",
                why: "the kernel does not allow UFFDIO_CONTINUE on the peer's regions",
            });
        }
    }
    Ok(())
}

/// Checks the regions against each other and against the store: no
/// overlaps in the store (each region's bytes are its own) and none past
/// its end.
fn check_layout(specs: &[ForeignRegionSpec], store_len: Option<u64>) -> Result<(), ForeignError> {
    for (i, s) in specs.iter().enumerate() {
        let end = s.store_offset.saturating_add(s.len as u64);
        if let Some(store_len) = store_len.filter(|&l| end > l) {
            return Err(ForeignError::PastEnd {
                index: i,
                offset: s.store_offset,
                end,
                store_len,
            });
        }
        for (j, t) in specs.iter().enumerate().skip(i + 1) {
            let (a, b) = (s.base, s.base.saturating_add(s.len as u64));
            let (c, d) = (t.base, t.base.saturating_add(t.len as u64));
            if a < d && c < b {
                return Err(ForeignError::Overlap { a: i, b: j });
            }
        }
    }
    Ok(())
}

/// Settings of a [`ForeignEngine`].
#[derive(Debug, Clone)]
pub struct ForeignEngineConfig {
    /// Handler threads (each serves its share of the peers). Default 1.
    pub threads: usize,
    /// Scratch buffer per thread (bounds one ioctl's run for stores
    /// without a zero-copy view). Default 4 MiB.
    pub scratch_bytes: usize,
    /// Messages read per `read(2)`. Default 64.
    pub batch: usize,
    /// Bytes one prefetch step installs before the thread looks for
    /// faults again. Default 2 MiB.
    pub prefetch_chunk_bytes: usize,
    /// Prefetch helper threads (shared by all peers) that install queued
    /// prefetch runs beside the handler threads, in pieces of
    /// [`PREFETCH_HELPER_PIECE`] bytes. Default 1.
    pub prefetch_helpers: usize,
}

/// Prefetch runs a prefetcher takes from a peer's queue per hold of its
/// lock.
const PREFETCH_BATCH: usize = 32;

/// Bytes a prefetch helper installs per hold of a peer's copy gate (the
/// longest its handler thread waits to read the peer's userfaultfd).
pub const PREFETCH_HELPER_PIECE: usize = 256 << 10;

impl Default for ForeignEngineConfig {
    fn default() -> Self {
        ForeignEngineConfig {
            threads: 1,
            scratch_bytes: 4 << 20,
            batch: 64,
            prefetch_chunk_bytes: 2 << 20,
            prefetch_helpers: 1,
        }
    }
}

/// What happened to a peer (on the receiver [`ForeignEngine::new`] returns).
#[derive(Debug)]
pub enum PeerEvent {
    /// Its hang-up descriptor reported a hang-up: it exited or was killed.
    /// It is no longer served.
    HungUp {
        /// The peer.
        peer: Arc<ForeignPeer>,
    },
    /// Something arrived on its hang-up descriptor (a second message).
    /// Bytes and descriptors were read and dropped; the peer is still
    /// served.
    Message {
        /// The peer.
        peer: Arc<ForeignPeer>,
        /// Bytes received.
        bytes: usize,
        /// Descriptors received (closed).
        fds: usize,
    },
    /// Serving it failed; it is no longer served (its faulting threads
    /// stay blocked: kill it).
    Failed {
        /// The peer.
        peer: Arc<ForeignPeer>,
        /// What failed.
        error: String,
    },
    /// Its prefetch queue is empty.
    PrefetchDone {
        /// The peer.
        peer: Arc<ForeignPeer>,
        /// When the last run was installed.
        at: Instant,
    },
    /// A store error poisoned a page (the faulting thread gets SIGBUS).
    StoreError {
        /// The peer.
        peer: Arc<ForeignPeer>,
        /// The error.
        error: String,
    },
}

struct Slot {
    peers: Mutex<Vec<Arc<ForeignPeer>>>,
    changed: AtomicBool,
    wake: EventFd,
}

/// Handler threads serving the faults of any number of peers. See the
/// module docs.
pub struct ForeignEngine {
    slots: Vec<Arc<Slot>>,
    threads: Vec<Background>,
    helpers: Vec<Background>,
    work: Arc<Work>,
}

/// Wakes idle prefetch helpers.
#[derive(Default)]
struct Work {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Work {
    fn notify(&self) {
        *self.generation.lock().expect("work") += 1;
        self.cv.notify_all();
    }
}

impl std::fmt::Debug for ForeignEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignEngine")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl ForeignEngine {
    /// Starts the handler threads. `kind` is the engine the caller would
    /// use for its own memory: the thread engines all serve peers the same
    /// way (poll-style threads); `signal` is refused.
    pub fn new(
        kind: EngineKind,
        cfg: ForeignEngineConfig,
    ) -> Result<(ForeignEngine, Receiver<PeerEvent>), ForeignError> {
        if kind.delivery().on_faulting_thread {
            return Err(ForeignError::Refused {
                what: "the signal engine",
                why: "the faults happen on the peer's threads, which never run our SIGBUS handler",
            });
        }
        let (tx, rx) = channel();
        let mut slots = Vec::new();
        let mut threads = Vec::new();
        for i in 0..cfg.threads.max(1) {
            let slot = Arc::new(Slot {
                peers: Mutex::new(Vec::new()),
                changed: AtomicBool::new(false),
                wake: EventFd::new().map_err(|source| ForeignError::Spawn {
                    what: "an eventfd",
                    source,
                })?,
            });
            let (s, tx, cfg) = (slot.clone(), tx.clone(), cfg.clone());
            threads.push(
                Background::spawn(format!("faultline-peer-{i}"), move |stop| {
                    Worker::new(s, tx, &cfg).run(stop)
                })
                .map_err(|source| ForeignError::Spawn {
                    what: "a handler thread",
                    source,
                })?,
            );
            slots.push(slot);
        }
        let work = Arc::new(Work::default());
        let mut helpers = Vec::new();
        for i in 0..cfg.prefetch_helpers {
            let (slots, work, tx) = (slots.clone(), work.clone(), tx.clone());
            let scratch = cfg.scratch_bytes.max(PageSize::HUGE_2M.bytes());
            helpers.push(
                Background::spawn(format!("faultline-prefetch-{i}"), move |stop| {
                    prefetch_helper(&slots, &work, &tx, scratch, stop)
                })
                .map_err(|source| ForeignError::Spawn {
                    what: "a prefetch helper thread",
                    source,
                })?,
            );
        }
        Ok((
            ForeignEngine {
                slots,
                threads,
                helpers,
                work,
            },
            rx,
        ))
    }

    /// Starts serving `peer` (on the least loaded thread).
    pub fn add(&self, peer: ForeignPeer) -> Arc<ForeignPeer> {
        let peer = Arc::new(peer);
        let slot = self
            .slots
            .iter()
            .min_by_key(|s| s.peers.lock().expect("peers").len())
            .expect("at least one thread");
        slot.peers.lock().expect("peers").push(peer.clone());
        slot.changed.store(true, Relaxed);
        slot.wake.notify();
        if peer.prefetch_pending() {
            self.work.notify();
        }
        peer
    }

    /// Stops serving peer `id`; returns it (the caller decides when its
    /// descriptors close by dropping it).
    pub fn remove(&self, id: u64) -> Option<Arc<ForeignPeer>> {
        for s in &self.slots {
            let mut peers = s.peers.lock().expect("peers");
            if let Some(i) = peers.iter().position(|p| p.id == id) {
                let p = peers.remove(i);
                s.changed.store(true, Relaxed);
                s.wake.notify();
                return Some(p);
            }
        }
        None
    }

    /// The peers being served.
    pub fn peers(&self) -> Vec<Arc<ForeignPeer>> {
        self.slots
            .iter()
            .flat_map(|s| s.peers.lock().expect("peers").clone())
            .collect()
    }
}

impl Drop for ForeignEngine {
    fn drop(&mut self) {
        for h in &mut self.helpers {
            h.stop(|| self.work.notify());
        }
        for (t, s) in self.threads.iter_mut().zip(&self.slots) {
            t.stop(|| s.wake.notify());
        }
    }
}

/// A prefetch helper: installs pieces of the queues of peers with prefetch
/// pending (under each peer's copy gate), sleeps while there are none.
fn prefetch_helper(
    slots: &[Arc<Slot>],
    work: &Work,
    tx: &Sender<PeerEvent>,
    scratch: usize,
    stop: &crate::background::StopFlag,
) {
    let mut scratch = vec![0u8; scratch];
    while !stop.is_set() {
        let seen = *work.generation.lock().expect("work");
        let pending: Vec<Arc<ForeignPeer>> = slots
            .iter()
            .flat_map(|s| {
                s.peers
                    .lock()
                    .expect("peers")
                    .iter()
                    .filter(|p| p.prefetch_pending())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        if pending.is_empty() {
            let g = work.generation.lock().expect("work");
            if *g == seen {
                let _ = work
                    .cv
                    .wait_timeout(g, Duration::from_millis(IDLE_MS as u64))
                    .expect("work");
            }
            continue;
        }
        let (mut blocked, mut helped) = (false, false);
        for p in &pending {
            // A shared-mode peer's prefetch takes one helper beside its
            // handler thread: CONTINUE is cheap per page and contended in
            // the kernel (the peer's mm), so more threads on one peer spent
            // more CPU (serve 28-37 ms against 19-21 with one helper, for
            // the 10% set of 1 GiB) that its vCPUs needed, for no faster
            // restore. Copy-mode peers take every helper (copies scale).
            let limit = if p.is_shared() { 1 } else { usize::MAX };
            if p.helpers.fetch_add(1, Relaxed) >= limit {
                p.helpers.fetch_sub(1, Relaxed);
                continue;
            }
            helped = true;
            let gate = p.copy_gate.read().expect("copy gate");
            blocked |= prefetch_chunk(p, PREFETCH_HELPER_PIECE, &mut scratch, tx);
            drop(gate);
            p.helpers.fetch_sub(1, Relaxed);
        }
        if !helped {
            // Every pending peer has its helper: wait for more work.
            let g = work.generation.lock().expect("work");
            let _ = work
                .cv
                .wait_timeout(g, Duration::from_millis(1))
                .expect("work");
        }
        if blocked {
            // An event is pending on some peer: its handler thread reads it.
            std::thread::sleep(BACKOFF_MIN);
        }
    }
}

/// Installs up to `budget` bytes of `p`'s prefetch queue, over as many
/// queued runs as it takes; reports `PrefetchDone` when the queue runs
/// dry. Returns whether a pending event (EAGAIN) stopped it.
fn prefetch_chunk(
    p: &Arc<ForeignPeer>,
    mut budget: usize,
    scratch: &mut [u8],
    tx: &Sender<PeerEvent>,
) -> bool {
    let mut blocked = false;
    let mut batch: Vec<(usize, Range<usize>)> = Vec::with_capacity(PREFETCH_BATCH);
    while budget > 0 && !blocked {
        // Up to PREFETCH_BATCH runs (or the budget's worth) under one hold
        // of the queue's lock: with several prefetchers, a lock per run of
        // a page or two made them queue for the lock more than install.
        // The untaken tail of a run goes straight back for the others.
        batch.clear();
        {
            let mut q = p.prefetch.lock().expect("prefetch queue");
            while budget > 0 && batch.len() < PREFETCH_BATCH {
                let Some((ri, run)) = q.runs.pop_front() else {
                    break;
                };
                let ps = p.regions[ri].state.pages.size().bytes();
                let take = run.start..(run.start + (budget / ps).max(1)).min(run.end);
                budget = budget.saturating_sub(take.len() * ps);
                if take.end < run.end {
                    q.runs.push_front((ri, take.end..run.end));
                }
                batch.push((ri, take));
            }
            q.taken += batch.len();
        }
        if batch.is_empty() {
            break;
        }
        let taken = batch.len();
        // What was not installed (a pending event stopped it) goes back to
        // the front, in order.
        let mut left: Vec<(usize, Range<usize>)> = Vec::new();
        for (ri, take) in batch.drain(..) {
            if blocked {
                left.push((ri, take));
                continue;
            }
            let r = &p.regions[ri].state;
            let page;
            (page, blocked) = install_run(p, r, take.clone(), scratch);
            if page < take.end {
                left.push((ri, page..take.end));
            }
        }
        let mut q = p.prefetch.lock().expect("prefetch queue");
        q.taken -= taken;
        for run in left.into_iter().rev() {
            q.runs.push_front(run);
        }
    }
    // Done when nothing is queued and no run is being installed (by
    // another prefetcher).
    let done = {
        let q = p.prefetch.lock().expect("prefetch queue");
        q.runs.is_empty() && q.taken == 0
    };
    if done && p.prefetch_pending.swap(false, Relaxed) {
        p.clock
            .prefetch_done
            .get_or_init(faultline_sys::monotonic_ns);
        let _ = tx.send(PeerEvent::PrefetchDone {
            peer: p.clone(),
            at: Instant::now(),
        });
    }
    blocked
}

/// Installs the absent pages of `take`; returns where it stopped and
/// whether a pending event (EAGAIN) stopped it.
fn install_run(
    p: &ForeignPeer,
    r: &RegionState,
    take: Range<usize>,
    scratch: &mut [u8],
) -> (usize, bool) {
    let mut page = take.start;
    while page < take.end {
        if r.residency.get(page) != PageState::Absent {
            page += 1;
            continue;
        }
        let origin = Origin::Populate(page..take.end);
        match resolve(r, page, Access::WRITE, &origin, scratch) {
            Resolution::Resolved => {
                // The run it installed: the pages from here that are now
                // present (queued runs never overlap, so no other
                // prefetcher installs these).
                let start = page;
                while page < take.end && r.residency.get(page) != PageState::Absent {
                    page += 1;
                }
                p.stats.prefetched.fetch_add((page - start) as u64, Relaxed);
                p.stats.prefetch_ioctls.fetch_add(1, Relaxed);
                p.clock
                    .first_prefetch
                    .get_or_init(faultline_sys::monotonic_ns);
            }
            Resolution::Retry => return (page, true),
            _ => page += 1,
        }
    }
    (page, false)
}

const IDLE_MS: i32 = 200;

/// A peer worker's faults: each belongs to a peer (its regions, counters
/// and record), is resolved with the worker's scratch buffer, and what
/// cannot be served drops the peer (the stop is the message it is
/// reported with).
struct Peers {
    tx: Sender<PeerEvent>,
    scratch: Vec<u8>,
}

impl Serve for Peers {
    type Owner = Arc<ForeignPeer>;
    type Stop = String;

    fn uffd<'a>(&'a self, p: &'a Arc<ForeignPeer>) -> &'a Uffd {
        &p.uffd.uffd
    }

    fn event(&mut self, p: &Arc<ForeignPeer>, m: Msg) {
        match m {
            Msg::Remove { start, end } => on_remove(p, start, end),
            _ => {
                p.stats.other_events.fetch_add(1, Relaxed);
            }
        }
    }

    fn fault(
        &mut self,
        p: &Arc<ForeignPeer>,
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Action<String> {
        if attempt != Attempt::Retry {
            p.clock.first_fault.get_or_init(faultline_sys::monotonic_ns);
            p.stats.faults.fetch_add(1, Relaxed);
        }
        let Some(reg) = p.find(addr) else {
            p.stats.outside.fetch_add(1, Relaxed);
            return Action::Stop(format!(
                "a fault at {addr:#x} lies outside every region it declared"
            ));
        };
        let r = &reg.state;
        let page = r.pages.index(addr);
        if let (Some(seen), Some(log)) = (&reg.seen, &p.record) {
            if !seen.get(page) {
                seen.set(page);
                log.lock()
                    .expect("record log")
                    .push(reg.store_offset + r.pages.offset(page));
            }
        }
        if r.residency.get(page) != PageState::Absent {
            // A fault on a page we installed. Without REMOVE events the
            // peer dropped it behind our back. With them it is usually a
            // message that raced with the install (resolve wakes, done);
            // but a REMOVE is read *before* the kernel zaps its range (the
            // balloon's madvise waits for the event to be read, then
            // zaps), so a page installed in between is recorded present
            // and then dropped, and its thread faults on it again and
            // again. So the second fault of a page the map calls present
            // means stale (a raced message is read once). Forget it (under
            // its claim, so a resolver finishing it is not overwritten):
            // resolve re-installs it, or finds it there (EEXIST).
            let stale = !p.uffd.reports_removes() || reg.suspect.get(page);
            if !stale {
                reg.suspect.set(page);
            } else if r.residency.try_claim(page) {
                reg.suspect.clear(page);
                r.residency.set(page, PageState::Absent);
                r.residency.release(page..page + 1);
            }
        }
        if let Some(cached) = &r.cached {
            if flags & pagefault_flag::MINOR == 0 {
                // Shared mode: a MISSING fault says the page cache lacks
                // this page (a hole in the snapshot): copy it.
                cached.clear(page);
            }
        }
        r.fault_seen(page, t0);
        let access = Access {
            write: flags & pagefault_flag::WRITE != 0,
            wp: flags & pagefault_flag::WP != 0,
        };
        let res = resolve(r, page, access, &Origin::Fault, &mut self.scratch);
        r.add_cycles(faultline_sys::rdtsc().wrapping_sub(t0));
        settle(
            r,
            page,
            res,
            |e| {
                let error = format!(
                    "store error at peer page {:#x} (store offset {:#x}): {e}; the page is poisoned and the faulting thread gets SIGBUS",
                    r.pages.addr(page),
                    reg.store_offset + r.pages.offset(page)
                );
                let _ = self.tx.send(PeerEvent::StoreError {
                    peer: p.clone(),
                    error,
                });
            },
            |e| format!("resolving the fault at {addr:#x} failed: {e}"),
        )
    }

    fn deferred(&self, p: &Arc<ForeignPeer>) {
        p.stats.deferred.fetch_add(1, Relaxed);
    }

    fn read_failed(&mut self, _: &Arc<ForeignPeer>, e: UffdError) -> String {
        format!("reading its userfaultfd: {e}")
    }
}

/// One handler thread of a [`ForeignEngine`]: polls its peers'
/// userfaultfds and hang-up descriptors, runs the handler loop over each
/// peer with messages, and one bounded prefetch step per round.
struct Worker {
    slot: Arc<Slot>,
    peers: Vec<Arc<ForeignPeer>>,
    handler: Handler<Peers>,
    chunk: usize,
    next_prefetch: usize,
}

impl Worker {
    fn new(slot: Arc<Slot>, tx: Sender<PeerEvent>, cfg: &ForeignEngineConfig) -> Worker {
        let peers = Peers {
            tx,
            scratch: vec![0u8; cfg.scratch_bytes.max(PageSize::HUGE_2M.bytes())],
        };
        Worker {
            slot,
            peers: Vec::new(),
            handler: Handler::new(peers, cfg.batch),
            chunk: cfg.prefetch_chunk_bytes.max(PageSize::BASE.bytes()),
            next_prefetch: 0,
        }
    }

    fn run(mut self, stop: &crate::background::StopFlag) {
        let mut fds: Vec<PollFd> = Vec::new();
        while !stop.is_set() {
            if self.slot.changed.swap(false, Relaxed) {
                self.peers = self.slot.peers.lock().expect("peers").clone();
                let live: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
                self.handler.forget(|p| live.contains(&p.id));
            }
            fds.clear();
            fds.push(PollFd {
                fd: self.slot.wake.raw(),
                events: events::IN,
                revents: 0,
            });
            for p in &self.peers {
                fds.push(PollFd {
                    fd: p.uffd.raw_fd(),
                    events: events::IN,
                    revents: 0,
                });
                fds.push(PollFd {
                    fd: p.hangup.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    events: events::IN | events::RDHUP,
                    revents: 0,
                });
            }
            let prefetching = self.peers.iter().any(|p| p.prefetch_pending());
            let timeout = if prefetching {
                0
            } else {
                poll_timeout(self.handler.next_due(), IDLE_MS)
            };
            if poll::poll(&mut fds, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            if fds[0].revents != 0 {
                self.slot.wake.drain();
            }
            let mut dropped: Vec<(u64, PeerEvent)> = Vec::new();
            for (i, p) in self.peers.clone().iter().enumerate() {
                let (u, h) = (fds[1 + 2 * i].revents, fds[2 + 2 * i].revents);
                if u & events::IN != 0 {
                    if let Err(error) = self.serve(p) {
                        dropped.push((
                            p.id,
                            PeerEvent::Failed {
                                peer: p.clone(),
                                error,
                            },
                        ));
                        continue;
                    }
                } else if u & (events::ERR | events::NVAL) != 0 {
                    dropped.push((
                        p.id,
                        PeerEvent::Failed {
                            peer: p.clone(),
                            error: format!("its userfaultfd reports poll events {u:#x}"),
                        },
                    ));
                    continue;
                }
                if h != 0 {
                    if let Some(ev) = self.on_hangup_fd(p, h) {
                        dropped.push((p.id, ev));
                    }
                }
            }
            for (id, ev) in dropped {
                self.forget(id);
                let _ = self.handler.serve.tx.send(ev);
            }
            if let Err((peer, error)) = self.handler.retry_deferred() {
                self.forget(peer.id);
                let _ = self
                    .handler
                    .serve
                    .tx
                    .send(PeerEvent::Failed { peer, error });
            }
            // Faults first: the ones read this round are resolved; then one
            // bounded prefetch step, and back to poll (timeout 0).
            if prefetching {
                self.prefetch_step();
            }
        }
    }

    /// Stops serving peer `id` (it was dropped).
    fn forget(&mut self, id: u64) {
        self.peers.retain(|p| p.id != id);
        self.handler.forget(|p| p.id != id);
        self.slot
            .peers
            .lock()
            .expect("peers")
            .retain(|p| p.id != id);
    }

    /// Something on the peer's hang-up descriptor: a message (reported,
    /// dropped; the peer is still served) or a hang-up.
    fn on_hangup_fd(&mut self, p: &Arc<ForeignPeer>, revents: i16) -> Option<PeerEvent> {
        let fd = p.hangup.as_ref()?;
        if revents & events::IN != 0 {
            let mut buf = [0u8; 4096];
            match sock::recv_with_fds(fd.as_fd(), &mut buf, true) {
                Ok(got) if got.bytes > 0 || !got.fds.is_empty() => {
                    let _ = self.handler.serve.tx.send(PeerEvent::Message {
                        peer: p.clone(),
                        bytes: got.bytes,
                        fds: got.fds.len(),
                    });
                    return None;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                _ => {}
            }
        }
        (revents & (events::HUP | events::RDHUP | events::ERR | events::IN) != 0)
            .then(|| PeerEvent::HungUp { peer: p.clone() })
    }

    /// Reads and handles the peer's pending messages, a batch at a time
    /// (events first within a batch, under the peer's copy gate: see
    /// `ForeignPeer::copy_gate`); the error says why the peer must be
    /// dropped.
    fn serve(&mut self, p: &Arc<ForeignPeer>) -> Result<(), String> {
        loop {
            let n = self
                .handler
                .read(p, || p.copy_gate.write().expect("copy gate"))?;
            if n < self.handler.batch() {
                return Ok(());
            }
        }
    }

    /// Installs up to one chunk of one peer's prefetch queue (its handler
    /// thread: no copy gate needed, it is the one reading the events).
    fn prefetch_step(&mut self) {
        let n = self.peers.len();
        for k in 0..n {
            let i = (self.next_prefetch + k) % n;
            let p = self.peers[i].clone();
            if p.prefetch_pending() {
                self.next_prefetch = i + 1;
                let peers = &mut self.handler.serve;
                prefetch_chunk(&p, self.chunk, &mut peers.scratch, &peers.tx);
                return;
            }
        }
    }
}

/// The peer dropped `[start, end)` (`MADV_DONTNEED`): those pages are
/// absent, and read as zeros from now on.
fn on_remove(p: &ForeignPeer, start: u64, end: u64) {
    p.stats.removes.fetch_add(1, Relaxed);
    for r in &p.regions {
        let pages = r.state.pages.within(start, end);
        if pages.is_empty() {
            continue;
        }
        for pg in pages.clone() {
            r.removed.bits.set(pg);
            // Shared mode: its next (minor) fault must get zeros, a
            // private page, not the snapshot's page again.
            if let Some(cached) = &r.state.cached {
                cached.clear(pg);
            }
        }
        r.removed.any.store(true, Relaxed);
        r.state
            .residency
            .set_range(pages.clone(), PageState::Absent);
        p.stats.removed_pages.fetch_add(pages.len() as u64, Relaxed);
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
pub fn prepare_store(store: &dyn PageStore, offsets: &[u64], page_bytes: u64) -> u64 {
    let mut sorted: Vec<u64> = offsets
        .iter()
        .map(|o| o / page_bytes * page_bytes)
        .collect();
    sorted.sort_unstable();
    sorted.dedup();
    let coalesce = |bridge: u64| {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &o in &sorted {
            match ranges.last_mut() {
                Some((_, end)) if o <= *end + bridge * page_bytes => *end = o + page_bytes,
                _ => ranges.push((o, o + page_bytes)),
            }
        }
        ranges
    };
    for (s, e) in coalesce(4) {
        store.will_need(s, (e - s) as usize);
    }
    let exact = coalesce(0);
    for &(s, e) in &exact {
        store.populate(s, (e - s) as usize);
    }
    exact.iter().map(|(s, e)| e - s).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use faultline_sys::mem::{Advice, Mapping};
    use faultline_sys::uffd::{self, register_mode};

    #[test]
    fn prefetch_queues_contiguous_runs_in_first_touch_order_without_bridging() {
        let len = 64 << 12;
        let u = uffd::dev_userfaultfd(uffd::open_flags(true))
            .or_else(|_| uffd::syscall_userfaultfd(uffd::open_flags(true)))
            .unwrap();
        u.api(feature::EVENT_REMOVE).unwrap();
        let a = Mapping::anon(len).unwrap();
        a.advise(0, len, Advice::NoHugePage).unwrap();
        u.register(a.addr(), len as u64, register_mode::MISSING)
            .unwrap();
        let fd: OwnedFd = u.as_fd().try_clone_to_owned().unwrap();
        let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(vec![7u8; len]));
        let spec = ForeignRegionSpec {
            base: a.addr(),
            len,
            page_size: 4096,
            store_offset: 0,
        };
        let peer = ForeignPeer::new(
            "t",
            ForeignUffd::adopt(fd).unwrap(),
            &[spec],
            store,
            &ForeignOptions::default(),
        )
        .unwrap();
        // First touched: 40, 42, 41 (a cluster touched out of order), then
        // 3, then 5 (one hole between: not bridged), then 40 again.
        let pages = [40u64, 42, 41, 3, 5, 40];
        let offs: Vec<u64> = pages.iter().map(|p| p << 12).collect();
        assert_eq!(peer.prefetch(&offs), 5);
        let q = peer.prefetch.lock().unwrap();
        let runs: Vec<Range<usize>> = q.runs.iter().map(|r| r.1.clone()).collect();
        assert_eq!(runs, vec![40..43, 3..4, 5..6]);
        drop(q);
        // One plan, made once, queued for a peer whose two regions hold the
        // store's halves swapped: a run crossing the halves' boundary in the
        // store (30..34) is split at it, each piece in its region's pages
        // (the pieces in address order).
        let plan = PrefetchPlan::new(
            &[40u64, 42, 41, 3, 5, 31, 30, 33, 32]
                .iter()
                .map(|p| p << 12)
                .collect::<Vec<_>>(),
        );
        assert_eq!(plan.pages(), 9);
        let store_runs: Vec<(u64, usize)> = plan.runs().collect();
        assert_eq!(
            store_runs,
            vec![
                (40 << 12, 3 << 12),
                (3 << 12, 4096),
                (5 << 12, 4096),
                (30 << 12, 4 << 12)
            ]
        );
        let half = len / 2;
        let specs = [
            ForeignRegionSpec {
                base: a.addr(),
                len: half,
                page_size: 4096,
                store_offset: half as u64,
            },
            ForeignRegionSpec {
                base: a.addr() + half as u64,
                len: half,
                page_size: 4096,
                store_offset: 0,
            },
        ];
        let fd: OwnedFd = u.as_fd().try_clone_to_owned().unwrap();
        let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(vec![7u8; len]));
        let swapped = ForeignPeer::new(
            "t2",
            ForeignUffd::adopt(fd).unwrap(),
            &specs,
            store,
            &ForeignOptions::default(),
        )
        .unwrap();
        assert_eq!(swapped.prefetch_plan(&plan, false), 9);
        let q = swapped.prefetch.lock().unwrap();
        let runs: Vec<(usize, Range<usize>)> = q.runs.iter().cloned().collect();
        assert_eq!(
            runs,
            vec![(0, 8..11), (1, 3..4), (1, 5..6), (0, 0..2), (1, 30..32)]
        );
    }

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
        let data: Vec<u8> = (0..16 * 4096).map(|i| (i / 4096) as u8 + 1).collect();
        let inner = Arc::new(CountingBatched {
            inner: MemoryStore::new(data),
            batches: AtomicUsize::new(0),
        });
        let removed = Arc::new(Removed {
            bits: PageBits::new(8),
            any: AtomicBool::new(true),
        });
        removed.bits.set(2);
        let rs = RegionStore {
            inner: inner.clone(),
            base: 8 * 4096,
            len: 8 * 4096,
            shift: 12,
            removed,
        };
        assert!(
            rs.batched(),
            "a batched store stays batched behind a peer's region"
        );
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 2 * 4096]);
        let mut ranges = [
            FillRange {
                offset: 0,
                buf: &mut a,
            },
            FillRange {
                offset: 4096,
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
        assert_eq!((ranges[0].offset, ranges[1].offset), (0, 4096));
        // Region page 0 is store page 8; page 2 was removed by the peer.
        assert!(a.iter().all(|&x| x == 9));
        assert!(b[..4096].iter().all(|&x| x == 10));
        assert!(
            b[4096..].iter().all(|&x| x == 0),
            "a removed page reads as zeros"
        );
    }
}
