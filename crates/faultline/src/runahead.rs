//! Run-ahead population: a background thread installs the pages a stream
//! of faults is about to touch, so those faults never happen (seed 004's
//! "parallelise the page allocation ahead of fault time", done in user
//! space).
//!
//! 1. Every fault delivered for the region (any engine) is posted to the
//!    region's feed: the page, a sequence number, and a futex wake if
//!    the populator sleeps. Posting is two atomics and at most one syscall,
//!    async-signal-safe.
//! 2. The populator thread feeds the faults to a
//!    [`crate::policy::StreamPredictor`] (sequential and
//!    strided streams) and resolves the predicted windows itself, through
//!    the same resolve path, from its own CPU. The budget bounds how far
//!    ahead of the last fault it goes.
//! 3. Pages it installs are marked in the region's `ahead` bitmap, so users
//!    can count faults avoided (`ahead` pages that were touched) and waste
//!    (`ahead` pages never touched).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use crate::policy::StreamPredictor;
use crate::region::{RegionThread, Shared};
use crate::residency::PageState;
use crate::resolve::resolve;
use crate::sys::thread::{futex_wait, futex_wake};

/// Run-ahead settings.
#[derive(Debug, Clone, Copy)]
pub struct RunAheadConfig {
    /// Most pages populated ahead of the last fault.
    pub budget_pages: usize,
}

impl Default for RunAheadConfig {
    fn default() -> Self {
        RunAheadConfig { budget_pages: 1024 }
    }
}

/// Run-ahead counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunAheadStats {
    /// Faults the populator looked at.
    pub faults_seen: u64,
    /// Windows it predicted.
    pub windows_predicted: u64,
    /// Pages it installed.
    pub pages_populated: u64,
}

/// Where faults are posted for the populator.
#[derive(Debug, Default)]
pub(crate) struct Feed {
    seq: AtomicU32,
    page: AtomicU64,
    sleeping: AtomicBool,
    pub faults_seen: AtomicU64,
    pub windows: AtomicU64,
    pub populated: AtomicU64,
}

impl Feed {
    /// Posts a fault at `page`. Async-signal-safe.
    #[inline]
    pub fn post(&self, page: usize) {
        self.page.store(page as u64, SeqCst);
        self.seq.fetch_add(1, SeqCst);
        if self.sleeping.load(SeqCst) {
            futex_wake(&self.seq);
        }
    }

    /// Wakes the populator whatever it waits for (to stop it).
    pub fn wake_all(&self) {
        self.seq.fetch_add(1, SeqCst);
        futex_wake(&self.seq);
    }

    pub fn stats(&self) -> RunAheadStats {
        RunAheadStats {
            faults_seen: self.faults_seen.load(Relaxed),
            windows_predicted: self.windows.load(Relaxed),
            pages_populated: self.populated.load(Relaxed),
        }
    }
}

/// Starts the populator thread of `shared` (a region with a feed).
pub(crate) fn start(
    shared: &Shared,
    cfg: RunAheadConfig,
    scratch_bytes: usize,
) -> std::io::Result<RegionThread> {
    RegionThread::spawn("faultline-runahead", shared, move |r, stop| {
        run(r, cfg, stop, scratch_bytes)
    })
}

fn run(r: &Shared, cfg: RunAheadConfig, stop: &AtomicBool, scratch_bytes: usize) {
    let feed = r.feed.as_ref().expect("run-ahead regions have a feed");
    let ahead = r
        .ahead
        .as_ref()
        .expect("run-ahead regions have an ahead map");
    let mut predictor = StreamPredictor::new(r.fault_around, cfg.budget_pages);
    let mut scratch = vec![0u8; scratch_bytes.max(r.page_size * r.fault_around.max(1))];
    let mut seen = feed.seq.load(SeqCst);
    while !stop.load(SeqCst) {
        let s = feed.seq.load(SeqCst);
        if s == seen {
            feed.sleeping.store(true, SeqCst);
            if feed.seq.load(SeqCst) == s {
                futex_wait(&feed.seq, s, Duration::from_millis(50));
            }
            feed.sleeping.store(false, SeqCst);
            continue;
        }
        seen = s;
        let page = feed.page.load(SeqCst) as usize;
        feed.faults_seen.fetch_add(1, Relaxed);
        for w in predictor.on_fault(page, r.pages) {
            feed.windows.fetch_add(1, Relaxed);
            // A newer fault moves the stream: re-predict from there.
            if feed.seq.load(SeqCst) != seen && stop.load(Relaxed) {
                break;
            }
            if r.residency.get(w.start) != PageState::Absent {
                continue;
            }
            // Installs the window (claims keep it exclusive with the
            // application's own faults) and marks it in `ahead`.
            let _ = resolve(
                r,
                r.page_addr(w.start),
                true,
                false,
                true,
                &mut scratch,
                Some(ahead),
            );
        }
    }
}
