//! The fault path every engine shares: from a faulting address to an
//! installed page.
//!
//! ```text
//!   engine (signal handler, or a handler thread's uffd message)
//!     │ fault address, read/write, write-protect
//!     ▼
//!   table::enter(addr)        lock-free lookup of the region, marks it in flight
//!     │ &RegionState
//!     ▼
//!   resolve::resolve(..)      claim the page (+ read-ahead window), fetch, install
//!     │                       ├─ store::PageStore::fill / view   (the bytes)
//!     │                       ├─ pool::FramePool::take           (MOVE frames)
//!     │                       └─ feeds: budget log, run-ahead    (background threads)
//!     ▼
//!   sys::uffd                 UFFDIO_COPY / ZEROPAGE / CONTINUE / MOVE / POISON, then WAKE
//! ```
//!
//! * [`table`]: the process-wide region table (`enter`, in-flight counts,
//!   publishing and retiring a region).
//! * [`state`]: [`RegionState`], what the fault path knows of one region.
//! * [`resolve`]: the one resolution path.
//! * [`readahead`]: per-thread stream slots driving
//!   [`crate::policy::ReadaheadConfig`] from inside signal handlers.
//! * [`feeds`]: what the fault path tells the evictor (the install log of
//!   a budget, the budget's counters) and the run-ahead populator (the
//!   last fault).
//! * [`reclaim`]: making room under a budget: victims, batched eviction,
//!   for the evictor thread and for faults that evict for themselves.
//! * `holes`: the absent holes of a read-ahead window gathered into one
//!   batched fill, for stores that pay per request.
//! * [`report`]: allocation-free messages and the fail-closed exit.
//!
//! Everything here is async-signal-safe when the store is: no allocation,
//! no locks (but a peer's copy gate, `state::CopyGate`, which no signal
//! handler meets), only atomics and system calls. Nothing here knows which
//! engine delivered the fault: what differs between engines is described
//! by a [`Delivery`], which each engine declares.

pub(crate) mod crew;
pub(crate) mod feeds;
mod holes;
pub(crate) mod readahead;
pub(crate) mod reclaim;
pub(crate) mod report;
pub(crate) mod resolve;
pub(crate) mod state;
pub(crate) mod table;
mod zero;

pub(crate) use state::RegionState;
pub use state::RegionStats;
pub(crate) use zero::{init as zero_init, BYTES as ZERO_BYTES};

/// How an engine delivers faults: what the fault path may assume about
/// the faulting thread. Engines declare theirs with
/// [`Engine::delivery`](crate::Engine::delivery); regions and the
/// resolve path ask it instead of checking which engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The resolve path runs on the faulting thread, inside a signal
    /// handler: stores must be async-signal-safe, and a wait must not need
    /// another thread of the engine.
    pub on_faulting_thread: bool,
    /// The faulting thread sleeps in the kernel until a resolve ioctl or
    /// `UFFDIO_WAKE` wakes it.
    pub faulter_sleeps: bool,
    /// The engine reads the userfaultfd's events (`UFFD_EVENT_REMOVE`), so
    /// the residency map learns when pages are dropped behind its back.
    pub reads_events: bool,
    /// The region's memory is mapped in this process, so `mincore` can
    /// tell whether one of its pages is mapped (not so for a peer's memory
    /// served through its userfaultfd).
    pub memory_here: bool,
    /// A fault's window is installed faulting page first: that page is
    /// copied and its thread woken before the rest of the window is
    /// copied (copy mode, no budget; see `fault::resolve`).
    pub wake_first: bool,
    /// Each resolve stamps its steps on the thread (`resolve::stamps`:
    /// the foreign engine's phase samples); off, the fault path reads no
    /// clock for them.
    pub stamps: bool,
}

impl Delivery {
    /// A signal on the faulting thread, resolved there (the `signal`
    /// engine): nobody sleeps, no events.
    pub const SAME_THREAD: Delivery = Delivery {
        on_faulting_thread: true,
        faulter_sleeps: false,
        reads_events: false,
        memory_here: true,
        wake_first: false,
        stamps: false,
    };
    /// A message read by a handler thread; the faulting thread sleeps
    /// until woken (the `poll`, `spin` and `workers` engines).
    pub const HANDLER_THREAD: Delivery = Delivery {
        on_faulting_thread: false,
        faulter_sleeps: true,
        reads_events: true,
        memory_here: true,
        wake_first: false,
        stamps: false,
    };
    /// A peer's fault read by a handler thread of this process
    /// (`crate::foreign`): like [`HANDLER_THREAD`](Self::HANDLER_THREAD),
    /// but the memory is in the peer's address space.
    pub const PEER_HANDLER: Delivery = Delivery {
        memory_here: false,
        ..Delivery::HANDLER_THREAD
    };
}
