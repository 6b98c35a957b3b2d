//! The holes of a read-ahead window, for stores that pay per request
//! ([`PageStore::batched`](crate::store::PageStore::batched)).
//!
//! `resolve` claims the contiguous absent run around a faulting page; for a
//! batched store it also claims the other absent runs of the window (up to
//! [`MAX_HOLES`]), fills the run and every hole with one
//! [`fill_batch`](crate::store::PageStore::fill_batch) into consecutive
//! pieces of the scratch buffer (the run first), and then installs each
//! hole with its own ioctl. A hole whose fill failed is released, never
//! poisoned: only the faulting page's own failure poisons it.

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

use super::RegionState;
use crate::residency::PageState;
use crate::store::{FillRange, StoreError};

/// Most holes gathered besides the faulting run (bounds the stack).
pub(crate) const MAX_HOLES: usize = 15;

/// The claimed holes of one window and which of them were filled.
pub(crate) struct Holes {
    runs: [(usize, usize); MAX_HOLES],
    n: usize,
    filled: u32,
}

impl Holes {
    pub const NONE: Holes = Holes {
        runs: [(0, 0); MAX_HOLES],
        n: 0,
        filled: 0,
    };

    /// Claims the absent pages of `window` outside `run` as up to
    /// [`MAX_HOLES`] runs.
    pub fn claim(r: &RegionState, window: Range<usize>, run: &Range<usize>) -> Holes {
        let mut h = Holes::NONE;
        let mut open = false;
        for p in window.filter(|p| !run.contains(p)) {
            let got = r.residency.get(p) == PageState::Absent && r.residency.try_claim(p);
            let got = got && {
                let still = r.residency.get(p) == PageState::Absent;
                if !still {
                    r.residency.release(p..p + 1);
                }
                still
            };
            if !got {
                open = false;
                continue;
            }
            if open && h.runs[h.n - 1].1 == p {
                h.runs[h.n - 1].1 = p + 1;
            } else if h.n < MAX_HOLES {
                h.runs[h.n] = (p, p + 1);
                h.n += 1;
                open = true;
            } else {
                r.residency.release(p..p + 1);
                break;
            }
        }
        h
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Fills `run` and every hole with one batched store call into
    /// consecutive pieces of `scratch` (the run at 0); returns the run's
    /// result. Holes whose fill failed are released.
    pub fn fill(
        &mut self,
        r: &RegionState,
        run: &Range<usize>,
        scratch: &mut [u8],
    ) -> Result<(), StoreError> {
        let ps = r.pages.size().bytes();
        let mut spans =
            std::iter::once((run.start, run.end)).chain(self.runs[..self.n].iter().copied());
        let mut rest = scratch;
        let mut list: [FillRange<'_>; MAX_HOLES + 1] = std::array::from_fn(|_| {
            let (start, end) = spans.next().unwrap_or((0, 0));
            let (buf, tail) = std::mem::take(&mut rest).split_at_mut((end - start) * ps);
            rest = tail;
            FillRange {
                offset: r.pages.offset(start),
                buf,
            }
        });
        let n = self.n + 1;
        let mut out = [const { Ok(()) }; MAX_HOLES + 1];
        r.store.fill_batch(&mut list[..n], &mut out[..n]);
        let [first, holes @ ..] = out;
        if first.is_ok() {
            // Installed from the scratch (`copy_run`'s prefilled source,
            // which counts nothing itself).
            r.stats.store_fills.fetch_add(run.len() as u64, Relaxed);
        }
        for (i, res) in holes[..self.n].iter().enumerate() {
            if res.is_ok() {
                self.filled |= 1 << i;
                r.stats.store_fills.fetch_add(self.len(i) as u64, Relaxed);
            } else {
                let (s, e) = self.runs[i];
                r.residency.release(s..e);
            }
        }
        first
    }

    fn len(&self, i: usize) -> usize {
        self.runs[i].1 - self.runs[i].0
    }

    /// The filled holes with their byte offset in the scratch buffer
    /// (after the run of `run_pages` pages).
    pub fn filled(
        &self,
        run_pages: usize,
        ps: usize,
    ) -> impl Iterator<Item = (Range<usize>, usize)> + '_ {
        let mut at = run_pages * ps;
        (0..self.n).filter_map(move |i| {
            let (s, e) = self.runs[i];
            let here = at;
            at += (e - s) * ps;
            (self.filled & (1 << i) != 0).then_some((s..e, here))
        })
    }
}
