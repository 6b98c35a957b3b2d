//! The one fault-resolution path every engine shares.
//!
//! Given a region and a faulting address:
//!
//! 1. Find the region page; a poisoned page is reported, never refilled.
//! 2. Claim the page (one bit in the residency map). A resolver that
//!    loses the claim backs off: another thread is installing the page.
//! 3. Fault-around: extend the claim over absent pages of the aligned
//!    window of `fault_around` region pages holding the fault, so one ioctl
//!    installs up to K pages.
//! 4. Get the bytes: nothing for ZEROPAGE, the store's zero-copy view, or
//!    the store's `fill` into the caller's scratch buffer, the page cache
//!    via the alias view (CONTINUE), or a pre-touched pool page (MOVE).
//! 5. One resolve ioctl (with DONTWAKE); record what it did in the
//!    residency map; release the claims; then, for thread engines, WAKE the
//!    sleeping faulting thread(s). The residency map therefore never
//!    claims a page present before it is mapped, and a thread that resumes
//!    from a fault always finds its page recorded. EEXIST means someone
//!    else installed the page: done (and a WAKE).
//! 6. A store error poisons the faulting page (`UFFDIO_POISON`) so the
//!    faulting thread gets SIGBUS instead of a zero page.
//!
//! Everything here is async-signal-safe when the store is: no allocation,
//! no locks, only atomics and syscalls.

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

use crate::region::{Bitset, Shared};
use crate::residency::PageState;
use crate::store::StoreError;
use crate::sys::uffd::{mode, Outcome, UffdError};
use crate::sys::{self, rdtsc};
use crate::ResolveOp;

/// What became of a fault.
#[derive(Debug)]
pub(crate) enum Resolution {
    /// The faulting page is installed (by us or by someone else).
    Resolved,
    /// Another resolver holds the page's claim: retry the access.
    Busy,
    /// An event is pending (EAGAIN): defer and retry later.
    Retry,
    /// The range is gone (ENOENT/ESRCH).
    Gone,
    /// The page was poisoned by an earlier store error.
    Poisoned,
    /// The store failed now; the page has been poisoned.
    StoreFailed(StoreError),
    /// An unexpected ioctl failure.
    Failed(UffdError),
}

/// Resolves the fault at `addr`. `wake`: issue UFFDIO_WAKE when the page
/// turns out to be there already (thread engines; the faulting thread is
/// asleep). `scratch`: a buffer of at least one region page for stores
/// without a zero-copy view.
pub(crate) fn resolve(
    r: &Shared,
    addr: u64,
    write: bool,
    wp: bool,
    wake: bool,
    scratch: &mut [u8],
    ahead: Option<&Bitset>,
) -> Resolution {
    let ps = r.page_size;
    let page = ((addr - r.base) / ps as u64) as usize;
    for _attempt in 0..8 {
        let state = r.residency.get(page);
        if r.evict.is_some() && write && (wp || state == PageState::ReadOnly) {
            // A write to a clean, write-protected page of a budget region.
            match mark_dirty(r, page, wake) {
                Some(res) => return res,
                None => continue,
            }
        }
        match state {
            PageState::Poisoned => return Resolution::Poisoned,
            PageState::ReadOnly | PageState::Writable => {
                // Thread engines learn of dropped pages through REMOVE
                // events, so a fault on a recorded page is a message that
                // raced with its resolution: wake and done. The signal
                // engine has no event reader: the page may have been
                // dropped behind our back (MADV_DONTNEED). For anonymous
                // memory mincore tells; for shmem/hugetlb (mincore reports
                // the page cache, not the mapping) re-install, which is
                // idempotent (EEXIST if it was there).
                let stale = r.signal_mode
                    && (r.kind != crate::MemoryKind::PrivateAnon
                        || !sys::mem::is_mapped(r.page_addr(page), ps));
                if !stale {
                    if wake {
                        let _ = r.uffd.wake(r.page_addr(page), ps as u64);
                    }
                    return Resolution::Resolved;
                }
                // Mark it absent under the claim, so a resolver that is
                // just finishing this page cannot be overwritten.
                if !r.residency.try_claim(page) {
                    return Resolution::Busy;
                }
                r.residency.set(page, PageState::Absent);
                r.residency.release(page..page + 1);
            }
            PageState::Absent => {}
        }
        if let Some(ev) = r.evict.as_ref().filter(|ev| ev.over_limit()) {
            if wake {
                // Thread engines: defer it. Waiting here would stall the
                // evictor, whose zap waits for this very thread to read the
                // REMOVE event.
                return Resolution::Retry;
            }
            ev.wait_below_limit();
        }
        if !r.residency.try_claim(page) {
            return Resolution::Busy;
        }
        if r.residency.get(page) != PageState::Absent {
            r.residency.release(page..page + 1);
            continue;
        }
        let run = claim_window(r, page, scratch.len());
        // Every ioctl runs with DONTWAKE: the faulting thread (thread
        // engines) is woken only after the residency map and counters
        // record the install, so a resumed thread always sees them.
        let step = install(r, run.clone(), page, write, scratch, ahead);
        if matches!(step, Step::Done) && write && r.evict.is_some() {
            // Installed clean; this fault is a write: dirty it now rather
            // than take a second (WP) fault on the retry.
            let _ = mark_dirty(r, page, false);
        }
        if wake {
            let woken = match &step {
                Step::Done => Some((r.page_addr(run.start), (run.len() * ps) as u64)),
                // A store failure is woken by the engine after it has
                // printed its message (the thread is about to die).
                Step::Exists => Some((r.page_addr(page), ps as u64)),
                _ => None,
            };
            if let Some((a, l)) = woken {
                let _ = r.uffd.wake(a, l);
            }
        }
        match step {
            Step::Done | Step::Exists => return Resolution::Resolved,
            Step::Again => continue,
            Step::Out(res) => return res,
        }
    }
    // Eight rounds of partial progress without reaching our page: let the
    // access retry (it will fault again and start over).
    Resolution::Busy
}

