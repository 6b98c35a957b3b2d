//! What a peer's service is made of: its regions ([`ForeignRegionSpec`]:
//! where in the peer, how large, which page size, where in the store), how
//! they are served ([`ForeignOptions`]: read-ahead, run-ahead, record,
//! shared mode; eviction and the local page-cache mode are refused), and
//! the engine's settings ([`ForeignEngineConfig`]: handler threads,
//! scratch, batch, prefetch chunk and helpers, how a handler thread waits:
//! [`HandlerWait`]).
//!
//! The checks that need nothing but the specs live here too: a region's
//! page size and alignment ([`ForeignRegionSpec::pages`]), and the layout
//! of all of them ([`check_layout`]: no overlap in the peer, none past the
//! store's end).

use std::sync::Arc;
use std::time::Duration;

use super::error::ForeignError;
use super::snapshot::SharedSnapshot;
use crate::error::Error;
use crate::evict::EvictionConfig;
use crate::page::{MemoryKind, PageSize, Pages};
use crate::policy::{ReadaheadConfig, WindowTuning};
use crate::runahead::RunAheadConfig;

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

impl ForeignRegionSpec {
    /// The region's pages in the peer's address space, and the memory
    /// behind them: the two page sizes a peer's memory comes in, 4 KiB
    /// (anonymous memory) and 2 MiB (hugetlb). `index` names the region in
    /// errors.
    pub(super) fn pages(&self, index: usize) -> Result<(Pages, MemoryKind), ForeignError> {
        let size = usize::try_from(self.page_size)
            .ok()
            .and_then(|bytes| PageSize::new(bytes).ok());
        let (size, kind) = match size {
            Some(PageSize::BASE) => (PageSize::BASE, MemoryKind::PrivateAnon),
            Some(PageSize::HUGE_2M) => (PageSize::HUGE_2M, MemoryKind::Hugetlb),
            _ => {
                return Err(ForeignError::PageSize {
                    index,
                    bytes: self.page_size,
                })
            }
        };
        let geometry = |source| ForeignError::Geometry { index, source };
        if !size.is_aligned(self.base) {
            return Err(geometry(Error::Unaligned {
                addr: self.base,
                align: size.bytes(),
            }));
        }
        let pages = Pages::new(self.base, self.len, size).map_err(geometry)?;
        Ok((pages, kind))
    }
}

/// How a peer's regions are served.
#[derive(Debug, Clone, Default)]
pub struct ForeignOptions {
    /// Fault-around / read-ahead (default: the runtime's default).
    pub readahead: ReadaheadConfig,
    /// Adaptive isolated windows: a fault that continues no stream
    /// installs a window sized from where the peer's earlier faults
    /// landed, starting at `readahead.initial` and kept within these
    /// bounds and `readahead.max` ([`IsolatedWindows`](crate::policy::IsolatedWindows)).
    /// Default none: always `readahead.initial`.
    pub window_tuning: Option<WindowTuning>,
    /// A run-ahead populator per region (default: none). Its budget is in
    /// base (4 KiB) pages: a region of huge pages runs the same bytes
    /// ahead (at least one of its pages).
    pub run_ahead: Option<RunAheadConfig>,
    /// A resident budget: refused (see [the foreign path's docs](super)).
    pub budget: Option<EvictionConfig>,
    /// The page-cache zero-copy mode of local regions: refused (see [the
    /// foreign path's docs](super); [`ForeignOptions::shared`] is its
    /// foreign form).
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
    /// Keep TSC stamps of the last this many faults along the handler's
    /// path ([`FaultPhases`](super::FaultPhases), read back with
    /// [`ForeignPeer::phases`](super::ForeignPeer::phases)). Default 0:
    /// off.
    pub phase_samples: usize,
    /// Install a fault's window faulting page first: that page is copied
    /// and its thread woken, then the rest of the window is copied (copy
    /// mode; the thread no longer waits for its whole window's copy).
    /// Default false: one ioctl for the window, then the wake.
    pub wake_first: bool,
    /// Dirty tracking: register the regions with write-protect through the
    /// peer's userfaultfd, install every page write-protected and note
    /// each page's first write ([`ForeignPeer::dirty_set`](super::ForeignPeer::dirty_set);
    /// see `foreign/dirty.rs`). Refused for regions the kernel cannot
    /// write-protect. Default false. A userfaultfd with
    /// `UFFD_FEATURE_WP_ASYNC` (the kernel un-protects a written page
    /// itself, no fault reaches us) is tracked by reading the peer's page
    /// tables instead (`PAGEMAP_SCAN`), which needs [`ForeignOptions::pid`].
    pub track_dirty: bool,
    /// The peer's pid (serve: from `SO_PEERCRED`), for reading its page
    /// tables through `/proc/PID/pagemap` (dirty tracking of a
    /// `WP_ASYNC` userfaultfd). Default none.
    pub pid: Option<i32>,
    /// Shared mode, regions of 2 MiB pages (a snapshot on hugetlbfs): the
    /// pages one fault maps, the aligned block holding the fault (it
    /// replaces [`ForeignOptions::readahead`] there). `UFFDIO_CONTINUE`
    /// maps a huge page with one PMD and no copy, so a fault's wake-up
    /// costs more than mapping its neighbours. Default (`None`, or 0):
    /// [`HUGE_WINDOW`] pages.
    pub huge_window: Option<usize>,
}

