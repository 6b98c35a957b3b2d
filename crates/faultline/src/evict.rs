//! Eviction under a resident-memory budget, with write-back of dirty pages.
//!
//! A region built with [`crate::RegionBuilder::budget`] is registered for
//! MISSING and WP faults and every page is installed write-protected
//! (`UFFDIO_COPY` with `MODE_WP`): resident and *clean* (`ReadOnly` in the
//! residency map). The first write takes a write-protect fault (a message
//! for thread engines, a SIGBUS for the signal engine); the resolve path
//! marks the page dirty (`Writable`) and un-protects it.
//!
//! Synchronous WP faults or `WP_ASYNC` + `PAGEMAP_SCAN`? Measured here (C,
//! 20,000 pages, median cycles): the first write to a clean page costs
//! 12,800 with a synchronous WP fault resolved in a SIGBUS handler and 2,340
//! with `WP_ASYNC` (the kernel un-protects without telling anyone); finding
//! and re-protecting the dirty pages costs 155/page with one `PAGEMAP_SCAN`
//! (`PM_SCAN_WP_MATCHING`) and 260-340/page with `UFFDIO_WRITEPROTECT`.
//! `WP_ASYNC` is cheaper, but it cannot stop a write: a write landing
//! between "the scan says clean" and the zap would be lost. Synchronous WP
//! blocks that write in a fault that sees the evictor's claim, so eviction
//! is exact. It was picked for correctness; an async variant would have to
//! take the victim out atomically first (`UFFDIO_MOVE` to a staging area)
//! and compare it with the store.
//!
//! An evictor thread per region:
//!
//! 1. drains the install log (a lock-free ring the fault path appends to)
//!    into the eviction policy ([`crate::policy`]: FIFO, CLOCK, refault-aware);
//! 2. while more pages are resident than the budget, takes the policy's
//!    victim and *claims* it (the same claim bit faults use, so no fault
//!    can install or dirty it meanwhile);
//! 3. for a dirty victim: write-protects it (writers now block in a WP
//!    fault, which sees the claim and waits), writes it back to the store;
//! 4. zaps it (`MADV_DONTNEED`), marks it absent, releases the claim. A
//!    thread that touches it later faults and reads it back from the store.
//!
//! The evictor is asynchronous; a fault that finds the region well past
//! its budget (budget + max(budget/4, 4 windows)) waits for it, like the
//! kernel's direct reclaim, so the budget holds approximately even when
//! faults outrun the evictor: the signal engine yields in place (up to
//! ~10 ms); thread engines defer the fault on their backoff queue, because
//! the evictor's zap needs the handler thread to read its REMOVE event.
//!
//! A write-back that fails leaves the page resident and dirty, counted in
//! `write_back_errors`; nothing is dropped that the store does not hold.
//! Dropping the region stops the evictor and writes every dirty page back
//! (reporting pages it could not write).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use crate::policy::PolicyKind;
use crate::region::{RegionThread, Shared};
use crate::residency::PageState;
use crate::store::StoreError;
use crate::sys::mem;

/// Budget settings.
#[derive(Debug, Clone, Copy)]
pub struct EvictionConfig {
    /// Most region pages resident at once.
    pub budget_pages: usize,
    /// Which policy picks victims.
    pub policy: PolicyKind,
}

/// Eviction counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionStats {
    /// Pages evicted.
    pub evicted: u64,
    /// Dirty pages written back (by eviction or flush).
    pub written_back: u64,
    /// Write-backs that failed (the page stayed resident and dirty).
    pub write_back_errors: u64,
    /// Pages resident now (as counted by the runtime).
    pub resident: u64,
    /// Most pages resident at once. The budget is enforced by an
    /// asynchronous evictor: faulting threads can run past it while the
    /// evictor catches up (it never blocks a fault).
    pub max_resident: u64,
}

/// Eviction state shared with the fault path.
#[derive(Debug)]
pub(crate) struct EvictState {
    /// Resident pages past which faults wait for the evictor (bounded).
    limit: usize,
    log: Box<[AtomicU64]>,
    tail: AtomicU64,
    head: AtomicU64,
    pub resident: AtomicUsize,
    max_resident: AtomicUsize,
    pub evicted: AtomicU64,
    pub written_back: AtomicU64,
    pub write_back_errors: AtomicU64,
}

impl EvictState {
    pub fn new(pages: usize, budget: usize, fault_around: usize) -> EvictState {
        // Every logged install is drained before its page can be evicted,
        // so at most `pages` entries are ever outstanding.
        let cap = pages.max(1024).next_power_of_two();
        EvictState {
            limit: budget + (budget / 4).max(4 * fault_around),
            log: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            resident: AtomicUsize::new(0),
            max_resident: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            write_back_errors: AtomicU64::new(0),
        }
    }

    /// Logs that `page` was installed. Async-signal-safe, wait-free.
    #[inline]
    pub fn installed(&self, page: usize) {
        let now = self.resident.fetch_add(1, SeqCst) + 1;
        self.max_resident.fetch_max(now, Relaxed);
        let i = self.tail.fetch_add(1, SeqCst) as usize & (self.log.len() - 1);
        self.log[i].store(page as u64 + 1, SeqCst);
    }