/// Extends the claim on `page` over the absent pages of its aligned
/// fault-around window, capped so the run fits the sources.
fn claim_window(r: &Shared, page: usize, scratch_len: usize) -> Range<usize> {
    let mut cap = usize::MAX;
    if r.needs_scratch() {
        cap = (scratch_len / r.page_size).max(1);
    }
    cap = cap.min(r.max_run_pages);
    // Adaptive read-ahead: a window starting at the fault, growing on a
    // sequential stream; otherwise the fixed, aligned fault-around window.
    let (win_start, k) = match r.readahead.as_ref() {
        Some(ra) => (page, ra.window_for(page).min(cap)),
        None => {
            let k = r.fault_around.max(1).min(cap);
            (page - page % k, k)
        }
    };
    if k == 1 {
        return page..page + 1;
    }
    let win_end = (win_start + k).min(r.pages);
    let mut end = page + 1;
    while end < win_end && r.residency.get(end) == PageState::Absent && r.residency.try_claim(end) {
        if r.residency.get(end) != PageState::Absent {
            r.residency.release(end..end + 1);
            break;
        }
        end += 1;
    }
    let mut start = page;
    while start > win_start
        && r.residency.get(start - 1) == PageState::Absent
        && r.residency.try_claim(start - 1)
    {
        if r.residency.get(start - 1) != PageState::Absent {
            r.residency.release(start - 1..start);
            break;
        }
        start -= 1;
    }
    start..end
}

enum Step {
    /// The faulting page is installed.
    Done,
    /// The faulting page already existed (EEXIST).
    Exists,
    /// Progress, but not on the faulting page: go round again.
    Again,
    /// Final answer.
    Out(Resolution),
}

