//! Making room under a memory budget: choosing victims and evicting them
//! in batches, for the evictor thread ([`crate::evict`]) and for faults
//! that find the budget full and evict for themselves.
//!
//! A fault charges its pages to the budget before it installs them
//! ([`charge`]). When the budget is full:
//!
//! ```text
//!   fault ──try_charge──▶ full ──may evict?──▶ reclaim a batch of this
//!     ▲                     │                   region's pages, charge
//!     │                     │ no (a handler thread, or handler threads
//!     │                     ▼     read the region's REMOVE events)
//!     └──── retry ◀── defer: ask the evictor (Retry), or sleep on the
//!                     budget's room futex until pages are uncharged
//! ```
//!
//! How one batch goes ([`reclaim`]):
//!
//! 1. Under the region's victim lock ([`VictimState`], shared by the
//!    evictor and faulting threads; a faulting thread only *tries* it):
//!    drain the install log and the access hints into the policy, pick up
//!    to [`batch_for`] victims ([`BATCH`] pages, at most [`BATCH_BYTES`])
//!    and claim each (the claim bit faults use: no
//!    fault can install, dirty or evict a claimed page). A page an I/O
//!    holds, or claimed by someone else, goes back to the policy. Then the
//!    lock is released: the system calls below run without it, so several
//!    threads evict in parallel.
//! 2. Dirty victims are write-protected (one `UFFDIO_WRITEPROTECT` per run
//!    of contiguous pages: a writer now blocks in a WP fault that sees the
//!    claim and waits) and written back with one
//!    [`PageStore::write_back_batch`](crate::PageStore::write_back_batch).
//! 3. Every victim is dropped: one `process_madvise(MADV_DONTNEED)` for
//!    the whole batch (one TLB flush instead of one per page), or, when
//!    handler threads read the region's events, one `madvise` per run of
//!    contiguous pages with the REMOVE handshake of [`BudgetFeed::zap`].
//! 4. Each is recorded absent and uncharged (waking faults that wait for
//!    room) and its claim released. A dirty page whose write-back failed
//!    stays resident and dirty and is held for a retry (the evictor's
//!    [`retry_held`], with backoff).
//!
//! Everything a faulting thread runs here is async-signal-safe: atomics,
//! a `try_lock`, system calls, arrays on the stack; the policy and the
//! held list were sized when the evictor started, so while the budget
//! holds they do not allocate.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use super::feeds::{BudgetFeed, VictimState, ROOM_STALL};
use super::report::report;
use super::RegionState;
use crate::policy::PolicyKind;
use crate::residency::PageState;
use crate::store::{StoreError, WriteRange};
use faultline_sys::mem::{madvise_ranges, Advice, MADVISE_BATCH};
use faultline_sys::{rdtsc, Errno};

/// Most pages one batch evicts (one `process_madvise`).
pub(crate) const BATCH: usize = MADVISE_BATCH;

/// First and longest wait before a failed write-back is retried.
const RETRY_MIN: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a fault that found nothing to evict sleeps before it looks
/// again (it is woken as soon as pages are uncharged).
const ROOM_NAP: Duration = Duration::from_millis(1);

/// Most bytes one batch evicts: [`BATCH`] pages of 4 KiB. Larger pages
/// make smaller batches (4 of 64 KiB): a fault that evicts for itself
/// writes back at most this much before it installs, and several threads
/// (evictors, faults) evict batches side by side instead of one of them
/// writing back megabytes while the others wait for room.
pub(crate) const BATCH_BYTES: usize = BATCH * 4096;

/// The batch eviction takes for a budget of `max` pages of `page_bytes`:
/// [`BATCH`] pages, at most [`BATCH_BYTES`] (at least one page), at most
/// a sixteenth of the budget (a small budget is not emptied to make room
/// for one page).
pub(crate) fn batch_for(max: usize, page_bytes: usize) -> usize {
    (max / 16)
        .clamp(1, BATCH)
        .min((BATCH_BYTES / page_bytes.max(1)).max(1))
}

