//! Read-ahead streams, lock-free so the SIGBUS handler can use them.
//!
//! The algorithm is the pure [`ReadaheadConfig::on_fault`]; this file only
//! keeps each stream's [`Stream`] in an atomic slot, found one of two ways:
//!
//! 1. **By thread** ([`Streams::new`], local regions of the signal engine,
//!    whose faults are resolved on the faulting thread): a thread gets its
//!    slot at its first fault (a const-initialised thread-local index,
//!    safe to read in a signal handler) and keeps it: threads scanning
//!    different parts of a region do not reset each other's windows.
//!    Threads that share a slot (more threads than slots) race benignly: a
//!    window may start over.
//! 2. **By address** ([`Streams::by_address`], a peer's regions and local
//!    regions of the handler-thread engines): one handler thread reads
//!    the faults of all the application's (or the peer's) threads, and
//!    `workers` spreads one thread's over several handlers, so the
//!    reading thread says nothing of the faulting one. A fault continues
//!    the stream whose window ended at its page, or a few pages before it
//!    ([`STRIDE_SLACK`](crate::policy::STRIDE_SLACK); any slot); a fault
//!    that continues none takes the next slot round-robin, as the kernel's
//!    read-ahead tells streams apart by where they are, not by who reads.
//!
//!    ```text
//!      vCPU 0 sweeps 0.., vCPU 1 sweeps 4096..; one handler reads both
//!      fault 0     no stream ends at 0     slot a: [0, 16)     next 16
//!      fault 4096  none ends at 4096       slot b: [4096, 4112) next 4112
//!      fault 16    slot a ends at 16       slot a: [16, 48)    next 48
//!      fault 4112  slot b ends at 4112     slot b: [4112, 4144) ...
//!    ```
//!
//! 3. **Tuned** ([`Streams::tuned`], a peer's regions with adaptive
//!    isolated windows): as by address, but a fault that continues no
//!    stream takes the window [`IsolatedWindows`] sizes from where the
//!    earlier faults landed, and a stream grows from that window's length
//!    (one lock per fault: no signal handler runs this).
//!
//! A slot packs the stream into one word, so it is read and written with
//! one atomic each:
//!
//! ```text
//!   63            44 43                         0
//!   | window (20)   | next page (44; all ones = none) |
//! ```

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::policy::{IsolatedWindows, ReadaheadConfig, ReadaheadStream as Stream, WindowTuning};

const NEXT_BITS: u32 = 44;
const NEXT_NONE: u64 = (1 << NEXT_BITS) - 1;
/// The largest window a slot can hold (windows are capped to it).
pub(crate) const MAX_WINDOW: usize = (1 << (64 - NEXT_BITS)) - 1;

thread_local! {
    /// This thread's stream slot (no destructor: safe in a signal handler).
    static SLOT: Cell<u32> = const { Cell::new(u32::MAX) };
}
static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);

fn pack(s: Stream) -> u64 {
    let next = if s.next as u64 >= NEXT_NONE {
        NEXT_NONE
    } else {
        s.next as u64
    };
    ((s.window.min(MAX_WINDOW) as u64) << NEXT_BITS) | next
}

fn unpack(v: u64) -> Stream {
    let next = v & NEXT_NONE;
    Stream {
        next: if next == NEXT_NONE {
            usize::MAX
        } else {
            next as usize
        },
        window: (v >> NEXT_BITS) as usize,
    }
}

/// A region's read-ahead: its configuration and one slot per stream.
#[derive(Debug)]
pub(crate) struct Streams {
    config: ReadaheadConfig,
    slots: Box<[AtomicU64]>,
    /// Streams found by where they end, not by thread (see the module
    /// docs); `victim` is the next slot a new stream takes.
    by_address: bool,
    victim: AtomicU32,
    /// Adaptive isolated windows ([`Streams::tuned`]).
    tuner: Option<Mutex<IsolatedWindows>>,
}

impl Streams {
    pub fn new(config: ReadaheadConfig) -> Streams {
        let mut config = config.normalized();
        config.max = config.max.min(MAX_WINDOW);
        config.initial = config.initial.min(config.max);
        // A fixed depth keeps no state.
        let n = if config.initial == config.max {
            0
        } else {
            config.streams
        };
        Streams {
            config,
            slots: (0..n).map(|_| AtomicU64::new(pack(Stream::NEW))).collect(),
            by_address: false,
            victim: AtomicU32::new(0),
            tuner: None,
        }
    }

    /// Streams told apart by where they are, whose isolated windows adapt
    /// (see the module docs): they start at the configuration's
    /// `initial` and stay within `tuning`'s bounds and its `max`.
    pub fn tuned(config: ReadaheadConfig, tuning: WindowTuning) -> Streams {
        let s = Streams::by_address(config);
        let c = s.config;
        let mut tuning = tuning.normalized();
        // A power of two no larger than the cap.
        let cap = 1usize << (usize::BITS - 1 - c.max.leading_zeros());
        tuning.max = tuning.max.min(cap);
        tuning.min = tuning.min.min(tuning.max);
        Streams {
            slots: (0..c.streams)
                .map(|_| AtomicU64::new(pack(Stream::NEW)))
                .collect(),
            tuner: Some(Mutex::new(IsolatedWindows::new(tuning, c.initial))),
            ..s
        }
    }

    /// The adaptive isolated window now, and how often it doubled and
    /// halved (`None`: not [`Streams::tuned`]).
    pub fn isolated(&self) -> Option<(usize, u64, u64)> {
        let t = self.tuner.as_ref()?.lock().expect("isolated windows");
        Some((t.size(), t.grows, t.shrinks))
    }

