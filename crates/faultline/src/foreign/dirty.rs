//! Dirty tracking after restore: which pages a peer has written since we
//! began serving it (what a platform needs to write a diff snapshot), with
//! the peer's own userfaultfd and no change to the VMM.
//!
//! ```text
//!   ForeignPeer::new ── arm ──► UFFDIO_REGISTER MISSING|WP (|MINOR) per region
//!                               UFFDIO_WRITEPROTECT (protect) the whole range
//!   every install (fault window, prefetch, run-ahead)
//!        COPY_MODE_WP / CONTINUE_MODE_WP ─────► page present, write-protected
//!   vCPU writes a protected page ─► WP fault ─► bit set, WRITEPROTECT clear + wake
//!   vCPU writes a missing page ──► MISSING|WRITE fault ─► installed writable, bit set
//!   REMOVE (balloon, MADV_DONTNEED) ─► bits set: those pages read zeros now
//!   DirtySet::of ◄── the bits, as store offsets of 4 KiB pages
//! ```
//!
//! 1. **Arm** ([`arm`], from [`ForeignPeer::new`](super::ForeignPeer::new),
//!    before the engine reads any fault): a registration acts on the mm
//!    the userfaultfd was created in, whoever makes it, and registering a
//!    range again from the same userfaultfd replaces its modes, so each
//!    region is registered MISSING|WP (MISSING|MINOR|WP in shared mode)
//!    through the peer's descriptor. The kernel's answer must allow
//!    `UFFDIO_WRITEPROTECT` (anonymous memory always; shmem and hugetlbfs
//!    when the kernel has uffd-wp PTE markers, which is what
//!    `UFFD_FEATURE_WP_HUGETLBFS_SHMEM` advertises: the ioctl's answer is
//!    the test, not the feature bit the peer chose). Then the whole range
//!    is write-protected once: a page the VMM populated before the hand-off
//!    is protected too (on a fresh restore there is none, and the walk is
//!    over empty page tables). While one of the peer's events is unread
//!    (a REMOVE: it already runs and drops memory) the kernel refuses that
//!    with EAGAIN, and nobody reads the event until the peer is served:
//!    after [`PROTECT_WAIT`] the step is skipped and the caveat kept
//!    ([`ForeignPeer::dirty_caveat`](super::ForeignPeer::dirty_caveat)):
//!    a page the VMM populated itself before the hand-off would not be
//!    tracked (Firecracker populates none: its guest memory is empty until
//!    the handler fills it).
//! 2. **`UFFD_FEATURE_WP_ASYNC`**: the kernel resolves the peer's
//!    write-protect faults itself (it clears the page's uffd-wp bit; the
//!    vCPU never waits for us), so none reaches us. Such a peer is tracked
//!    by reading its page tables: `PAGEMAP_SCAN` of `/proc/PID/pagemap`
//!    (opened at arm time, it keeps reading that address space) lists its
//!    present or swapped pages without the uffd-wp bit (`PAGE_IS_WRITTEN`)
//!    when the set is read. Without the peer's pid, or where the scan
//!    fails, it is refused: never tracked silently wrong.
//! 3. **Installed protected**: the region's `RegionState::written` bits
//!    make the resolve path install every page write-protected (as a
//!    budget region's clean pages), fault-around windows, prefetch and
//!    run-ahead included; only a write fault's own page installed alone
//!    is mapped writable, and noted at once.
//! 4. **First write**: a WP fault sets the page's bit, then clears its
//!    protection and wakes the writer; later writes cost nothing. A
//!    MISSING fault with the write flag installs its window protected and
//!    un-protects the faulting page in the same resolution.
//! 5. **REMOVE** (balloon, `MADV_DONTNEED`): the pages read zeros from
//!    now on, which is not the snapshot's content: they count dirty.
//! 6. **Read** ([`DirtySet::of`]): the bits of every region (with
//!    `WP_ASYNC`, and the written pages the scan finds) as the store
//!    offsets of the memory file's 4 KiB pages (a 2 MiB hugetlb page
//!    written is 512 of them), sorted.
//!
//! No lock: one atomic bit per page in each region (set with `fetch_or`
//! by whichever thread resolves the write), read without stopping the
//! peer (a set read while the peer runs holds every write that was
//! resolved before the read).

