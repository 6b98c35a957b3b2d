//! Isolated windows that pay for themselves: the fault-around window of a
//! fault that continues no stream, sized from the faults that follow it.
//!
//! The kernel's read-ahead marks a page of each window (`PG_readahead`)
//! and grows the next window when that page is touched. A handler cannot
//! see touches of pages it installed, only faults; so the evidence is
//! where later faults land beside earlier windows:
//!
//! 1. Each isolated window of `len` pages is remembered with its
//!    *neighbours*, the `len` pages before and after it. A later fault
//!    there (while the window is among the last [`HORIZON`] remembered)
//!    is a fault a longer window would have saved: a *hit*.
//! 2. Every [`PROBE_EVERY`]th isolated fault is a *probe*: it installs
//!    half the current window (the aligned half holding the fault) and
//!    leaves the other half out as a *marker*. A later fault on the
//!    marker is a fault the current window saves; none says the current
//!    window installs pages nobody asks for.
//! 3. A fault costs about as much as installing `fault_pages` pages
//!    (copy mode: a read, a wake and a return against ~2 us a page
//!    copied; shared mode maps the page cache's pages, a fault is worth
//!    more pages). Hits are counted against the windows made at the
//!    current size: after [`JUDGE`] probes the window halves if
//!    `hits / probes < (size / 2) / fault_pages`; after `3 * JUDGE` full
//!    windows it doubles if `hits / windows > size / fault_pages` (the
//!    `size` pages more save more faults than they cost). A change of
//!    size starts both counts over.
//!
//! ```text
//!   size 16; fault at 37 (isolated): window [32, 48), neighbours
//!   [16, 32) and [48, 64); a later fault at 50: a hit (grow evidence)
//!   probe at 70: window [64, 72), marker [72, 80)
//!   no later fault in [72, 80): the 16-page window would have wasted
//!   those 8 pages (shrink evidence)
//! ```
//!
//! What it cannot see: a neighbour the guest touches long after its
//! window (a dense set touched in random order) is evidence that comes
//! too late, so on such sets the window shrinks below what pays (see
//! RESULTS.md, "Isolated windows that pay for themselves"; serve keeps it
//! opt-in). Everything here is pure; the fault path keeps one
//! [`IsolatedWindows`] per peer region under a lock (`fault/readahead.rs`).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// Isolated windows remembered, waiting for a fault on a neighbour or marker.
pub const HORIZON: usize = 4096;
/// One isolated fault in this many is a probe (half the window).
pub const PROBE_EVERY: u64 = 4;
/// Windows (or probes) judged before the size may change.
pub const JUDGE: u32 = 16;

/// The bounds and the cost model of adaptive isolated windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTuning {
    /// What one fault costs the faulting thread, in pages installed
    /// (at least 1).
    pub fault_pages: usize,
    /// The smallest isolated window, pages (a power of two, at least 1).
    pub min: usize,
    /// The largest isolated window, pages (a power of two, at least
    /// `min`).
    pub max: usize,
}

impl WindowTuning {
    /// Copy mode: a demand fault's read, wake and return (~45 us on this
    /// project's test machine) against ~1.8 us to copy a page: 25 pages.
    pub const COPY: WindowTuning = WindowTuning {
        fault_pages: 25,
        min: 1,
        max: 64,
    };
    /// Shared (zero-copy) mode: `UFFDIO_CONTINUE` maps a page in ~0.6 us,
    /// a fault's read, wake and return cost ~23 us: 40 pages.
    pub const SHARED: WindowTuning = WindowTuning {
        fault_pages: 40,
        min: 1,
        max: 256,
    };

    /// The same tuning with every field in its valid range.
    pub fn normalized(self) -> WindowTuning {
        let pow2 = |n: usize| n.max(1).checked_next_power_of_two().unwrap_or(1 << 20);
        let min = pow2(self.min);
        WindowTuning {
            fault_pages: self.fault_pages.max(1),
            min,
            max: pow2(self.max).max(min),
        }
    }
}

/// One remembered window: is it a probe, was a neighbour or its marker faulted.
#[derive(Debug, Clone, Copy)]
struct Entry {
    probe: bool,
    hit: bool,
}

