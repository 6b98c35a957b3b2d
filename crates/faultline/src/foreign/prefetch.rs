//! Prefetch: installing a peer's queued runs ahead of its faults.
//!
//! ```text
//!   ForeignPeer::prefetch_plan ─► the peer's PrefetchQueue (plan.rs)
//!                                    │ PREFETCH_BATCH runs per hold of its lock
//!        ┌───────────────────────────┴────────────────────────┐
//!   the peer's handler thread                       prefetch helpers (shared by all peers)
//!   one chunk per poll round,                       pieces of GATE_PIECE,
//!   after that round's faults                       each under the peer's copy gate (shared)
//!        └────────────► prefetch_chunk ─► install_run ─► fault::resolve (Populate)
//! ```
//!
//! 1. **Queueing** ([`ForeignPeer::prefetch_plan`]): a plan's store runs
//!    are cut at the peer's region boundaries into (region, pages) runs,
//!    in the plan's order; in a region of pages larger than the plan's
//!    (2 MiB) a page is queued once. The store is told to start reading
//!    them (a thread of its own), unless [`prepare_store`] did already.
//! 2. **Demand first.** The peer's handler thread installs at most one
//!    chunk ([`ForeignEngineConfig::prefetch_chunk_bytes`]) per poll round,
//!    after the faults read in that round, and polls again without waiting
//!    while prefetch is pending.
//! 3. **Helpers** install pieces beside it; each install holds the peer's
//!    copy gate shared (the resolve path: `CopyGate`; the handler thread
//!    holds it exclusively while it reads events), so a REMOVE is never
//!    read while a helper's copy is in flight. A shared-mode peer takes one helper at a time (CONTINUE
//!    contends in the peer's mm); a copy-mode peer takes every helper.
//!    Before any prefetch a helper takes pieces of a fault's long window
//!    posted to the engine's crew (`fault::crew`): a vCPU waits for those.
//! 4. **EAGAIN** (an event is pending) stops an install where it is; the
//!    rest of the run goes back to the front of the queue, in order, and
//!    the helper backs off for the handler loop's first backoff.
//! 5. **Done** when the queue is empty and no run is taken out: once, the
//!    peer's `PrefetchDone` event and its `prefetch_done` milestone.
//! 6. **Yielding** ([`ForeignEngineConfig::prefetch_idle`]): helpers run
//!    under `SCHED_IDLE`, so they copy only on CPUs nothing else wants;
//!    the handler thread, which serves the faults, keeps its normal
//!    policy. A helper preempted while it holds a peer's copy gate delays
//!    that peer's next read of its userfaultfd until it runs again, which
//!    it does as soon as a CPU idles: the faulting vCPU and the handler
//!    both wait then, so on a host whose other threads do not fill every
//!    CPU the wait is the rest of one piece.
//!
//! [`ForeignEngineConfig::prefetch_idle`]: super::ForeignEngineConfig::prefetch_idle
//!
//! [`ForeignEngineConfig::prefetch_chunk_bytes`]: super::ForeignEngineConfig::prefetch_chunk_bytes
//! [`prepare_store`]: super::prepare_store

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::config::GATE_PIECE;
use super::peer::{ForeignPeer, PeerEvent};
use super::plan::{PrefetchPlan, PLAN_PAGE};
use crate::background::StopFlag;
use crate::engine::handler::BACKOFF_MIN;
use crate::fault::crew::Crew;
use crate::fault::resolve::{resolve, Access, Origin, Resolution};
use crate::fault::RegionState;
use crate::residency::{PageBits, PageState};

/// Queueing prefetch work.
impl ForeignPeer {
    /// Queues the pages at these store offsets for eager installation (see
    /// [the foreign path's docs](super)), in the order given: a record
    /// lists pages in the order they first faulted, so the pages the peer
    /// needs first are installed first. Around each page not yet queued, the queue gets the
    /// longest contiguous run of set pages not yet queued (one ioctl for a
    /// cluster, whatever order its pages were touched in); holes between
    /// set pages are never bridged (a page costs more to copy than an
    /// ioctl). A helper thread asks the store to start reading the runs
    /// ([`PageStore::will_need`](crate::store::PageStore::will_need)); when the store was made ready with
    /// [`prepare_store`](super::prepare_store), [`ForeignPeer::prefetch_prepared`] skips that.
    /// Offsets outside every region are ignored; returns the number of
    /// pages queued.
    pub fn prefetch(&self, offsets: &[u64]) -> usize {
        self.prefetch_plan(&PrefetchPlan::new(offsets), true)
    }