/// Installs the claimed `run` (which contains `page`) and releases it.
fn install(
    r: &Shared,
    run: Range<usize>,
    page: usize,
    write: bool,
    scratch: &mut [u8],
    ahead: Option<&Bitset>,
) -> Step {
    let ps = r.page_size;
    let dst = r.page_addr(run.start);
    let bytes = (run.len() * ps) as u64;
    let offset = (run.start * ps) as u64;
    let mut state = PageState::Writable;

    let outcome: Result<Outcome, CopyErr> = match r.op {
        ResolveOp::Continue => {
            if let Err(e) = fill_page_cache(r, run.clone()) {
                return fail_store(r, run, page, e);
            }
            r.uffd
                .continue_(dst, bytes, mode::CONTINUE_DONTWAKE)
                .map_err(CopyErr::Uffd)
        }
        ResolveOp::Move => match r
            .pool
            .as_ref()
            .filter(|p| run.start.is_multiple_of(p.slot_pages()))
            .and_then(|p| p.take(run.len()))
        {
            Some(slots) => {
                let n = slots.pages;
                // Shrink the run to what the pool gave us.
                let moved_run = run.start..run.start + n;
                r.residency.release(moved_run.end..run.end);
                let src = slots.addr;
                if !r.store.is_zero() {
                    // SAFETY: the slots are ours (taken from the pool) and
                    // writable; nothing else references them.
                    let buf = unsafe { std::slice::from_raw_parts_mut(src as *mut u8, n * ps) };
                    if let Err(e) = r.store.fill(offset, buf) {
                        r.pool.as_ref().expect("pool").discard(slots);
                        return fail_store(r, moved_run, page, e);
                    }
                }
                // SAFETY: the source slots were prepared for this move and
                // are not referenced anywhere else.
                let out = unsafe {
                    r.uffd
                        .move_pages(dst, src, (n * ps) as u64, mode::MOVE_DONTWAKE)
                };
                let pool = r.pool.as_ref().expect("pool");
                if matches!(out, Ok(Outcome::Done(_))) {
                    pool.finish(slots);
                } else {
                    pool.discard(slots);
                }
                match out {
                    // EBUSY: the kernel could not take the source folio just
                    // now (locked, being split or migrated); nothing moved.
                    // Install this run with COPY instead.
                    Err(e) if e.errno() == libc::EBUSY => {
                        r.stats.pool_misses.fetch_add(1, Relaxed);
                        let bytes = (moved_run.len() * ps) as u64;
                        return match copy_run(r, &moved_run, dst, offset, bytes, scratch) {
                            Ok(o) => finish(r, moved_run, page, Ok(o), PageState::Writable, ahead),
                            Err(CopyErr::Uffd(e)) => {
                                finish(r, moved_run, page, Err(e), PageState::Writable, ahead)
                            }
                            Err(CopyErr::Store(e)) => fail_store(r, moved_run, page, e),
                        };
                    }
                    out => return finish(r, moved_run, page, out, PageState::Writable, ahead),
                }
            }
            None => {
                r.stats.pool_misses.fetch_add(1, Relaxed);
                copy_run(r, &run, dst, offset, bytes, scratch)
            }
        },
        ResolveOp::Copy | ResolveOp::Auto => {
            if r.evict.is_some() {
                state = PageState::ReadOnly;
            }
            if r.store.is_zero() && !write && r.zeropage_reads {
                state = PageState::ReadOnly;
                r.uffd
                    .zeropage(dst, bytes, mode::ZEROPAGE_DONTWAKE)
                    .map_err(CopyErr::Uffd)
            } else {
                copy_run(r, &run, dst, offset, bytes, scratch)
            }
        }
    };
    match outcome {
        Ok(out) => finish(r, run, page, Ok(out), state, ahead),
        Err(CopyErr::Uffd(e)) => finish(r, run, page, Err(e), state, ahead),
        Err(CopyErr::Store(e)) => fail_store(r, run, page, e),
    }
}

enum CopyErr {
    Store(StoreError),
    Uffd(UffdError),
}

impl From<UffdError> for CopyErr {
    fn from(e: UffdError) -> Self {
        CopyErr::Uffd(e)
    }
}

/// UFFDIO_COPY of the run from the cheapest source: the zero buffer, the
/// store's view, or the scratch buffer filled by the store.
fn copy_run(
    r: &Shared,
    run: &Range<usize>,
    dst: u64,
    offset: u64,
    bytes: u64,
    scratch: &mut [u8],
) -> Result<Outcome, CopyErr> {
    let src: *const u8 = if r.store.is_zero() {
        crate::region::zero_source(bytes as usize)
    } else if let Some(v) = r.store.view(offset, bytes as usize) {
        r.stats.zero_copy_fills.fetch_add(run.len() as u64, Relaxed);
        v.as_ptr()
    } else {
        let buf = &mut scratch[..bytes as usize];
        r.store.fill(offset, buf).map_err(CopyErr::Store)?;
        r.stats.store_fills.fetch_add(run.len() as u64, Relaxed);
        buf.as_ptr()
    };
    // Budget regions install pages write-protected (clean); the first write
    // takes a WP fault that marks them dirty.
    let wp = if r.evict.is_some() { mode::COPY_WP } else { 0 };
    // SAFETY: `src` points at `bytes` readable bytes: the zero buffer is at
    // least `bytes` long (max_run_pages caps runs), the view and the
    // scratch slice were checked to be that long.
    Ok(unsafe { r.uffd.copy(dst, src, bytes, mode::COPY_DONTWAKE | wp) }?)
}

/// Makes sure every page of `run` is in the shmem/hugetlb page cache,
/// filling it through the unregistered alias view.
fn fill_page_cache(r: &Shared, run: Range<usize>) -> Result<(), StoreError> {
    let ps = r.page_size;
    let alias = r
        .alias
        .as_ref()
        .expect("continue regions have an alias view");
    let cached = r
        .cached
        .as_ref()
        .expect("continue regions track the page cache");
    for p in run {
        if cached.get(p) {
            continue;
        }
        let off = p * ps;
        if r.store.is_zero() {
            // Allocate the page-cache page without writing a byte.
            sys::mem::madvise(alias.addr() + off as u64, ps, sys::mem::MADV_POPULATE_WRITE)
                .map_err(|e| StoreError::Failed {
                    offset: off as u64,
                    reason: std::borrow::Cow::Borrowed(e.op),
                })?;
        } else {
            // SAFETY: `off..off+ps` is inside the alias mapping, which is
            // not registered with userfaultfd and is only written here,
            // under the page's claim.
            let buf = unsafe { std::slice::from_raw_parts_mut(alias.as_ptr().add(off), ps) };
            r.store.fill(off as u64, buf)?;
            r.stats.store_fills.fetch_add(1, Relaxed);
        }
        cached.set(p);
    }
    Ok(())
}

