//! A peer's REMOVE journal: the ranges it dropped, in a memfd the keeper
//! holds, so they outlive the serve that read the events.
//!
//! ```text
//!  offset 0   count    u64  entries written (stored after the entry: Release)
//!  offset 8   full     u64  1: an entry did not fit (the journal is unusable)
//!  offset 16  entries  [start u64, end u64] x CAPACITY  (the peer's addresses)
//! ```
//!
//! One writer: the peer's handler thread (one reader per userfaultfd), in
//! [`ForeignPeer::with_journal`](faultline::ForeignPeer::with_journal)'s
//! hook, before the REMOVE's bookkeeping and before any later event or
//! fault of the peer is acted on. A reader (a serve taking the peer over)
//! reads `count` (Acquire), then the entries below it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use faultline_sys::mem::{self, Mapping};

/// The journal's size: a header and 65 535 ranges.
const BYTES: usize = 1 << 20;
/// Ranges it holds.
const CAPACITY: usize = (BYTES - 16) / 16;

/// A peer's REMOVE journal (see the module docs).
pub struct Journal {
    map: Mapping,
    fd: OwnedFd,
}

impl Journal {
    /// A new, empty journal (a memfd).
    pub fn create() -> Result<Journal, mem::MemError> {
        let fd = mem::memfd("faultline-serve-journal", false)?;
        mem::ftruncate(&fd, BYTES as u64)?;
        Journal::open(fd)
    }

    /// The journal in `fd` (received from the keeper).
    pub fn open(fd: OwnedFd) -> Result<Journal, mem::MemError> {
        let map = Mapping::shared(&fd, BYTES, 0)?;
        Ok(Journal { map, fd })
    }

    /// Its memfd (to hand to the keeper).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < BYTES / 8);
        // SAFETY: word `i` lies inside the mapping (checked above), which
        // is 8-aligned (page-aligned) and lives as long as `self`; the
        // memory is only ever accessed as atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().cast::<u64>().add(i)) }
    }

    /// Appends `[start, end)` (the one writer only, see the module docs).
    pub fn append(&self, start: u64, end: u64) {
        let n = self.word(0).load(Ordering::Relaxed) as usize;
        if n >= CAPACITY {
            self.word(1).store(1, Ordering::Release);
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
        (ranges, self.word(1).load(Ordering::Acquire) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_of_the_memfd_reads_what_the_first_wrote() {
        let a = Journal::create().unwrap();
        a.append(0x1000, 0x3000);
        a.append(0x8000, 0x9000);
        let dup = a.fd().try_clone_to_owned().unwrap();
        drop(a);
        let b = Journal::open(dup).unwrap();
        assert_eq!(
            b.entries(),
            (vec![(0x1000, 0x3000), (0x8000, 0x9000)], false)
        );
        for i in 0..CAPACITY {
            b.append(i as u64, i as u64 + 1);
        }
        assert!(b.entries().1, "the overflow is recorded");
    }
}
