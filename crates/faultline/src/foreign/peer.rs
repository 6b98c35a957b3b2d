//! The peer: one process whose memory this process serves, through the
//! userfaultfd it handed over, from a store at each region's offset.
//!
//! ```text
//!   ForeignPeer
//!     ├── uffd: ForeignUffd (the peer's descriptor, its features)
//!     ├── regions: sorted by peer address ──► ForeignRegion
//!     │     ├── state: RegionState (base = the PEER's address), served by
//!     │     │          the one resolve path through a RegionStore
//!     │     ├── removed (zeros), seen (record), suspect (stale pages)
//!     │     └── store_offset
//!     ├── hang-up descriptor, record log, prefetch queue, copy gate
//!     └── counters (PeerStats) and milestones (PeerTimes)
//! ```
//!
//! 1. **Lookup.** The resolve ioctls act on the mm the userfaultfd was
//!    created in, whoever calls them, so each region gets a `RegionState`
//!    whose base is the peer's address. Those states are not in the
//!    process-wide region table (keyed by our own addresses; a peer's may
//!    overlap ours and other peers'): [`ForeignPeer::find`] looks a fault
//!    up in the peer's own sorted vector.
//! 2. **Before a fault is resolved** ([`ForeignPeer::on_fault`]): the
//!    record logs its page once, in first-touch order; a page the map
//!    calls present that faults a second time is stale (the peer dropped
//!    it) and is forgotten; in shared mode a MISSING fault says the page
//!    cache lacks the page, which is then copied.
//! 3. **A REMOVE** ([`ForeignPeer::on_remove`]): its whole pages are
//!    absent and read zeros from now on (the region store masks them; in
//!    shared mode their page-cache bit is cleared, so a minor fault gets a
//!    private page of zeros).
//! 4. **What it costs.** [`ForeignPeer::bookkeeping_bytes`]: a few bits a
//!    page, the record log and the prefetch queue.

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use parking_lot::RwLock;
use std::time::Instant;

use super::config::{check_layout, ForeignOptions, ForeignRegionSpec, GATE_PIECE, HUGE_WINDOW};
use super::dirty::{self, DirtySet};
use super::error::ForeignError;
use super::phases::{FaultPhases, PhaseRing};
use super::plan::PrefetchQueue;
use super::service::{FaultKinds, ServiceCounters, ServiceTimes};
use super::store::{RegionStore, Removed};
use super::uffd::ForeignUffd;
use crate::background::Background;
use crate::fault::crew::Crew;
use crate::fault::feeds::RunAheadFeed;
use crate::fault::readahead::Streams;
use crate::fault::resolve::Resolution;
use crate::fault::state::CopyGate;
use crate::fault::{Delivery, RegionState, RegionStats};
use crate::page::{MemoryKind, PageSize, ResolveOp};
use crate::policy::ReadaheadConfig;
use crate::residency::{PageBits, PageState, Residency};
use crate::runahead::RunAheadConfig;
use crate::store::PageStore;
use faultline_sys::pagemap::Pagemap;
use faultline_sys::uffd::{feature, pagefault_flag};

