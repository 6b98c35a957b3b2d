//! The one fault-resolution path every engine (and `populate`, and the
//! run-ahead populator) shares.
//!
//! Given a region and a page:
//!
//! 1. A poisoned page is reported, never refilled.
//! 2. With a memory budget, charge the page to it first; a full budget
//!    makes room ([`super::reclaim::charge`]: evict a batch on this
//!    thread, wait, or defer the fault to the evictor).
//! 3. Claim the page (one bit in the residency map). A resolver that
//!    loses the claim backs off: another thread is installing the page.
//!    Extend the claim over the absent pages of the window the request
//!    asks for: the read-ahead window of a fault
//!    ([`crate::policy::ReadaheadConfig`]), or the range being populated;
//!    one ioctl installs them all. With a budget the rest of the window
//!    is charged too, or dropped when it does not fit.
//! 4. Get the bytes: nothing for ZEROPAGE, the store's zero-copy view, or
//!    the store's `fill` into the caller's scratch buffer, the page cache
//!    via the alias view (CONTINUE), or a pre-touched pool frame (MOVE).
//! 5. One resolve ioctl (with DONTWAKE); record what it did in the
//!    residency map and the feeds; release the claims; then, when the
//!    faulting thread sleeps ([`Delivery::faulter_sleeps`]), WAKE it. The
//!    residency map therefore never claims a page present before it is
//!    mapped, and a thread that resumes from a fault always finds its page
//!    recorded. EEXIST means someone else installed the page: done (and a
//!    WAKE). With [`Delivery::wake_first`] (a peer's copy mode) a fault's
//!    window goes in two steps: the faulting page alone, its thread woken,
//!    then the rest of the window (still claimed) in up to two ioctls;
//!    what fails there only releases its claims. A peer's region holds
//!    the peer's copy gate shared around each install (`CopyGate`: no
//!    REMOVE is read meanwhile), a window copied from the store in pieces
//!    of a hold each, its thread woken once all are in.
//!
//!    Each step is stamped on the thread ([`stamps`]: bytes ready, ioctl
//!    returned, wake returned), the foreign engine's phase samples.
//! 6. A store error poisons the faulting page (`UFFDIO_POISON`) so the
//!    faulting thread gets SIGBUS instead of a zero page.
//!
//! Everything here is async-signal-safe when the store is: no allocation,
//! no locks (but a peer's copy gate, never in a signal handler), only
//! atomics and system calls.
//!
//! [`Delivery::faulter_sleeps`]: super::Delivery::faulter_sleeps
//! [`Delivery::wake_first`]: super::Delivery::wake_first

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::feeds::BudgetFeed;
use super::holes::Holes;
use super::state::CopyGate;
use super::{reclaim, zero, RegionState};
use crate::error::{Error, Result};
use crate::page::{MemoryKind, PageSize, ResolveOp};
use crate::residency::PageState;
use crate::store::StoreError;
use faultline_sys::mem::Advice;
use faultline_sys::uffd::{mode, pagefault_flag, Outcome, UffdError};
use faultline_sys::{self as sys, rdtsc, Errno};

/// Who asks for a page, which decides the window installed with it.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// A fault: the region's read-ahead picks the window.
    Fault,
    /// `Region::populate`: the pages of this range.
    Populate(Range<usize>),
    /// The run-ahead populator: the pages of this range, recorded as
    /// installed ahead of any fault.
    RunAhead(Range<usize>),
}

/// The access that faulted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Access {
    /// A write (else a read).
    pub write: bool,
    /// A write-protect fault on a present page.
    pub wp: bool,
}

impl Access {
    /// A write fault on a missing page (what `populate` asks for).
    pub const WRITE: Access = Access {
        write: true,
        wp: false,
    };

    /// The access of a userfaultfd fault message with these `flags`.
    pub fn of_message(flags: u64) -> Access {
        Access {
            write: flags & pagefault_flag::WRITE != 0,
            wp: flags & pagefault_flag::WP != 0,
        }
    }
}

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

/// TSC stamps of the last [`resolve`] on this thread: where the
/// handler's part of a fault went (the foreign engine's phase samples,
/// `bench restore`'s phases). 0: the step did not happen (the page was
/// there, or a store failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stamps {
    /// The bytes were ready (store read, page cache filled): the install
    /// ioctl of the faulting page's run was about to start.
    pub filled: u64,
    /// That ioctl returned.
    pub resolved: u64,
    /// The faulting thread's `UFFDIO_WAKE` returned (0: not woken here).
    pub woken: u64,
    /// Pages that ioctl installed.
    pub pages: u64,
}

impl Stamps {
    const ZERO: Stamps = Stamps {
        filled: 0,
        resolved: 0,
        woken: 0,
        pages: 0,
    };
}

thread_local! {
    /// This thread's [`Stamps`] (a const-initialised cell: no allocation,
    /// safe in the signal engine's handler).
    static STAMPS: Cell<Stamps> = const { Cell::new(Stamps::ZERO) };
}

/// The stamps of this thread's last [`resolve`].
pub(crate) fn stamps() -> Stamps {
    STAMPS.get()
}