/// One region's adaptive isolated window (see the module docs).
#[derive(Debug, Clone)]
pub struct IsolatedWindows {
    tuning: WindowTuning,
    size: usize,
    /// The blocks remembered windows wait on (length, first page: the
    /// neighbours or the marker) to the window's number.
    waits: HashMap<(usize, usize), u64>,
    /// Remembered windows by number; their blocks, oldest first in
    /// `order` (at most `horizon`).
    entries: HashMap<u64, Entry>,
    order: VecDeque<(u64, [(usize, usize); 2])>,
    horizon: usize,
    isolated: u64,
    /// (windows made, of them hit) at the current size, full and probes.
    full: (u32, u32),
    probes: (u32, u32),
    /// Times the window doubled.
    pub grows: u64,
    /// Times it halved.
    pub shrinks: u64,
}

impl IsolatedWindows {
    /// Starts at `initial` pages (rounded up to a power of two, within
    /// the tuning's bounds).
    pub fn new(tuning: WindowTuning, initial: usize) -> IsolatedWindows {
        IsolatedWindows::with_horizon(tuning, initial, HORIZON)
    }

    /// [`IsolatedWindows::new`] remembering the last `horizon` windows.
    pub fn with_horizon(tuning: WindowTuning, initial: usize, horizon: usize) -> IsolatedWindows {
        let tuning = tuning.normalized();
        let size = initial
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(tuning.max)
            .clamp(tuning.min, tuning.max);
        IsolatedWindows {
            tuning,
            size,
            waits: HashMap::new(),
            entries: HashMap::new(),
            order: VecDeque::new(),
            horizon: horizon.max(1),
            isolated: 0,
            full: (0, 0),
            probes: (0, 0),
            grows: 0,
            shrinks: 0,
        }
    }

    /// The current isolated window, pages.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A fault at `page` (any fault, before its window is chosen): marks
    /// the remembered windows whose neighbours or marker hold it, and counts the hit if
    /// the window was of the current size (or a probe of it).
    pub fn observe(&mut self, page: usize) {
        let mut len = (self.tuning.min / 2).max(1);
        while len <= self.tuning.max {
            let id = self.waits.get(&(len, page - page % len)).copied();
            if let Some(e) = id.and_then(|id| self.entries.get_mut(&id)) {
                if !e.hit {
                    e.hit = true;
                    if e.probe && len * 2 == self.size {
                        self.probes.1 += 1;
                    } else if !e.probe && len == self.size {
                        self.full.1 += 1;
                    }
                }
            }
            len *= 2;
        }
    }

    /// The window of an isolated fault at `page` of a `pages`-page
    /// region: the aligned block of the current size holding it, or of
    /// half that for a probe; remembered with its neighbours or marker.
    pub fn window(&mut self, page: usize, pages: usize) -> Range<usize> {
        debug_assert!(page < pages);
        self.isolated += 1;
        let probe = self.size > self.tuning.min && self.isolated.is_multiple_of(PROBE_EVERY);
        let len = if probe { self.size / 2 } else { self.size };
        let start = page - page % len;
        // A full window's neighbours on both sides; a probe's the half
        // of the current window it left out.
        let keys = if probe {
            let buddy = ((start / len) ^ 1) * len;
            [(len, buddy), (len, buddy)]
        } else {
            [(len, start.wrapping_sub(len)), (len, start + len)]
        };
        let id = self.isolated;
        self.entries.insert(id, Entry { probe, hit: false });
        for k in keys {
            if k.1 < pages {
                self.waits.insert(k, id);
            }
        }
        self.order.push_back((id, keys));
        if self.order.len() > self.horizon {
            let (old, keys) = self.order.pop_front().expect("not empty");
            self.entries.remove(&old);
            for k in keys {
                if self.waits.get(&k) == Some(&old) {
                    self.waits.remove(&k);
                }
            }
        }
        if probe {
            self.probes.0 += 1;
        } else {
            self.full.0 += 1;
        }
        self.judge();
        start..(start + len).min(pages)
    }