/// Sets up the victim state of `r` (a budget region) with `policy`, sized
/// for `capacity` resident pages so that it does not allocate while the
/// budget holds.
pub(crate) fn init(r: &RegionState, policy: PolicyKind, capacity: usize) {
    let feed = feed(r);
    let capacity = capacity.min(r.pages.count()).max(1);
    let _ = feed.victims.set(std::sync::Mutex::new(VictimState {
        policy: policy.build(capacity),
        held: std::collections::VecDeque::with_capacity(capacity),
        retry_delay: RETRY_MIN,
        retry_due: None,
    }));
    WP_WHAT.get_or_init(|| Arc::from("the region (write-protecting a page for its write-back)"));
}

/// What a failed `UFFDIO_WRITEPROTECT` names, made once outside any signal
/// handler (a `StoreError` carries an `Arc<str>`).
static WP_WHAT: OnceLock<Arc<str>> = OnceLock::new();

fn feed(r: &RegionState) -> &BudgetFeed {
    r.budget.as_ref().expect("only regions with a budget evict")
}

/// The victim lock: waited for (`blocking`, the evictor) or only tried (a
/// faulting thread, which never blocks on it inside a signal handler).
fn lock(feed: &BudgetFeed, blocking: bool) -> Option<MutexGuard<'_, VictimState>> {
    let m = feed.victims.get()?;
    if blocking {
        return Some(m.lock().unwrap_or_else(|e| e.into_inner()));
    }
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Charges `n` pages of `r` before a fault (or populate) installs them,
/// making room first when the budget is full: by evicting a batch of the
/// region's pages from this thread (`may_evict`), else by sleeping until
/// pages are uncharged (`may_wait`). A caller that may do neither (a
/// handler thread: the evictor's zaps need it to read REMOVE events) gets
/// `false` after asking the evictors for room, and defers the fault.
/// After [`ROOM_STALL`] without any page uncharged (nothing can be
/// evicted: everything pinned, or held because the store refuses writes)
/// the pages are charged past the budget and counted as an overrun.
pub(crate) fn charge(r: &RegionState, n: usize, may_evict: bool, may_wait: bool) -> bool {
    let feed = feed(r);
    let core = feed.core();
    if core.try_charge(n) {
        return true;
    }
    if !may_wait {
        core.ask_for_room();
        return false;
    }
    feed.full_faults.fetch_add(1, Relaxed);
    let t0 = rdtsc();
    let batch = batch_for(core.max(), r.pages.size().bytes()).max(n);
    let mut progress_at = Instant::now();
    let charged = loop {
        if may_evict {
            let got = reclaim(r, batch, false);
            if got > 0 {
                feed.evicted_inline.fetch_add(got as u64, Relaxed);
                progress_at = Instant::now();
            }
            if core.try_charge(n) {
                break true;
            }
            if got > 0 {
                continue;
            }
        }
        // Nothing to evict here (or another thread holds the victim lock):
        // the evictors and other threads make room; sleep until they do.
        core.start_waiting();
        let seen = core.uncharged();
        core.wait_for_room(n, ROOM_NAP);
        core.stop_waiting();
        if core.try_charge(n) {
            break true;
        }
        if core.uncharged() != seen {
            progress_at = Instant::now();
        } else if progress_at.elapsed() > ROOM_STALL {
            break false;
        }
    };
    if !charged {
        core.force_charge(n);
        if feed.overruns.fetch_add(1, Relaxed) == 0 {
            report(|w| {
                let _ = write!(
                    w,
                    "region #{}: a fault waited {ROOM_STALL:?} for room in a full budget of {} pages \
                     and nothing was evicted (pinned pages, or dirty pages the store refuses); \
                     installing past the budget",
                    r.id,
                    core.max()
                );
            });
        }
    }
    feed.room_cycles
        .fetch_add(rdtsc().wrapping_sub(t0), Relaxed);
    true
}

/// Evicts up to `want` (at most [`BATCH`]) pages of `r`; returns how many
/// left memory. `blocking`: wait for the victim lock (the evictor thread);
/// otherwise return 0 when another thread holds it.
pub(crate) fn reclaim(r: &RegionState, want: usize, blocking: bool) -> usize {
    let feed = feed(r);
    let mut victims = [0usize; BATCH];
    let n = {
        let Some(mut st) = lock(feed, blocking) else {
            return 0;
        };
        pick(r, feed, &mut st, want.min(BATCH), &mut victims)
    };
    if n == 0 {
        return 0;
    }
    let mut failed: [Option<StoreError>; BATCH] = std::array::from_fn(|_| None);
    let evicted = evict_batch(r, feed, &mut victims[..n], &mut failed);
    if evicted < n {
        // Write-backs failed: hold those pages for a retry.
        let mut st = lock(feed, true).expect("victims are set up before eviction");
        for (&page, err) in victims[..n].iter().zip(failed.iter_mut()) {
            if let Some(e) = err.take() {
                hold(r, feed, &mut st, page, Some(e));
            }
        }
    }
    evicted
}