/// Counters of one peer (relaxed atomics).
#[derive(Debug, Default)]
pub(super) struct PeerCounters {
    pub reads: AtomicU64,
    /// Messages read, counted before any of a batch is handled.
    pub messages: AtomicU64,
    pub removes: AtomicU64,
    pub removed_pages: AtomicU64,
    pub other_events: AtomicU64,
    pub deferred: AtomicU64,
    pub prefetched: AtomicU64,
    pub prefetch_ioctls: AtomicU64,
    /// Pages queued for prefetch.
    pub prefetch_queued: AtomicU64,
    pub outside: AtomicU64,
    /// Faults by kind, their service times, demand pages (service.rs).
    pub service: ServiceCounters,
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

/// When serving a peer reached its milestones (see [`PeerTimes`]).
#[derive(Debug, Default)]
pub(super) struct PeerClock {
    pub first_fault: OnceLock<u64>,
    pub first_prefetch: OnceLock<u64>,
    pub prefetch_done: OnceLock<u64>,
}

/// A snapshot of a peer's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Fault messages read.
    pub faults: u64,
    /// `read(2)`s of its userfaultfd that returned messages (fault
    /// messages per read: `faults / reads`).
    pub reads: u64,
    /// Messages those reads returned (faults and events), counted as each
    /// `read(2)` returns, before any of them is handled: once every
    /// message read is handled, `faults + removes + other_events` equals
    /// it (the handled ones are counted as each is handled, never
    /// before it is read).
    pub messages: u64,
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
    /// Pages queued for prefetch (prefetch progress: `prefetched` of
    /// these).
    pub prefetch_queued: u64,
    /// Fault messages by kind.
    pub fault_kinds: FaultKinds,
    /// Faults whose page was present once resolved: the pages installed
    /// on demand (see [`ServiceTimes`]'s module).
    pub demand_pages: u64,
    /// The faults' service times.
    pub service: ServiceTimes,
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

/// One region of a peer: its fault-path state and what the peer's
/// handler keeps beside it.
pub(super) struct ForeignRegion {
    pub state: Box<RegionState>,
    /// Pages the peer removed (they read zeros).
    pub removed: Arc<Removed>,
    /// Pages that have faulted (record mode).
    pub seen: Option<PageBits>,
    /// Pages that faulted once while the map called them present (see
    /// [`ForeignPeer::on_fault`]); only the peer's handler thread touches
    /// them.
    pub suspect: PageBits,
    /// Where the region's bytes start in the store.
    pub store_offset: u64,
}

/// Scratch bytes of a run-ahead populator of a peer region.
const RUN_AHEAD_SCRATCH: usize = 4 << 20;

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);
static NEXT_REGION: AtomicU64 = AtomicU64::new(1 << 40);

impl ForeignRegion {
    /// Region `index` of a peer (`spec`), served from `store` through
    /// `uffd` as `opts` says.
    fn new(
        index: usize,
        spec: &ForeignRegionSpec,
        uffd: &ForeignUffd,
        store: &Arc<dyn PageStore>,
        opts: &ForeignOptions,
        copy_gate: &Arc<RwLock<()>>,
    ) -> Result<ForeignRegion, ForeignError> {
        let (pages, kind) = spec.pages(index)?;
        let size = pages.size();
        let removed = Arc::new(Removed::new(pages.count()));
        let rstore: Arc<dyn PageStore> = Arc::new(RegionStore::new(
            store.clone(),
            spec.store_offset,
            pages,
            removed.clone(),
        ));
        // Shared mode: which pages the snapshot's page cache holds
        // (CONTINUE); the others (holes, and later removed pages) are
        // copied. A run is at most 2 MiB of base pages, or `huge_window`
        // huge pages (a copied part of one is cut to the handler's scratch
        // when the store has no view: `resolve::install`).
        let huge_window = opts.huge_window.filter(|&n| n > 0).unwrap_or(HUGE_WINDOW);
        // Shared regions of huge pages: fixed windows of `huge_window`.
        let huge_blocks = opts.shared.is_some() && size != PageSize::BASE;
        let (kind, op, cached, max_run_pages) = match &opts.shared {
            Some(snap) => (
                if size == PageSize::BASE {
                    MemoryKind::Shmem
                } else {
                    MemoryKind::Hugetlb
                },
                ResolveOp::Continue,
                Some(snap.cached_bits(spec.store_offset, pages.count())),
                if huge_blocks {
                    huge_window
                } else {
                    PageSize::HUGE_2M.bytes() / size.bytes()
                },
            ),
            None => (kind, ResolveOp::Copy, None, usize::MAX),
        };
        let state = Box::new(RegionState {
            id: NEXT_REGION.fetch_add(1, Relaxed),
            pages,
            kind,
            op,
            zeropage_reads: false,
            readahead: match opts.window_tuning {
                _ if huge_blocks => Streams::by_address(ReadaheadConfig::fixed(huge_window)),
                Some(t) => Streams::tuned(opts.readahead, t),
                None => Streams::by_address(opts.readahead),
            },
            max_run_pages,
            store: rstore,
            residency: Residency::new(pages.count()),
            cached,
            alias: None,
            pool: None,
            uffd: uffd.uffd.clone(),
            // We read the events when the peer enabled them; without them
            // the fault path treats a fault on a recorded page as a dropped
            // page (never `mincore`, which would look at our own address
            // space).
            delivery: Delivery {
                wake_first: opts.wake_first,
                stamps: opts.phase_samples > 0,
                ..Delivery::PEER_HANDLER
            },
            inflight: AtomicUsize::new(0),
            stats: Default::default(),
            budget: None,
            runahead: opts.run_ahead.map(|_| RunAheadFeed::new(pages.count())),
            written: opts.track_dirty.then(|| dirty::bits(pages.count())),
            copy_gate: Some(CopyGate {
                lock: copy_gate.clone(),
                piece_pages: size.pages_in(GATE_PIECE).max(1),
                crew: OnceLock::new(),
            }),
            timing_start: AtomicU64::new(0),
            timing_resolved: AtomicU64::new(0),
        });
        Ok(ForeignRegion {
            state,
            removed,
            seen: opts.record.then(|| PageBits::new(pages.count())),
            suspect: PageBits::new(pages.count()),
            store_offset: spec.store_offset,
        })
    }
}

