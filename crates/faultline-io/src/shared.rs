//! What a device and its queues share: the queue discipline and the
//! device state the queues update (counters, access log, pin policy).
//! `device` builds and owns it; `queue` only reads and counts, so neither
//! imports the other back.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use faultline::Region;

use crate::adp::PinPolicy;
use crate::log::{AccessEvent, AccessLog};
use crate::tenant::TenantInner;

/// Queue discipline on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// The paper's paused queue: an I/O that misses parks, and every later
    /// I/O of the queue waits behind it; I/Os issue and complete in
    /// submission order, and an I/O that depends on an earlier one (same
    /// socket, overlapping region buffer or file range with a write) runs
    /// only after it has finished.
    Ordered,
    /// Only the I/O that missed parks; later I/Os go on (the paper's §8
    /// future work).
    Unordered,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
    pub iopfs: AtomicU64,
    pub posted: AtomicU64,
    pub reissued: AtomicU64,
    pub efault_caught: AtomicU64,
    pub efault_lost: AtomicU64,
    pub parked: AtomicU64,
    pub pinned_units: AtomicUsize,
    pub reclaim_ages: AtomicU64,
}

/// What a device learns of the evictor: the pages it takes (for
/// [`PinMode::AdpDerived`](crate::PinMode::AdpDerived)) and when the
/// device last touched each unit (ns since the device's birth; `u64::MAX`:
/// never), to turn each into an age.
pub(crate) struct Reclaims {
    pub watch: faultline::ReclaimWatch,
    pub last_ns: Vec<u64>,
}

pub(crate) struct DeviceInner {
    pub name: String,
    pub id: u64,
    pub region: Arc<Region>,
    pub tenant: Arc<TenantInner>,
    pub ordering: Ordering,
    /// The CPU whose tenant worker serves this device's page requests
    /// first ([`DeviceConfig::home_cpu`](crate::DeviceConfig::home_cpu)).
    pub home_cpu: Option<usize>,
    pub log: AccessLog,
    /// Whether queues append to `log` (`log_slots > 0`).
    pub log_on: bool,
    pub born: Instant,
    pub counters: Counters,
    pub unit_pages: usize,
    /// Whether every page is pinned ([`PinMode::All`]).
    pub pin_all: bool,
    /// The pin policy (the drain thread's; `PinMode::All` pins at once).
    pub policy: Mutex<Box<dyn PinPolicy>>,
    /// Taken inside `policy` by the drain, never the other way round.
    pub reclaims: Option<Mutex<Reclaims>>,
    /// The drain's scratch, taken inside `policy` (a leaf).
    pub batch: Mutex<Batch>,
    pub stop: AtomicBool,
    /// The CPU a queue of this device last went to wait on
    /// ([`NO_CPU`]: none yet); the drain thread keeps off it.
    pub queue_cpu: AtomicUsize,
}

/// [`DeviceInner::queue_cpu`] before any queue waited.
pub(crate) const NO_CPU: usize = usize::MAX;

/// One drain's coalescing: each unit's last access and each page's hint
/// once per drain, however many events name them.
#[derive(Default)]
pub(crate) struct Batch {
    /// Per unit: its last access in this drain (`u64::MAX`: none).
    last: Vec<u64>,
    /// Units accessed in this drain.
    units: Vec<usize>,
    /// Per page, a bit: hinted in this drain.
    hinted: Vec<u64>,
    /// The nonzero words of `hinted` (each once), cleared after the drain.
    words: Vec<usize>,
}

impl DeviceInner {
    /// Time since the device's birth (ns): the access log's stamps and
    /// the drain's ticks.
    pub fn now_ns(&self) -> u64 {
        self.born.elapsed().as_nanos() as u64
    }

