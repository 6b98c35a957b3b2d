//! Stream prediction for run-ahead population (seed 004's "run ahead of the
//! fault").
//!
//! The runtime tells the predictor about each fault it resolves (one per
//! fault-around window), and whether the fault *follows* installed memory
//! (the page before its isolated window is resident: the stream goes on
//! where the last window, its own or the populator's, ended):
//!
//! * a fault after an earlier one that follows, or that is at most an
//!   isolated window past it: a sequential stream (heap growth, a scan):
//!   predict the read-ahead windows right after the current one, up to the
//!   budget;
//! * two consecutive faults at the same larger distance that do not
//!   follow: a strided stream (`a[::k]`): predict an isolated window at
//!   each of the next stride points, up to the budget. (Judged by the
//!   read-ahead window instead, a stride shorter than it counted as a scan
//!   and the populator installed every page between the points: twice the
//!   memory and slower than no run-ahead, found by a user audit.)
//!
//! Anything else (random faults, direction changes) predicts nothing, so a
//! random workload wastes no memory. Pure code: no syscalls.

use std::ops::Range;

/// Predicts windows to populate ahead of a stream of faults.
#[derive(Debug, Clone)]
pub struct StreamPredictor {
    /// Pages a sequential prediction installs per window.
    window: usize,
    /// Pages an isolated fault installs: a strided prediction's window.
    isolated: usize,
    budget: usize,
    last: Option<usize>,
    delta: Option<usize>,
}

impl StreamPredictor {
    /// `window`: pages a stream's fault installs (the region's largest
    /// read-ahead window); `isolated`: pages an isolated fault installs;
    /// `budget`: most pages predicted ahead of the faulting page. Windows
    /// are at most the budget (a budget smaller than the read-ahead
    /// window still predicts).
    pub fn new(window: usize, isolated: usize, budget: usize) -> StreamPredictor {
        let cap = budget.max(1);
        StreamPredictor {
            window: window.clamp(1, cap),
            isolated: isolated.clamp(1, cap),
            budget,
            last: None,
            delta: None,
        }
    }

    /// Whether a fault at `page` follows installed memory, given what is
    /// resident: the page before its isolated window.
    pub fn follows(&self, page: usize, resident: impl Fn(usize) -> bool) -> bool {
        let block = page / self.isolated * self.isolated;
        block > 0 && resident(block - 1)
    }

    /// A fault at `page` (of `limit` pages), which `follows` installed
    /// memory or not: the windows to populate now, ascending, each inside
    /// `0..limit`, in total at most `budget` pages.
    pub fn on_fault(&mut self, page: usize, limit: usize, follows: bool) -> Vec<Range<usize>> {
        let delta = self
            .last
            .and_then(|l| page.checked_sub(l))
            .filter(|&d| d > 0);
        let confirmed = delta.is_some() && delta == self.delta;
        let sequential = delta.is_some_and(|d| follows || d <= self.isolated);
        self.last = Some(page);
        self.delta = delta;
        let mut out = Vec::new();
        let mut left = self.budget;
        if sequential {
            // The window after the faulting one, then onwards.
            let w = self.window;
            let mut start = (page / w + 1) * w;
            while left >= w && start < limit {
                let end = (start + w).min(limit);
                out.push(start..end);
                left -= end - start;
                start = end;
            }
        } else if confirmed {
            let (d, w) = (delta.expect("confirmed"), self.isolated);
            let mut k = 1;
            while left >= w {
                let start = (page + k * d) / w * w;
                if start >= limit {
                    break;
                }
                let end = (start + w).min(limit);
                if out.last().is_none_or(|l: &Range<usize>| l.end <= start) {
                    out.push(start..end);
                    left -= end - start;
                }
                k += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sequential_predicts_the_next_windows() {
        let mut p = StreamPredictor::new(16, 16, 64);
        assert!(
            p.on_fault(0, 1000, false).is_empty(),
            "one fault is no evidence"
        );
        assert_eq!(
            p.on_fault(16, 1000, true),
            vec![32..48, 48..64, 64..80, 80..96]
        );
        assert_eq!(
            p.on_fault(990, 1000, false),
            Vec::<Range<usize>>::new(),
            "a jump breaks the stream"
        );
        // A fault where the populator's windows ended follows them, however
        // far it is from the last.
        let mut p = StreamPredictor::new(16, 16, 64);
        p.on_fault(0, 1000, false);
        assert_eq!(
            p.on_fault(400, 1000, true),
            vec![416..432, 432..448, 448..464, 464..480]
        );
    }

    #[test]
    fn a_stride_shorter_than_the_read_ahead_window_is_a_stride_not_a_scan() {
        // a[::k] with k 32 pages, isolated windows of 16: the stride points
        // only, never the pages between them.
        let mut p = StreamPredictor::new(256, 16, 1024);
        assert!(p.on_fault(0, 100_000, false).is_empty());
        assert!(p.on_fault(32, 100_000, false).is_empty(), "one distance");
        let out = p.on_fault(64, 100_000, false);
        assert_eq!(out[..3], [96..112, 128..144, 160..176]);
        assert!(
            out.iter().all(|w| w.len() == 16 && w.start % 32 == 0),
            "{out:?}"
        );
    }

    #[test]
    fn a_budget_smaller_than_the_window_still_predicts() {
        let mut p = StreamPredictor::new(256, 16, 64);
        p.on_fault(0, 1000, false);
        assert_eq!(p.on_fault(16, 1000, true), vec![64..128]);
    }

    #[test]
    fn strides_need_two_equal_distances() {
        let mut p = StreamPredictor::new(4, 4, 8);
        assert!(p.on_fault(0, 1000, false).is_empty());
        assert!(
            p.on_fault(100, 1000, false).is_empty(),
            "one distance is not a stride yet"
        );
        assert_eq!(p.on_fault(200, 1000, false), vec![300..304, 400..404]);
        assert!(p.on_fault(50, 1000, false).is_empty(), "backwards: nothing");
    }

    proptest! {
        #[test]
        fn predictions_stay_in_bounds_and_budget(
            window in 1usize..64, isolated in 1usize..64, budget in 0usize..512,
            limit in 1usize..5000,
            faults in prop::collection::vec((0usize..5000, any::<bool>()), 1..50),
        ) {
            let mut p = StreamPredictor::new(window, isolated, budget);
            let window = window.clamp(1, budget.max(1));
            for (f, follows) in faults {
                let f = f % limit;
                let out = p.on_fault(f, limit, follows);
                let total: usize = out.iter().map(|r| r.len()).sum();
                prop_assert!(total <= budget);
                for (i, r) in out.iter().enumerate() {
                    prop_assert!(r.start < r.end && r.end <= limit);
                    prop_assert!(r.start > f / window * window || r.start >= f, "ahead of the fault");
                    if i > 0 { prop_assert!(out[i - 1].end <= r.start); }
                }
            }
        }
    }
}
