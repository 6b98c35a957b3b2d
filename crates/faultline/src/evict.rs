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
//! The evictor is asynchronous. A fault that finds the region well past
//! its budget (budget + max(budget/4, 4 read-ahead windows)) waits for it,
//! like the kernel's direct reclaim, so the budget holds approximately even
//! when faults outrun the evictor: a fault resolved on the faulting thread
//! (signal engine) yields in place, for at most 10 ms; a handler thread
//! defers the fault on its backoff queue instead, because the evictor's zap
//! needs that very thread to read its REMOVE event. Eviction therefore does
//! block faults, briefly, when they outrun it.
//!
//! A write-back that fails leaves the page resident and dirty, counted in
//! `write_back_errors`; nothing is dropped that the store does not hold.
//! Dropping the region stops the evictor and writes every dirty page back
//! (reporting pages it could not write).
//!
//! The policy sees the calls the evictor makes (see
//! [`crate::policy::EvictionPolicy`]): `on_fault` for every install the
//! fault path logged (and again for a victim that could not be evicted),
//! and `pick_victim` with the claim bits as the pin predicate.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use crate::background::{Background, StopFlag};
use crate::fault::RegionState;
use crate::policy::PolicyKind;
use crate::residency::PageState;
use crate::store::StoreError;
use crate::sys::mem::{self, Advice};
use crate::sys::Errno;

pub use crate::fault::feeds::EvictionStats;

/// Budget settings.
#[derive(Debug, Clone, Copy)]
pub struct EvictionConfig {
    /// Most region pages resident at once.
    pub budget_pages: usize,
    /// Which policy picks victims.
    pub policy: PolicyKind,
}

/// Writes dirty `page` back: write-protect, copy to the store, mark clean.
/// The caller holds the page's claim. Returns the store error, if any (the
/// page is then un-protected again and stays dirty).
pub(crate) fn write_back(r: &RegionState, page: usize) -> Result<(), StoreError> {
    let budget = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    let (addr, ps) = (r.pages.addr(page), r.pages.size().bytes());
    let offset = r.pages.offset(page);
    // (DONTWAKE is only valid when clearing protection.) EAGAIN: an event
    // is pending (thread engines read it soon); retry, bounded.
    let mut tries = 0;
    loop {
        match r.uffd.writeprotect(addr, ps as u64, true, false) {
            Ok(()) => break,
            Err(e) if e.is(Errno::EAGAIN) && tries < 2000 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => {
                return Err(StoreError::Failed {
                    offset,
                    reason: format!("write-protecting for write-back: {e}").into(),
                })
            }
        }
    }
    // SAFETY: the page is resident (dirty) and write-protected; we only read.
    let data = unsafe { std::slice::from_raw_parts(addr as *const u8, ps) };
    match r.store.write_back(offset, data) {
        Ok(()) => {
            r.residency.set(page, PageState::ReadOnly);
            budget.written_back.fetch_add(1, Relaxed);
            Ok(())
        }
        Err(e) => {
            budget.write_back_errors.fetch_add(1, Relaxed);
            let _ = r.uffd.writeprotect(addr, ps as u64, false, false);
            Err(e)
        }
    }
}

/// Evicts `page` if it is resident and can be claimed; true if evicted.
fn evict(r: &RegionState, page: usize) -> bool {
    let budget = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    if !r.residency.try_claim(page) {
        return false;
    }
    let ok = match r.residency.get(page) {
        PageState::Writable => write_back(r, page).is_ok(),
        PageState::ReadOnly => true,
        _ => false,
    };
    if ok {
        let _ = mem::madvise(r.pages.addr(page), r.pages.size().bytes(), Advice::DontNeed);
        r.residency.set(page, PageState::Absent);
        budget.resident.fetch_sub(1, SeqCst);
        budget.evicted.fetch_add(1, Relaxed);
    }
    r.residency.release(page..page + 1);
    ok
}

/// Starts the evictor thread of `state` (a region with a budget).
pub(crate) fn start(state: &RegionState, cfg: EvictionConfig) -> std::io::Result<Background> {
    state.spawn_worker("faultline-evictor", move |r, stop| run(r, cfg, stop))
}

fn run(r: &RegionState, cfg: EvictionConfig, stop: &StopFlag) {
    let budget_feed = r
        .budget
        .as_ref()
        .expect("budget regions have a budget feed");
    let mut policy = cfg.policy.build(cfg.budget_pages);
    let budget = cfg.budget_pages.max(1);
    while !stop.is_set() {
        budget_feed.drain(|p| policy.on_fault(p));
        let mut progress = false;
        let mut tries = 0;
        while budget_feed.resident.load(SeqCst) > budget && tries < 4 * budget {
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
                    budget_feed.drain(|p| policy.on_fault(p));
                    break;
                }
            }
        }
        if !progress {
            std::thread::park_timeout(Duration::from_micros(200));
        }
    }
}