/// Stamps the first install ioctl of this resolve as about to start
/// (when the region stamps, [`Delivery::stamps`]).
///
/// [`Delivery::stamps`]: super::Delivery::stamps
#[inline]
fn stamp_filled(r: &RegionState) {
    if !r.delivery.stamps {
        return;
    }
    let mut s = STAMPS.get();
    if s.filled == 0 {
        s.filled = rdtsc();
        STAMPS.set(s);
    }
}

/// Resolves `page` of `r` for `access`, with the window `origin` asks
/// for. `scratch`: a buffer of at least one region page for stores
/// without a zero-copy view (its length caps the window).
pub(crate) fn resolve(
    r: &RegionState,
    page: usize,
    access: Access,
    origin: &Origin,
    scratch: &mut [u8],
) -> Resolution {
    let wake = r.delivery.faulter_sleeps;
    let ps = r.pages.size().bytes();
    let mut access = access;
    if r.delivery.stamps {
        STAMPS.set(Stamps::ZERO);
    }
    if r.written.is_some() && !matches!(origin, Origin::Fault) {
        // Dirty tracking counts a fault's writes only: populate, prefetch
        // and run-ahead install their pages clean (write-protected).
        access.write = false;
    }
    for _attempt in 0..8 {
        let state = r.residency.get(page);
        if r.write_protects() && access.write && (access.wp || state == PageState::ReadOnly) {
            // A write to a clean, write-protected page of a budget region
            // (or of a tracked one).
            match mark_dirty(r, page, wake) {
                Some(res) => return res,
                // The map says absent. A WP fault says the page was mapped
                // when it faulted; it may have been evicted since, or the
                // map may be stale. Take the install path as for a missing
                // page: COPY installs it, or answers EEXIST if it is there
                // (then the retried write faults again and is un-protected).
                // Asking `mark_dirty` again would only find it absent again.
                None => {
                    access.wp = false;
                    continue;
                }
            }
        }
        match state {
            PageState::Poisoned => return repoison(r, page),
            PageState::ReadOnly | PageState::Writable => {
                // A missing fault on a page the map records as installed:
                // usually a message that raced with its resolution (wake
                // and done). But the map may be stale. Without an event
                // reader the page may have been dropped behind our back
                // (MADV_DONTNEED). With one, a REMOVE is read *before* the
                // kernel zaps its range (the madvise caller waits for the
                // event to be read, then zaps), so a page installed in
                // between is recorded present and then dropped. For
                // anonymous memory of this process mincore tells. For
                // shmem/hugetlb (mincore reports the page cache, not the
                // mapping) without events, re-install, which is idempotent
                // (EEXIST if it was there). Local shmem/hugetlb with events
                // keeps the first reading (a shared mapping's page cache
                // outlives the zap, so its next touch does not fault); a
                // peer's handler tells stale pages itself (`crate::foreign`:
                // the same page faulting twice as present).
                let stale = !access.wp
                    && if r.delivery.memory_here && r.kind == MemoryKind::PrivateAnon {
                        !sys::mem::is_mapped(r.pages.addr(page), ps)
                    } else {
                        !r.delivery.reads_events
                    };
                if !stale {
                    if wake {
                        let _ = r.uffd.wake(r.pages.addr(page), ps as u64);
                    }
                    return Resolution::Resolved;
                }
                // Mark it absent under the claim, so a resolver that is
                // just finishing this page cannot be overwritten.
                if !r.residency.try_claim(page) {
                    return Resolution::Busy;
                }
                // Under the claim, again: an eviction that zapped the page
                // (hence "not mapped") may have recorded it absent and
                // uncharged it between the look above and the claim;
                // counting it dropped too would uncharge it twice.
                if r.residency.get(page) == state {
                    r.residency.set(page, PageState::Absent);
                    if let Some(b) = &r.budget {
                        // It was charged when installed.
                        b.dropped_one();
                    }
                }
                r.residency.release(page..page + 1);
            }
            PageState::Absent => {}
        }
        // A budget: charge the faulting page before anything is claimed,
        // making room when the budget is full (see `reclaim::charge`): a
        // fault on its own thread and a populating thread may wait, and
        // evict themselves unless handler threads read the region's
        // events; a handler thread defers the fault (its engine retries
        // it) and asks the evictor. Run-ahead never makes room.
        let mut charge = Charge::new(r);
        if charge.feed.is_some() {
            let waits = match origin {
                Origin::Fault => r.delivery.on_faulting_thread,
                Origin::Populate(_) => true,
                Origin::RunAhead(_) => false,
            };
            let evicts = waits && !r.delivery.reads_events;
            if matches!(origin, Origin::RunAhead(_)) {
                if !charge.more(1) {
                    return Resolution::Retry;
                }
            } else if reclaim::charge(r, 1, evicts, waits) {
                charge.charged = 1;
            } else {
                return Resolution::Retry;
            }
        }
        if !r.residency.try_claim(page) {
            return Resolution::Busy;
        }
        if r.residency.get(page) != PageState::Absent {
            r.residency.release(page..page + 1);
            continue;
        }
        let window = window(r, page, origin, scratch.len());
        let mut run = claim_window(r, page, window.clone());
        if run.len() > 1 && !charge.more(run.len() - 1) {
            // No room for the read-ahead: the faulting page alone.
            r.residency.release(run.start..page);
            r.residency.release(page + 1..run.end);
            run = page..page + 1;
        }
        // The rest of the window goes in after the part holding the
        // faulting page, still claimed meanwhile: with wake first
        // (Delivery::wake_first) the faulting page alone, its thread woken,
        // then the rest; under a peer's copy gate, a run longer than a
        // hold's piece in pieces, the thread woken once all are in.
        let cuttable = r.budget.is_none()
            && matches!(r.op, ResolveOp::Copy | ResolveOp::Auto)
            && !r.batches_fills();
        let piece = r.copy_gate.as_ref().map_or(usize::MAX, |g| g.piece_pages);
        let mut rest = None;
        let mut wake_first = false;
        let whole = run.clone();
        if wake
            && r.delivery.wake_first
            && run.len() > 1
            && matches!(origin, Origin::Fault)
            && cuttable
        {
            rest = Some([run.start..page, page + 1..run.end]);
            run = page..page + 1;
            wake_first = true;
        } else if run.len() > piece && cuttable {
            let start = (page - page % piece).max(run.start);
            let end = (start + piece).min(run.end);
            rest = Some([run.start..start, end..run.end]);
            run = start..end;
        }
        // A batched store reads the window's holes before the install and
        // copies them after it: one hold of the copy gate for all of it.
        let held = r
            .copy_gate
            .as_ref()
            .filter(|_| r.batches_fills())
            .map(CopyGate::hold);
        let hold = || {
            r.copy_gate
                .as_ref()
                .filter(|_| held.is_none())
                .map(CopyGate::hold)
        };
        // A store that pays per request: the window's other absent holes
        // come in the same round trip (installed after the faulting run).
        let mut holes = Holes::NONE;
        let mut prefilled = None;
        if r.batches_fills() && charge.more(window.len().saturating_sub(run.len())) {
            holes = Holes::claim(r, window, &run);
            if !holes.is_empty() {
                prefilled = Some(holes.fill(r, &run, scratch));
            }
        }
        // Every ioctl runs with DONTWAKE: a sleeping faulting thread is
        // woken only after the residency map and counters record the
        // install, so a resumed thread always sees them.
        let ahead = matches!(origin, Origin::RunAhead(_));
        let run_pages = run.len();
        let installed = &mut charge.installed;
        let before = *installed;
        let gate = hold();
        let mut step = install(
            r,
            run.clone(),
            page,
            access.write,
            scratch,
            ahead,
            prefilled,
            installed,
        );
        if let Step::Narrowed = step {
            // The store failed somewhere in the window: only the faulting
            // page's own failure may poison it.
            run = page..page + 1;
            step = install(
                r,
                run.clone(),
                page,
                access.write,
                scratch,
                ahead,
                None,
                installed,
            );
        }
        drop(gate);
        // What the run's copies installed (a copy stops at a page that
        // exists: not always the whole run).
        let run_installed = *installed - before;
        if matches!(step, Step::Done) && access.write && r.write_protects() {
            if r.residency.get(page) == PageState::ReadOnly {
                // Installed clean (with its read-ahead window); this fault
                // is a write: dirty it now rather than take a second (WP)
                // fault on the retry.
                let _ = mark_dirty(r, page, false);
            } else {
                // Installed alone and writable (a write fault's own page).
                r.note_write(page);
            }
        }
        let placed = matches!(step, Step::Done | Step::Exists);
        let mut rest_installed = 0;
        if !wake_first {
            rest_installed =
                install_parts(r, rest.take(), placed, piece, ahead, scratch, installed);
        }
        if wake {
            let woken = match &step {
                // The whole window (cut in pieces or not), but the faulting
                // page alone when the rest goes in after the wake.
                Step::Done => {
                    let all = if wake_first { &run } else { &whole };
                    Some((r.pages.addr(all.start), r.pages.bytes(all.len()) as u64))
                }
                // A store failure is woken by the engine after it has
                // printed its message (the thread is about to die).
                Step::Exists => Some((r.pages.addr(page), ps as u64)),
                _ => None,
            };
            if let Some((a, l)) = woken {
                let _ = r.uffd.wake(a, l);
                if r.delivery.stamps {
                    let mut s = STAMPS.get();
                    s.woken = rdtsc();
                    STAMPS.set(s);
                }
            }
        }
        rest_installed += install_parts(r, rest, placed, piece, ahead, scratch, installed);
        let hole_state = r.clean_state();
        let mut around = match step {
            Step::Done if matches!(origin, Origin::Fault) => {
                run_installed.saturating_sub(1) + rest_installed
            }
            _ => 0,
        };
        for (hole, at) in holes.filled(run_pages, ps) {
            if matches!(origin, Origin::Fault) {
                around += hole.len();
            }
            let (dst, bytes) = (r.pages.addr(hole.start), r.pages.bytes(hole.len()) as u64);
            let clean = r.write_protects();
            let out = copy_run(
                r,
                &hole,
                dst,
                0,
                bytes,
                &mut scratch[at..],
                Some(Ok(())),
                clean,
            );
            let out = out.map_err(|e| match e {
                CopyErr::Uffd(e) => e,
                CopyErr::Store(_) => unreachable!("holes are filled already"),
            });
            finish(
                r,
                hole.clone(),
                hole.start,
                out,
                hole_state,
                ahead,
                installed,
            );
        }
        drop(held);
        if around > 0 {
            r.stats.around.fetch_add(around as u64, Relaxed);
        }
        match step {
            Step::Done | Step::Exists => return Resolution::Resolved,
            Step::Again => continue,
            Step::Out(res) => return res,
            Step::Narrowed => unreachable!("a one-page run is never narrowed"),
        }
    }
    // Eight rounds of partial progress without reaching our page: let the
    // access retry (it will fault again and start over).
    Resolution::Busy
}

