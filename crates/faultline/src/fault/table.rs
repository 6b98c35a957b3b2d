//! The process-wide region table: which region holds a faulting address.
//!
//! Engines find the region of a fault through [`enter`]: a lock-free
//! lookup in a [`SnapshotTable`] (so the SIGBUS handler can use it) that
//! also counts a resolution in flight on the region and returns an
//! [`InFlight`] guard; the table's read guard is dropped before resolving.
//!
//! A region leaves the table through [`retire`]:
//!
//! 1. it is removed from the table (after the grace period no new handler
//!    can find it);
//! 2. the resolutions already in flight are drained (with a timeout), so
//!    faults being handled complete with real data;
//! 3. every page that is still absent is poisoned (`UFFDIO_POISON`; a run
//!    of 2 MiB or more is made inaccessible instead, `PROT_NONE`), then
//!    the range is woken and unregistered: a thread still blocked on a
//!    queued fault retries into a poison marker and gets SIGBUS (SIGSEGV
//!    in an inaccessible run). It never
//!    gets a zero page, which is what a plain UNREGISTER or close would
//!    hand it (silent data loss). Installed pages stay, so threads woken by
//!    the drained resolutions find their data.

use std::fmt::Write;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use super::report::StackWriter;
use super::RegionState;
use crate::error::{Error, Result};
use crate::interval::SnapshotTable;
use crate::residency::PageState;
use faultline_sys::mem::Prot;
use faultline_sys::uffd::{mode, Outcome};

/// Address interval -> `*const RegionState`.
static TABLE: SnapshotTable<usize> = SnapshotTable::new();

/// A region in flight: the table guard is dropped, the region cannot be
/// retired until this is dropped.
pub(crate) struct InFlight<'a> {
    state: &'a RegionState,
}

impl std::ops::Deref for InFlight<'_> {
    type Target = RegionState;
    fn deref(&self) -> &RegionState {
        self.state
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.state.exit();
    }
}

/// Finds the region holding `addr` and marks a resolution in flight on it.
/// Async-signal-safe.
#[inline]
pub(crate) fn enter(addr: u64) -> Option<InFlight<'static>> {
    let g = TABLE.read();
    let ptr = g.lookup(addr)?.value as *const RegionState;
    // SAFETY: the table only holds pointers to live states; an entry is
    // removed (with a grace period) before its state is freed, and
    // `retire` waits for `inflight` to reach zero before freeing, so
    // counting ourselves in while the read guard is held keeps it alive.
    let state: &'static RegionState = unsafe { &*ptr };
    state.enter();
    drop(g);
    Some(InFlight { state })
}

/// Whether the region of table entry `value` was inherited from the
/// parent of a forked child: not mapped in this process (its entry is
/// stale here, a copy of the parent's table).
fn inherited(value: usize) -> bool {
    // SAFETY: the table only holds pointers to live states (a forked
    // child's copies of its parent's are never freed: see `retire`).
    unsafe { &*(value as *const RegionState) }.uffd.inherited()
}

/// Fails if `[start, start + len)` overlaps a published region.
pub(crate) fn check_free(start: u64, len: u64) -> Result<()> {
    let g = TABLE.read();
    match g
        .items()
        .iter()
        .find(|i| i.start < start + len && i.end > start && !inherited(i.value))
    {
        Some(o) => Err(Error::Overlap(crate::interval::IntervalError::Overlap {
            start,
            end: start + len,
            other_start: o.start,
            other_end: o.end,
        })),
        None => Ok(()),
    }
}

/// Publishes `state`: from now on faults in its range find it. The state
/// must stay at its address until [`retire`]d.
pub(crate) fn publish(state: &RegionState) -> Result<()> {
    let p = &state.pages;
    // A forked child may map its own region where its parent's was.
    let stale: Vec<(u64, u64)> = TABLE
        .read()
        .items()
        .iter()
        .filter(|i| i.start < p.end() && i.end > p.base() && inherited(i.value))
        .map(|i| (i.start, i.end))
        .collect();
    for (start, end) in stale {
        TABLE.remove(start, end);
    }
    TABLE
        .insert(p.base(), p.end(), state as *const RegionState as usize)
        .map_err(Error::Overlap)
}

