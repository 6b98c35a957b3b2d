//! Per-page residency: 2 bits per region page, lock-free.
//!
//! This is VPRI's page-attribute bitmap (seed 003 §4.1): a device-style
//! access checks [`Residency::is_resident`] before touching memory, and the
//! fault path records what it installed. Words hold 32 pages each:
//!
//! ```text
//!  word k:  | p31 | p30 | ... | p1 | p0 |     2 bits per page
//!  00 absent   01 resident read-only   10 resident writable   11 poisoned
//! ```
//!
//! A second bitmap holds one *claim* bit per page: the resolver that sets
//! it owns the fetch of that page, so concurrent faults on one page (the
//! signal engine runs handlers on every faulting thread) fetch the store
//! and install the page exactly once; the losers simply retry the access.
//!
//! Updates are single atomic read-modify-write operations per word; a page
//! query is one load (`O(1)`), a range query one load per 32 pages.
//!
//! A third array, allocated on first use, holds one 32-bit *I/O reference*
//! word per page: the low 16 bits count I/Os in flight on the page (the
//! kernel reads or writes it on behalf of a system call), the high 16 bits
//! count pins ([`Residency::pin`]); either keeps the evictor away. The
//! protocol is Dekker-style (VPRI's "invalidate before unmap"): an I/O
//! takes its references ([`Residency::io_acquire`], SeqCst) *then* checks
//! [`Residency::io_ready`] (state and claim); the evictor takes the claim
//! *then* checks [`Residency::io_busy`] (both behind a SeqCst fence). At
//! least one side sees the other, so no page is zapped under an I/O that
//! found it ready.

use std::ops::Range;
use std::sync::atomic::{
    fence, AtomicU32, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::SeqCst,
};
use std::sync::OnceLock;

/// What the runtime knows about one region page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PageState {
    /// Not mapped; an access faults to the runtime.
    Absent = 0,
    /// Mapped read-only (zero page, or write-protected copy). On anonymous
    /// memory a later write may be upgraded by the kernel without telling
    /// us: "read-only" means "installed by a read".
    ReadOnly = 1,
    /// Mapped writable.
    Writable = 2,
    /// Poisoned after a store error: accesses get SIGBUS, never data.
    Poisoned = 3,
}

impl PageState {
    fn from_bits(b: u64) -> PageState {
        match b & 3 {
            0 => PageState::Absent,
            1 => PageState::ReadOnly,
            2 => PageState::Writable,
            _ => PageState::Poisoned,
        }
    }
}

const LO: u64 = 0x5555_5555_5555_5555;

/// The residency map of one region. See the module docs.
#[derive(Debug)]
pub struct Residency {
    states: Box<[AtomicU64]>,
    claims: Box<[AtomicU64]>,
    io_refs: OnceLock<Box<[AtomicU32]>>,
    pages: usize,
}

/// `n` atomic words, all 0, from zeroed memory (`calloc`: a large one is
/// fresh anonymous memory the kernel fills on first touch), so a map of a
/// huge region costs no time and no resident memory until its words are
/// used; built word by word it touched every page of itself (2 GiB and
/// 1.7 s for the install log of a 1 TiB region).
pub(crate) fn zeroed_words(n: usize) -> Box<[AtomicU64]> {
    const _: () = assert!(
        std::mem::size_of::<AtomicU64>() == std::mem::size_of::<u64>()
            && std::mem::align_of::<AtomicU64>() == std::mem::align_of::<u64>()
    );
    let words: Box<[u64]> = vec![0u64; n].into_boxed_slice();
    // SAFETY: `AtomicU64` has the size, alignment and bit validity of
    // `u64` (checked above), so the allocation is a valid `[AtomicU64]`
    // of the same length, freed with the same layout.
    unsafe { Box::from_raw(Box::into_raw(words) as *mut [AtomicU64]) }
}

impl Residency {
    /// All `pages` absent and unclaimed.
    pub fn new(pages: usize) -> Residency {
        let words = pages.div_ceil(32);
        let cwords = pages.div_ceil(64);
        Residency {
            states: zeroed_words(words),
            claims: zeroed_words(cwords),
            io_refs: OnceLock::new(),
            pages,
        }
    }