/// Records the outcome of the ioctl over `run` and releases its claims.
fn finish(
    r: &Shared,
    run: Range<usize>,
    page: usize,
    out: Result<Outcome, UffdError>,
    state: PageState,
    ahead: Option<&Bitset>,
) -> Step {
    let ps = r.page_size;
    let t = rdtsc();
    r.timing_resolved.store(t, Relaxed);
    let step = match out {
        Ok(Outcome::Done(_) | Outcome::Partial { .. }) => {
            // COPY/MOVE stop at the first page that exists: a partial
            // result installed the first `done` bytes.
            let n = match out {
                Ok(Outcome::Partial { done, .. }) => done / ps,
                _ => run.len(),
            };
            let installed = run.start..run.start + n;
            r.residency.set_range(installed.clone(), state);
            r.stats.installed.fetch_add(n as u64, Relaxed);
            r.stats.ioctls.fetch_add(1, Relaxed);
            if let Some(ev) = r.evict.as_ref() {
                installed.clone().for_each(|p| ev.installed(p));
            }
            if let (Some(a), Some(feed)) = (ahead, r.feed.as_ref()) {
                installed.clone().for_each(|p| a.set(p));
                feed.populated.fetch_add(n as u64, Relaxed);
            }
            if page < installed.end {
                Step::Done
            } else {
                Step::Again
            }
        }
        Ok(Outcome::Exists) => {
            // The first page of the run exists already.
            r.residency.set(run.start, PageState::Writable);
            r.stats.exists.fetch_add(1, Relaxed);
            if page == run.start {
                Step::Exists
            } else {
                Step::Again
            }
        }
        Ok(Outcome::Retry) => {
            r.stats.retries.fetch_add(1, Relaxed);
            Step::Out(Resolution::Retry)
        }
        Ok(Outcome::Gone(_)) => {
            r.stats.gone.fetch_add(1, Relaxed);
            Step::Out(Resolution::Gone)
        }
        Err(e) => Step::Out(Resolution::Failed(e)),
    };
    r.residency.release(run);
    step
}

/// A store error: poison the faulting page so its thread gets SIGBUS, not
/// a zero page; release the rest of the run.
fn fail_store(r: &Shared, run: Range<usize>, page: usize, err: StoreError) -> Step {
    r.residency.set(page, PageState::Poisoned);
    r.stats.poisoned.fetch_add(1, Relaxed);
    r.last_poisoned.store(page as u64, Relaxed);
    let poisoned = r
        .uffd
        .poison(r.page_addr(page), r.page_size as u64, mode::POISON_DONTWAKE);
    r.residency.release(run);
    match poisoned {
        Err(e) => Step::Out(Resolution::Failed(e)),
        Ok(_) => Step::Out(Resolution::StoreFailed(err)),
    }
}

/// A write fault on a clean page of a budget region: un-protect it and
/// mark it dirty. `None`: the page changed state meanwhile, look again.
fn mark_dirty(r: &Shared, page: usize, wake: bool) -> Option<Resolution> {
    if !r.residency.try_claim(page) {
        // The evictor (or another resolver) holds it: retry the access.
        return Some(Resolution::Busy);
    }
    // A WP fault proves the page is mapped and protected, whatever the map
    // says; only an absent page goes back to the install path.
    if r.residency.get(page) == PageState::Absent {
        r.residency.release(page..page + 1);
        return None;
    }
    let (addr, ps) = (r.page_addr(page), r.page_size as u64);
    let res = match r.uffd.writeprotect(addr, ps, false, true) {
        Ok(()) => {
            r.residency.set(page, PageState::Writable);
            Resolution::Resolved
        }
        // An event (the evictor's REMOVE) is pending: defer, like COPY.
        Err(e) if e.errno() == libc::EAGAIN => Resolution::Retry,
        Err(e) => Resolution::Failed(e),
    };
    r.residency.release(page..page + 1);
    if wake && matches!(res, Resolution::Resolved) {
        let _ = r.uffd.wake(addr, ps);
    }
    Some(res)
}