    /// Changes the size when enough windows of the current size say so.
    fn judge(&mut self) {
        let b = self.tuning.fault_pages as u64;
        let size = self.size as u64;
        if self.probes.0 >= JUDGE {
            let (n, hits) = (u64::from(self.probes.0), u64::from(self.probes.1));
            self.probes = (0, 0);
            // hits / n < (size / 2) / b: the half left out is rarely
            // asked for.
            if hits * b < n * (size / 2) {
                self.resize(self.size / 2);
                self.shrinks += 1;
                return;
            }
        }
        if self.full.0 >= JUDGE * (PROBE_EVERY as u32 - 1) {
            let (n, hits) = (u64::from(self.full.0), u64::from(self.full.1));
            self.full = (0, 0);
            // hits / n > size / b: doubling saves more than it costs.
            if self.size < self.tuning.max && hits * b > n * size {
                self.resize(self.size * 2);
                self.grows += 1;
            }
        }
    }

    fn resize(&mut self, size: usize) {
        self.size = size.clamp(self.tuning.min, self.tuning.max);
        self.full = (0, 0);
        self.probes = (0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 1 << 20;

    /// Isolated faults at `faults`, each followed by the faults `then`
    /// gives for its window (touches a window did not install).
    fn run(
        t: &mut IsolatedWindows,
        faults: impl Iterator<Item = usize>,
        then: impl Fn(Range<usize>) -> Vec<usize>,
    ) {
        for p in faults {
            t.observe(p);
            let w = t.window(p, N);
            for q in then(w) {
                t.observe(q);
            }
        }
    }

    #[test]
    fn scattered_faults_shrink_the_window_to_the_minimum() {
        let mut t = IsolatedWindows::new(WindowTuning::COPY, 16);
        // Far apart: no fault ever lands beside a window.
        run(&mut t, (0..4000).map(|i| i * 4096 % N + 7), |_| Vec::new());
        assert_eq!(t.size(), 1, "grows {} shrinks {}", t.grows, t.shrinks);
        assert_eq!(t.grows, 0);
    }

    #[test]
    fn runs_longer_than_the_window_grow_it_to_what_a_fault_is_worth() {
        // Every window is followed by a fault just past it (a run going
        // on): with faults worth 40 pages the window doubles while
        // size < 40 (to 64), never beyond.
        let mut t = IsolatedWindows::new(WindowTuning::SHARED, 16);
        run(&mut t, (0..4000).map(|i| i * 4096 % N), |w| {
            vec![w.end, w.start + 2 * w.len()]
        });
        assert_eq!(t.size(), 64, "grows {} shrinks {}", t.grows, t.shrinks);
        // Copy mode's faults are worth 25 pages: 32 at most.
        let mut t = IsolatedWindows::new(WindowTuning::COPY, 16);
        run(&mut t, (0..4000).map(|i| i * 4096 % N), |w| {
            vec![w.end, w.start + 2 * w.len()]
        });
        assert_eq!(t.size(), 32);
    }

    #[test]
    fn a_probe_whose_marker_is_asked_for_keeps_the_window() {
        // Runs of 16 aligned pages: a probe's left-out half is always
        // faulted, a full window's neighbours never.
        let mut t = IsolatedWindows::new(WindowTuning::COPY, 16);
        run(&mut t, (0..4000).map(|i| i * 4096 % N), |w| {
            if w.len() < 16 {
                vec![w.start / 16 * 16 + (w.start % 16 + 8) % 16]
            } else {
                Vec::new()
            }
        });
        assert_eq!(t.size(), 16, "grows {} shrinks {}", t.grows, t.shrinks);
    }

    #[test]
    fn windows_are_aligned_hold_the_fault_and_stay_in_bounds() {
        let mut t = IsolatedWindows::new(WindowTuning::COPY, 13);
        assert_eq!(t.size(), 16);
        for p in [0, 5, 99, 1000, 1023] {
            let w = t.window(p, 1024);
            assert!(w.contains(&p) && w.end <= 1024);
            assert_eq!(w.start % w.len(), 0);
        }
        let odd = WindowTuning {
            fault_pages: 0,
            min: 3,
            max: 2,
        }
        .normalized();
        assert_eq!((odd.fault_pages, odd.min, odd.max), (1, 4, 4));
    }
}
