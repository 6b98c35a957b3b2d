//! The crate's error types: [`Error`], one variant per thing that can go
//! wrong when setting up or changing a region, each keeping its cause; and
//! [`StoreError`], a page store's failure, which `Error` and the fault path
//! carry (it lives here, below `store/`, so the crate's error needs nothing
//! above it).

use std::borrow::Cow;
use std::sync::Arc;

use crate::interval::IntervalError;

/// The kernel interface's errors that this crate's errors carry, named
/// here so callers can match on them without depending on `faultline-sys`.
pub use faultline_sys::{mem::MemError, uffd::UffdError, Errno};

/// Errors of region and engine setup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An address that must be aligned was not.
    #[error("address {addr:#x} is not aligned to {align} bytes")]
    Unaligned { addr: u64, align: usize },
    /// A zero-length region or range.
    #[error("length must be non-zero")]
    ZeroLength,
    /// A length that is not a multiple of the region's page size.
    #[error("length {len} is not a multiple of the page size {page_size}")]
    LengthNotPageMultiple { len: usize, page_size: usize },
    /// A page size that is not a non-zero multiple of 4 KiB (or, for
    /// hugetlb, not 2 MiB).
    #[error("page size {page_size} is invalid: {reason}")]
    BadPageSize {
        page_size: usize,
        reason: &'static str,
    },
    /// A memory budget too small to run: one instruction may need up to
    /// `min` pages resident at once (a copy's source and destination, each
    /// across a page boundary); with fewer, eviction takes each page for
    /// the other and the access never finishes.
    #[error("a budget of {pages} page(s) is less than {min}: one instruction may need that many resident at once (a copy's source and destination, each across a page boundary), and with fewer it would wait for ever")]
    BudgetTooSmall { pages: usize, min: usize },
    /// A range outside the region.
    #[error(
        "range [{start:#x}, {end:#x}) is outside the region [{region_start:#x}, {region_end:#x})"
    )]
    OutOfRange {
        start: u64,
        end: u64,
        region_start: u64,
        region_end: u64,
    },
    /// The new region overlaps one that exists.
    #[error("region overlaps an existing region: {0}")]
    Overlap(#[source] IntervalError),
    /// The store holds fewer bytes than the region and does not zero-fill.
    #[error("store {store} holds {store_len} bytes, fewer than the region's {region_len}")]
    StoreTooShort {
        store: String,
        store_len: u64,
        region_len: u64,
    },
    /// The `signal` engine runs the store inside a SIGBUS handler.
    #[error("store {store} is not signal-safe (it may allocate, lock or block: a network client is not async-signal-safe); the signal engine runs stores inside the SIGBUS handler (use the poll, spin or workers engine)")]
    StoreNotSignalSafe { store: String },
    /// A kernel feature the request needs is missing.
    #[error("{what} is not available: {reason}")]
    Unsupported { what: &'static str, reason: String },
    /// A userfaultfd call failed.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A memory-management call failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// Another I/O error (thread creation, eventfd).
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A store call made on the caller's thread (populate, write-back) failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A store failure. Constructing one never allocates (except
/// `Failed` with an owned reason, which signal-safe stores must not use),
/// so signal-safe stores can report errors from the SIGBUS handler.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A system call failed.
    #[error("{op} of {what} at offset {offset:#x} failed: {errno}")]
    Io {
        /// What was read (a file path, a device name).
        what: Arc<str>,
        /// The call that failed (`pread`, `pwrite`).
        op: &'static str,
        /// Byte offset in the store.
        offset: u64,
        /// The errno.
        errno: Errno,
    },
    /// The store cannot take writes.
    #[error("store {what} is read-only (write-back at offset {offset:#x})")]
    ReadOnly { what: Arc<str>, offset: u64 },
    /// A remote store's request for one key failed (after its retries).
    #[error("{what}: key {key} (offset {offset:#x}): {cause}")]
    Remote {
        /// The store ("redis unix:///run/redis.sock").
        what: Arc<str>,
        /// The key that was asked for.
        key: Arc<str>,
        /// Byte offset in the store.
        offset: u64,
        /// Why ("connection refused after 12 tries over 2s", "missing").
        cause: Cow<'static, str>,
    },
    /// Anything else, with a reason.
    #[error("store failed at offset {offset:#x}: {reason}")]
    Failed {
        /// Byte offset in the store.
        offset: u64,
        /// Why.
        reason: Cow<'static, str>,
    },
}

impl StoreError {
    /// The store offset the error concerns.
    pub fn offset(&self) -> u64 {
        match self {
            StoreError::Io { offset, .. }
            | StoreError::ReadOnly { offset, .. }
            | StoreError::Remote { offset, .. }
            | StoreError::Failed { offset, .. } => *offset,
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