    /// [`ForeignPeer::prefetch`] of a set whose store ranges
    /// [`prepare_store`](super::prepare_store) already read and mapped (no read hints).
    pub fn prefetch_prepared(&self, offsets: &[u64]) -> usize {
        self.prefetch_plan(&PrefetchPlan::new(offsets), false)
    }

    /// [`ForeignPeer::prefetch`] of a set made into runs once
    /// ([`PrefetchPlan::new`]), for any number of peers: this peer's share
    /// costs O(runs), not O(set). `read_hints`: ask the store to start
    /// reading the runs (false when [`prepare_store`](super::prepare_store) did).
    pub fn prefetch_plan(&self, plan: &PrefetchPlan, read_hints: bool) -> usize {
        let mut runs: VecDeque<(usize, Range<usize>)> = VecDeque::with_capacity(plan.runs().len());
        // Regions of pages larger than the plan's: several runs fall in one
        // page; it is queued once.
        let queued: Vec<Option<PageBits>> = self
            .regions
            .iter()
            .map(|r| {
                (r.state.pages.size() > PLAN_PAGE).then(|| PageBits::new(r.state.pages.count()))
            })
            .collect();
        let mut n = 0;
        for (off, len) in plan.runs() {
            let (lo, hi) = (off, off + len as u64);
            for (i, r) in self.regions.iter().enumerate() {
                let (so, end) = (r.store_offset, r.store_offset + r.state.pages.len() as u64);
                let (a, b) = (lo.max(so), hi.min(end));
                if a >= b {
                    continue;
                }
                let Some(pages) = r.state.pages.covering((a - so) as usize, (b - a) as usize)
                else {
                    continue;
                };
                let (first, last) = (pages.start, pages.end);
                match &queued[i] {
                    None => {
                        runs.push_back((i, first..last));
                        n += last - first;
                    }
                    Some(q) => {
                        let mut p = first;
                        while p < last {
                            if q.get(p) {
                                p += 1;
                                continue;
                            }
                            let s = p;
                            while p < last && !q.get(p) {
                                q.set(p);
                                p += 1;
                            }
                            runs.push_back((i, s..p));
                            n += p - s;
                        }
                    }
                }
            }
        }
        // Ask the store to start reading every run now, in the background
        // (a file: the kernel's large asynchronous reads), in the order the
        // runs will be installed.
        if read_hints {
            let hints: Vec<(u64, usize)> = runs
                .iter()
                .map(|(i, run)| {
                    let r = &self.regions[*i];
                    (
                        r.store_offset + r.state.pages.offset(run.start),
                        r.state.pages.bytes(run.len()),
                    )
                })
                .collect();
            let store = self.store.clone();
            let _ = std::thread::Builder::new()
                .name("fl-prefetch-rd".into())
                .spawn(move || hints.into_iter().for_each(|(o, l)| store.will_need(o, l)));
        }
        self.stats.prefetch_queued.fetch_add(n as u64, Relaxed);
        let mut q = self.prefetch.lock().expect("prefetch queue");
        q.runs.extend(runs);
        self.prefetch_pending
            .store(!q.runs.is_empty() || q.taken > 0, Relaxed);
        n
    }

    /// Whether queued prefetch work remains.
    pub fn prefetch_pending(&self) -> bool {
        self.prefetch_pending.load(Relaxed)
    }
}

/// Prefetch runs a prefetcher takes from a peer's queue per hold of its
/// lock.
const PREFETCH_BATCH: usize = 32;

/// How long an idle helper sleeps when nobody wakes it.
const HELPER_IDLE: Duration = Duration::from_millis(200);