    /// Number of pages tracked.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The state of one page: one atomic load.
    #[inline]
    pub fn get(&self, page: usize) -> PageState {
        debug_assert!(page < self.pages);
        let w = self.states[page / 32].load(Acquire);
        PageState::from_bits(w >> ((page % 32) * 2))
    }

    /// Sets one page's state; returns the previous one.
    #[inline]
    pub fn set(&self, page: usize, state: PageState) -> PageState {
        let shift = (page % 32) * 2;
        let prev = self.states[page / 32]
            .fetch_update(AcqRel, Acquire, |w| {
                Some((w & !(3 << shift)) | ((state as u64) << shift))
            })
            .unwrap_or_else(|w| w);
        PageState::from_bits(prev >> shift)
    }

    /// Sets every page in `range` (one RMW per word).
    pub fn set_range(&self, range: Range<usize>, state: PageState) {
        let fill = LO * state as u64;
        for_each_word(range, 32, |word, mask_lo| {
            let mask = mask_lo | (mask_lo << 1);
            let _ = self.states[word]
                .fetch_update(AcqRel, Acquire, |w| Some((w & !mask) | (fill & mask)));
        });
    }

    /// Whether every page of `range` is mapped (read-only or writable).
    pub fn is_resident(&self, range: Range<usize>) -> bool {
        let mut all = true;
        for_each_word(range, 32, |word, mask_lo| {
            if all {
                let w = self.states[word].load(Acquire);
                // 01 and 10 are resident: exactly one of the two bits set.
                let one = (w ^ (w >> 1)) & LO;
                all = one & mask_lo == mask_lo;
            }
        });
        all
    }

    /// Number of pages in `range` in `state`.
    pub fn count(&self, range: Range<usize>, state: PageState) -> usize {
        let mut n = 0;
        for_each_word(range, 32, |word, mask_lo| {
            let w = self.states[word].load(Acquire);
            let lo = w & LO;
            let hi = (w >> 1) & LO;
            let m = match state {
                PageState::Absent => !lo & !hi & LO,
                PageState::ReadOnly => lo & !hi,
                PageState::Writable => !lo & hi,
                PageState::Poisoned => lo & hi,
            };
            n += (m & mask_lo).count_ones() as usize;
        });
        n
    }

    /// Tries to take the fetch claim of `page`; true if we now own it.
    #[inline]
    pub fn try_claim(&self, page: usize) -> bool {
        let bit = 1u64 << (page % 64);
        self.claims[page / 64].fetch_or(bit, AcqRel) & bit == 0
    }

    /// Releases the claims of `range`.
    pub fn release(&self, range: Range<usize>) {
        for_each_word(range, 64, |word, mask| {
            self.claims[word].fetch_and(!mask, AcqRel);
        });
    }

    /// Whether `page` is claimed by some resolver right now.
    pub fn is_claimed(&self, page: usize) -> bool {
        self.claims[page / 64].load(Acquire) & (1 << (page % 64)) != 0
    }

    /// Claims the run of absent, unclaimed pages starting at `first`, up
    /// to `max` pages and the end of `limit`; returns the claimed range
    /// (empty when `first` itself could not be claimed or is not absent).
    pub fn claim_run(&self, first: usize, max: usize, limit: usize) -> Range<usize> {
        let end = (first + max).min(limit).min(self.pages);
        let mut p = first;
        while p < end {
            if self.get(p) != PageState::Absent || !self.try_claim(p) {
                break;
            }
            // Re-check after claiming: a resolver may have installed the
            // page and released its claim between our load and our claim.
            if self.get(p) != PageState::Absent {
                self.release(p..p + 1);
                break;
            }
            p += 1;
        }
        first..p
    }
}

impl Residency {
    fn refs(&self) -> &[AtomicU32] {
        self.io_refs
            .get_or_init(|| (0..self.pages).map(|_| AtomicU32::new(0)).collect())
    }

    /// Takes one I/O reference on every page of `range` (SeqCst), before
    /// the I/O checks [`io_ready`](Self::io_ready). Panics past 65,535
    /// references on one page (a leak).
    pub fn io_acquire(&self, range: Range<usize>) {
        self.add_refs(range, 1);
    }

    /// Drops one I/O reference on every page of `range`.
    pub fn io_release(&self, range: Range<usize>) {
        self.sub_refs(range, 1);
    }