    /// Drains the access log into the pinning policy and the region's
    /// eviction policy, ticks the policy, applies its pin changes.
    ///
    /// The drained events are coalesced first: the policy sees each unit
    /// once, at its last access in this drain (oldest first), and the
    /// eviction policy each page once. So the consumer's work grows with
    /// the units and pages the device touched in a period, not with its
    /// I/O rate (ADP's rules act on seconds; a drain period is ms).
    pub(crate) fn drain(&self) {
        let mut p = self.policy.lock().expect("pin policy lock");
        let mut rec = self
            .reclaims
            .as_ref()
            .map(|r| r.lock().expect("reclaims lock"));
        let mut batch = self.batch.lock().expect("drain batch lock");
        let Batch {
            last,
            units,
            hinted,
            words,
        } = &mut *batch;
        let pages = self.region.pages();
        last.resize(pages.div_ceil(self.unit_pages), u64::MAX);
        hinted.resize(pages.div_ceil(64), 0);
        let now = self.now_ns();
        // A shift instead of a division per event when units are a power
        // of two pages (the paper's 2 MiB, the benchmarks' 16 pages).
        let up = self.unit_pages;
        let shift = up.is_power_of_two().then(|| up.trailing_zeros());
        let unit_of = |page: usize| shift.map_or(page / up, |s| page >> s);
        self.log.drain(usize::MAX, |ev: AccessEvent| {
            let end = (ev.page + ev.pages as usize).min(pages);
            let unit = unit_of(ev.page);
            let Some(t) = last.get_mut(unit) else {
                return;
            };
            if *t == u64::MAX {
                units.push(unit);
                *t = ev.ts_ns;
            }
            *t = (*t).max(ev.ts_ns);
            for pg in ev.page..end {
                let (w, bit) = (pg / 64, 1u64 << (pg % 64));
                if hinted[w] & bit == 0 {
                    if hinted[w] == 0 {
                        words.push(w);
                    }
                    hinted[w] |= bit;
                    self.region.access_hint(pg);
                }
            }
        });
        units.sort_by_key(|&u| last[u]);
        for &u in units.iter() {
            let t = std::mem::replace(&mut last[u], u64::MAX);
            p.on_access(u, t);
            if let Some(l) = rec.as_mut().and_then(|r| r.last_ns.get_mut(u)) {
                *l = t;
            }
        }
        units.clear();
        for w in words.drain(..) {
            hinted[w] = 0;
        }
        drop(batch);
        // The evictor's reclaims of units this device touched, with their
        // ages since that touch (one per unit and run of pages).
        if let Some(r) = rec.as_mut() {
            let Reclaims { watch, last_ns } = &mut **r;
            let mut last = usize::MAX;
            watch.drain(|page| {
                let unit = page / self.unit_pages;
                if unit == last {
                    return;
                }
                last = unit;
                if let Some(&t) = last_ns.get(unit).filter(|&&t| t != u64::MAX) {
                    p.on_reclaim(unit, now.saturating_sub(t));
                    self.counters.reclaim_ages.fetch_add(1, Relaxed);
                }
            });
        }
        drop(rec);
        p.tick(now);
        self.apply(&mut **p);
    }

    pub(crate) fn apply(&self, p: &mut dyn PinPolicy) {
        let n = self.region.pages();
        p.drain_changes(&mut |unit, pin| {
            let start = unit * self.unit_pages;
            let range = start.min(n)..((unit + 1) * self.unit_pages).min(n);
            if range.is_empty() {
                return;
            }
            if pin {
                self.region.pin(range);
                self.counters.pinned_units.fetch_add(1, Relaxed);
            } else {
                self.region.unpin(range);
                self.counters.pinned_units.fetch_sub(1, Relaxed);
            }
        });
    }

    pub(crate) fn unpin_all(&self) {
        let n = self.region.pages();
        let p = self.policy.lock().expect("pin policy lock");
        for unit in 0..n.div_ceil(self.unit_pages) {
            if p.is_pinned(unit) {
                let range = unit * self.unit_pages..((unit + 1) * self.unit_pages).min(n);
                self.region.unpin(range);
            }
        }
    }
}
