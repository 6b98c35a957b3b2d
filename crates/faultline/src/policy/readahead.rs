//! Sequential-stream detection and read-ahead window sizing.
//!
//! Modelled on the kernel's on-demand read-ahead (`mm/readahead.c`), reduced
//! to what a fault handler needs: for a fault at page `p`, which pages to
//! fetch now.
//!
//! How it works:
//!
//! 1. The detector keeps a small table of streams, each the last window it
//!    fetched (`start..end`) and its size.
//! 2. A fault at `p` with `start < p <= end` continues that stream: `p == end`
//!    is the page right after the window, `p < end` a page of the window that
//!    was not fetched or already evicted. The window doubles (up to `max`)
//!    and `p..p + window` is fetched.
//! 3. Any other fault starts a new stream with the initial window, replacing
//!    the least recently used stream. With `initial == 1` an isolated fault
//!    fetches only its own page: the window collapses on random access.
//!
//! ```text
//!   faults:  0        1      3          7                 15
//!   fetch:  [0] [1 2] [3 4 5 6] [7 8 9 10 11 12 13 14] [15 ...]   initial 1
//! ```
//!
//! Several interleaved sequential streams (one per thread, say) are each
//! recognised as long as there are at most `streams` of them. Unlike the
//! kernel there is no asynchronous marker: fetching happens on the fault.
//! Backward streams are not detected. A fixed fault-around depth `n` is
//! `initial == max == n`.

use std::ops::Range;

/// Read-ahead parameters, in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadaheadConfig {
    /// Window of a new stream (pages fetched on an isolated fault, including
    /// the faulting page). Values below 1 are treated as 1.
    pub initial: usize,
    /// Largest window. Values below `initial` are treated as `initial`.
    pub max: usize,
    /// Number of concurrent streams tracked. Values below 1 are treated as 1.
    pub streams: usize,
}

impl Default for ReadaheadConfig {
    /// No read-ahead on isolated faults, growing to 32 pages (128 KiB with
    /// 4 KiB pages, the kernel's default `read_ahead_kb`), 8 streams.
    fn default() -> Self {
        Self {
            initial: 1,
            max: 32,
            streams: 8,
        }
    }
}

impl ReadaheadConfig {
    /// A fixed fault-around depth: every fault fetches `depth` pages
    /// (at least 1) starting at the faulting page.
    pub fn fixed(depth: usize) -> Self {
        Self {
            initial: depth,
            max: depth,
            streams: 1,
        }
    }
}

/// Counters kept by [`Readahead`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadaheadStats {
    /// Faults that continued a known stream.
    pub sequential: u64,
    /// Faults that started a new stream.
    pub random: u64,
    /// Pages requested in total (sum of returned range lengths).
    pub pages: u64,
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    start: usize,
    end: usize,
    window: usize,
    last_used: u64,
}

/// Sequential-stream detector deciding how many pages to fetch per fault.
#[derive(Debug, Clone)]
pub struct Readahead {
    initial: usize,
    max: usize,
    capacity: usize,
    region_pages: usize,
    streams: Vec<Stream>,
    tick: u64,
    stats: ReadaheadStats,
}

impl Readahead {
    /// A detector for a region of `region_pages` pages; returned ranges never
    /// extend past it.
    pub fn new(config: ReadaheadConfig, region_pages: usize) -> Self {
        let initial = config.initial.max(1);
        let capacity = config.streams.max(1);
        Self {
            initial,
            max: config.max.max(initial),
            capacity,
            region_pages,
            streams: Vec::with_capacity(capacity),
            tick: 0,
            stats: ReadaheadStats::default(),
        }
    }

    /// The effective largest window.
    pub fn max_window(&self) -> usize {
        self.max
    }

    /// Counters so far.
    pub fn stats(&self) -> ReadaheadStats {
        self.stats
    }

    /// Forgets all streams (e.g. after the region was discarded).
    pub fn reset(&mut self) {
        self.streams.clear();
    }