    /// Pins every page of `range`: the evictor leaves it alone until
    /// [`unpin`](Self::unpin) (pins nest).
    pub fn pin(&self, range: Range<usize>) {
        self.add_refs(range, PIN);
    }

    /// Drops one pin on every page of `range`.
    pub fn unpin(&self, range: Range<usize>) {
        self.sub_refs(range, PIN);
    }

    fn add_refs(&self, range: Range<usize>, unit: u32) {
        let refs = self.refs();
        for p in range {
            let prev = refs[p].fetch_add(unit, SeqCst);
            assert!(
                (prev / unit) & 0xffff < 0xffff,
                "I/O reference overflow on page {p}"
            );
        }
    }

    fn sub_refs(&self, range: Range<usize>, unit: u32) {
        let refs = self.refs();
        for p in range {
            let prev = refs[p].fetch_sub(unit, SeqCst);
            debug_assert!(
                (prev / unit) & 0xffff > 0,
                "I/O reference underflow on page {p}"
            );
        }
    }

    /// The addresses of the words [`io_ready`](Self::io_ready) loads for
    /// `page` (its state word and its claim word), for benchmarks that
    /// flush them from the cache (VPRI Table 2's "caching disabled").
    #[doc(hidden)]
    pub fn words_of(&self, page: usize) -> [*const u8; 2] {
        [
            (&self.states[page / 32] as *const AtomicU64).cast(),
            (&self.claims[page / 64] as *const AtomicU64).cast(),
        ]
    }

    /// Starts loading what an I/O's [`io_acquire`](Self::io_acquire) and
    /// [`io_ready`](Self::io_ready) of `range` will read (the state, claim
    /// and I/O reference words of its first and last pages) without
    /// waiting for it. A batch of I/Os prefetches every I/O's words first
    /// and then checks each, so their cache misses overlap instead of
    /// queueing (pipelined lookups, as hash tables batch probes).
    #[inline]
    pub fn prefetch_io(&self, range: Range<usize>) {
        let Some(last) = range.end.checked_sub(1).filter(|&l| l >= range.start) else {
            return;
        };
        if last >= self.pages {
            return;
        }
        let refs = self.io_refs.get();
        for p in [range.start, last] {
            prefetch(&self.states[p / 32]);
            prefetch(&self.claims[p / 64]);
            if let Some(r) = refs {
                prefetch(&r[p]);
            }
        }
    }

    /// Whether an I/O is in flight on `page` (pins aside).
    pub fn io_inflight(&self, page: usize) -> bool {
        fence(SeqCst);
        self.io_refs
            .get()
            .is_some_and(|r| r[page].load(SeqCst) & 0xffff != 0)
    }

    /// Whether `page` is pinned.
    pub fn is_pinned(&self, page: usize) -> bool {
        self.io_refs
            .get()
            .is_some_and(|r| r[page].load(SeqCst) >= PIN)
    }

    /// Whether an I/O (or a pin) holds `page`. The evictor calls it after
    /// taking the page's claim; see the module docs.
    #[inline]
    pub fn io_busy(&self, page: usize) -> bool {
        fence(SeqCst);
        self.io_refs
            .get()
            .is_some_and(|r| r[page].load(SeqCst) != 0)
    }

    /// VPRI's pre-DMA lookup: whether an I/O may touch every page of
    /// `range` without faulting. A device *read* (the kernel reads the
    /// region: `write(2)`, `send`) needs the pages mapped; a device *write*
    /// (`read(2)`, `recv`) needs them writable when `wp_tracked` (budget
    /// regions install pages clean and write-protected: "RO and the DMA is
    /// a write → fault"), else mapped. A claimed page (being installed or
    /// evicted) is never ready. Returns the first page that is not.
    pub fn io_ready(
        &self,
        range: Range<usize>,
        write: bool,
        wp_tracked: bool,
    ) -> Result<(), usize> {
        // SeqCst loads after the submitter's SeqCst reference increment:
        // no fence needed on this side (the evictor's side has one).
        let mut bad = None;
        for_each_word(range.clone(), 32, |word, mask_lo| {
            if bad.is_none() {
                let w = self.states[word].load(SeqCst);
                let ok = if write && wp_tracked {
                    (w >> 1) & !w & LO // 10 only
                } else {
                    (w ^ (w >> 1)) & LO // 01 or 10
                };
                let missing = mask_lo & !ok;
                if missing != 0 {
                    bad = Some(word * 32 + missing.trailing_zeros() as usize / 2);
                }
            }
        });
        if let Some(p) = bad {
            return Err(p);
        }
        for_each_word(range, 64, |word, mask| {
            if bad.is_none() {
                let c = self.claims[word].load(SeqCst) & mask;
                if c != 0 {
                    bad = Some(word * 64 + c.trailing_zeros() as usize);
                }
            }
        });
        bad.map_or(Ok(()), Err)
    }
}

