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
//! *peer's* address, looked up in the peer's own regions (not in the
//! process-wide region table), and the one handler loop
//! (`engine/handler.rs`) reads its messages.
//!
//! # The map
//!
//! From the top (what a caller starts) down:
//!
//! ```text
//!   engine     ForeignEngine: handler threads (one reader per peer uffd),
//!              the peer's Serve of the handler loop, PeerEvent reports
//!   prefetch   installing queued runs ahead of faults: the peer's handler
//!              thread between polls, helper threads beside it
//!   peer       ForeignPeer: its regions, their lookup, what a fault and a
//!              REMOVE change before and beside the resolve path; its
//!              counters (PeerStats) and milestones (PeerTimes)
//!   service    FaultKinds, ServiceTimes: faults by kind, their service
//!              times, demand pages (what live metrics read)
//!   phases     FaultPhases: TSC stamps of a peer's last N faults along
//!              the handler's path (where the time goes)
//!   dirty      dirty tracking: regions registered WP through the peer's
//!              uffd, pages installed protected, first writes noted
//!              (DirtySet)
//!   plan       PrefetchPlan (a record made into runs once, for any number
//!              of peers), the per-peer queue, prepare_store
//!   store      RegionStore: the store at a region's offset, REMOVE'd pages
//!              reading zeros
//!   uffd       ForeignUffd: the adopted descriptor, its features read back
//!              from fdinfo, the MINOR registration of shared mode
//!   config     ForeignRegionSpec, ForeignOptions, ForeignEngineConfig
//!   snapshot   SharedSnapshot: the tmpfs copy of a store that shared-mode
//!              peers map MAP_PRIVATE (zero copy), and its checks
//!   error      ForeignError
//! ```
//!
//! # What carries over, what is refused
//! Fault-around/read-ahead, run-ahead, the residency map, statistics and
//! prefetch work on foreign memory. Refused with [`ForeignError::Refused`]:
//! a resident budget with eviction (evicting means `MADV_DONTNEED` on the
//! pages, which only the peer can do to its own mm), the page-cache
//! zero-copy mode of local regions (it maps the store's file into the
//! region, and we cannot map anything into the peer; [`ForeignOptions::shared`]
//! is its foreign form), and the `signal` engine (the faults happen on the
//! peer's threads, which never run our signal handler). Page sizes: 4 KiB
//! (anonymous memory) and 2 MiB (hugetlb).
//!
//! # The peer's handshake
//! `UFFDIO_API` can be done once per userfaultfd, and the peer did it: we
//! read the features it chose ([`ForeignUffd::features`]) and work with
//! them.
//! * With `UFFD_FEATURE_EVENT_REMOVE` (Firecracker asks for it, and only
//!   it) the peer's `MADV_DONTNEED` (its balloon) reaches us as a REMOVE
//!   event: the residency map forgets the pages, and later faults there
//!   are served **zeros**, never the store's data again.
//! * Without it, a dropped page is invisible until it faults again: a fault
//!   on a page the map records as present is taken as "dropped behind our
//!   back" and the page is installed again, from the store (we cannot know
//!   it should read zeros).
//! * While a REMOVE is unread every resolve ioctl returns `EAGAIN`: the
//!   fault is deferred with bounded backoff and retried after the event.
//!
//! # Shared (zero-copy) mode
//! Copy mode allocates and copies every page it installs (`UFFDIO_COPY`).
//! A peer that maps its guest memory `MAP_PRIVATE` from a [`SharedSnapshot`]
//! (one page cache for every clone) and registers it MISSING|MINOR is
//! served with `UFFDIO_CONTINUE` ([`ForeignOptions::shared`]): a minor
//! fault maps the page-cache page read-only into the peer, no store read,
//! no allocation, no copy; the peer's first write copies it in the kernel
//! (private COW), so writes stay private and never reach the file. A page
//! the peer removed reads zeros (`UFFDIO_COPY` of zeros installs a private
//! anonymous page in a `MAP_PRIVATE` vma); a MISSING fault (a hole in the
//! snapshot) is copied from the store.
//!
//! # Record and prefetch
//! A peer built with [`ForeignOptions::record`] logs the store offset of
//! every page in the order it first faulted ([`ForeignPeer::take_record`]).
//! [`ForeignPeer::prefetch`] queues such a set as runs in that order (the
//! pages the peer needs first go first; holes are never bridged), and the
//! engine installs them between faults and on helper threads
//! ([`ForeignEngineConfig::prefetch_helpers`]); [`prepare_store`] reads and
//! maps the set's store ranges before any peer connects. Pages outside the
//! set are served on demand.

mod config;
mod dirty;
mod engine;
mod error;
mod peer;
mod phases;
mod plan;
mod prefetch;
mod service;
pub mod snapshot;
mod store;
mod uffd;

pub use config::{
    ForeignEngineConfig, ForeignOptions, ForeignRegionSpec, HandlerWait, GATE_PIECE, HUGE_WINDOW,
    PREFETCH_CHUNK,
};
pub use dirty::{DirtySet, DIRTY_PAGE};
pub use engine::{ForeignEngine, HandlerBusy, HandlerStats};
pub use error::ForeignError;
pub use peer::{ForeignPeer, PeerEvent, PeerStats, PeerTimes, RecordJournal, RemoveJournal};
pub use phases::FaultPhases;
pub use plan::{prepare_store, prepare_store_until, PrefetchPlan};
pub use service::{FaultKinds, ServiceTimes, SERVICE_BOUNDS_NS, SERVICE_BUCKETS};
pub use snapshot::{PeerBacking, Populated, SharedSnapshot, SnapshotError, Verify};
pub use uffd::ForeignUffd;