/// Installs the `rest` of a fault's window (claimed, absent) after the
/// part holding its faulting page, in pieces of at most `piece` pages, a
/// hold of the copy gate each (with the gate's crew, if it has one, when
/// there are several); only releases the claims when that part was not
/// `placed`. Returns the pages installed.
fn install_parts(
    r: &RegionState,
    rest: Option<[Range<usize>; 2]>,
    placed: bool,
    piece: usize,
    ahead: bool,
    scratch: &mut [u8],
    installed: &mut usize,
) -> usize {
    let parts = rest.into_iter().flatten().filter(|p| !p.is_empty());
    if !placed {
        parts.for_each(|p| r.residency.release(p));
        return 0;
    }
    let piece = piece.max(1);
    let count: usize = parts.clone().map(|p| p.len().div_ceil(piece)).sum();
    let pieces = parts.flat_map(|p| {
        (p.start..p.end)
            .step_by(piece)
            .map(move |s| s..p.end.min(s.saturating_add(piece)))
    });
    // The crew for several pieces (a batch is allocated: long windows
    // only); one piece, or none, on this thread alone.
    let crew = r.copy_gate.as_ref().and_then(|g| g.crew.get());
    if let Some(crew) = crew.filter(|_| count > 1) {
        let pieces: Vec<Range<usize>> = pieces.collect();
        let target = Target { r, ahead };
        let ctx = (&target as *const Target<'_>).cast::<()>();
        let n = crew.install(ctx, crew_piece, pieces, scratch);
        *installed += n;
        return n;
    }
    pieces
        .map(|p| install_piece(r, p, ahead, scratch, installed))
        .sum()
}

/// What a crew member installs into: the region, and whether the window
/// is run-ahead's (its pages counted as such: `finish`).
struct Target<'a> {
    r: &'a RegionState,
    ahead: bool,
}