    /// Whether the region is past budget + slack.
    #[inline]
    pub fn over_limit(&self) -> bool {
        self.resident.load(Relaxed) > self.limit
    }

    /// The signal engine's fault path past the limit: wait (yielding, at
    /// most ~10 ms) for the evictor to catch up, as the kernel's direct
    /// reclaim makes an allocating thread wait. Async-signal-safe. (Thread
    /// engines defer the fault instead; see `resolve`.)
    pub fn wait_below_limit(&self) {
        let deadline = crate::sys::rdtsc() + 26_000_000;
        while self.over_limit() && crate::sys::rdtsc() < deadline {
            std::thread::yield_now();
        }
    }

    /// Hands every logged install to `f`, oldest first.
    fn drain(&self, mut f: impl FnMut(usize)) {
        let tail = self.tail.load(SeqCst);
        let mut head = self.head.load(Relaxed);
        while head < tail {
            let slot = &self.log[head as usize & (self.log.len() - 1)];
            let v = slot.swap(0, SeqCst);
            if v == 0 {
                break; // its producer has not written it yet
            }
            f(v as usize - 1);
            head += 1;
        }
        self.head.store(head, Relaxed);
    }

    pub fn stats(&self) -> EvictionStats {
        EvictionStats {
            evicted: self.evicted.load(Relaxed),
            written_back: self.written_back.load(Relaxed),
            write_back_errors: self.write_back_errors.load(Relaxed),
            resident: self.resident.load(Relaxed) as u64,
            max_resident: self.max_resident.load(Relaxed) as u64,
        }
    }
}

/// Writes dirty `page` back: write-protect, copy to the store, mark clean.
/// The caller holds the page's claim. Returns the store error, if any (the
/// page is then un-protected again and stays dirty).
pub(crate) fn write_back(r: &Shared, page: usize) -> Result<(), StoreError> {
    let ev = r
        .evict
        .as_ref()
        .expect("budget regions have eviction state");
    let (addr, ps) = (r.page_addr(page), r.page_size);
    // (DONTWAKE is only valid when clearing protection.) EAGAIN: an event
    // is pending (thread engines read it soon); retry, bounded.
    let mut tries = 0;
    loop {
        match r.uffd.writeprotect(addr, ps as u64, true, false) {
            Ok(()) => break,
            Err(e) if e.errno() == libc::EAGAIN && tries < 2000 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => {
                return Err(StoreError::Failed {
                    offset: (page * ps) as u64,
                    reason: format!("write-protecting for write-back: {e}").into(),
                })
            }
        }
    }
    // SAFETY: the page is resident (dirty) and write-protected; we only read.
    let data = unsafe { std::slice::from_raw_parts(addr as *const u8, ps) };
    match r.store.write_back((page * ps) as u64, data) {
        Ok(()) => {
            r.residency.set(page, PageState::ReadOnly);
            ev.written_back.fetch_add(1, Relaxed);
            Ok(())
        }
        Err(e) => {
            ev.write_back_errors.fetch_add(1, Relaxed);
            let _ = r.uffd.writeprotect(addr, ps as u64, false, false);
            Err(e)
        }
    }
}

/// Evicts `page` if it is resident and can be claimed; true if evicted.
fn evict(r: &Shared, page: usize) -> bool {
    let ev = r
        .evict
        .as_ref()
        .expect("budget regions have eviction state");
    if !r.residency.try_claim(page) {
        return false;
    }
    let ok = match r.residency.get(page) {
        PageState::Writable => write_back(r, page).is_ok(),
        PageState::ReadOnly => true,
        _ => false,
    };
    if ok {
        let _ = mem::madvise(r.page_addr(page), r.page_size, libc::MADV_DONTNEED);
        r.residency.set(page, PageState::Absent);
        ev.resident.fetch_sub(1, SeqCst);
        ev.evicted.fetch_add(1, Relaxed);
    }
    r.residency.release(page..page + 1);
    ok
}

/// Starts the evictor thread of `shared` (a region with a budget).
pub(crate) fn start(shared: &Shared, cfg: EvictionConfig) -> std::io::Result<RegionThread> {
    RegionThread::spawn("faultline-evictor", shared, move |r, stop| {
        run(r, cfg, stop)
    })
}

fn run(r: &Shared, cfg: EvictionConfig, stop: &AtomicBool) {
    let ev = r
        .evict
        .as_ref()
        .expect("budget regions have eviction state");
    let mut policy = cfg.policy.build(cfg.budget_pages);
    let budget = cfg.budget_pages.max(1);
    while !stop.load(SeqCst) {
        ev.drain(|p| policy.on_fault(p));
        let mut progress = false;
        let mut tries = 0;
        while ev.resident.load(SeqCst) > budget && tries < 4 * budget {
            tries += 1;
            // Pages whose claim is held (being faulted or dirtied) are
            // skipped this round and handed back to the policy.
            match policy.pick_victim(&|p| r.residency.is_claimed(p)) {
                Some(v) => {
                    if evict(r, v) {
                        progress = true;
                    } else if r.residency.get(v) != PageState::Absent {
                        policy.on_fault(v);
                    }
                }
                None => {
                    ev.drain(|p| policy.on_fault(p));
                    break;
                }
            }
        }
        if !progress {
            std::thread::park_timeout(Duration::from_micros(200));
        }
    }
}