    /// A fault at `page`: returns the pages to fetch, `page..page + w` with
    /// `1 <= w <= max`, clipped to the region. Empty if `page` is outside
    /// the region.
    pub fn on_fault(&mut self, page: usize) -> Range<usize> {
        if page >= self.region_pages {
            return page..page;
        }
        self.tick += 1;
        let found = self
            .streams
            .iter()
            .position(|s| s.start < page && page <= s.end);
        let window = match found {
            Some(i) => {
                self.stats.sequential += 1;
                let w = self.streams[i].window.saturating_mul(2).min(self.max);
                (i, w)
            }
            None => {
                self.stats.random += 1;
                let i = if self.streams.len() < self.capacity {
                    self.streams.push(Stream {
                        start: 0,
                        end: 0,
                        window: 0,
                        last_used: 0,
                    });
                    self.streams.len() - 1
                } else {
                    // Least recently used stream; the table is small.
                    let mut lru = 0;
                    for (i, s) in self.streams.iter().enumerate() {
                        if s.last_used < self.streams[lru].last_used {
                            lru = i;
                        }
                    }
                    lru
                };
                (i, self.initial)
            }
        };
        let (i, w) = window;
        let end = page.saturating_add(w).min(self.region_pages);
        self.streams[i] = Stream {
            start: page,
            end,
            window: w,
            last_used: self.tick,
        };
        self.stats.pages += (end - page) as u64;
        page..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pages fetched when scanning `0..n` sequentially, touching only pages
    /// not already fetched.
    fn scan(ra: &mut Readahead, n: usize) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut next = 0;
        while next < n {
            let r = ra.on_fault(next);
            next = r.end;
            out.push(r);
        }
        out
    }

    #[test]
    fn doubles_on_sequential_then_caps() {
        let mut ra = Readahead::new(
            ReadaheadConfig {
                initial: 1,
                max: 8,
                streams: 2,
            },
            100,
        );
        let lens: Vec<usize> = scan(&mut ra, 100).iter().map(|r| r.len()).collect();
        assert_eq!(&lens[..6], &[1, 2, 4, 8, 8, 8]);
        assert_eq!(lens.iter().sum::<usize>(), 100);
    }

    #[test]
    fn random_access_collapses() {
        let mut ra = Readahead::new(ReadaheadConfig::default(), 1 << 20);
        scan(&mut ra, 200);
        for p in [5000, 90_000, 12, 777_777] {
            assert_eq!(ra.on_fault(p), p..p + 1);
        }
        assert!(ra.stats().random >= 4);
    }

    #[test]
    fn interleaved_streams_are_tracked() {
        let mut ra = Readahead::new(ReadaheadConfig::default(), 1 << 20);
        let (mut a, mut b) = (0, 500_000);
        let mut last = (0, 0);
        for _ in 0..10 {
            let ra_a = ra.on_fault(a);
            let ra_b = ra.on_fault(b);
            a = ra_a.end;
            b = ra_b.end;
            last = (ra_a.len(), ra_b.len());
        }
        assert_eq!(last, (32, 32));
    }

    #[test]
    fn fixed_depth_and_region_end() {
        let mut ra = Readahead::new(ReadaheadConfig::fixed(4), 10);
        assert_eq!(ra.on_fault(0), 0..4);
        assert_eq!(ra.on_fault(4), 4..8);
        assert_eq!(ra.on_fault(8), 8..10);
        assert_eq!(ra.on_fault(10), 10..10);
        let mut zero = Readahead::new(ReadaheadConfig::fixed(0), 10);
        assert_eq!(zero.on_fault(3), 3..4);
    }

    proptest! {
        #[test]
        fn windows_stay_in_bounds(
            faults in proptest::collection::vec(0usize..2000, 0..300),
            initial in 0usize..8,
            max in 0usize..64,
            streams in 0usize..6,
            region in 1usize..1500,
        ) {
            let cfg = ReadaheadConfig { initial, max, streams };
            let mut ra = Readahead::new(cfg, region);
            for p in faults {
                let r = ra.on_fault(p);
                if p >= region {
                    prop_assert!(r.is_empty());
                } else {
                    prop_assert_eq!(r.start, p);
                    prop_assert!(r.end <= region);
                    prop_assert!(!r.is_empty());
                    prop_assert!(r.len() <= ra.max_window());
                }
            }
        }

        #[test]
        fn sequential_windows_grow(initial in 1usize..8, max in 1usize..128, n in 1usize..5000) {
            let mut ra = Readahead::new(ReadaheadConfig { initial, max, streams: 1 }, n);
            let ranges = scan(&mut ra, n);
            // Contiguous cover of 0..n, windows non-decreasing except the
            // final one clipped by the region end.
            let mut next = 0;
            for (i, r) in ranges.iter().enumerate() {
                prop_assert_eq!(r.start, next);
                next = r.end;
                if i + 2 < ranges.len() {
                    prop_assert!(ranges[i + 1].len() >= r.len());
                }
            }
            prop_assert_eq!(next, n);
            let cap = max.max(initial);
            if ranges.len() > 1 + cap.ilog2() as usize + 1 {
                prop_assert_eq!(ranges[ranges.len() - 2].len(), cap);
            }
        }
    }
}
