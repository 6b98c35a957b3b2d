//! The I/O page access log (VPRI's IO-PAL, seed 003 §4.2.1, §5.3): one
//! lossy ring per device that every issued I/O appends to.
//!
//! A bounded multi-producer multi-consumer ring (one sequence number per
//! slot). A producer that finds the ring full drops its event and counts
//! it: the log never makes an I/O wait, only the footprint it reports gets
//! less accurate, exactly as the DPU discards events when the host has
//! posted no empty descriptors. The consumer (the device's pinner thread,
//! or the user) regulates the cost by how often it drains.
//!
//! Producers and consumers claim runs of slots with one compare-and-swap
//! a run (the logged count is the enqueue position): a queue logs the
//! I/Os of one call together, with one clock read
//! ([`AccessLog::push_batch`]), so an I/O's share is a few stores, and
//! [`AccessLog::drain`] takes every published event at once.
//! `faultline bench vpri --only b8` measures what it costs an I/O.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// One logged I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessEvent {
    /// First region page the I/O touches.
    pub page: usize,
    /// Number of region pages it touches.
    pub pages: u32,
    /// When it was issued (ns since the device was created; a queue
    /// stamps the I/Os of one call with one clock read).
    pub ts_ns: u64,
    /// Whether the I/O wrote region memory (a read or receive).
    pub write: bool,
}

struct Slot {
    seq: AtomicUsize,
    page: AtomicU64,
    ts: AtomicU64,
    meta: AtomicU64,
}