/// A crew's install of one piece of the [`Target`] at `ctx` (the crew's
/// [`Run`](super::crew::Run)); a member's pieces are counted in the
/// region's `helped`.
///
/// # Safety
///
/// `ctx` points at a live `Target` (the poster's, which waits).
unsafe fn crew_piece(
    ctx: *const (),
    piece: Range<usize>,
    scratch: &mut [u8],
    member: bool,
) -> usize {
    // SAFETY: the caller's contract (`Crew::install` calls it only while
    // the poster, which borrows the region, waits).
    let t = unsafe { &*ctx.cast::<Target<'_>>() };
    let mut n = 0;
    install_piece(t.r, piece, t.ahead, scratch, &mut n);
    if member {
        t.r.stats.helped.fetch_add(1, Relaxed);
    }
    n
}

/// Installs one piece of a fault's window (its pages claimed and absent)
/// under the copy gate, if the region has one; returns the pages
/// installed (see [`install_rest`]).
fn install_piece(
    r: &RegionState,
    piece: Range<usize>,
    ahead: bool,
    scratch: &mut [u8],
    installed: &mut usize,
) -> usize {
    let _gate = r.copy_gate.as_ref().map(CopyGate::hold);
    install_rest(r, piece, ahead, scratch, installed)
}

/// Installs `part` of a fault's window after its faulting page (wake
/// first, or a piece under a copy gate): its pages are claimed and absent; whatever fails (a store
/// error, EAGAIN, EEXIST part-way) only releases the claims of what was
/// not installed, leaving those pages to their own faults (a neighbour's
/// failure never poisons a page). `ahead`: the window is run-ahead's,
/// its pages counted as populated ahead. Returns the pages installed.
fn install_rest(
    r: &RegionState,
    part: Range<usize>,
    ahead: bool,
    scratch: &mut [u8],
    installed: &mut usize,
) -> usize {
    let dst = r.pages.addr(part.start);
    let bytes = r.pages.bytes(part.len()) as u64;
    let offset = r.pages.offset(part.start);
    let before = *installed;
    // Not the faulting page: a tracked region installs it write-protected
    // (its first write is noted by the WP fault that follows).
    let clean = r.write_protects();
    let state = r.clean_state();
    let out = match copy_run(r, &part, dst, offset, bytes, scratch, None, clean) {
        Ok(out) => Ok(out),
        Err(CopyErr::Uffd(e)) => Err(e),
        Err(CopyErr::Store(_)) => {
            r.residency.release(part);
            return 0;
        }
    };
    let _ = finish(r, part.clone(), part.start, out, state, ahead, installed);
    *installed - before
}

/// Installs every absent page of `pages` from the calling thread (not a
/// fault), waiting up to `timeout` for pages other resolvers hold.
pub(crate) fn populate(
    r: &RegionState,
    pages: Range<usize>,
    scratch: &mut [u8],
    timeout: Duration,
) -> Result<()> {
    populate_where(r, pages, Access::WRITE, scratch, timeout, |s| {
        s == PageState::Absent
    })
}

/// Resolves every page of `pages` whose state `needs` says is not yet
/// good enough, as an `access` from the calling thread (not a fault):
/// `populate`, and the I/O API's fault workers (a device write into a
/// clean page of a budget region dirties it, as a write fault would).
pub(crate) fn populate_where(
    r: &RegionState,
    pages: Range<usize>,
    access: Access,
    scratch: &mut [u8],
    timeout: Duration,
    needs: impl Fn(PageState) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let origin = Origin::Populate(pages.clone());
    let poisoned = |p: usize| {
        Err(Error::Store(StoreError::Failed {
            offset: r.pages.offset(p),
            reason: "page was poisoned by an earlier store error".into(),
        }))
    };
    let mut p = pages.start;
    while p < pages.end {
        let state = r.residency.get(p);
        // Poisoned earlier: never data (an access gets SIGBUS, a system
        // call EFAULT), so never "populated".
        if state == PageState::Poisoned {
            return poisoned(p);
        }
        if !needs(state) {
            p += 1;
            continue;
        }
        match resolve(r, p, access, &origin, scratch) {
            Resolution::Resolved => p += 1,
            Resolution::Busy | Resolution::Retry => {
                if Instant::now() > deadline {
                    return Err(Error::Io {
                        op: "populate",
                        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                    });
                }
                std::thread::yield_now();
            }
            Resolution::Gone => {
                return Err(Error::Uffd(UffdError::gone("populate")));
            }
            Resolution::Poisoned => return poisoned(p),
            Resolution::StoreFailed(e) => return Err(Error::Store(e)),
            Resolution::Failed(e) => return Err(Error::Uffd(e)),
        }
    }
    Ok(())
}

/// The window `origin` asks for around `page`, capped so it fits the
/// sources.
fn window(r: &RegionState, page: usize, origin: &Origin, scratch_len: usize) -> Range<usize> {
    let n = r.pages.count();
    let want = match origin {
        Origin::Fault => r.readahead.window(page, n),
        Origin::Populate(w) | Origin::RunAhead(w) => w.start.min(page)..w.end.clamp(page + 1, n),
    };
    let mut cap = r.max_run_pages;
    if r.needs_scratch() {
        cap = cap.min((scratch_len / r.pages.size().bytes()).max(1));
    }
    // Too long for the sources: the cap-aligned piece of it holding the
    // fault.
    if want.len() > cap {
        let start = want.start + (page - want.start) / cap * cap;
        start..(start + cap).min(want.end)
    } else {
        want
    }
}

/// Extends the claim on `page` over the contiguous absent pages of
/// `window` around it.
fn claim_window(r: &RegionState, page: usize, window: Range<usize>) -> Range<usize> {
    let (win_start, win_end) = (window.start, window.end);
    if win_end - win_start <= 1 {
        return page..page + 1;
    }
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

/// The pages one attempt charged to its region's budget, and how many of
/// them it installed; the rest is uncharged when the attempt ends.
struct Charge<'a> {
    feed: Option<&'a BudgetFeed>,
    charged: usize,
    installed: usize,
}

impl<'a> Charge<'a> {
    fn new(r: &'a RegionState) -> Charge<'a> {
        Charge {
            feed: r.budget.as_ref(),
            charged: 0,
            installed: 0,
        }
    }

    /// Charges `n` more pages if they fit, without making room. Always
    /// true without a budget.
    fn more(&mut self, n: usize) -> bool {
        let Some(feed) = self.feed else { return true };
        if n == 0 || feed.core().try_charge(n) {
            self.charged += n;
            true
        } else {
            false
        }
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if let Some(feed) = self.feed {
            let core = feed.core();
            if self.installed > self.charged {
                // Pages logged installed beyond what this attempt charged
                // (a page found existing, EEXIST, while the map said
                // absent): charge them now, past the budget if need be,
                // so that each resident page is charged once and its
                // eviction uncharges only what was charged.
                core.force_charge(self.installed - self.charged);
            } else {
                core.uncharge(self.charged - self.installed);
            }
        }
    }
}

enum Step {
    /// The faulting page is installed.
    Done,
    /// The faulting page already existed (EEXIST).
    Exists,
    /// Progress, but not on the faulting page: go round again.
    Again,
    /// The store failed for a run of several pages: every claim but the
    /// faulting page's is released; install that page alone.
    Narrowed,
    /// Final answer.
    Out(Resolution),
}

/// Installs the claimed `run` (which contains `page`) and releases it;
/// adds the pages installed to `installed`.
#[allow(
    clippy::too_many_arguments,
    reason = "the fault's whole context, passed down one level"
)]
fn install(
    r: &RegionState,
    run: Range<usize>,
    page: usize,
    write: bool,
    scratch: &mut [u8],
    ahead: bool,
    prefilled: Option<Result<(), StoreError>>,
    installed: &mut usize,
) -> Step {
    // A private view of a tmpfs file (zero copy): page-cache pages are
    // mapped with CONTINUE, holes are filled from the store with COPY. One
    // ioctl does one or the other: keep the part of the run that agrees
    // with `page`.
    let (run, in_cache) = match (r.op, &r.alias, &r.cached) {
        (ResolveOp::Continue, None, Some(cached)) => {
            let hit = cached.get(page);
            let mut start = page;
            while start > run.start && cached.get(start - 1) == hit {
                start -= 1;
            }
            let mut end = page + 1;
            while end < run.end && cached.get(end) == hit {
                end += 1;
            }
            r.residency.release(run.start..start);
            r.residency.release(end..run.end);
            let (mut start, mut end) = (start, end);
            // Pages to copy from a store without a view go through the
            // scratch buffer (`copy_run`; a zero store copies from the
            // zero source): at most its length, the piece of the run
            // holding `page`.
            let ps = r.pages.size().bytes();
            let fits = (scratch.len() / ps).max(1);
            let (at, bytes) = (r.pages.offset(start), r.pages.bytes(end - start));
            if !hit && end - start > fits && !r.store.is_zero() && r.store.view(at, bytes).is_none()
            {
                let piece = start + (page - start) / fits * fits;
                r.residency.release(start..piece);
                r.residency.release((piece + fits).min(end)..end);
                (start, end) = (piece, (piece + fits).min(end));
            }
            (start..end, Some(hit))
        }
        _ => (run, None),
    };
    let ps = r.pages.size().bytes();
    let dst = r.pages.addr(run.start);
    let bytes = r.pages.bytes(run.len()) as u64;
    let offset = r.pages.offset(run.start);
    let mut state = PageState::Writable;
    // A tracked region maps page-cache pages write-protected too, except
    // the page of a write fault mapped alone (its write is noted at once).
    let continue_wp = if r.written.is_some() && !(write && run.len() == 1) {
        mode::CONTINUE_WP
    } else {
        0
    };

    let outcome: Result<Outcome, CopyErr> = match (r.op, in_cache) {
        (ResolveOp::Continue, Some(true)) => {
            // Mapped read-only into the private view: a write copies it.
            state = PageState::ReadOnly;
            stamp_filled(r);
            r.uffd
                .continue_(dst, bytes, mode::CONTINUE_DONTWAKE | continue_wp)
                .map_err(CopyErr::Uffd)
        }
        (ResolveOp::Continue, None) => {
            if let Err(e) = fill_page_cache(r, run.clone()) {
                return fail_store(r, run, page, e, ahead);
            }
            stamp_filled(r);
            if continue_wp != 0 {
                state = PageState::ReadOnly;
            }
            r.uffd
                .continue_(dst, bytes, mode::CONTINUE_DONTWAKE | continue_wp)
                .map_err(CopyErr::Uffd)
        }
        (ResolveOp::Move, _) => match r
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
                        if !moved_run.contains(&page) {
                            // The failure is a neighbour's, and this page's
                            // claim went with the shrink: start over.
                            r.residency.release(moved_run);
                            return Step::Again;
                        }
                        return fail_store(r, moved_run, page, e, ahead);
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
                    Err(e) if e.is(Errno::EBUSY) => {
                        r.stats.pool_misses.fetch_add(1, Relaxed);
                        let bytes = r.pages.bytes(moved_run.len()) as u64;
                        return match copy_run(
                            r, &moved_run, dst, offset, bytes, scratch, None, false,
                        ) {
                            Ok(o) => finish(
                                r,
                                moved_run,
                                page,
                                Ok(o),
                                PageState::Writable,
                                ahead,
                                installed,
                            ),
                            Err(CopyErr::Uffd(e)) => finish(
                                r,
                                moved_run,
                                page,
                                Err(e),
                                PageState::Writable,
                                ahead,
                                installed,
                            ),
                            Err(CopyErr::Store(e)) => fail_store(r, moved_run, page, e, ahead),
                        };
                    }
                    out => {
                        return finish(
                            r,
                            moved_run,
                            page,
                            out,
                            PageState::Writable,
                            ahead,
                            installed,
                        )
                    }
                }
            }
            None => {
                r.stats.pool_misses.fetch_add(1, Relaxed);
                copy_run(r, &run, dst, offset, bytes, scratch, None, false)
            }
        },
        (ResolveOp::Copy | ResolveOp::Auto, _) | (ResolveOp::Continue, Some(false)) => {
            // A budget (or tracked) region installs pages clean and
            // write-protected, except the page of a write fault installed
            // alone: dirty at once, no WP fault to follow.
            let clean = r.write_protects() && !(write && run.len() == 1);
            if clean {
                state = PageState::ReadOnly;
            }
            if r.store.is_zero() && !write && r.zeropage_reads {
                state = PageState::ReadOnly;
                stamp_filled(r);
                r.uffd
                    .zeropage(dst, bytes, mode::ZEROPAGE_DONTWAKE)
                    .map_err(CopyErr::Uffd)
            } else {
                copy_run(r, &run, dst, offset, bytes, scratch, prefilled, clean)
            }
        }
    };
    match outcome {
        Ok(out) => finish(r, run, page, Ok(out), state, ahead, installed),
        Err(CopyErr::Uffd(e)) => finish(r, run, page, Err(e), state, ahead, installed),
        Err(CopyErr::Store(e)) => fail_store(r, run, page, e, ahead),
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
/// store's view, or the scratch buffer filled by the store (`prefilled`:
/// already filled by a batched call, with this result); write-protected
/// when `clean` (a budget region's clean pages).
#[allow(
    clippy::too_many_arguments,
    reason = "the fault's whole context, passed down one level"
)]
fn copy_run(
    r: &RegionState,
    run: &Range<usize>,
    dst: u64,
    offset: u64,
    bytes: u64,
    scratch: &mut [u8],
    prefilled: Option<Result<(), StoreError>>,
    clean: bool,
) -> Result<Outcome, CopyErr> {
    let mut viewed = false;
    let src: *const u8 = if let Some(filled) = prefilled {
        filled.map_err(CopyErr::Store)?;
        scratch.as_ptr()
    } else if r.store.is_zero() {
        zero::source(bytes as usize)
    } else if let Some(v) = r.store.view(offset, bytes as usize) {
        r.stats.zero_copy_fills.fetch_add(run.len() as u64, Relaxed);
        viewed = true;
        v.as_ptr()
    } else {
        let buf = &mut scratch[..bytes as usize];
        r.store.fill(offset, buf).map_err(CopyErr::Store)?;
        r.stats.store_fills.fetch_add(run.len() as u64, Relaxed);
        buf.as_ptr()
    };
    // Budget regions install clean pages write-protected; the first write
    // takes a WP fault that marks them dirty.
    let wp = if clean { mode::COPY_WP } else { 0 };
    stamp_filled(r);
    // SAFETY: `src` points at `bytes` readable bytes: the zero buffer is at
    // least `bytes` long (max_run_pages caps runs), the view and the
    // scratch slice were checked to be that long.
    match unsafe { r.uffd.copy(dst, src, bytes, mode::COPY_DONTWAKE | wp) } {
        // The store's view could not be read (a file mapping whose file
        // was truncated since: past its end the mapping faults): ask the
        // store, whose fill says why, and the page is poisoned with that;
        // a failure of its own to explain stays the ioctl's. Not for a
        // peer's memory: serve kills a VM whose memory file shrank, saying
        // so, where a poisoned page would SIGBUS it first.
        Err(e)
            if viewed && e.is(Errno::EFAULT) && r.delivery.memory_here && !scratch.is_empty() =>
        {
            let step = scratch.len();
            let mut at = 0;
            while at < bytes as usize {
                let n = step.min(bytes as usize - at);
                r.store
                    .fill(offset + at as u64, &mut scratch[..n])
                    .map_err(CopyErr::Store)?;
                at += n;
            }
            Err(CopyErr::Uffd(e))
        }
        // The run's first page has a first base page mapped: a region page
        // of several base pages that an earlier copy stopped inside (a
        // pending event, EAGAIN after some base pages): map the rest of
        // it, or it would stay half mapped for good, its missing base
        // pages faulting for a page the map says is there. (A hugetlb page
        // is mapped whole or not at all.)
        Ok(Outcome::Exists)
            if r.pages.size().bytes() > PageSize::BASE.bytes() && r.kind != MemoryKind::Hugetlb =>
        {
            Ok(complete_page(r, dst, src, wp)?)
        }
        out => Ok(out?),
    }
}

