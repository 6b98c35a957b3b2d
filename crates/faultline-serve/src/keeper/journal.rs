//! A peer's journal: the ranges it dropped (REMOVE) and, when it records
//! (`--record`), the pages its record logged so far, in a memfd the keeper
//! holds, so they outlive the serve that read the events.
//!
//! ```text
//!  offset 0        count    u64  REMOVE entries written (stored after the entry: Release)
//!  offset 8        flags    u64  bit 0: an entry did not fit (the journal is unusable);
//!                                 bit 1: the peer's writes are tracked (--track-dirty)
//!  offset 16       entries  [start u64, end u64] x CAPACITY  (the peer's addresses)
//!  offset 1 MiB-48 identity u64 x 6  the memory file it is served from: its size,
//!                                 fingerprint, device, inode, mtime (ns), and a
//!                                 spare word (all 0: not said; the last three 0:
//!                                 no file, a remote store)
//!  offset 1 MiB    rcount   u64  record entries written (Release), when the memfd
//!  offset 1 MiB+8  rfull    u64    is longer than 1 MiB: the peer records
//!  offset 1 MiB+16 records  [store offset u64, first touch ns u64] x (the rest / 16)
//! ```
//!
//! One writer per section: the peer's handler thread (one reader per
//! userfaultfd), in [`ForeignPeer::with_journal`](faultline::ForeignPeer::with_journal)'s
//! hook, before the REMOVE's bookkeeping and before any later event or
//! fault of the peer is acted on; the record's entries in
//! [`ForeignPeer::with_record_journal`](faultline::ForeignPeer::with_record_journal)'s,
//! under the record log's lock, before the fault is resolved. A reader (a
//! serve taking the peer over) reads a count (Acquire), then the entries
//! below it. The memfd is sparse: a record section sized for every page
//! of a large VM costs only the pages it logged.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use faultline_sys::mem::{self, Mapping};

/// The REMOVE section's size: a header and 65 535 ranges.
const BYTES: usize = 1 << 20;
/// Ranges it holds (the header before them, the identity after).
const CAPACITY: usize = (BYTES - 16 - 48) / 16;
/// The identity's first word.
const IDENTITY: usize = (BYTES - 48) / 8;

/// The memory file a peer is served from, as its journal names it: the
/// store's size and fingerprint ([`crate::record::Identity`]) and, for a
/// file, its device, inode and modification time (`[0; 3]` for a store
/// that is no file).
pub type Served = [u64; 5];
/// The record section's first word.
const RECORD: usize = BYTES / 8;
/// Bit 0 of the flags word: an entry did not fit.
const FULL: u64 = 1;
/// Bit 1: the peer's writes are tracked.
const TRACKS_DIRTY: u64 = 2;

/// A peer's journal (see the module docs).
pub struct Journal {
    map: Mapping,
    fd: OwnedFd,
    /// Its bytes (the memfd's size).
    len: usize,
}

impl Journal {
    /// A new, empty journal (a memfd), with room for `record_pages`
    /// record entries (0: the peer does not record).
    pub fn create(record_pages: usize) -> Result<Journal, mem::MemError> {
        let fd = mem::memfd("faultline-serve-journal", false)?;
        let len = match record_pages {
            0 => BYTES,
            n => BYTES + 16 + n * 16,
        };
        mem::ftruncate(&fd, len as u64)?;
        Journal::open(fd)
    }

    /// Notes that the peer's writes are tracked (`--track-dirty`): a serve
    /// taking it over tracks it on.
    pub fn set_tracks_dirty(&self) {
        self.word(1).fetch_or(TRACKS_DIRTY, Ordering::Release);
    }

    /// Notes the memory file the peer is served from ([`Served`]), so a
    /// serve taking it over from another file refuses to.
    pub fn set_identity(&self, id: Served) {
        for (i, w) in id.iter().enumerate().skip(1) {
            self.word(IDENTITY + i).store(*w, Ordering::Relaxed);
        }
        // The size last: a reader that sees it sees the rest.
        self.word(IDENTITY).store(id[0], Ordering::Release);
    }

    /// The memory file the peer is served from (`None`: not said).
    pub fn identity(&self) -> Option<Served> {
        let mut id = [self.word(IDENTITY).load(Ordering::Acquire), 0, 0, 0, 0];
        for (i, w) in id.iter_mut().enumerate().skip(1) {
            *w = self.word(IDENTITY + i).load(Ordering::Relaxed);
        }
        (id != [0; 5]).then_some(id)
    }

    /// Whether the peer's writes are tracked.
    pub fn tracks_dirty(&self) -> bool {
        self.word(1).load(Ordering::Acquire) & TRACKS_DIRTY != 0
    }