/// Drains the install log and the hints into the policy, then picks and
/// claims up to `want` victims into `out`. A dirty victim is held instead
/// (without trying) while the store is failing.
fn pick(
    r: &RegionState,
    feed: &BudgetFeed,
    st: &mut VictimState,
    want: usize,
    out: &mut [usize; BATCH],
) -> usize {
    feed.drain(|p| st.policy.on_fault(p));
    feed.drain_hints(|p| st.policy.on_access_hint(p));
    let mut n = 0;
    let mut skips = 0;
    while n < want && skips < 4 * want + 64 {
        // Pages whose claim is held (being faulted, dirtied or evicted) or
        // that an I/O holds are passed over this round.
        let held_by_io = |p| {
            let busy = r.residency.io_busy(p);
            if busy {
                feed.skipped_io_busy.fetch_add(1, Relaxed);
            }
            busy
        };
        let Some(v) = st
            .policy
            .pick_victim(&|p| r.residency.is_claimed(p) || held_by_io(p))
        else {
            break;
        };
        if !r.residency.try_claim(v) {
            skips += 1;
            if r.residency.get(v) != PageState::Absent {
                st.policy.on_fault(v);
            }
            continue;
        }
        if r.residency.io_busy(v) {
            // An I/O took a reference between the scan and the claim.
            feed.skipped_io_busy.fetch_add(1, Relaxed);
            r.residency.release(v..v + 1);
            st.policy.on_fault(v);
            skips += 1;
            continue;
        }
        match r.residency.get(v) {
            PageState::ReadOnly => {
                out[n] = v;
                n += 1;
            }
            PageState::Writable if st.retry_due.is_some() => {
                // The store is failing: do not try another write now.
                r.residency.release(v..v + 1);
                hold(r, feed, st, v, None);
            }
            PageState::Writable => {
                out[n] = v;
                n += 1;
            }
            // Dropped meanwhile: no longer resident, not tracked.
            PageState::Absent | PageState::Poisoned => {
                r.residency.release(v..v + 1);
                skips += 1;
            }
        }
    }
    n
}

/// Evicts the claimed `victims` (see the module docs) and releases their
/// claims. A victim whose write-back failed stays resident and dirty, with
/// its error in `failed` at its index. Returns the pages that left memory.
fn evict_batch(
    r: &RegionState,
    feed: &BudgetFeed,
    victims: &mut [usize],
    failed: &mut [Option<StoreError>; BATCH],
) -> usize {
    victims.sort_unstable();
    let mut dirty = [0usize; BATCH];
    let mut nd = 0;
    for &p in victims.iter() {
        if r.residency.get(p) == PageState::Writable {
            dirty[nd] = p;
            nd += 1;
        }
    }
    if nd > 0 {
        let mut out: [Result<(), StoreError>; BATCH] = std::array::from_fn(|_| Ok(()));
        write_back_batch(r, &dirty[..nd], &mut out[..nd]);
        for (&p, res) in dirty[..nd].iter().zip(out.iter_mut()) {
            if let Err(e) = std::mem::replace(res, Ok(())) {
                let i = victims.binary_search(&p).expect("a victim");
                failed[i] = Some(e);
            }
        }
    }
    // Drop every victim but the failed ones, runs of contiguous pages as
    // one range.
    let ps = r.pages.size().bytes();
    let mut runs = [const { 0..0 }; BATCH];
    let mut nr = 0;
    let mut prev: Option<usize> = None;
    for (i, &p) in victims.iter().enumerate() {
        if failed[i].is_some() {
            prev = None;
            continue;
        }
        if prev == Some(p.wrapping_sub(1)) {
            runs[nr - 1].end = p + 1;
        } else {
            runs[nr] = p..p + 1;
            nr += 1;
        }
        prev = Some(p);
    }
    if r.delivery.reads_events {
        // Handler threads read the REMOVE events: one run at a time, with
        // the handshake (only the evictor thread gets here).
        for run in &runs[..nr] {
            feed.zap(r, run.clone());
        }
    } else if nr > 0 {
        let mut ranges = [(0u64, 0usize); BATCH];
        for (range, run) in ranges.iter_mut().zip(&runs[..nr]) {
            *range = (r.pages.addr(run.start), run.len() * ps);
        }
        feed.zap_calls.fetch_add(1, Relaxed);
        if madvise_ranges(&ranges[..nr], Advice::DontNeed).is_err() {
            // Not expected (the ranges are mapped and ours); make sure
            // nothing is recorded absent that may still be mapped: drop
            // each range again on its own, whatever it costs.
            for &(addr, len) in &ranges[..nr] {
                feed.zap_calls.fetch_add(1, Relaxed);
                let _ = faultline_sys::mem::madvise(addr, len, Advice::DontNeed);
            }
        }
        for (i, &p) in victims.iter().enumerate() {
            if failed[i].is_none() {
                r.residency.set(p, PageState::Absent);
            }
        }
    }
    let mut evicted = 0;
    for (i, &p) in victims.iter().enumerate() {
        if failed[i].is_none() {
            feed.evicted_one();
            feed.reclaimed(p);
            evicted += 1;
        }
        r.residency.release(p..p + 1);
    }
    evicted
}