/// Maps every base page of the region page at `dst` that is not mapped
/// yet, from `src` (`wp`: write-protected). `Exists` once the whole page
/// is mapped; `Retry` when an event is pending (the next attempt goes on
/// from there).
fn complete_page(r: &RegionState, dst: u64, src: *const u8, wp: u64) -> Result<Outcome, UffdError> {
    let base = PageSize::BASE.bytes();
    for at in (0..r.pages.size().bytes()).step_by(base) {
        // SAFETY: `src` holds the run's bytes, at least one region page
        // (`copy_run`'s contract), so `src + at` has `base` readable bytes.
        let out = unsafe {
            r.uffd.copy(
                dst + at as u64,
                src.add(at),
                base as u64,
                mode::COPY_DONTWAKE | wp,
            )
        }?;
        match out {
            Outcome::Done(_) | Outcome::Partial { .. } | Outcome::Exists => {}
            Outcome::Retry | Outcome::Gone(_) => return Ok(out),
        }
    }
    Ok(Outcome::Exists)
}

/// Makes sure every page of `run` is in the shmem/hugetlb page cache,
/// filling it through the unregistered alias view.
fn fill_page_cache(r: &RegionState, run: Range<usize>) -> Result<(), StoreError> {
    let ps = r.pages.size().bytes();
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
        let off = r.pages.offset(p) as usize;
        if r.store.is_zero() {
            // Allocate the page-cache page without writing a byte.
            sys::mem::madvise(alias.addr() + off as u64, ps, Advice::PopulateWrite).map_err(
                |e| StoreError::Failed {
                    offset: off as u64,
                    reason: std::borrow::Cow::Borrowed(e.op),
                },
            )?;
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

/// Records the outcome of the ioctl over `run` and releases its claims;
/// adds the pages installed to `installed` (the budget's charge).
fn finish(
    r: &RegionState,
    run: Range<usize>,
    page: usize,
    out: Result<Outcome, UffdError>,
    state: PageState,
    ahead: bool,
    installed_pages: &mut usize,
) -> Step {
    let ps = r.pages.size().bytes();
    let t = rdtsc();
    r.timing_resolved.store(t, Relaxed);
    if r.delivery.stamps {
        let mut s = STAMPS.get();
        if s.resolved == 0 {
            s.resolved = t;
            s.pages = match out {
                Ok(Outcome::Partial { done, .. }) => (done / ps) as u64,
                Ok(Outcome::Done(_)) => run.len() as u64,
                _ => 0,
            };
            STAMPS.set(s);
        }
    }
    let step = match out {
        Ok(Outcome::Done(_) | Outcome::Partial { .. }) => {
            // COPY/MOVE stop at the first page that exists: a partial
            // result installed the first `done` bytes.
            let n = match out {
                Ok(Outcome::Partial { done, .. }) => done / ps,
                _ => run.len(),
            };
            let installed = run.start..run.start + n;
            *installed_pages += n;
            r.residency.set_range(installed.clone(), state);
            r.stats.installed.fetch_add(n as u64, Relaxed);
            r.stats.ioctls.fetch_add(1, Relaxed);
            if let Some(budget) = r.budget.as_ref() {
                installed.clone().for_each(|p| budget.installed(p));
            }
            if let Some(feed) = r.runahead.as_ref().filter(|_| ahead) {
                installed.clone().for_each(|p| feed.ahead.set(p));
                feed.populated.fetch_add(n as u64, Relaxed);
            }
            if page < installed.end {
                Step::Done
            } else {
                Step::Again
            }
        }
        Ok(Outcome::Exists) => {
            // The first page of the run exists already (the map said
            // absent): record it, and with a budget charge and log it so
            // eviction knows it.
            r.residency.set(run.start, PageState::Writable);
            if let Some(budget) = r.budget.as_ref() {
                *installed_pages += 1;
                budget.installed(run.start);
            }
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

/// A store error. For a run of several pages, release all but the
/// faulting page and let the caller try that page alone (a read-ahead
/// window must not turn a neighbour's failure into this page's). For the
/// faulting page alone: poison it so its thread gets SIGBUS, not a zero
/// page. A run-ahead install (`ahead`) is a guess with no thread waiting:
/// it leaves the run absent, so the application's own fault asks the
/// store again and reports what fails (poisoned here, with no one to say
/// why, the access was a bare SIGBUS).
fn fail_store(
    r: &RegionState,
    run: Range<usize>,
    page: usize,
    err: StoreError,
    ahead: bool,
) -> Step {
    if ahead {
        r.residency.release(run);
        return Step::Out(Resolution::StoreFailed(err));
    }
    if run.len() > 1 {
        r.residency.release(run.start..page);
        r.residency.release(page + 1..run.end);
        return Step::Narrowed;
    }
    r.residency.set(page, PageState::Poisoned);
    r.stats.poisoned.fetch_add(1, Relaxed);
    let ps = r.pages.size().bytes() as u64;
    let poisoned = r.uffd.poison(r.pages.addr(page), ps, mode::POISON_DONTWAKE);
    r.residency.release(run);
    match poisoned {
        Err(e) => Step::Out(Resolution::Failed(e)),
        Ok(_) => Step::Out(Resolution::StoreFailed(err)),
    }
}

/// A fault on a page the map says is poisoned. The marker normally makes
/// the access SIGBUS without a fault, so a fault here means the marker is
/// missing: `UFFDIO_POISON` met a pending event (EAGAIN, the evictor's
/// REMOVE) when the store failed. Install it now (EEXIST: it was there,
/// the fault raced with it); `Retry` defers until the event is read.
/// Without this the thread re-faulted on a missing page for ever.
fn repoison(r: &RegionState, page: usize) -> Resolution {
    if !r.residency.try_claim(page) {
        return Resolution::Busy;
    }
    let ps = r.pages.size().bytes() as u64;
    let out = r.uffd.poison(r.pages.addr(page), ps, mode::POISON_DONTWAKE);
    r.residency.release(page..page + 1);
    match out {
        Ok(Outcome::Retry) => Resolution::Retry,
        Err(e) => Resolution::Failed(e),
        Ok(_) => Resolution::Poisoned,
    }
}

/// A write fault on a clean page of a budget (or tracked) region:
/// un-protect it and mark it dirty. `None`: the page changed state meanwhile, look again.
fn mark_dirty(r: &RegionState, page: usize, wake: bool) -> Option<Resolution> {
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
    let (addr, ps) = (r.pages.addr(page), r.pages.size().bytes() as u64);
    // Noted before the page can be written: a dirty set read meanwhile
    // never misses a write that lands.
    r.note_write(page);
    let res = match r.uffd.writeprotect(addr, ps, false, true) {
        Ok(()) => {
            r.residency.set(page, PageState::Writable);
            Resolution::Resolved
        }
        // An event (the evictor's REMOVE) is pending: defer, like COPY.
        Err(e) if e.is(Errno::EAGAIN) => Resolution::Retry,
        Err(e) => Resolution::Failed(e),
    };
    r.residency.release(page..page + 1);
    if wake && matches!(res, Resolution::Resolved) {
        let _ = r.uffd.wake(addr, ps);
    }
    Some(res)
}