    /// [`Streams::window`] of tuned streams.
    fn tuned_window(
        &self,
        tuner: &Mutex<IsolatedWindows>,
        page: usize,
        pages: usize,
    ) -> Range<usize> {
        let mut t = tuner.lock().expect("isolated windows");
        t.observe(page);
        let (w, next, slot) = match self
            .slots
            .iter()
            .find(|s| unpack(s.load(Relaxed)).continued_by(page, self.config.max))
        {
            Some(slot) => {
                let (w, next) = self
                    .config
                    .continued(unpack(slot.load(Relaxed)), page, pages);
                (w, next, slot)
            }
            None => {
                let w = t.window(page, pages);
                let i = self.victim.fetch_add(1, Relaxed) as usize;
                let next = Stream {
                    next: w.end,
                    window: w.len(),
                };
                (w, next, &self.slots[i % self.slots.len()])
            }
        };
        slot.store(pack(next), Relaxed);
        w
    }

    /// Streams told apart by where they are (a handler reading the faults
    /// of many threads, see the module docs).
    pub fn by_address(config: ReadaheadConfig) -> Streams {
        Streams {
            by_address: true,
            ..Streams::new(config)
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> ReadaheadConfig {
        self.config
    }

    /// The pages a fault at `page` of a `pages`-page region resolves; the
    /// calling thread's stream records it. Async-signal-safe.
    pub fn window(&self, page: usize, pages: usize) -> Range<usize> {
        if let Some(t) = &self.tuner {
            return self.tuned_window(t, page, pages);
        }
        if self.slots.is_empty() {
            return self.config.on_fault(Stream::NEW, page, pages).0;
        }
        let slot = if self.by_address {
            let ends_here = self
                .slots
                .iter()
                .find(|s| unpack(s.load(Relaxed)).continued_by(page, self.config.max));
            ends_here.unwrap_or_else(|| {
                let i = self.victim.fetch_add(1, Relaxed) as usize;
                &self.slots[i % self.slots.len()]
            })
        } else {
            let me = SLOT.with(|s| {
                if s.get() == u32::MAX {
                    s.set(NEXT_SLOT.fetch_add(1, Relaxed));
                }
                s.get()
            });
            &self.slots[me as usize % self.slots.len()]
        };
        let (w, next) = self
            .config
            .on_fault(unpack(slot.load(Relaxed)), page, pages);
        slot.store(pack(next), Relaxed);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_round_trip_through_a_slot() {
        for s in [
            Stream::NEW,
            Stream { next: 0, window: 1 },
            Stream {
                next: (1 << 40) + 3,
                window: 4096,
            },
        ] {
            assert_eq!(unpack(pack(s)), s);
        }
    }

    #[test]
    fn a_thread_scan_grows_its_window() {
        let s = Streams::new(ReadaheadConfig::adaptive(2, 16));
        let mut page = 0;
        let mut lens = Vec::new();
        while page < 60 {
            let w = s.window(page, 60);
            lens.push(w.len());
            page = w.end;
        }
        assert_eq!(lens, [2, 4, 8, 16, 16, 14]);
        // Another thread's stream starts from scratch.
        let other = std::thread::scope(|t| t.spawn(|| s.window(60 - 1, 60)).join().unwrap());
        assert_eq!(other, 58..60);
    }

    #[test]
    fn threads_taking_turns_out_of_step_grow_one_stream() {
        // Pages 0.. of a run, page i on vCPU i % 2; vCPU 1 lags, so every
        // fault is vCPU 0's, one page past the end of the last window.
        let s = Streams::by_address(ReadaheadConfig::adaptive(1, 64));
        let (mut page, mut lens, mut installed) = (0, Vec::new(), vec![false; 200]);
        while page < 200 {
            let w = s.window(page, 200);
            assert!(w.contains(&page), "{w:?} {page}");
            w.clone().for_each(|p| installed[p] = true);
            lens.push(w.len());
            // vCPU 0's next page of its own that no window installed.
            page = (page + 2..200)
                .step_by(2)
                .find(|&p| !installed[p])
                .unwrap_or(200);
        }
        assert_eq!(lens[..7], [1, 2, 4, 8, 16, 32, 64], "{lens:?}");
        // vCPU 1's pages were installed on the way: it never faults.
        assert!(installed.iter().all(|&i| i), "{installed:?}");
    }

    #[test]
    fn interleaved_sweeps_read_by_one_thread_each_grow_their_window() {
        let s = Streams::by_address(ReadaheadConfig::adaptive(16, 256));
        let n = 1 << 16;
        let (mut a, mut b) = (0, 1 << 15);
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        while a < 2048 {
            let w = s.window(a, n);
            la.push(w.len());
            a = w.end;
            let w = s.window(b, n);
            lb.push(w.len());
            b = w.end;
        }
        assert_eq!(la[..6], [16, 32, 64, 128, 256, 256]);
        assert_eq!(la, lb);
        // Keyed by thread, the two sweeps read by this one thread reset
        // each other: every window is the fault-around one.
        let t = Streams::new(ReadaheadConfig::adaptive(16, 256));
        let lens: Vec<usize> = (0..8)
            .map(|i| t.window(if i % 2 == 0 { i * 8 } else { 1 << 15 }, n).len())
            .collect();
        assert!(lens.iter().all(|&l| l == 16), "{lens:?}");
    }
}