/// Wakes idle prefetch helpers.
#[derive(Debug, Default)]
pub(super) struct Work {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Work {
    /// There is new prefetch work (a peer was added with its queue full).
    pub(super) fn notify(&self) {
        *self.generation.lock().expect("work") += 1;
        self.cv.notify_all();
    }
}

/// A prefetch helper thread's body: installs the pieces of faults'
/// windows its `crew` is asked to help with, first, and pieces of the
/// queues of the peers `pending` lists (those with prefetch pending);
/// sleeps while there are neither (`work` wakes it). `(scratch, idle)`: its
/// copy buffer's bytes, and whether it runs under `SCHED_IDLE` (see step
/// 6 of the module docs). `cpu_us`: its CPU time (microseconds, user +
/// system), published before each wait and after each pass over the
/// queues.
pub(super) fn helper(
    pending: impl Fn() -> Vec<Arc<ForeignPeer>>,
    (work, crew): (&Work, &Crew),
    tx: &Sender<PeerEvent>,
    (scratch, idle): (usize, bool),
    (cpu_us, stop): (&AtomicU64, &StopFlag),
) {
    if idle {
        // Unprivileged; a failure leaves the helper a normal thread.
        let _ = faultline_sys::thread::set_idle();
    }
    let account = || {
        if let Ok(u) = faultline_sys::process::thread_usage() {
            cpu_us.store(u.cpu_us(), Relaxed);
        }
    };
    let mut scratch = vec![0u8; scratch];
    while !stop.is_set() {
        let seen = *work.generation.lock().expect("work");
        // A fault's window first: its vCPU waits for it.
        while crew.help(&mut scratch) {}
        let pending = pending();
        if pending.is_empty() {
            account();
            let g = work.generation.lock().expect("work");
            if *g == seen {
                let _ = work.cv.wait_timeout(g, HELPER_IDLE).expect("work");
            }
            continue;
        }
        let (mut blocked, mut helped) = (false, false);
        for p in &pending {
            // A shared-mode peer's prefetch takes one helper beside its
            // handler thread: CONTINUE is cheap per page and contended in
            // the kernel (the peer's mm), so more threads on one peer spent
            // more CPU (serve 28-37 ms against 19-21 with one helper, for
            // the 10% set of 1 GiB) that its vCPUs needed, for no faster
            // restore. Copy-mode peers take every helper (copies scale).
            let limit = if p.is_shared() { 1 } else { usize::MAX };
            if p.helpers.fetch_add(1, Relaxed) >= limit {
                p.helpers.fetch_sub(1, Relaxed);
                continue;
            }
            helped = true;
            while crew.help(&mut scratch) {}
            blocked |= prefetch_chunk(p, GATE_PIECE, &mut scratch, tx);
            p.helpers.fetch_sub(1, Relaxed);
        }
        account();
        if !helped {
            // Every pending peer has its helper: wait for more work.
            let g = work.generation.lock().expect("work");
            let _ = work
                .cv
                .wait_timeout(g, Duration::from_millis(1))
                .expect("work");
        }
        if blocked {
            // An event is pending on some peer: its handler thread reads it.
            std::thread::sleep(BACKOFF_MIN);
        }
    }
}

/// Installs up to `budget` bytes of `p`'s prefetch queue, over as many
/// queued runs as it takes; reports `PrefetchDone` when the queue runs
/// dry. Returns whether a pending event (EAGAIN) stopped it.
pub(super) fn prefetch_chunk(
    p: &Arc<ForeignPeer>,
    mut budget: usize,
    scratch: &mut [u8],
    tx: &Sender<PeerEvent>,
) -> bool {
    let mut blocked = false;
    let mut batch: Vec<(usize, Range<usize>)> = Vec::with_capacity(PREFETCH_BATCH);
    while budget > 0 && !blocked {
        // Up to PREFETCH_BATCH runs (or the budget's worth) under one hold
        // of the queue's lock: with several prefetchers, a lock per run of
        // a page or two made them queue for the lock more than install.
        // The untaken tail of a run goes straight back for the others.
        batch.clear();
        {
            let mut q = p.prefetch.lock().expect("prefetch queue");
            while budget > 0 && batch.len() < PREFETCH_BATCH {
                let Some((ri, run)) = q.runs.pop_front() else {
                    break;
                };
                let pages = &p.regions[ri].state.pages;
                let take =
                    run.start..(run.start + pages.size().pages_in(budget).max(1)).min(run.end);
                budget = budget.saturating_sub(pages.bytes(take.len()));
                if take.end < run.end {
                    q.runs.push_front((ri, take.end..run.end));
                }
                batch.push((ri, take));
            }
            q.taken += batch.len();
        }
        if batch.is_empty() {
            break;
        }
        let taken = batch.len();
        // What was not installed (a pending event stopped it) goes back to
        // the front, in order.
        let mut left: Vec<(usize, Range<usize>)> = Vec::new();
        for (ri, take) in batch.drain(..) {
            if blocked {
                left.push((ri, take));
                continue;
            }
            let r = &p.regions[ri].state;
            let page;
            (page, blocked) = install_run(p, r, take.clone(), scratch);
            if page < take.end {
                left.push((ri, page..take.end));
            }
        }
        let mut q = p.prefetch.lock().expect("prefetch queue");
        q.taken -= taken;
        for run in left.into_iter().rev() {
            q.runs.push_front(run);
        }
    }
    // Done when nothing is queued and no run is being installed (by
    // another prefetcher).
    let done = {
        let q = p.prefetch.lock().expect("prefetch queue");
        q.runs.is_empty() && q.taken == 0
    };
    if done && p.prefetch_pending.swap(false, Relaxed) {
        p.clock
            .prefetch_done
            .get_or_init(faultline_sys::monotonic_ns);
        let _ = tx.send(PeerEvent::PrefetchDone {
            peer: p.clone(),
            at: Instant::now(),
        });
    }
    blocked
}

/// Installs the absent pages of `take`; returns where it stopped and
/// whether a pending event (EAGAIN) stopped it.
fn install_run(
    p: &ForeignPeer,
    r: &RegionState,
    take: Range<usize>,
    scratch: &mut [u8],
) -> (usize, bool) {
    let mut page = take.start;
    while page < take.end {
        if r.residency.get(page) != PageState::Absent {
            page += 1;
            continue;
        }
        let origin = Origin::Populate(page..take.end);
        match resolve(r, page, Access::WRITE, &origin, scratch) {
            Resolution::Resolved => {
                // The run it installed: the pages from here that are now
                // present (queued runs never overlap, so no other
                // prefetcher installs these).
                let start = page;
                while page < take.end && r.residency.get(page) != PageState::Absent {
                    page += 1;
                }
                p.stats.prefetched.fetch_add((page - start) as u64, Relaxed);
                p.stats.prefetch_ioctls.fetch_add(1, Relaxed);
                p.clock
                    .first_prefetch
                    .get_or_init(faultline_sys::monotonic_ns);
                faultline_sys::failpoint::hit("prefetch-run");
            }
            Resolution::Retry => return (page, true),
            _ => page += 1,
        }
    }
    (page, false)
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, OwnedFd};

