//! Read-ahead: how many pages one fault resolves.
//!
//! Modelled on the kernel's fault-around plus on-demand read-ahead
//! (`mm/filemap.c`, `mm/readahead.c`), reduced to what a fault handler
//! needs: for a fault at page `p`, which pages to install now.
//!
//! Each fault stream (one per faulting thread in the runtime) remembers
//! where its last window ended (`next`) and that window's length:
//!
//! 1. A fault at `next`, or less than [`STRIDE_SLACK`] pages past it,
//!    continues the stream: the window doubles (up to `max`) and starts at
//!    `next`, filling the pages skipped (threads taking turns through one
//!    run of pages, as a guest's vCPUs do, fault each at the pages its
//!    turn skips to, and the thread ahead faults past the end of a window
//!    before the other reaches it).
//! 2. Any other fault starts the stream over with the *fault-around*
//!    window: the aligned block of `initial` pages holding `p`. With
//!    `initial == 1` an isolated fault installs only its own page.
//!
//! ```text
//!   initial 4, max 16; a thread scanning pages 0, 1, 2, ...
//!   faults at:   0            4                12
//!   installs:   [0 1 2 3]    [4 .. 11]        [12 .. 27]      (4, 8, 16 pages)
//!   a fault at 40 (not 28): [40 41 42 43], the stream starts over
//! ```
//!
//! A fixed fault-around depth `n` is `initial == max == n`: every window
//! is then the aligned block of `n` pages. Windows never pass the end of
//! the region. The runtime keeps one [`Stream`] per thread in lock-free
//! slots (it runs inside the SIGBUS handler); everything here is pure.

use std::ops::Range;

/// How far past the end of a stream's last window a fault still continues
/// it, in pages (the fault at `next + STRIDE_SLACK - 1` does; capped by the
/// largest window). Two threads that take turns through a run of pages,
/// page `i` on thread `i % 2`, and are out of step by more than one fault:
/// the one ahead faults at `next + 1`, never at `next`, and with exact
/// matching every such fault started a new stream (measured with the
/// clustered set of `bench restore`, 2 vCPUs, an isolated window of 1
/// page: 26,213 faults for 26,214 pages, against 10,447 with one vCPU).
pub const STRIDE_SLACK: usize = 4;

/// Read-ahead parameters, in region pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadaheadConfig {
    /// Fault-around: the aligned window a fault that continues no stream
    /// resolves (1 = only the faulting page). Values below 1 mean 1.
    pub initial: usize,
    /// Largest window a sequential stream grows to. Values below
    /// `initial` mean `initial`.
    pub max: usize,
    /// Stream slots: faulting threads share `streams` slots (a thread's
    /// slot is fixed at its first fault), so threads scanning different
    /// parts of a region do not reset each other's windows. At least 1.
    pub streams: usize,
}

impl Default for ReadaheadConfig {
    /// No fault-around on isolated faults, growing to 32 pages (128 KiB
    /// with 4 KiB pages, the kernel's default `read_ahead_kb`), 64 slots.
    fn default() -> Self {
        ReadaheadConfig::adaptive(1, 32)
    }
}

impl ReadaheadConfig {
    /// Fault-around of `initial` pages, growing to `max` on sequential
    /// streams.
    pub fn adaptive(initial: usize, max: usize) -> Self {
        ReadaheadConfig {
            initial,
            max,
            streams: 64,
        }
        .normalized()
    }

    /// A fixed fault-around depth: every fault resolves the aligned block
    /// of `depth` pages holding it (at least 1).
    pub fn fixed(depth: usize) -> Self {
        ReadaheadConfig::adaptive(depth, depth)
    }

    /// One page per fault: read-ahead off.
    pub fn off() -> Self {
        ReadaheadConfig::fixed(1)
    }

    /// The same configuration with every field in its valid range.
    pub fn normalized(self) -> Self {
        let initial = self.initial.max(1);
        ReadaheadConfig {
            initial,
            max: self.max.max(initial),
            streams: self.streams.max(1),
        }
    }

    /// Whether every fault resolves exactly one page.
    pub fn is_off(&self) -> bool {
        self.max <= 1
    }

    /// The pages a fault at `page` of a `pages`-page region resolves,
    /// given its stream's state, and the stream's next state. Always
    /// contains `page`; never longer than `max`; never past `pages`.
    pub fn on_fault(&self, s: Stream, page: usize, pages: usize) -> (Range<usize>, Stream) {
        debug_assert!(page < pages);
        let c = self.normalized();
        let (start, window) = if s.continued_by(page, c.max) {
            let grown = s.window.saturating_mul(2).clamp(c.initial, c.max);
            (s.next, grown.max(page - s.next + 1))
        } else {
            (page - page % c.initial, c.initial)
        };
        let end = start.saturating_add(window).min(pages);
        (start..end, Stream { next: end, window })
    }