use std::ops::Range;

use super::config::ForeignRegionSpec;
use super::error::ForeignError;
use super::uffd::ForeignUffd;
use crate::fault::RegionState;
use crate::residency::PageBits;
use faultline_sys::pagemap::{category, Pagemap};
use faultline_sys::uffd::{feature, ioctl_bit, register_mode, UffdError};
use faultline_sys::Errno;

/// The unit of a dirty set: the memory file's 4 KiB pages.
pub const DIRTY_PAGE: u64 = 4096;

/// How long write-protecting a region is tried again while an event of
/// the peer is pending (EAGAIN).
pub const PROTECT_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// What [`arm`] could not do (the peer is tracked all the same).
pub(super) const UNPROTECTED: &str = "an event of the peer was pending, so the pages present before the hand-off could not be write-protected: a page the VMM populated itself before it would not be tracked";

/// The pages a tracked peer has written (and removed) since it was first
/// served: the store offsets of the memory file's 4 KiB pages, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirtySet {
    /// Store offsets of the dirty pages ([`DIRTY_PAGE`] bytes each),
    /// ascending.
    pub offsets: Vec<u64>,
}

impl DirtySet {
    /// The dirty set of `regions` (each a region's state and its store
    /// offset) now; with `scan` (a `WP_ASYNC` peer's page tables), the
    /// pages written that no fault told us of too.
    pub(super) fn of<'a>(
        regions: impl Iterator<Item = (&'a RegionState, u64)>,
        scan: Option<&Pagemap>,
    ) -> Result<DirtySet, ForeignError> {
        let mut offsets = Vec::new();
        for (state, store_offset) in regions {
            let Some(bits) = &state.written else {
                continue;
            };
            let pages = &state.pages;
            let per = (pages.size().bytes() as u64 / DIRTY_PAGE).max(1);
            let mut push = |p: usize| {
                let at = store_offset + pages.offset(p);
                offsets.extend((0..per).map(|i| at + i * DIRTY_PAGE));
            };
            let mut seen = (0..pages.count()).filter(|&p| bits.get(p)).peekable();
            let scanned = match scan {
                Some(m) => m
                    .scan(
                        pages.base(),
                        pages.end(),
                        category::WRITTEN,
                        category::PRESENT | category::SWAPPED,
                    )
                    .map_err(ForeignError::Pagemap)?,
                None => Vec::new(),
            };
            if scanned.is_empty() {
                seen.for_each(&mut push);
                continue;
            }
            // Merge the bits with the scan's pages, each page once.
            let mut from_scan = scanned
                .into_iter()
                .flat_map(|w| pages.within(w.start, w.end))
                .peekable();
            loop {
                let next = match (seen.peek(), from_scan.peek()) {
                    (Some(&a), Some(&b)) => a.min(b),
                    (Some(&a), None) => a,
                    (None, Some(&b)) => b,
                    (None, None) => break,
                };
                while seen.next_if(|&p| p == next).is_some() {}
                while from_scan.next_if(|&p| p == next).is_some() {}
                push(next);
            }
        }
        offsets.sort_unstable();
        offsets.dedup();
        Ok(DirtySet { offsets })
    }

    /// Number of dirty 4 KiB pages.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether no page is dirty.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
}

/// The bits of a tracked region of `pages` pages (none written yet).
pub(super) fn bits(pages: usize) -> PageBits {
    PageBits::new(pages)
}

/// What [`arm`] set up.
#[derive(Debug, Default)]
pub(super) struct Armed {
    /// The peer's page tables, for a `WP_ASYNC` userfaultfd.
    pub scan: Option<Pagemap>,
    /// What it could not do (see the module docs).
    pub caveat: Option<&'static str>,
}