    use super::super::config::{ForeignOptions, ForeignRegionSpec};
    use super::super::uffd::ForeignUffd;
    use super::*;
    use crate::page::PageSize;
    use crate::store::{MemoryStore, PageStore};
    use faultline_sys::mem::{Advice, Mapping};
    use faultline_sys::uffd::{self, feature, register_mode};

    /// Base pages, in bytes.
    const P: u64 = PageSize::BASE.bytes() as u64;

    /// The policies of this process's threads whose name starts with
    /// `name` (the kernel keeps 15 bytes of a name).
    fn policies_of(name: &str) -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| {
                let tid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                comm.trim()
                    .starts_with(name)
                    .then(|| faultline_sys::thread::policy(tid).ok())
                    .flatten()
            })
            .collect()
    }

    #[test]
    fn idle_prefetch_helpers_run_under_sched_idle() {
        use super::super::config::ForeignEngineConfig;
        use super::super::engine::ForeignEngine;
        use crate::engine::EngineKind;
        use faultline_sys::thread::SCHED_IDLE;
        let cfg = ForeignEngineConfig {
            prefetch_helpers: 2,
            prefetch_idle: true,
            ..Default::default()
        };
        let (engine, _events) = ForeignEngine::new(EngineKind::Poll, cfg).unwrap();
        // Each helper sets its policy as it starts.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let idle = policies_of("fl-helper-")
                .iter()
                .filter(|&&p| p == SCHED_IDLE)
                .count();
            if idle >= 2 {
                break;
            }
            assert!(Instant::now() < deadline, "no helper runs under SCHED_IDLE");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The handler thread serves faults at the normal policy (once it
        // has named itself: it starts beside the helpers, not before).
        while !policies_of("fl-handler-").iter().any(|&p| p != SCHED_IDLE) {
            assert!(
                Instant::now() < deadline,
                "no handler thread at the normal policy"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(engine);
    }

    #[test]
    fn prefetch_queues_contiguous_runs_in_first_touch_order_without_bridging() {
        let len = 64 * P as usize;
        let u = uffd::dev_userfaultfd(uffd::open_flags(true))
            .or_else(|_| uffd::syscall_userfaultfd(uffd::open_flags(true)))
            .unwrap();
        u.api(feature::EVENT_REMOVE).unwrap();
        let a = Mapping::anon(len).unwrap();
        a.advise(0, len, Advice::NoHugePage).unwrap();
        u.register(a.addr(), len as u64, register_mode::MISSING)
            .unwrap();
        let fd: OwnedFd = u.as_fd().try_clone_to_owned().unwrap();
        let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(vec![7u8; len]));
        let spec = ForeignRegionSpec {
            base: a.addr(),
            len,
            page_size: P,
            store_offset: 0,
        };
        let peer = ForeignPeer::new(
            "t",
            ForeignUffd::adopt(fd).unwrap(),
            &[spec],
            store,
            &ForeignOptions::default(),
        )
        .unwrap();
        // First touched: 40, 42, 41 (a cluster touched out of order), then
        // 3, then 5 (one hole between: not bridged), then 40 again.
        let pages = [40u64, 42, 41, 3, 5, 40];
        let offs: Vec<u64> = pages.iter().map(|p| p * P).collect();
        assert_eq!(peer.prefetch(&offs), 5);
        let q = peer.prefetch.lock().unwrap();
        let runs: Vec<Range<usize>> = q.runs.iter().map(|r| r.1.clone()).collect();
        assert_eq!(runs, vec![40..43, 3..4, 5..6]);
        drop(q);
        // One plan, made once, queued for a peer whose two regions hold the
        // store's halves swapped: a run crossing the halves' boundary in the
        // store (30..34) is split at it, each piece in its region's pages
        // (the pieces in address order).
        let plan = PrefetchPlan::new(
            &[40u64, 42, 41, 3, 5, 31, 30, 33, 32]
                .iter()
                .map(|p| p * P)
                .collect::<Vec<_>>(),
        );
        assert_eq!(plan.pages(), 9);
        let store_runs: Vec<(u64, usize)> = plan.runs().collect();
        assert_eq!(
            store_runs,
            vec![
                (40 * P, 3 * P as usize),
                (3 * P, P as usize),
                (5 * P, P as usize),
                (30 * P, 4 * P as usize)
            ]
        );
        let half = len / 2;
        let specs = [
            ForeignRegionSpec {
                base: a.addr(),
                len: half,
                page_size: P,
                store_offset: half as u64,
            },
            ForeignRegionSpec {
                base: a.addr() + half as u64,
                len: half,
                page_size: P,
                store_offset: 0,
            },
        ];
        let fd: OwnedFd = u.as_fd().try_clone_to_owned().unwrap();
        let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(vec![7u8; len]));
        let swapped = ForeignPeer::new(
            "t2",
            ForeignUffd::adopt(fd).unwrap(),
            &specs,
            store,
            &ForeignOptions::default(),
        )
        .unwrap();
        assert_eq!(swapped.prefetch_plan(&plan, false), 9);
        let q = swapped.prefetch.lock().unwrap();
        let runs: Vec<(usize, Range<usize>)> = q.runs.iter().cloned().collect();
        assert_eq!(
            runs,
            vec![(0, 8..11), (1, 3..4), (1, 5..6), (0, 0..2), (1, 30..32)]
        );
    }
}