/// Refuses a region whose handshake page size is not the page size of
/// process `pid`'s mapping there (`PROCMAP_QUERY`). Where the peer's maps
/// cannot be read (another user, a kernel before 6.11, the peer gone) the
/// installs say it instead.
fn check_page_sizes(pid: i32, specs: &[ForeignRegionSpec]) -> Result<(), ForeignError> {
    let Ok(maps) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
        return Ok(());
    };
    for (index, s) in specs.iter().enumerate() {
        let Ok(Some(v)) = faultline_sys::mem::procmap_query(&maps, s.base) else {
            continue;
        };
        if v.start <= s.base && v.page_size != 0 && v.page_size != s.page_size {
            return Err(ForeignError::PageSizeMismatch {
                index,
                addr: s.base,
                said: s.page_size,
                mapped: v.page_size,
            });
        }
    }
    Ok(())
}

/// A peer: its userfaultfd, its regions and what it asked for. Built with
/// [`ForeignPeer::new`], served once added to a
/// [`ForeignEngine`](super::ForeignEngine). See the module docs.
pub struct ForeignPeer {
    pub(super) id: u64,
    label: String,
    pub(super) uffd: ForeignUffd,
    /// Run-ahead populators; stopped before the regions are freed.
    populators: Mutex<Vec<Background>>,
    pub(super) regions: Vec<ForeignRegion>,
    pub(super) hangup: Option<OwnedFd>,
    /// (store offset, `CLOCK_MONOTONIC` ns) of each page's first fault.
    record: Option<Mutex<Vec<(u64, u64)>>>,
    /// Queued prefetch runs, and how many were taken out and are being
    /// installed.
    pub(super) prefetch: Mutex<PrefetchQueue>,
    pub(super) prefetch_pending: AtomicBool,
    /// Prefetch helpers installing this peer's runs now.
    pub(super) helpers: AtomicUsize,
    /// Held shared by every install into this peer's regions (the resolve
    /// path: `CopyGate`, a copied window in pieces of [`GATE_PIECE`]),
    /// exclusively by each thread reading its userfaultfd around the read
    /// and the REMOVE bookkeeping that follows: a REMOVE is never read
    /// while a copy is in flight, so none can put the store's bytes into a
    /// range after the peer dropped it.
    pub(super) copy_gate: Arc<RwLock<()>>,
    pub(super) store: Arc<dyn PageStore>,
    pub(super) stats: PeerCounters,
    pub(super) clock: PeerClock,
    /// Told of every REMOVE before its bookkeeping ([`ForeignPeer::with_journal`]).
    journal: Option<RemoveJournal>,
    /// Phase samples of its last faults ([`ForeignOptions::phase_samples`]).
    pub(super) phases: Option<PhaseRing>,
    /// A handler thread has reported it dropped (hung up, failed): with
    /// several threads reading it, only the first report goes out.
    pub(super) dropped: AtomicBool,
    /// What dirty tracking could not do ([`ForeignPeer::dirty_caveat`]).
    dirty_caveat: Option<&'static str>,
    /// A `WP_ASYNC` peer's page tables (dirty tracking reads them).
    dirty_scan: Option<Pagemap>,
    /// Told of every page the record logs ([`ForeignPeer::with_record_journal`]).
    record_journal: Option<RecordJournal>,
    /// Handed back to the kernel ([`ForeignPeer::hand_back`]).
    handed_back: AtomicBool,
    /// The CPUs its threads may run on ([`ForeignPeer::with_cpus`]).
    pub(super) cpus: Option<Vec<usize>>,
    /// Which handler threads read its userfaultfd, by index (`None`: all
    /// of its engine's; set when the engine takes it).
    pub(super) read_by: Option<Vec<bool>>,
}