/// Step 1 of the module docs: registers every region of `specs` with
/// write-protect (and MINOR when `shared`) through the peer's userfaultfd,
/// and write-protects what is present; opens the page tables of a
/// `WP_ASYNC` peer (`pid`). Refuses regions the kernel cannot
/// write-protect, and a `WP_ASYNC` peer whose page tables cannot be read.
pub(super) fn arm(
    uffd: &ForeignUffd,
    specs: &[ForeignRegionSpec],
    shared: bool,
    pid: Option<i32>,
) -> Result<Armed, ForeignError> {
    let mut armed = Armed::default();
    if uffd.features() & feature::WP_ASYNC != 0 {
        let Some(pid) = pid.filter(|&p| p > 0) else {
            return Err(ForeignError::Refused {
                what: "dirty tracking",
                why: "the peer's userfaultfd has UFFD_FEATURE_WP_ASYNC (the kernel un-protects written pages itself, no fault reaches us) and its pid is unknown, so its page tables cannot be read",
            });
        };
        let m = Pagemap::open(pid).map_err(ForeignError::Pagemap)?;
        if let Some(s) = specs.first() {
            // PAGEMAP_SCAN is there (6.7) and answers for this peer.
            m.scan(s.base, s.base + s.len as u64, category::WRITTEN, 0)
                .map_err(ForeignError::Pagemap)?;
        }
        armed.scan = Some(m);
    }
    let mut mode = register_mode::MISSING | register_mode::WP;
    if shared {
        mode |= register_mode::MINOR;
    }
    for (index, s) in specs.iter().enumerate() {
        let ioctls = uffd
            .uffd
            .register(s.base, s.len as u64, mode)
            .map_err(|source| ForeignError::TrackDirty {
                index,
                step: if shared {
                    "UFFDIO_REGISTER MISSING|MINOR|WP"
                } else {
                    "UFFDIO_REGISTER MISSING|WP"
                },
                source,
            })?;
        if ioctls & (1 << ioctl_bit::WRITEPROTECT) == 0 {
            return Err(ForeignError::Refused {
                what: "dirty tracking",
                why: "the kernel does not allow UFFDIO_WRITEPROTECT on the peer's regions (shmem and hugetlbfs need uffd-wp PTE markers)",
            });
        }
        if shared && ioctls & (1 << ioctl_bit::CONTINUE) == 0 {
            return Err(ForeignError::Refused {
                what: "shared (zero-copy) mode",
                why: "the kernel does not allow UFFDIO_CONTINUE on the peer's regions",
            });
        }
        match protect(uffd, s.base, s.len as u64) {
            Ok(()) => {}
            Err(e) if e.is(Errno::EAGAIN) => armed.caveat = Some(UNPROTECTED),
            Err(source) => {
                return Err(ForeignError::TrackDirty {
                    index,
                    step: "UFFDIO_WRITEPROTECT of the pages present",
                    source,
                })
            }
        }
    }
    Ok(armed)
}

/// Write-protects `[start, start + len)` of the peer, trying again while
/// one of its events is pending (EAGAIN).
fn protect(uffd: &ForeignUffd, start: u64, len: u64) -> Result<(), UffdError> {
    let deadline = std::time::Instant::now() + PROTECT_WAIT;
    loop {
        // Protecting takes no DONTWAKE (the kernel refuses the pair with
        // EINVAL); there is nobody to wake anyway.
        match uffd.uffd.writeprotect(start, len, true, false) {
            Err(e) if e.is(Errno::EAGAIN) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            other => return other,
        }
    }
}

/// Step 5: the peer removed `pages` of `state`'s region: they read zeros
/// now, and count dirty.
pub(super) fn note_removed(state: &RegionState, pages: Range<usize>) {
    if let Some(bits) = &state.written {
        pages.for_each(|p| bits.set(p));
    }
}
