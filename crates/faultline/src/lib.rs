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
//! | [`WorkersEngine`] | N pinned threads, faults sharded by page window | 2 |
//! | [`PerCpuEngine`] | a thread pinned on each CPU, each resolving what it reads | 2, the handler's on the faulting CPU |
//!
//! The `signal` engine is the software form of seed 000's user-interrupt
//! page-fault forwarding: the fault is delivered on the faulting thread
//! with its address and error code, and nothing sleeps.
//!
//! ```no_run
//! use faultline::{Region, SignalEngine, MemoryStore};
//! let engine = SignalEngine::new()?;
//! let snapshot = vec![7u8; 1 << 20];
//! let region = Region::builder(1 << 20)
//!     .store(MemoryStore::new(snapshot))
//!     .build(&engine)?;
//! // SAFETY: the region is mapped and readable for its whole length.
//! let first = unsafe { *region.as_ptr() };
//! assert_eq!(first, 7);
//! # Ok::<(), faultline::Error>(())
//! ```
//!
//! # The map
//!
//! The modules follow the path of a fault, top to bottom:
//!
//! ```text
//!   region     the user's handle (handle.rs), its builder (builder.rs), the
//!              hooks for I/O into its memory (io.rs)
//!   foreign    another process's memory, served through the userfaultfd it
//!              hands over (the VM snapshot hand-off): engine (handler threads),
//!              prefetch (queued runs installed ahead), peer (its regions and
//!              bookkeeping), plan (a record made into runs), store (a region's
//!              view of the store), uffd (the adopted descriptor), config,
//!              snapshot (the shared zero-copy snapshot), error
//!   engine     how a fault reaches the runtime: signal (SIGBUS on the faulting
//!              thread), and poll, spin, workers, per-cpu (threaded.rs) over the one
//!              handler loop (handler.rs), which the foreign engine runs too
//!   fault      the shared fault path: region table, resolve, feeds, reports
//!   store      where pages come from (zeros, memory, files)
//!   error      the crate's errors: Error, and StoreError, which it carries
//! ```
//!
//! Below every module: the kernel interface is the `faultline-sys` crate,
//! the only code that calls libc (its errors that this crate's API carries
//! are re-exported in [`error`]).
//!
//! Beside the path: [`policy`] holds pure paging decisions (read-ahead,
//! eviction, run-ahead prediction); [`pool`], [`runahead`] and [`evict`]
//! are the work done off the fault path (frames prepared ahead, pages
//! installed ahead of a stream, pages evicted under a budget), on
//! `background` threads (one stop flag, a waker, join);
//! [`page`], [`residency`] and [`interval`] are the vocabulary and the
//! lock-free structures the fault path reads; [`caps`] probes what the
//! kernel offers; [`testing`] is test support for users' own programs
//! (failing stores, child-process tests with deadlines, huge page pools).
//! `DESIGN.md` has the threading model, the lock order and how to add an
//! engine, a store or a policy. Watchpoints built on the same kernel
//! interface live in the `faultline-watch` crate, I/O into region memory in
//! `faultline-io`.
//!
//! "Seed 000" and the other seed numbers name the research this crate
//! builds on; `DESIGN.md` lists them.

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "faultline supports x86_64 Linux only: the signal engine reads the x86 page-fault error code \
     from the signal context, and the userfaultfd ABI is hard-coded for x86_64"
);

mod background;
pub mod caps;
pub mod engine;
pub mod error;
pub mod evict;
mod fault;
pub mod foreign;
pub mod interval;
pub mod page;
pub mod policy;
pub mod pool;
pub mod region;
pub mod residency;
pub mod runahead;
pub mod store;
pub mod testing;

pub use caps::{capabilities, Capabilities};
pub use engine::{
    Delivery, Engine, EngineConfig, EngineKind, EngineStats, PerCpuEngine, PollEngine,
    SignalEngine, SpinEngine, WorkersEngine,
};
pub use error::{Error, Result};
pub use evict::{EvictionConfig, EvictionStats, ReclaimWatch, SharedBudget};
pub use fault::report::StackWriter;
pub use fault::RegionStats;
/// The shared zero-copy snapshot, where it was before the foreign path
/// got its own folder ([`foreign::snapshot`]).
pub use foreign::snapshot;
pub use foreign::{
    prepare_store, prepare_store_until, DirtySet, FaultKinds, FaultPhases, ForeignEngine,
    ForeignEngineConfig, ForeignError, ForeignOptions, ForeignPeer, ForeignRegionSpec, ForeignUffd,
    HandlerBusy, HandlerStats, HandlerWait, PeerBacking, PeerEvent, PeerStats, PeerTimes,
    PrefetchPlan, ServiceTimes, SharedSnapshot, SnapshotError, Verify, DIRTY_PAGE, HUGE_WINDOW,
    SERVICE_BOUNDS_NS, SERVICE_BUCKETS,
};
pub use page::{MemoryKind, PageSize, ResolveOp};
pub use policy::ReadaheadConfig;
pub use pool::{FramePoolConfig, FramePoolStats};
pub use region::{Region, RegionBuilder, MIN_BUDGET_PAGES};
pub use residency::PageState;
pub use runahead::{RunAheadConfig, RunAheadStats};
pub use store::{
    FileAccess, FileStore, FillRange, MemoryStore, PageStore, StoreError, StoreView, WriteRange,
    ZeroStore,
};