/// What [`ForeignPeer::with_journal`] calls with each REMOVE'd range
/// `[start, end)` (the peer's addresses).
pub type RemoveJournal = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// What [`ForeignPeer::with_record_journal`] calls with each page the
/// record logs: its store offset and first-touch time (`CLOCK_MONOTONIC`
/// ns).
pub type RecordJournal = Arc<dyn Fn(u64, u64) + Send + Sync>;

impl std::fmt::Debug for ForeignPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignPeer")
            .field("id", &self.id)
            .field("label", &self.label)
            .field("regions", &self.regions.len())
            .finish()
    }
}

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
        if let Some(pid) = opts.pid {
            check_page_sizes(pid, specs)?;
        }
        let mut armed = dirty::Armed::default();
        if let Some(snap) = &opts.shared {
            let minor = if snap.page_size() == PageSize::BASE {
                feature::MINOR_SHMEM
            } else {
                feature::MINOR_HUGETLBFS
            };
            if uffd.features() & minor == 0 {
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
            uffd.register_minor(specs)?;
        }
        if opts.track_dirty {
            // Before any fault is served: every page we install is then
            // installed write-protected.
            armed = dirty::arm(&uffd, specs, opts.shared.is_some(), opts.pid)?;
        }
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|&i| specs[i].base);
        let copy_gate = Arc::new(RwLock::new(()));
        let regions = order
            .into_iter()
            .map(|i| ForeignRegion::new(i, &specs[i], &uffd, &store, opts, &copy_gate))
            .collect::<Result<Vec<_>, _>>()?;
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
            copy_gate,
            store,
            stats: PeerCounters::default(),
            clock: PeerClock::default(),
            journal: None,
            phases: PhaseRing::new(opts.phase_samples),
            dropped: AtomicBool::new(false),
            dirty_caveat: armed.caveat,
            handed_back: AtomicBool::new(false),
            dirty_scan: armed.scan,
            record_journal: None,
            cpus: None,
            read_by: None,
        };
        if let Some(cfg) = opts.run_ahead {
            let mut pop = peer.populators.lock().expect("populators");
            for r in &peer.regions {
                let per_page = r.state.pages.size().bytes() / PageSize::BASE.bytes();
                let cfg = RunAheadConfig {
                    budget_pages: (cfg.budget_pages / per_page).max(1),
                };
                pop.push(
                    crate::runahead::start(&r.state, cfg, RUN_AHEAD_SCRATCH).map_err(|source| {
                        ForeignError::Spawn {
                            what: "a run-ahead thread",
                            source,
                        }
                    })?,
                );
            }
        }
        Ok(peer)
    }

    /// Lets `crew` install pieces of this peer's long windows beside the
    /// thread resolving a fault (its engine's helpers: `fault::crew`).
    pub(super) fn join_crew(&self, crew: &Arc<Crew>) {
        for r in &self.regions {
            if let Some(gate) = &r.state.copy_gate {
                let _ = gate.crew.set(crew.clone());
            }
        }
    }

    /// Watches `fd` (the connection the peer handed its userfaultfd over):
    /// when it reports a hang-up the peer is dropped and reported gone.
    pub fn with_hangup(mut self, fd: OwnedFd) -> ForeignPeer {
        self.hangup = Some(fd);
        self
    }

    /// The CPUs the peer's threads may run on (its vCPUs'): with handler
    /// threads pinned one per CPU ([`ForeignEngineConfig::pin`]), only the
    /// ones on these CPUs read its userfaultfd, so a fault wakes those
    /// alone, not every handler (all of them do when none is on these
    /// CPUs). The others still watch its hang-up and run its prefetch.
    ///
    /// [`ForeignEngineConfig::pin`]: super::ForeignEngineConfig::pin
    pub fn with_cpus(mut self, cpus: Vec<usize>) -> ForeignPeer {
        self.cpus = Some(cpus);
        self
    }

    /// Calls `journal` with every REMOVE'd range as it is read, before the
    /// peer's bookkeeping of it and before any later event or fault of the
    /// peer is acted on: a record of what the kernel no longer remembers
    /// (which ranges must read zeros), for a handler that takes the peer
    /// over after this one is gone ([`ForeignPeer::replay_remove`]).
    pub fn with_journal(mut self, journal: RemoveJournal) -> ForeignPeer {
        self.journal = Some(journal);
        self
    }

    /// Calls `journal` with every page the record logs (record mode), as
    /// it is logged (under the log's lock, so in the log's order) and
    /// before its fault is resolved: the record so far, for a handler that
    /// takes the peer over ([`ForeignPeer::replay_record`]).
    pub fn with_record_journal(mut self, journal: RecordJournal) -> ForeignPeer {
        self.record_journal = Some(journal);
        self
    }

    /// Logs `entries` (store offset, first-touch ns), as an earlier
    /// handler of this peer recorded them (from its journal): each page
    /// counts as seen, so the record goes on where that handler's ended.
    /// Record mode only (else nothing); an offset outside every region is
    /// skipped. Gives the entries logged. Call it before the peer is added
    /// to an engine.
    pub fn replay_record(&self, entries: &[(u64, u64)]) -> usize {
        let Some(log) = &self.record else {
            return 0;
        };
        let mut log = log.lock().expect("record log");
        let before = log.len();
        for &(off, ns) in entries {
            let Some(reg) = self.regions.iter().find(|r| {
                off >= r.store_offset && off - r.store_offset < r.state.pages.len() as u64
            }) else {
                continue;
            };
            let pages = &reg.state.pages;
            let page = pages.index(pages.base() + (off - reg.store_offset));
            if let Some(seen) = &reg.seen {
                if !seen.get(page) {
                    seen.set(page);
                    log.push((off, ns));
                }
            }
        }
        log.len() - before
    }

    /// Marks `[start, end)` dropped, as a REMOVE event read by an earlier
    /// handler of this peer did (from its journal): its pages read zeros
    /// from now on. Call it before the peer is added to an engine.
    pub fn replay_remove(&self, start: u64, end: u64) {
        self.on_remove(start, end);
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

    /// Hands a shared-mode peer's memory back to the kernel: unregisters
    /// every region through its userfaultfd (the ioctl acts on the peer's
    /// mm), waking any thread blocked on them. From then on the kernel
    /// serves the peer's faults from the shared copy's page cache itself,
    /// as it would for a VMM that mapped the file without a userfaultfd
    /// (on a tmpfs mounted `huge=always`, a 2 MiB mapping a fault, which
    /// `UFFDIO_CONTINUE`, 4 KiB a page, cannot match): nothing more is
    /// installed, recorded, tracked or masked (a page the VMM drops reads
    /// the copy's bytes again, not zeros). Refused for a peer served by
    /// copy (its memory is not the copy) and one that records or tracks
    /// writes.
    pub fn hand_back(&self) -> Result<(), ForeignError> {
        if !self.is_shared() {
            return Err(ForeignError::NoHandBack(
                "it is not served in shared mode: its memory is not the shared copy",
            ));
        }
        if self.record.is_some() || self.tracks_dirty() {
            return Err(ForeignError::NoHandBack(
                "it records or tracks its writes, which needs its faults",
            ));
        }
        for (index, r) in self.regions.iter().enumerate() {
            let (base, len) = (r.state.pages.base(), r.state.pages.len() as u64);
            let u = &self.uffd.uffd;
            // The unregister wakes the range's waiting faults itself, but
            // before it write-locks the vma: a fault taken under the vma
            // lock may queue itself just after that wake and sleep on.
            // Once the unregister returns it is queued (the vma could not
            // change while it held the lock), so a wake now reaches it,
            // and it retries as the kernel's fault.
            u.unregister(base, len)
                .and_then(|()| u.wake(base, len))
                .map_err(|source| ForeignError::Unregister { index, source })?;
        }
        self.handed_back.store(true, Relaxed);
        Ok(())
    }

    /// Whether it was handed back to the kernel ([`Self::hand_back`]).
    pub fn is_handed_back(&self) -> bool {
        self.handed_back.load(Relaxed)
    }

    /// Whether its writes are tracked ([`ForeignOptions::track_dirty`]).
    pub fn tracks_dirty(&self) -> bool {
        self.regions.iter().any(|r| r.state.written.is_some())
    }

    /// The pages it has written or removed since it was first served
    /// (`None`: not tracked). Read while it runs: every write resolved
    /// before the call is in it (with `WP_ASYNC`: every write the kernel
    /// had un-protected when its page tables were read). Fails only when
    /// a `WP_ASYNC` peer's page tables cannot be read (it is gone).
    pub fn dirty_set(&self) -> Result<Option<DirtySet>, ForeignError> {
        if !self.tracks_dirty() {
            return Ok(None);
        }
        let regions = self.regions.iter().map(|r| (&*r.state, r.store_offset));
        DirtySet::of(regions, self.dirty_scan.as_ref()).map(Some)
    }

    /// Whether its dirty tracking reads its page tables (a `WP_ASYNC`
    /// userfaultfd: the kernel un-protects written pages itself).
    pub fn dirty_async(&self) -> bool {
        self.dirty_scan.is_some()
    }

    /// What arming its dirty tracking could not do (the peer is tracked
    /// all the same): see `foreign/dirty.rs`. `None`: nothing.
    pub fn dirty_caveat(&self) -> Option<&'static str> {
        self.dirty_caveat
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
                let bitmaps = 3
                    + usize::from(r.seen.is_some())
                    + usize::from(r.state.cached.is_some())
                    + usize::from(r.state.written.is_some());
                let words = n.div_ceil(32) + n.div_ceil(64) * bitmaps;
                words * 8
            })
            .sum();
        let log = self
            .record
            .as_ref()
            .map_or(0, |m| m.lock().expect("record log").capacity() * 16);
        let queue = self
            .prefetch
            .lock()
            .expect("prefetch queue")
            .runs
            .capacity()
            * std::mem::size_of::<(usize, Range<usize>)>();
        let phases = self.phases.as_ref().map_or(0, PhaseRing::bytes);
        bits + log + queue + phases
    }

    /// The phase samples of its last faults, oldest first (empty unless
    /// [`ForeignOptions::phase_samples`] asked for them).
    pub fn phases(&self) -> Vec<FaultPhases> {
        self.phases
            .as_ref()
            .map_or_else(Vec::new, PhaseRing::samples)
    }

    /// Its adaptive isolated windows ([`ForeignOptions::window_tuning`]):
    /// the largest region's window now, in pages, and the times the
    /// regions' windows doubled and halved; `None` without the tuning.
    pub fn isolated_windows(&self) -> Option<(usize, u64, u64)> {
        let mut out: Option<(usize, u64, u64, usize)> = None;
        for r in &self.regions {
            let Some((size, grows, shrinks)) = r.state.readahead.isolated() else {
                continue;
            };
            let n = r.state.pages.count();
            let o = out.get_or_insert((size, 0, 0, n));
            if n > o.3 {
                (o.0, o.3) = (size, n);
            }
            o.1 += grows;
            o.2 += shrinks;
        }
        out.map(|(size, g, s, _)| (size, g, s))
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
            regions.around += s.around;
            regions.ioctls += s.ioctls;
            regions.store_fills += s.store_fills;
            regions.zero_copy_fills += s.zero_copy_fills;
            regions.exists += s.exists;
            regions.retries += s.retries;
            regions.gone += s.gone;
            regions.busy += s.busy;
            regions.poisoned += s.poisoned;
            regions.helped += s.helped;
            regions.handler_cycles += s.handler_cycles;
        }
        let fault_kinds = c.service.kinds();
        PeerStats {
            faults: fault_kinds.total(),
            reads: c.reads.load(Relaxed),
            messages: c.messages.load(Relaxed),
            removes: c.removes.load(Relaxed),
            removed_pages: c.removed_pages.load(Relaxed),
            other_events: c.other_events.load(Relaxed),
            deferred: c.deferred.load(Relaxed),
            prefetched: c.prefetched.load(Relaxed),
            prefetch_ioctls: c.prefetch_ioctls.load(Relaxed),
            prefetch_queued: c.prefetch_queued.load(Relaxed),
            fault_kinds,
            demand_pages: c.service.demand(),
            service: c.service.times(),
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
        self.take_record_timed()
            .into_iter()
            .map(|(o, _)| o)
            .collect()
    }

    /// [`ForeignPeer::take_record`] with when each page first faulted:
    /// (store offset, `CLOCK_MONOTONIC` ns), in first-touch order.
    pub fn take_record_timed(&self) -> Vec<(u64, u64)> {
        self.record
            .as_ref()
            .map(|m| std::mem::take(&mut *m.lock().expect("record log")))
            .unwrap_or_default()
    }

    /// The region holding the peer address `addr`.
    fn find(&self, addr: u64) -> Option<&ForeignRegion> {
        let i = self
            .regions
            .partition_point(|r| r.state.pages.base() <= addr)
            .checked_sub(1)?;
        let r = &self.regions[i];
        r.state.pages.contains(addr).then_some(r)
    }

    /// The bookkeeping of a fault at `addr` (message flags `flags`) before
    /// it is resolved (see the module docs): its region and page, or why
    /// the peer must be dropped. `first`: a fault message just read (not a
    /// deferred fault tried again).
    pub(super) fn on_fault(
        &self,
        addr: u64,
        flags: u64,
        first: bool,
    ) -> Result<(&ForeignRegion, usize), String> {
        if first {
            self.clock
                .first_fault
                .get_or_init(faultline_sys::monotonic_ns);
            self.stats.service.message(flags);
            // A fault read and not yet answered (its vCPU blocked).
            faultline_sys::failpoint::hit("fault-read");
        }
        let Some(reg) = self.find(addr) else {
            self.stats.outside.fetch_add(1, Relaxed);
            return Err(format!(
                "a fault at {addr:#x} lies outside every region it declared"
            ));
        };
        let r = &reg.state;
        let page = r.pages.index(addr);
        if let (Some(seen), Some(log)) = (&reg.seen, &self.record) {
            if !seen.get(page) {
                seen.set(page);
                let entry = (
                    reg.store_offset + r.pages.offset(page),
                    faultline_sys::monotonic_ns(),
                );
                let mut log = log.lock().expect("record log");
                log.push(entry);
                if let Some(journal) = &self.record_journal {
                    journal(entry.0, entry.1);
                }
            }
        }
        // A write-protect fault is on a present page by definition (dirty
        // tracking's first writes): never a sign of a dropped page.
        if flags & pagefault_flag::WP == 0 && r.residency.get(page) != PageState::Absent {
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
            let stale = !self.uffd.reports_removes() || reg.suspect.get(page);
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
        Ok((reg, page))
    }

    /// A fault of this peer whose handling started at `started_ns`
    /// (`CLOCK_MONOTONIC`) ended with `res`: its service time, and a
    /// demand page when its page is there (see `service.rs`). A deferral
    /// (EAGAIN) is not an end: the retry counts.
    pub(super) fn fault_served(&self, res: &Resolution, started_ns: u64) {
        if matches!(res, Resolution::Retry) {
            return;
        }
        let ns = faultline_sys::monotonic_ns().saturating_sub(started_ns);
        self.stats
            .service
            .served(ns, matches!(res, Resolution::Resolved));
    }

    /// The peer dropped `[start, end)` (`MADV_DONTNEED`, a REMOVE event):
    /// its whole pages are absent, and read as zeros from now on.
    pub(super) fn on_remove(&self, start: u64, end: u64) {
        if let Some(journal) = &self.journal {
            journal(start, end);
        }
        self.stats.removes.fetch_add(1, Relaxed);
        for r in &self.regions {
            let pages = r.state.pages.within(start, end);
            if pages.is_empty() {
                continue;
            }
            r.removed.remove(pages.clone());
            dirty::note_removed(&r.state, pages.clone());
            if let Some(cached) = &r.state.cached {
                // Shared mode: its next (minor) fault must get zeros, a
                // private page, not the snapshot's page again.
                pages.clone().for_each(|pg| cached.clear(pg));
            }
            r.state
                .residency
                .set_range(pages.clone(), PageState::Absent);
            self.stats
                .removed_pages
                .fetch_add(pages.len() as u64, Relaxed);
        }
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

/// What happened to a peer (on the receiver [`ForeignEngine::new`](super::ForeignEngine::new)
/// returns).
#[derive(Debug)]
pub enum PeerEvent {
    /// Its hang-up descriptor reported a hang-up: it exited or was killed.
    /// It is no longer served.
    HungUp {
        /// The peer.
        peer: Arc<ForeignPeer>,
    },
    /// Something arrived on its hang-up descriptor after the hand-off: a
    /// second message, or what the peer reports of itself (`faultline
    /// serve` reads its vCPUs' stalls there). On a stream socket one
    /// event may hold part of what the peer sent, or several of its
    /// sends. Descriptors were closed; the peer is still served.
    Message {
        /// The peer.
        peer: Arc<ForeignPeer>,
        /// The bytes received (at most 16 KiB an event).
        data: Vec<u8>,
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
