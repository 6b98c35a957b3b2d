//! Stream prediction for run-ahead population (seed 004's "run ahead of the
//! fault").
//!
//! The runtime tells the predictor about each fault it resolves (one per
//! fault-around window). Two consecutive faults with the same positive
//! distance confirm a stream:
//!
//! * distance <= window: a sequential stream (heap growth, a scan): predict
//!   the windows right after the current one, up to the budget;
//! * distance > window: a strided stream: predict the next windows at that
//!   stride, up to the budget.
//!
//! Anything else (random faults, direction changes) predicts nothing, so a
//! random workload wastes no memory. Pure code: no syscalls.

use std::ops::Range;

/// Predicts windows to populate ahead of a stream of faults.
#[derive(Debug, Clone)]
pub struct StreamPredictor {
    window: usize,
    budget: usize,
    last: Option<usize>,
    delta: Option<usize>,
}

impl StreamPredictor {
    /// `window`: pages one fault installs (the region's fault-around);
    /// `budget`: most pages predicted ahead of the faulting page.
    pub fn new(window: usize, budget: usize) -> StreamPredictor {
        StreamPredictor {
            window: window.max(1),
            budget,
            last: None,
            delta: None,
        }
    }

    /// A fault at `page` (of `limit` pages): the windows to populate now,
    /// ascending, each inside `0..limit`, in total at most `budget` pages.
    pub fn on_fault(&mut self, page: usize, limit: usize) -> Vec<Range<usize>> {
        let w = self.window;
        let delta = self
            .last
            .and_then(|l| page.checked_sub(l))
            .filter(|&d| d > 0);
        let confirmed = delta.is_some() && delta == self.delta;
        let sequential = delta.is_some_and(|d| d <= w);
        self.last = Some(page);
        self.delta = delta;
        let mut out = Vec::new();
        let mut left = self.budget;
        if sequential {
            // The window after the faulting one, then onwards.
            let mut start = (page / w + 1) * w;
            while left >= w && start < limit {
                let end = (start + w).min(limit);
                out.push(start..end);
                left -= end - start;
                start = end;
            }
        } else if confirmed {
            let d = delta.expect("confirmed");
            let mut k = 1;
            while left >= w {
                let start = (page + k * d) / w * w;
                if start >= limit {
                    break;
                }
                let end = (start + w).min(limit);
                out.push(start..end);
                left -= end - start;
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
        let mut p = StreamPredictor::new(16, 64);
        assert!(p.on_fault(0, 1000).is_empty(), "one fault is no evidence");
        assert_eq!(p.on_fault(16, 1000), vec![32..48, 48..64, 64..80, 80..96]);
        assert_eq!(
            p.on_fault(990, 1000),
            Vec::<Range<usize>>::new(),
            "a jump breaks the stream"
        );
    }

    #[test]
    fn strides_need_two_equal_distances() {
        let mut p = StreamPredictor::new(4, 8);
        assert!(p.on_fault(0, 1000).is_empty());
        assert!(
            p.on_fault(100, 1000).is_empty(),
            "one distance is not a stride yet"
        );
        assert_eq!(p.on_fault(200, 1000), vec![300..304, 400..404]);
        assert!(p.on_fault(50, 1000).is_empty(), "backwards: nothing");
    }

    proptest! {
        #[test]
        fn predictions_stay_in_bounds_and_budget(
            window in 1usize..64, budget in 0usize..512, limit in 1usize..5000,
            faults in prop::collection::vec(0usize..5000, 1..50),
        ) {
            let mut p = StreamPredictor::new(window, budget);
            for f in faults {
                let f = f % limit;
                let out = p.on_fault(f, limit);
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