/// The default of [`ForeignOptions::huge_window`]: 16 pages of 2 MiB, 32
/// MiB a fault (RESULTS.md, "On demand over 2 MiB pages": 1.6-2.3x
/// faster than one page a fault on clustered working sets).
pub const HUGE_WINDOW: usize = 16;

/// Checks the regions against each other and against the store: no
/// overlaps in the store (each region's bytes are its own) and none past
/// its end.
pub(super) fn check_layout(
    specs: &[ForeignRegionSpec],
    store_len: Option<u64>,
) -> Result<(), ForeignError> {
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

/// Settings of a [`ForeignEngine`](super::ForeignEngine).
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
    /// [`GATE_PIECE`] bytes. Default 1.
    pub prefetch_helpers: usize,
    /// Run the prefetch helpers under `SCHED_IDLE`: they install only on
    /// CPUs the peers' vCPUs (and everything else) leave idle, so prefetch
    /// never takes a CPU from a vCPU that computes. Default false.
    pub prefetch_idle: bool,
    /// How a handler thread waits for its peers' next messages. Default
    /// [`HandlerWait::ADAPTIVE`].
    pub wait: HandlerWait,
    /// Workers: every handler thread reads every peer's userfaultfd, so
    /// one peer's faults are served on all of them at once (its copies on
    /// several CPUs); the first thread alone watches its hang-up and
    /// runs its prefetch steps. Default false: each peer is served by
    /// one thread.
    pub spread: bool,
    /// Pin handler thread `i` to the `i`-th CPU the thread creating the
    /// engine may run on (round robin). With [`spread`](Self::spread), one thread per CPU
    /// and [`HandlerWait::Poll`] this is the co-located design: a fault
    /// wakes every thread asleep on the peer's userfaultfd, and the one on
    /// the faulting thread's CPU runs as soon as that thread sleeps, with
    /// no inter-processor wake-up (RESULTS.md, "A handler on the faulting
    /// CPU"). Default false.
    pub pin: bool,
}

/// How a peer handler thread waits for its peers' messages (see [the
/// engine's docs](super::ForeignEngine)).
///
/// A fault served by a thread asleep in `poll(2)` pays that thread's
/// wake-up before its copy (an inter-processor wake-up and a vCPU halt in
/// a VM, 20-60 us on the project's machines) on top of the faulting
/// thread's own. A thread that polls with a zero timeout finds the message
/// as soon as it is queued, at the price of its CPU while it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerWait {
    /// Sleep in `poll(2)` until a descriptor is ready (the classic design).
    Poll,
    /// Never sleep: poll with a zero timeout in a loop (yielding the CPU
    /// between empty polls). A whole CPU per handler thread, always.
    Spin,
    /// Spin while the peers fault; once no message came for `idle`, sleep
    /// in `poll(2)` until the next one. The CPU it costs beyond `Poll` is
    /// at most `idle` per burst of faults.
    Adaptive {
        /// How long after the last message the thread keeps spinning.
        idle: Duration,
    },
}

impl HandlerWait {
    /// Adaptive with a 1 ms idle interval: longer than the gap between
    /// the faults of a guest sweeping its memory (a copy, a few
    /// microseconds), short enough that an idle peer costs a millisecond
    /// of CPU once per burst.
    pub const ADAPTIVE: HandlerWait = HandlerWait::Adaptive {
        idle: Duration::from_millis(1),
    };

    /// Its name on the command line (`poll`, `spin`, `adaptive`).
    pub fn name(self) -> &'static str {
        match self {
            HandlerWait::Poll => "poll",
            HandlerWait::Spin => "spin",
            HandlerWait::Adaptive { .. } => "adaptive",
        }
    }

    /// Whether a thread whose last message came `since` ago polls with a
    /// zero timeout.
    pub fn spins(self, since: Duration) -> bool {
        match self {
            HandlerWait::Poll => false,
            HandlerWait::Spin => true,
            HandlerWait::Adaptive { idle } => since < idle,
        }
    }
}

impl Default for HandlerWait {
    fn default() -> Self {
        HandlerWait::ADAPTIVE
    }
}

/// Bytes installed per hold of a peer's copy gate, at most (at least one
/// page): a demand fault's window copied from the store goes in pieces of
/// this size, and a prefetch helper takes this much of a queue at a time.
/// It bounds how long a thread waits to read the peer's userfaultfd
/// behind another thread's copy (about 0.1 ms here).
pub const GATE_PIECE: usize = 256 << 10;

/// The default [`ForeignEngineConfig::prefetch_chunk_bytes`]: 2 MiB (256
/// KiB was 1.04-1.46x slower in `bench restore`: more demand faults).
pub const PREFETCH_CHUNK: usize = 2 << 20;

impl Default for ForeignEngineConfig {
    fn default() -> Self {
        ForeignEngineConfig {
            threads: 1,
            scratch_bytes: 4 << 20,
            batch: 64,
            prefetch_chunk_bytes: PREFETCH_CHUNK,
            prefetch_helpers: 1,
            prefetch_idle: false,
            wait: HandlerWait::default(),
            spread: false,
            pin: false,
        }
    }
}
