//! # faultline: page faults handled in user space
//!
//! A program maps a [`Region`]; the first access to each page faults, and
//! instead of the kernel filling the page with zeros, faultline fetches it
//! from a [`PageStore`] (zeros, a memory snapshot, a file, ...) and installs
//! it with `userfaultfd` (`UFFDIO_COPY`, `ZEROPAGE`, `CONTINUE`, `MOVE`).
//!
//! How a fault reaches the handler is the job of an [`Engine`]:
//!
//! | engine | who runs the handler | wake-ups per fault |
//! |---|---|---|
//! | [`PollEngine`] | a thread blocked in `poll()`+`read()` (the classic design) | 2 (handler, then faulting thread) |
//! | [`SpinEngine`] | a thread busy-polling a non-blocking fd | 1 (faulting thread) |
//! | [`SignalEngine`] | the faulting thread itself, in a SIGBUS handler | 0 |
//! | [`WorkersEngine`] | N pinned threads, faults sharded by page | 2 |
//!
//! The `signal` engine is the software form of user-interrupt page-fault
//! forwarding (seed 000): the fault is delivered on the faulting thread with
//! its address and error code, and nothing sleeps.
//!
//! ```no_run
//! use faultline::{Region, SignalEngine, MemoryStore};
//! let engine = SignalEngine::new()?;
//! let snapshot = vec![7u8; 1 << 20];
//! let region = Region::builder(1 << 20)
//!     .store(MemoryStore::new(snapshot))
//!     .fault_around(8)
//!     .build(&engine)?;
//! // SAFETY: the region is mapped and readable for its whole length.
//! let first = unsafe { *region.as_ptr() };
//! assert_eq!(first, 7);
//! # Ok::<(), faultline::Error>(())
//! ```
//!
//! The layout of the crate follows its architecture: `sys` is the only
//! code that talks to the kernel; [`interval`] and [`residency`] are the
//! lock-free data structures the fault path reads; [`store`] holds backing
//! stores; [`engine`] the delivery engines; `resolve` the one fault
//! resolution path all engines share; [`region`] ties them together;
//! [`policy`] holds pure paging policies. Watchpoints on user-level page
//! permissions (write-protect, emulated stores, debug registers) are the
//! `faultline-watch` crate, built on `sys`. `DESIGN.md` has the threading
//! model and lock order.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod caps;
pub mod engine;
pub mod error;
pub mod evict;
pub mod interval;
pub mod policy;
pub mod pool;
pub mod region;
pub mod residency;
mod resolve;
pub mod runahead;
pub mod store;
#[doc(hidden)]
pub mod sys;

pub use caps::{capabilities, Capabilities};
pub use engine::{
    Engine, EngineConfig, EngineKind, EngineStats, PollEngine, SignalEngine, SpinEngine,
    WorkersEngine,
};
pub use error::{Error, Result};
pub use evict::{EvictionConfig, EvictionStats};
pub use pool::{FramePoolConfig, FramePoolStats};
pub use region::{Region, RegionBuilder, RegionStats};
pub use residency::PageState;
pub use runahead::{RunAheadConfig, RunAheadStats};
pub use store::{FileAccess, FileStore, MemoryStore, PageStore, StoreError, ZeroStore};

/// What memory backs a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`: MISSING faults; COPY, ZEROPAGE, MOVE.
    PrivateAnon,
    /// A shared memfd (shmem): MISSING and MINOR faults; the runtime fills
    /// the page cache through a second, unregistered view and maps it with
    /// `UFFDIO_CONTINUE`.
    Shmem,
    /// A hugetlb memfd (2 MiB pages, needs a pool): like `Shmem`.
    Hugetlb,
}

impl MemoryKind {
    /// Name for reports and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::PrivateAnon => "private-anon",
            MemoryKind::Shmem => "shmem",
            MemoryKind::Hugetlb => "hugetlb",
        }
    }
    /// The smallest page size a region of this kind may use.
    pub fn min_page_size(self) -> usize {
        match self {
            MemoryKind::Hugetlb => 2 << 20,
            _ => sys::BASE_PAGE,
        }
    }
}

/// How faults on a region are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolveOp {
    /// Pick per memory kind and store: ZEROPAGE for read faults on a zero
    /// store (private anon), COPY for data, CONTINUE for shmem/hugetlb.
    Auto,
    /// `UFFDIO_COPY` (allocates a page and copies into it).
    Copy,
    /// `UFFDIO_MOVE` of pre-touched pages from a per-region pool (private
    /// anonymous only): the page is prepared off the fault path.
    Move,
    /// `UFFDIO_CONTINUE` after filling the page cache through the alias
    /// view (shmem, hugetlb).
    Continue,
}

impl ResolveOp {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            ResolveOp::Auto => "auto",
            ResolveOp::Copy => "COPY",
            ResolveOp::Move => "MOVE",
            ResolveOp::Continue => "CONTINUE",
        }
    }
}
