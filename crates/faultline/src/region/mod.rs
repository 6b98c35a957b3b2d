//! Regions: the user's handle on a mapping whose page faults faultline
//! resolves, and the builder that makes one.
//!
//! ```text
//!   builder   RegionBuilder: validate ─► map ─► register ─► publish the
//!             RegionState in the region table ─► start background threads
//!   handle    Region: geometry, state, counters, flush, populate; Drop
//!             stops the threads, writes dirty pages back, retires, unmaps
//!   io        Region's hooks for I/O into its memory (faultline-io)
//! ```
//!
//! The handle knows nothing of the builder; the builder makes a handle
//! (and gives [`Region::builder`]). Nothing else in the library imports
//! this module: a region sits on top of the fault path.
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
//!   file on tmpfs ([`PageStore::page_cache`], e.g. a [`FileStore`] over a
//!   file in `/dev/shm`), the region maps that file privately and
//!   installs its page-cache pages with `UFFDIO_CONTINUE`: no allocation,
//!   no copy, and writes stay private (copy on write), exactly as with the
//!   kernel's `mmap(MAP_PRIVATE)`. [`RegionBuilder::zero_copy`] turns this
//!   off.
//!
//! [`PageStore::page_cache`]: crate::store::PageStore::page_cache
//! [`FileStore`]: crate::store::FileStore

mod builder;
mod handle;
mod io;

pub use builder::{RegionBuilder, MIN_BUDGET_PAGES};
pub use handle::Region;
