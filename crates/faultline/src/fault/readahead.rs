//! Per-thread read-ahead streams, lock-free so the SIGBUS handler can use
//! them.
//!
//! The algorithm is the pure [`ReadaheadConfig::on_fault`]; this file only
//! keeps each stream's [`Stream`] in an atomic slot. A thread gets its
//! slot at its first fault (a const-initialised thread-local index, safe
//! to read in a signal handler) and keeps it: threads scanning different
//! parts of a region do not reset each other's windows. Threads that
//! share a slot (more threads than slots) race benignly: a window may
//! start over.
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

use crate::policy::{ReadaheadConfig, ReadaheadStream as Stream};

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
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> ReadaheadConfig {
        self.config
    }

    /// The pages a fault at `page` of a `pages`-page region resolves; the
    /// calling thread's stream records it. Async-signal-safe.
    pub fn window(&self, page: usize, pages: usize) -> Range<usize> {
        if self.slots.is_empty() {
            return self.config.on_fault(Stream::NEW, page, pages).0;
        }
        let me = SLOT.with(|s| {
            if s.get() == u32::MAX {
                s.set(NEXT_SLOT.fetch_add(1, Relaxed));
            }
            s.get()
        });
        let slot = &self.slots[me as usize % self.slots.len()];
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
}
