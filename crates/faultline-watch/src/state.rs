//! The watcher's state, in one place so that the writer side
//! (`watcher.rs`) and the signal handlers (`handler/`) both build on it
//! without importing each other:
//!
//! * [`Inner`]: what the handlers read (the page table, the userfaultfd,
//!   `/proc/self/mem`, the callback and the options) and what only the
//!   writer touches, under its mutex ([`Writer`]);
//! * [`Shared`], [`HwWatch`]: what the handlers write (counters, trace
//!   timestamps, debug-register shadows), in arena memory that can never be
//!   watched.
//!
//! [`Inner::protect`], which sets or lifts one page's protection as its
//! tier does it, is async-signal-safe and used by both sides.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use faultline_sys::mem::Prot;
use faultline_sys::uffd::Uffd;
use faultline_sys::Errno;

use crate::hit::Callback;
use crate::hw::HwSlots;
use crate::table::{Arena, PageEntry, Pages, RangeTree, Tier, PAGE};

/// Counters and timestamps the handlers write: lives in the arena.
pub(crate) struct Shared {
    pub(crate) faults: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) false_positives: AtomicU64,
    pub(crate) emulated: AtomicU64,
    pub(crate) single_stepped: AtomicU64,
    pub(crate) interpreted: AtomicU64,
    pub(crate) hw_hits: AtomicU64,
    pub(crate) suppressed: AtomicU64,
    pub(crate) handler_cycles: AtomicU64,
    /// entry, after lookup, after store, handler exit.
    pub(crate) trace: [AtomicU64; 4],
    pub(crate) hw: [HwWatch; HwSlots::MAX],
}

/// One debug-register watch, as the SIGTRAP handler sees it.
pub(crate) struct HwWatch {
    pub(crate) active: AtomicBool,
    pub(crate) addr: AtomicU64,
    pub(crate) len: AtomicU64,
    /// The watched bytes as of the last report, for `before`.
    pub(crate) shadow: AtomicU64,
}

/// State shared with the handlers. Read-only for them except through
/// `shared` and page entries (arena memory).
pub(crate) struct Inner {
    pub(crate) pages: Pages,
    pub(crate) shared: &'static Shared,
    pub(crate) uffd: Uffd,
    pub(crate) mem_fd: OwnedFd,
    pub(crate) callback: Option<Callback>,
    pub(crate) classify: bool,
    pub(crate) trace: bool,
    pub(crate) interpret: bool,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) hw: HwSlots,
    pub(crate) arena: Arena,
}

/// How the pages of one mapping are armed: its range, its tier, the
/// protection to restore and (alias tier) the offset of the writable alias.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Armable {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) tier: Tier,
    pub(crate) prot: Prot,
    pub(crate) alias_delta: u64,
}

/// A watch held by a debug register.
pub(crate) struct HwEntry {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) slot: usize,
}

/// What `watch`/`unwatch` keep under the writer mutex.
pub(crate) struct Writer {
    pub(crate) tree: RangeTree,
    pub(crate) entries: usize,
    /// Mappings we know how to arm: uffd-registered ones (whole VMAs) and
    /// mprotect ones.
    pub(crate) known: Vec<Armable>,
    pub(crate) registered: Vec<(u64, u64)>,
    pub(crate) hw: Vec<HwEntry>,
    pub(crate) enabled: bool,
    pub(crate) exact: bool,
    pub(crate) hardware: bool,
    pub(crate) armed: u64,
}

impl Inner {
    /// Sets (`on`) or lifts the write protection of `e`'s page as its
    /// tier does it. Async-signal-safe; on failure, the call and its errno.
    pub(crate) fn protect(
        &self,
        e: &PageEntry,
        tier: Tier,
        on: bool,
    ) -> Result<(), (&'static str, Errno)> {
        match tier {
            Tier::Uffd | Tier::Alias => self
                .uffd
                // No thread waits on these faults (SIGBUS mode): no wake.
                .writeprotect(e.page, PAGE, on, !on)
                .map_err(|err| ("UFFDIO_WRITEPROTECT", Errno(err.errno()))),
            Tier::Mprotect => {
                let prot = e.prot();
                let prot = if on { prot.without(Prot::WRITE) } else { prot };
                faultline_sys::mem::mprotect(e.page, PAGE as usize, prot)
                    .map_err(|errno| ("mprotect", errno))
            }
            Tier::Off => Ok(()),
        }
    }

    /// `/proc/self/mem`, for the forced writes of the uffd and mprotect
    /// tiers.
    pub(crate) fn mem_raw(&self) -> i32 {
        self.mem_fd.as_raw_fd()
    }
}

/// Reads up to 8 bytes at `addr` as a little-endian integer.
///
/// # Safety
/// `addr..addr+len` must be readable.
pub(crate) unsafe fn read_small(addr: u64, len: usize) -> u64 {
    let mut b = [0u8; 8];
    let n = len.min(8);
    // SAFETY: the caller guarantees the bytes are readable.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), n) };
    u64::from_le_bytes(b)
}