/// Writes the dirty `pages` (claimed by the caller, at most [`BATCH`] per
/// store call) back: write-protect, one store call, mark clean. `out[i]`
/// is `pages[i]`'s result; a page that failed is un-protected again and
/// stays dirty. Allocation-free.
pub(crate) fn write_back_batch(
    r: &RegionState,
    pages: &[usize],
    out: &mut [Result<(), StoreError>],
) {
    for (pages, out) in pages.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
        write_back_chunk(r, pages, out);
    }
}

fn write_back_chunk(r: &RegionState, pages: &[usize], out: &mut [Result<(), StoreError>]) {
    let feed = feed(r);
    let ps = r.pages.size().bytes();
    // Write-protect runs of contiguous pages with one ioctl each.
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 {
            j += 1;
        }
        if let Err(e) = write_protect(r, pages[i], j - i) {
            out[i..j].iter_mut().for_each(|o| *o = Err(e.clone()));
        }
        i = j;
    }
    let empty = WriteRange {
        offset: 0,
        data: &[],
    };
    let mut ranges = [empty; BATCH];
    let mut which = [0usize; BATCH];
    let mut n = 0;
    for (i, &page) in pages.iter().enumerate() {
        if out[i].is_err() {
            continue;
        }
        // SAFETY: the page is resident, dirty and write-protected under
        // our claim; we only read it while the store copies it.
        let data = unsafe { std::slice::from_raw_parts(r.pages.addr(page) as *const u8, ps) };
        ranges[n] = WriteRange {
            offset: r.pages.offset(page),
            data,
        };
        which[n] = i;
        n += 1;
    }
    if n == 0 {
        return;
    }
    let mut res: [Result<(), StoreError>; BATCH] = std::array::from_fn(|_| Ok(()));
    r.store.write_back_batch(&ranges[..n], &mut res[..n]);
    for (&i, res) in which[..n].iter().zip(res.iter_mut()) {
        let page = pages[i];
        match std::mem::replace(res, Ok(())) {
            Ok(()) => {
                r.residency.set(page, PageState::ReadOnly);
                feed.written_back.fetch_add(1, Relaxed);
            }
            Err(e) => {
                feed.write_back_errors.fetch_add(1, Relaxed);
                let _ = r
                    .uffd
                    .writeprotect(r.pages.addr(page), ps as u64, false, false);
                out[i] = Err(e);
            }
        }
    }
}