    /// The journal in `fd` (received from the keeper): its size says
    /// whether it has a record section.
    pub fn open(fd: OwnedFd) -> Result<Journal, mem::MemError> {
        let file = std::fs::File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| mem::MemError {
                op: "fstat of the journal",
                source: e,
            })?
            .len() as usize;
        let fd = OwnedFd::from(file);
        if len < BYTES || (len > BYTES && len < BYTES + 16) {
            return Err(mem::MemError {
                op: "the journal's size",
                source: std::io::Error::from(std::io::ErrorKind::InvalidData),
            });
        }
        let map = Mapping::shared(&fd, len, 0)?;
        Ok(Journal { map, fd, len })
    }

    /// Whether the peer records (the journal has a record section).
    pub fn records(&self) -> bool {
        self.len > BYTES
    }

    /// Record entries the journal holds.
    fn record_capacity(&self) -> usize {
        self.len.saturating_sub(BYTES + 16) / 16
    }

    /// Appends record entry (store offset `off`, first touch `ns`) (the
    /// one writer only, see the module docs); nothing without a record
    /// section.
    pub fn append_record(&self, off: u64, ns: u64) {
        if !self.records() {
            return;
        }
        let n = self.word(RECORD).load(Ordering::Relaxed) as usize;
        if n >= self.record_capacity() {
            self.word(RECORD + 1).store(1, Ordering::Release);
            return;
        }
        self.word(RECORD + 2 + 2 * n).store(off, Ordering::Relaxed);
        self.word(RECORD + 3 + 2 * n).store(ns, Ordering::Relaxed);
        self.word(RECORD).store(n as u64 + 1, Ordering::Release);
    }

    /// The record entries written, and whether one did not fit.
    pub fn record_entries(&self) -> (Vec<(u64, u64)>, bool) {
        if !self.records() {
            return (Vec::new(), false);
        }
        let n = (self.word(RECORD).load(Ordering::Acquire) as usize).min(self.record_capacity());
        let entries = (0..n)
            .map(|i| {
                (
                    self.word(RECORD + 2 + 2 * i).load(Ordering::Relaxed),
                    self.word(RECORD + 3 + 2 * i).load(Ordering::Relaxed),
                )
            })
            .collect();
        (entries, self.word(RECORD + 1).load(Ordering::Acquire) != 0)
    }

    /// Its memfd (to hand to the keeper).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len / 8);
        // SAFETY: word `i` lies inside the mapping (checked above), which
        // is 8-aligned (page-aligned) and lives as long as `self`; the
        // memory is only ever accessed as atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().cast::<u64>().add(i)) }
    }

    /// Appends `[start, end)` (the one writer only, see the module docs).
    pub fn append(&self, start: u64, end: u64) {
        let n = self.word(0).load(Ordering::Relaxed) as usize;
        if n >= CAPACITY {
            self.word(1).fetch_or(FULL, Ordering::Release);
            return;
        }
        self.word(2 + 2 * n).store(start, Ordering::Relaxed);
        self.word(3 + 2 * n).store(end, Ordering::Relaxed);
        self.word(0).store(n as u64 + 1, Ordering::Release);
    }

    /// The ranges written, and whether one did not fit.
    pub fn entries(&self) -> (Vec<(u64, u64)>, bool) {
        let n = (self.word(0).load(Ordering::Acquire) as usize).min(CAPACITY);
        let ranges = (0..n)
            .map(|i| {
                (
                    self.word(2 + 2 * i).load(Ordering::Relaxed),
                    self.word(3 + 2 * i).load(Ordering::Relaxed),
                )
            })
            .collect();
        (ranges, self.word(1).load(Ordering::Acquire) & FULL != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_of_the_memfd_reads_what_the_first_wrote() {
        let a = Journal::create(0).unwrap();
        assert!(!a.records());
        a.append_record(1, 2);
        assert_eq!(a.record_entries(), (vec![], false));
        a.append(0x1000, 0x3000);
        a.append(0x8000, 0x9000);
        let dup = a.fd().try_clone_to_owned().unwrap();
        drop(a);
        let b = Journal::open(dup).unwrap();
        assert_eq!(
            b.entries(),
            (vec![(0x1000, 0x3000), (0x8000, 0x9000)], false)
        );
        assert!(!b.tracks_dirty());
        assert_eq!(b.identity(), None);
        b.set_identity([1 << 20, 0xfeed, 3, 4, 5]);
        b.set_tracks_dirty();
        assert!(b.tracks_dirty());
        assert!(!b.entries().1, "tracking is not an overflow");
        for i in 0..CAPACITY {
            b.append(i as u64, i as u64 + 1);
        }
        assert!(b.entries().1, "the overflow is recorded");
        assert!(b.tracks_dirty());
        assert_eq!(
            b.identity(),
            Some([1 << 20, 0xfeed, 3, 4, 5]),
            "a full journal keeps it"
        );
    }

    #[test]
    fn a_record_section_outlives_its_writer_and_says_when_it_is_full() {
        let a = Journal::create(3).unwrap();
        assert!(a.records());
        a.append(0x1000, 0x2000);
        a.append_record(0x5000, 11);
        a.append_record(0x1000, 12);
        let b = Journal::open(a.fd().try_clone_to_owned().unwrap()).unwrap();
        drop(a);
        assert_eq!(b.entries(), (vec![(0x1000, 0x2000)], false));
        assert_eq!(
            b.record_entries(),
            (vec![(0x5000, 11), (0x1000, 12)], false)
        );
        b.append_record(0x2000, 13);
        b.append_record(0x3000, 14);
        let (rec, full) = b.record_entries();
        assert_eq!(rec.len(), 3);
        assert!(full, "the 4th entry did not fit");
    }
}