    /// The window of a fault at `page` that continues stream `s`
    /// ([`Stream::continued_by`]) when isolated windows are sized elsewhere
    /// ([`IsolatedWindows`](super::IsolatedWindows)): the stream's window
    /// doubled, from 1 page up to `max`, starting at the stream's end.
    pub fn continued(&self, s: Stream, page: usize, pages: usize) -> (Range<usize>, Stream) {
        debug_assert!(page < pages && s.continued_by(page, self.normalized().max));
        let window = s
            .window
            .saturating_mul(2)
            .clamp(1, self.normalized().max)
            .max(page - s.next + 1);
        let end = s.next.saturating_add(window).min(pages);
        (s.next..end, Stream { next: end, window })
    }
}

/// What a fault stream remembers between faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    /// The page right after the stream's last window.
    pub next: usize,
    /// That window's length.
    pub window: usize,
}

impl Stream {
    /// A stream that has seen no fault.
    pub const NEW: Stream = Stream {
        next: usize::MAX,
        window: 0,
    };

    /// Whether a fault at `page` continues this stream: at its end or
    /// less than [`STRIDE_SLACK`] (at most `max`) pages past it.
    pub fn continued_by(&self, page: usize, max: usize) -> bool {
        page >= self.next && page - self.next < STRIDE_SLACK.min(max.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The windows a thread scanning `0..n` in order takes (it faults only
    /// on pages no window installed yet).
    fn scan(c: &ReadaheadConfig, n: usize) -> Vec<Range<usize>> {
        let (mut s, mut page, mut out) = (Stream::NEW, 0, Vec::new());
        while page < n {
            let (w, next) = c.on_fault(s, page, n);
            page = w.end;
            s = next;
            out.push(w);
        }
        out
    }

    #[test]
    fn windows_double_on_a_sequential_scan() {
        let c = ReadaheadConfig::adaptive(4, 16);
        let lens: Vec<usize> = scan(&c, 60).iter().map(|w| w.len()).collect();
        assert_eq!(lens, [4, 8, 16, 16, 16]);
    }

    #[test]
    fn a_random_fault_restarts_with_the_aligned_fault_around_window() {
        let c = ReadaheadConfig::adaptive(4, 16);
        let (_, s) = c.on_fault(Stream::NEW, 0, 100);
        let (w, s) = c.on_fault(s, 4, 100);
        assert_eq!(w, 4..12);
        let (w, _) = c.on_fault(s, 42, 100);
        assert_eq!(w, 40..44);
    }

    #[test]
    fn fixed_depth_is_aligned_fault_around() {
        let c = ReadaheadConfig::fixed(8);
        let mut s = Stream::NEW;
        for page in [3, 8, 17, 16, 99] {
            let (w, next) = c.on_fault(s, page, 100);
            assert_eq!(w.start, page / 8 * 8);
            assert_eq!(w.end, (page / 8 * 8 + 8).min(100));
            s = next;
        }
        assert!(ReadaheadConfig::off().is_off());
        assert_eq!(ReadaheadConfig::off().on_fault(s, 5, 10).0, 5..6);
    }

    proptest! {
        #[test]
        fn every_window_holds_the_fault_and_respects_the_limits(
            initial in 0usize..70, max in 0usize..300, faults in proptest::collection::vec(0usize..5000, 1..200),
            pages in 1usize..5000,
        ) {
            let c = ReadaheadConfig { initial, max, streams: 1 };
            let n = c.normalized();
            let mut s = Stream::NEW;
            for f in faults {
                let page = f % pages;
                let (w, next) = c.on_fault(s, page, pages);
                prop_assert!(w.contains(&page));
                prop_assert!(w.end <= pages);
                prop_assert!(w.len() <= n.max);
                prop_assert!(next.window >= n.initial && next.window <= n.max);
                prop_assert_eq!(next.next, w.end);
                if !s.continued_by(page, n.max) {
                    prop_assert_eq!(w.start % n.initial, 0, "a new stream's window is aligned");
                } else {
                    prop_assert_eq!(w.start, s.next, "a stream goes on from its end");
                }
                s = next;
            }
        }

        #[test]
        fn a_scan_covers_every_page_once_and_grows_geometrically(
            initial in 1usize..40, max in 1usize..400, pages in 1usize..20_000,
        ) {
            let c = ReadaheadConfig::adaptive(initial, max);
            let ws = scan(&c, pages);
            let mut expect = 0;
            for w in &ws {
                prop_assert_eq!(w.start, expect);
                expect = w.end;
            }
            prop_assert_eq!(expect, pages);
            // Windows reach `max` after log2(max / initial) doublings.
            let full = pages / c.max;
            let ramp = (usize::BITS - (c.max / c.initial).leading_zeros()) as usize + 1;
            prop_assert!(ws.len() <= full + ramp + 1, "{} windows for {} pages", ws.len(), pages);
        }
    }
}