/// Write-protects `n` pages from `first` for their write-back. (DONTWAKE
/// is only valid when clearing protection.) EAGAIN: an event is pending
/// (handler threads read it soon); retry, bounded.
fn write_protect(r: &RegionState, first: usize, n: usize) -> Result<(), StoreError> {
    let (addr, len) = (r.pages.addr(first), r.pages.bytes(n) as u64);
    let mut tries = 0;
    loop {
        match r.uffd.writeprotect(addr, len, true, false) {
            Ok(()) => return Ok(()),
            Err(e) if e.is(Errno::EAGAIN) && tries < 2000 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => {
                return Err(StoreError::Io {
                    what: WP_WHAT
                        .get()
                        .cloned()
                        .unwrap_or_else(|| Arc::from("the region")),
                    op: "UFFDIO_WRITEPROTECT",
                    offset: r.pages.offset(first),
                    errno: Errno(e.errno()),
                })
            }
        }
    }
}

/// Holds dirty `page` (whose write-back failed with `err`, or was not
/// tried while the store fails) for a retry; says so once per failing
/// period.
fn hold(
    r: &RegionState,
    feed: &BudgetFeed,
    st: &mut VictimState,
    page: usize,
    err: Option<StoreError>,
) {
    feed.hold_unwritable(true);
    st.held.push_back(page);
    let Some(err) = err else { return };
    if st.retry_due.is_none() {
        let budget = feed.core().max();
        report(|w| {
            let _ = w.write_str("write-back failed at ");
            r.describe_page(page, w);
            let _ = write!(
                w,
                ": {err}; the page stays resident and dirty, write-backs are retried with \
                 backoff (up to {RETRY_MAX:?}), and the region may stay resident past its \
                 budget of {budget} pages until the store takes writes again"
            );
        });
    }
    backoff(st);
}

fn backoff(st: &mut VictimState) {
    st.retry_delay = match st.retry_due {
        None => RETRY_MIN,
        Some(_) => (st.retry_delay * 2).min(RETRY_MAX),
    };
    st.retry_due = Some(Instant::now() + st.retry_delay);
}

/// The evictor's housekeeping: drains the log and the hints into the
/// policy and, when a retry is due, tries the held pages oldest first
/// until one fails again (while the store fails, one probe per backoff
/// period, not a storm); pages written back go back to the policy.
pub(crate) fn retry_held(r: &RegionState) {
    let feed = feed(r);
    let Some(mut st) = lock(feed, true) else {
        return;
    };
    let st = &mut *st;
    feed.drain(|p| st.policy.on_fault(p));
    feed.drain_hints(|p| st.policy.on_access_hint(p));
    if st.retry_due.is_none_or(|d| Instant::now() < d) {
        return;
    }
    while let Some(p) = st.held.pop_front() {
        if !r.residency.try_claim(p) {
            // A fault or flush holds it: look again next round.
            st.held.push_front(p);
            backoff(st);
            return;
        }
        let res = match r.residency.get(p) {
            PageState::Writable => {
                let mut out = [Ok(())];
                write_back_batch(r, &[p], &mut out);
                let [res] = out;
                res
            }
            // Written back by `flush`, or dropped: not held any more.
            _ => Ok(()),
        };
        r.residency.release(p..p + 1);
        match res {
            Ok(()) => {
                feed.hold_unwritable(false);
                if r.residency.get(p) != PageState::Absent {
                    st.policy.on_fault(p);
                }
            }
            Err(_) => {
                st.held.push_front(p);
                backoff(st);
                return;
            }
        }
    }
    if st.retry_due.take().is_some() {
        report(|w| {
            let _ = write!(
                w,
                "region #{}: write-back works again; every held page was written back",
                r.id
            );
        });
    }
    st.retry_delay = RETRY_MIN;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches are bounded in pages and in bytes: 64 pages of 4 KiB, 4 of
    /// 64 KiB, one of 2 MiB; never more than a sixteenth of the budget,
    /// never none.
    #[test]
    fn batches_are_bounded_in_bytes() {
        assert_eq!(batch_for(6553, 4096), BATCH);
        assert_eq!(batch_for(409, 64 << 10), 4);
        assert_eq!(batch_for(2048, 64 << 10), 4);
        assert_eq!(batch_for(1 << 20, 2 << 20), 1);
        assert_eq!(batch_for(160, 4096), 10);
        assert_eq!(batch_for(3, 4096), 1);
        assert!(batch_for(409, 64 << 10) * (64 << 10) <= BATCH_BYTES);
    }
}