/// A hint to the CPU to start loading `x`'s cache line (no effect on
/// other architectures).
#[inline(always)]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and
    // never faults; `x` is a live reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// One pin in an I/O reference word.
const PIN: u32 = 1 << 16;

/// Calls `f(word, mask)` for each word touched by `range`, where `mask`
/// has the low bit of each slot in range set (`per_word` slots per word;
/// 32 two-bit slots or 64 one-bit slots).
fn for_each_word(range: Range<usize>, per_word: usize, mut f: impl FnMut(usize, u64)) {
    let width = 64 / per_word; // bits per slot
    let slot_mask: u64 = if width == 2 { LO } else { u64::MAX };
    let mut p = range.start;
    while p < range.end {
        let word = p / per_word;
        let first = p % per_word;
        let last = (range.end - word * per_word).min(per_word); // exclusive
        let lo_bit = first * width;
        let hi_bit = last * width; // exclusive
        let mask = if hi_bit - lo_bit == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi_bit - lo_bit)) - 1) << lo_bit
        };
        f(word, mask & slot_mask);
        p = (word + 1) * per_word;
    }
}

/// One bit per region page, atomic: the page-cache map of a shmem region,
/// the pages run-ahead installed.
#[derive(Debug)]
pub(crate) struct PageBits(Box<[AtomicU64]>);

