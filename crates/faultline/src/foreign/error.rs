//! Why a foreign region, peer or engine could not be set up: one enum for
//! the whole peer path, each variant named after the step or the check
//! that failed, keeping its cause. (The shared snapshot has its own,
//! [`SnapshotError`](super::snapshot::SnapshotError).)

use faultline_sys::uffd::UffdError;

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
    /// The handshake's page size of a region is not its mapping's (a
    /// hugetlb region declared with 4 KiB pages: every install would fail
    /// with EINVAL, the VM killed at its first fault).
    #[error(
        "region {index}: the handshake says {said}-byte pages, the peer's mapping at {addr:#x} has {mapped}-byte pages"
    )]
    PageSizeMismatch {
        /// Region index.
        index: usize,
        /// Its base address.
        addr: u64,
        /// The page size the handshake gave.
        said: u64,
        /// The page size of the peer's mapping there.
        mapped: u64,
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
        source: UffdError,
    },
    /// The peer cannot be handed back to the kernel
    /// ([`super::ForeignPeer::hand_back`]).
    #[error("the peer cannot be handed back to the kernel: {0}")]
    NoHandBack(&'static str),
    /// Handing a region back to the kernel (unregistering it through the
    /// peer's userfaultfd) failed.
    #[error("region {index}: unregistering it through the peer's userfaultfd: {source}")]
    Unregister {
        /// Region index.
        index: usize,
        /// The error.
        #[source]
        source: UffdError,
    },
    /// Arming dirty tracking on a region failed: registering it with
    /// write-protect through the peer's userfaultfd, or write-protecting
    /// the pages already present.
    #[error("region {index}: dirty tracking: {step} through the peer's userfaultfd: {source}")]
    TrackDirty {
        /// Region index.
        index: usize,
        /// The step (`UFFDIO_REGISTER MISSING|WP`, ...).
        step: &'static str,
        /// The error.
        #[source]
        source: UffdError,
    },
    /// Reading the peer's page tables (`/proc/PID/pagemap`,
    /// `PAGEMAP_SCAN`) for dirty tracking failed.
    #[error("dirty tracking: reading the peer's page tables: {0}")]
    Pagemap(#[source] faultline_sys::mem::MemError),
    /// Waking the peer's threads blocked on a range failed.
    #[error("waking the peer's faulting threads (UFFDIO_WAKE): {0}")]
    Wake(#[source] UffdError),
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