/// Takes a published region out of the table and fails its remaining
/// faults closed (see the module docs), then frees the state — or, when a
/// resolution is still in flight after `drain_timeout`, leaks it with a
/// message (a stuck store must not become a use-after-free) and returns
/// `false`: the caller must then keep the region's address range mapped
/// (never reused: the resolution's copy, once its store answers, would
/// land in whatever was mapped there next).
pub(crate) fn retire(state: Box<RegionState>, drain_timeout: Duration) -> bool {
    if state.uffd.inherited() {
        // A forked child's copy of a parent's region: its userfaultfd
        // acts on the parent's memory (a poison or unregister from here
        // would break the parent's region), and no fault of this process
        // reaches it (not mapped here: `MADV_DONTFORK`). Nothing to undo;
        // its entry may already stand for a region of this process (see
        // `publish`), so it stays (and is skipped) rather than removed.
        std::mem::forget(state);
        return true;
    }
    let p = state.pages;
    TABLE.remove(p.base(), p.end());
    let deadline = Instant::now() + drain_timeout;
    let mut drained = true;
    while state.inflight.load(SeqCst) != 0 {
        if Instant::now() > deadline {
            drained = false;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    poison_absent(&state);
    let _ = state.uffd.wake(p.base(), p.len() as u64);
    let _ = state.uffd.unregister(p.base(), p.len() as u64);
    if !drained {
        let mut w = StackWriter::new();
        let _ = writeln!(
            w,
            "faultline: region #{} dropped with a resolution still in flight after {:?}; leaking its state and its address range",
            state.id, drain_timeout
        );
        faultline_sys::write_stderr(w.as_bytes());
        std::mem::forget(state);
    }
    drained
}

/// Absent runs at least this long are made inaccessible rather than
/// poisoned (see [`poison_absent`]).
const INACCESSIBLE_RUN: u64 = 2 << 20;

/// Poisons every absent page of the region (runs of absent pages in one
/// ioctl each), or makes a long run of them inaccessible. A page the map
/// thinks absent but that exists is skipped.
fn poison_absent(s: &RegionState) {
    let ps = s.pages.size().bytes() as u64;
    let n = s.pages.count();
    let mut p = 0;
    while p < n {
        if s.residency.get(p) != PageState::Absent {
            p += 1;
            continue;
        }
        let start = p;
        while p < n && s.residency.get(p) == PageState::Absent {
            p += 1;
        }
        let mut a = s.pages.addr(start);
        let end = s.pages.addr(p);
        // A long run is made inaccessible instead (one change of the
        // mapping, where a poison marker per page took 18 s for a 1 TiB
        // region): an access retries into SIGSEGV, as much a failure as
        // SIGBUS. Short ones are poisoned, so the mapping is not split
        // into a piece per run (the process has a limit of them; past
        // it, `mprotect` fails and the run is poisoned after all).
        if end - a >= INACCESSIBLE_RUN
            && faultline_sys::mem::mprotect(a, (end - a) as usize, Prot::NONE).is_ok()
        {
            continue;
        }
        let mut retries = 0;
        while a < end {
            match s.uffd.poison(a, end - a, mode::POISON_DONTWAKE) {
                Ok(Outcome::Done(_)) | Ok(Outcome::Gone(_)) | Err(_) => break,
                // Stopped at a page that exists: skip it.
                Ok(Outcome::Partial { done, .. }) => a += (done as u64).next_multiple_of(ps) + ps,
                Ok(Outcome::Exists) => a += ps,
                // An event is pending; it clears when its thread runs.
                Ok(Outcome::Retry) if retries < 1000 => {
                    retries += 1;
                    std::thread::sleep(Duration::from_micros(50));
                }
                Ok(Outcome::Retry) => a += ps,
            }
        }
    }
}