impl PageBits {
    /// `pages` bits, all clear.
    pub fn new(pages: usize) -> PageBits {
        PageBits(zeroed_words(pages.div_ceil(64)))
    }
    /// `pages` bits, all set.
    pub fn full(pages: usize) -> PageBits {
        PageBits(
            (0..pages.div_ceil(64))
                .map(|w| {
                    let left = pages - w * 64;
                    AtomicU64::new(if left >= 64 {
                        u64::MAX
                    } else {
                        (1 << left) - 1
                    })
                })
                .collect(),
        )
    }
    /// Whether `page`'s bit is set.
    #[inline]
    pub fn get(&self, page: usize) -> bool {
        self.0[page / 64].load(Acquire) & (1 << (page % 64)) != 0
    }
    /// Sets `page`'s bit.
    #[inline]
    pub fn set(&self, page: usize) {
        self.0[page / 64].fetch_or(1 << (page % 64), AcqRel);
    }
    /// Clears `page`'s bit.
    #[inline]
    pub fn clear(&self, page: usize) {
        self.0[page / 64].fetch_and(!(1 << (page % 64)), AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STATES: [PageState; 4] = [
        PageState::Absent,
        PageState::ReadOnly,
        PageState::Writable,
        PageState::Poisoned,
    ];

    proptest! {
        #[test]
        fn matches_a_vec_model(pages in 1usize..300, ops in prop::collection::vec((0usize..300, 0usize..80, 0usize..4), 1..50)) {
            let r = Residency::new(pages);
            let mut model = vec![PageState::Absent; pages];
            for (start, len, s) in ops {
                let start = start % pages;
                let end = (start + len).min(pages);
                let st = STATES[s];
                if len % 3 == 0 && start < end {
                    prop_assert_eq!(r.set(start, st), model[start]);
                    model[start] = st;
                } else {
                    r.set_range(start..end, st);
                    for m in &mut model[start..end] { *m = st; }
                }
                let qs = start / 2;
                let qe = (qs + len).min(pages);
                let resident = model[qs..qe].iter().all(|s| matches!(s, PageState::ReadOnly | PageState::Writable));
                prop_assert_eq!(r.is_resident(qs..qe), resident);
                for st in STATES {
                    prop_assert_eq!(r.count(qs..qe, st), model[qs..qe].iter().filter(|&&x| x == st).count());
                }
                for (i, m) in model.iter().enumerate() {
                    prop_assert_eq!(r.get(i), *m);
                }
            }
        }

        #[test]
        fn claims_are_exclusive(pages in 1usize..200, ops in prop::collection::vec((0usize..200, 1usize..70), 1..30)) {
            let r = Residency::new(pages);
            let mut held = vec![false; pages];
            for (first, max) in ops {
                let first = first % pages;
                let run = r.claim_run(first, max, pages);
                for p in run.clone() {
                    prop_assert!(!held[p]);
                    held[p] = true;
                }
                if run.is_empty() { prop_assert!(held[first]); }
                if first % 2 == 0 {
                    r.release(run.clone());
                    for p in run { held[p] = false; }
                }
                for (p, h) in held.iter().enumerate() { prop_assert_eq!(r.is_claimed(p), *h); }
            }
        }
    }

    proptest! {
        #[test]
        fn io_ready_matches_a_model(pages in 1usize..200, sets in prop::collection::vec((0usize..200, 0usize..4), 0..40), claims in prop::collection::vec(0usize..200, 0..5), q in (0usize..200, 1usize..80)) {
            let r = Residency::new(pages);
            let mut model = vec![PageState::Absent; pages];
            for (p, s) in sets { let p = p % pages; r.set(p, STATES[s]); model[p] = STATES[s]; }
            let mut claimed = vec![false; pages];
            for c in claims { let c = c % pages; r.try_claim(c); claimed[c] = true; }
            let start = q.0 % pages;
            let end = (start + q.1).min(pages);
            for (write, wp) in [(false, false), (true, false), (true, true), (false, true)] {
                let ok = |p: usize| !claimed[p] && match model[p] {
                    PageState::Writable => true,
                    PageState::ReadOnly => !(write && wp),
                    _ => false,
                };
                let want = (start..end).find(|&p| !ok(p));
                let got = r.io_ready(start..end, write, wp).err();
                // The first bad page by state, else the first claimed one.
                prop_assert_eq!(got.is_some(), want.is_some());
                if let Some(g) = got { prop_assert!(!ok(g)); }
            }
        }
    }

    #[test]
    fn prefetch_io_takes_any_range() {
        let r = Residency::new(100);
        r.prefetch_io(0..0);
        #[allow(
            clippy::reversed_empty_ranges,
            reason = "a reversed range is what this test hands prefetch_io"
        )]
        r.prefetch_io(5..3);
        r.prefetch_io(99..100);
        r.prefetch_io(90..130);
        r.io_acquire(0..1);
        r.prefetch_io(0..100);
        assert_eq!(r.io_ready(0..1, false, false), Err(0));
    }

    #[test]
    fn io_references_count_and_release() {
        let r = Residency::new(100);
        assert!(!r.io_busy(3));
        r.io_acquire(2..5);
        r.io_acquire(3..4);
        assert!(r.io_busy(3) && r.io_busy(2) && !r.io_busy(5));
        r.io_release(2..5);
        assert!(r.io_busy(3) && !r.io_busy(2));
        r.io_release(3..4);
        assert!(!r.io_busy(3));
        r.pin(7..9);
        assert!(r.io_busy(7) && r.is_pinned(8) && !r.io_inflight(7));
        r.io_acquire(7..8);
        assert!(r.io_inflight(7));
        r.io_release(7..8);
        r.unpin(7..9);
        assert!(!r.io_busy(7) && !r.is_pinned(8));
    }

    #[test]
    fn claim_run_stops_at_resident_pages() {
        let r = Residency::new(100);
        r.set(5, PageState::Writable);
        assert_eq!(r.claim_run(2, 10, 100), 2..5);
        assert_eq!(r.claim_run(5, 10, 100), 5..5);
        assert_eq!(r.claim_run(95, 10, 100), 95..100);
        assert_eq!(r.claim_run(90, 10, 93), 90..93);
    }

    #[test]
    fn concurrent_claims_have_one_winner() {
        let r = std::sync::Arc::new(Residency::new(64));
        let wins: usize = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || (0..64).filter(|&p| r.try_claim(p)).count())
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(wins, 64);
    }
}
