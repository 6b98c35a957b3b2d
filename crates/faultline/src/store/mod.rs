//! Backing stores: where a region's pages come from and go back to.
//!
//! A [`PageStore`] fills a buffer with the bytes at an offset and writes
//! pages back. Stores that may run inside the SIGBUS handler (the `signal`
//! engine resolves faults on the faulting thread) say so through
//! [`PageStore::signal_safe`]: such a store must not allocate, take locks
//! an application thread may hold, or call anything that is not
//! async-signal-safe. `pread`, `memcpy` and atomics are fine.
//!
//! Stores that hold their data in memory offer a zero-copy
//! [`PageStore::view`]: the runtime then resolves with `UFFDIO_COPY`
//! straight from the store's memory, skipping the intermediate buffer.
//! A store whose data is a file in the page cache of tmpfs/shmem (a file in
//! `/dev/shm`) offers [`PageStore::page_cache`]: a region may then map the
//! file itself and install its pages with `UFFDIO_CONTINUE`, copying
//! nothing at all.
//!
//! A store that pays per request (a network store: one round trip per
//! call) says so with [`PageStore::batched`] and fills many ranges in one
//! call ([`PageStore::fill_batch`], default: a loop over `fill`). The fault
//! path then gathers every absent hole of a read-ahead window (and the
//! run-ahead populator its predicted windows) into one batched fill, and
//! installs each contiguous sub-run with its own ioctl. Each range has its
//! own result, so a neighbour's failure never becomes the faulting page's.

mod file;
mod memory;
mod view;
mod zero;

pub use file::{FileAccess, FileStore};
pub use memory::MemoryStore;
pub use view::StoreView;
pub use zero::ZeroStore;

use std::os::fd::BorrowedFd;

pub use crate::error::StoreError;

/// How a store treats a region longer than its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Bytes past the end read as zeros (a file shorter than its region).
    ZeroFill,
    /// A region longer than the store is refused at creation
    /// ([`crate::Error::StoreTooShort`]).
    Refuse,
}

/// A backing store. See the module docs.
pub trait PageStore: Send + Sync + 'static {
    /// Short description for messages ("file /data/graph.bin", "memory").
    fn describe(&self) -> &str;

    /// Bytes of data the store holds; `None` for a store without an end
    /// (zeros).
    fn len(&self) -> Option<u64>;

    /// Whether [`len`](Self::len) is `Some(0)`.
    fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// How a region longer than the store is treated.
    fn tail(&self) -> Tail {
        Tail::ZeroFill
    }

    /// Fills `buf` with the bytes at `offset`; bytes past the end of the
    /// store are zeros (for [`Tail::ZeroFill`] stores).
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Fills every range of `ranges`, each with its own result: `out[i]`
    /// is set for `ranges[i]` (the slices have the same length). A store
    /// that pays per request does all of them in one round trip. The
    /// default loops over [`fill`](Self::fill). Signal-safe stores must
    /// keep this allocation-free too.
    fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
        for (range, res) in ranges.iter_mut().zip(out.iter_mut()) {
            *res = self.fill(range.offset, range.buf);
        }
    }

    /// Whether a call costs a round trip, so the runtime should gather
    /// the holes of a window into one [`fill_batch`](Self::fill_batch)
    /// rather than fill only the contiguous run around a fault. `false`
    /// (the default) for local stores.
    fn batched(&self) -> bool {
        false
    }

    /// Writes `data` back at `offset`.
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError>;

    /// Whether [`write_back`](Self::write_back) can succeed at all: `false`
    /// for a store that refuses every write (a file it could open only
    /// read-only), so that a region meant to write back can be refused
    /// when it is made rather than at its first flush.
    fn writable(&self) -> bool {
        true
    }

    /// Writes every range back, each with its own result (`out[i]` for
    /// `ranges[i]`, same lengths). A store that pays per request (a
    /// [`batched`](Self::batched) one) does all of them in one round
    /// trip; `Region::flush` hands it its dirty pages in batches. The
    /// default loops over [`write_back`](Self::write_back).
    fn write_back_batch(&self, ranges: &[WriteRange<'_>], out: &mut [Result<(), StoreError>]) {
        for (range, res) in ranges.iter().zip(out.iter_mut()) {
            *res = self.write_back(range.offset, range.data);
        }
    }

    /// A zero-copy view of `len` bytes at `offset`, if the store holds them
    /// in memory that stays mapped while the store lives ([`StoreView`]:
    /// an address, not a `&[u8]`, since the bytes may change meanwhile).
    fn view(&self, _offset: u64, _len: usize) -> Option<StoreView<'_>> {
        None
    }

    /// The store's bytes as a file in the page cache of tmpfs/shmem, which
    /// a region may map privately and install with `UFFDIO_CONTINUE` (zero
    /// copy; see [`crate::RegionBuilder::zero_copy`]). `None` (the default)
    /// for every other store.
    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        None
    }

    /// A hint that `len` bytes at `offset` will be read soon: a store
    /// that can start reading them in the background (a file: the page
    /// cache's read-ahead) does. The default does nothing.
    fn will_need(&self, _offset: u64, _len: usize) {}

    /// Makes `len` bytes at `offset` ready to be copied from without
    /// waiting or faulting: a store with a zero-copy view maps them into
    /// its page tables now (a file: `MADV_POPULATE_READ`, which reads what
    /// is not cached yet). Blocking; run it ahead of time, off the fault
    /// path. The default does nothing.
    fn populate(&self, _offset: u64, _len: usize) {}

    /// Whether every page reads as zeros (lets the runtime use
    /// `UFFDIO_ZEROPAGE` and skip copies).
    fn is_zero(&self) -> bool {
        false
    }

    /// Whether `fill`, `view` and `describe` may be called from a signal
    /// handler (see the module docs). Defaults to `false`.
    fn signal_safe(&self) -> bool {
        false
    }
}

/// One range of a [`PageStore::fill_batch`]: `buf.len()` bytes at
/// `offset`.
#[derive(Debug)]
pub struct FillRange<'a> {
    /// Byte offset in the store.
    pub offset: u64,
    /// Where the bytes go.
    pub buf: &'a mut [u8],
}

/// One range of a [`PageStore::write_back_batch`]: `data` at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct WriteRange<'a> {
    /// Byte offset in the store.
    pub offset: u64,
    /// The bytes.
    pub data: &'a [u8],
}

/// A store's data as a tmpfs/shmem file: `len` bytes of `fd` from
/// `offset` (page aligned). See [`PageStore::page_cache`].
#[derive(Debug, Clone, Copy)]
pub struct PageCacheFile<'a> {
    /// The file.
    pub fd: BorrowedFd<'a>,
    /// Byte offset of the store's offset 0 in the file.
    pub offset: u64,
    /// Bytes of the file from `offset`.
    pub len: u64,
}