/// A lossy, never-blocking ring of [`AccessEvent`]s. See the module docs.
pub struct AccessLog {
    slots: Box<[Slot]>,
    mask: usize,
    /// Events pushed so far (each successful push advances it by one, so
    /// it is also the count of events logged).
    enq: AtomicUsize,
    deq: AtomicUsize,
    dropped: AtomicU64,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("slots", &self.slots.len())
            .field("logged", &self.logged())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AccessLog {
    /// A ring of `slots` events (rounded up to a power of two, at least 2).
    pub fn new(slots: usize) -> AccessLog {
        let n = slots.max(2).next_power_of_two();
        AccessLog {
            slots: (0..n)
                .map(|i| Slot {
                    seq: AtomicUsize::new(i),
                    page: AtomicU64::new(0),
                    ts: AtomicU64::new(0),
                    meta: AtomicU64::new(0),
                })
                .collect(),
            mask: n - 1,
            enq: AtomicUsize::new(0),
            deq: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Appends `ev`; false (and counted) if the ring is full. Lock-free,
    /// never waits.
    pub fn push(&self, ev: AccessEvent) -> bool {
        self.push_batch(&[ev]) == 1
    }

    /// Appends as many of `evs` as there are free slots, with one
    /// compare-and-swap for the run (a queue logs the I/Os of one call
    /// together); the rest are dropped and counted with one atomic add.
    /// Returns how many were logged. Lock-free, never waits.
    pub fn push_batch(&self, evs: &[AccessEvent]) -> usize {
        let mut done = 0;
        while done < evs.len() {
            let Some(run) = self.claim(&self.enq, 0, evs.len() - done) else {
                break;
            };
            for (i, ev) in run.clone().zip(&evs[done..]) {
                let slot = &self.slots[i & self.mask];
                slot.page.store(ev.page as u64, Relaxed);
                slot.ts.store(ev.ts_ns, Relaxed);
                slot.meta
                    .store(u64::from(ev.pages) << 1 | u64::from(ev.write), Relaxed);
                slot.seq.store(i + 1, Release);
            }
            done += run.len();
        }
        if done < evs.len() {
            self.dropped.fetch_add((evs.len() - done) as u64, Relaxed);
        }
        done
    }

    /// Takes the oldest event, if any.
    pub fn pop(&self) -> Option<AccessEvent> {
        let mut ev = None;
        self.drain(1, |e| ev = Some(e));
        ev
    }

    /// Hands up to `max` events to `f`, oldest first; returns how many.
    /// Claims each run of published events with one compare-and-swap.
    pub fn drain(&self, max: usize, mut f: impl FnMut(AccessEvent)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(run) = self.claim(&self.deq, 1, max - n) else {
                break;
            };
            n += run.len();
            for i in run {
                let slot = &self.slots[i & self.mask];
                let meta = slot.meta.load(Relaxed);
                let ev = AccessEvent {
                    page: slot.page.load(Relaxed) as usize,
                    pages: (meta >> 1) as u32,
                    ts_ns: slot.ts.load(Relaxed),
                    write: meta & 1 != 0,
                };
                slot.seq.store(i + self.mask + 1, Release);
                f(ev);
            }
        }
        n
    }

    /// Claims, with one compare-and-swap on `idx` (the enqueue or dequeue
    /// position), the run of up to `max` slots from it that are ready:
    /// sequence number `pos + lag` (0: free for a producer; 1: published
    /// for a consumer). `None` when the next slot is not ready (the ring
    /// is full or empty).
    fn claim(&self, idx: &AtomicUsize, lag: usize, max: usize) -> Option<Range<usize>> {
        loop {
            let pos = idx.load(Relaxed);
            let mut k = 0;
            while k < max && k <= self.mask {
                if self.slots[(pos + k) & self.mask].seq.load(Acquire) != pos + k + lag {
                    break;
                }
                k += 1;
            }
            if k == 0 {
                if idx.load(Relaxed) == pos {
                    return None;
                }
                continue;
            }
            if idx.compare_exchange(pos, pos + k, Relaxed, Relaxed).is_ok() {
                return Some(pos..pos + k);
            }
        }
    }

    /// Events logged so far.
    pub fn logged(&self) -> u64 {
        self.enq.load(Relaxed) as u64
    }

    /// Events dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Capacity in events.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(page: usize) -> AccessEvent {
        AccessEvent {
            page,
            pages: 3,
            ts_ns: page as u64 * 10,
            write: page.is_multiple_of(2),
        }
    }

    #[test]
    fn fifo_until_full_then_drops() {
        let log = AccessLog::new(8);
        for p in 0..8 {
            assert!(log.push(ev(p)));
        }
        assert!(!log.push(ev(99)));
        assert_eq!(log.dropped(), 1);
        let mut got = vec![];
        log.drain(usize::MAX, |e| got.push(e));
        assert_eq!(got, (0..8).map(ev).collect::<Vec<_>>());
        assert!(log.push(ev(9)));
        assert_eq!(log.pop(), Some(ev(9)));
        assert_eq!(log.pop(), None);
    }

    #[test]
    fn drain_takes_runs_up_to_max_in_order() {
        let log = AccessLog::new(8);
        for p in 0..6 {
            assert!(log.push(ev(p)));
        }
        let mut got = vec![];
        assert_eq!(log.drain(4, |e| got.push(e)), 4);
        assert_eq!(log.pop(), Some(ev(4)));
        // Wraps around the ring.
        for p in 6..13 {
            assert!(log.push(ev(p)));
        }
        assert!(!log.push(ev(99)), "8 slots: 5..13 fill it");
        assert_eq!(log.drain(usize::MAX, |e| got.push(e)), 8);
        assert_eq!(got, (0..4).chain(5..13).map(ev).collect::<Vec<_>>());
        assert_eq!(log.drain(usize::MAX, |_| unreachable!()), 0);
        assert_eq!((log.logged(), log.dropped()), (13, 1));
    }

    #[test]
    fn push_batch_logs_what_fits_and_counts_the_rest() {
        let log = AccessLog::new(8);
        assert!(log.push(ev(0)));
        let batch: Vec<_> = (1..6).map(ev).collect();
        assert_eq!(log.push_batch(&batch), 5);
        let more: Vec<_> = (6..10).map(ev).collect();
        assert_eq!(log.push_batch(&more), 2, "8 slots: 6 and 7 fit");
        assert_eq!((log.logged(), log.dropped()), (8, 2));
        assert_eq!(log.push_batch(&[]), 0);
        let mut got = vec![];
        log.drain(3, |e| got.push(e));
        // Wraps around the ring.
        assert_eq!(log.push_batch(&more), 3);
        log.drain(usize::MAX, |e| got.push(e));
        assert_eq!(got, (0..8).chain(6..9).map(ev).collect::<Vec<_>>());
        assert_eq!((log.logged(), log.dropped()), (11, 3));
    }

    #[test]
    fn concurrent_producers_and_consumers_lose_nothing() {
        let log = std::sync::Arc::new(AccessLog::new(256));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (log, done) = (log.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seen = vec![];
                    loop {
                        let finished = done.load(Acquire);
                        log.drain(usize::MAX, |e| seen.push(e.page));
                        if finished {
                            break seen;
                        }
                    }
                })
            })
            .collect();
        // One producer pushes one by one, the other in batches of 7.
        let producers: Vec<_> = (0..2)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let ids: Vec<usize> = (0..20_000).map(|i| t * 100_000 + i).collect();
                    if t == 0 {
                        return ids.into_iter().filter(|&i| log.push(ev(i))).collect();
                    }
                    let mut kept = vec![];
                    for c in ids.chunks(7) {
                        let evs: Vec<_> = c.iter().map(|&i| ev(i)).collect();
                        kept.extend_from_slice(&c[..log.push_batch(&evs)]);
                    }
                    kept
                })
            })
            .collect();
        let mut pushed: Vec<usize> = producers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        done.store(true, Release);
        let mut seen: Vec<usize> = consumers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        pushed.sort_unstable();
        seen.sort_unstable();
        assert_eq!(seen, pushed, "every logged event drained exactly once");
        assert_eq!(pushed.len() as u64 + log.dropped(), 40_000);
        assert_eq!(log.logged(), pushed.len() as u64);
    }

    #[test]
    fn concurrent_producers_lose_nothing_they_report_logged() {
        let log = std::sync::Arc::new(AccessLog::new(1 << 16));
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    (0..10_000)
                        .filter(|i| log.push(ev(t * 100_000 + i)))
                        .count()
                })
            })
            .collect();
        let pushed: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        let mut n = 0;
        log.drain(usize::MAX, |_| n += 1);
        assert_eq!(n, pushed);
        assert_eq!(pushed as u64 + log.dropped(), 40_000);
    }
}
