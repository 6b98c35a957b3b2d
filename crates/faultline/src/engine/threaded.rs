//! What the thread engines (poll, spin, workers) share: reading message
//! batches, handling one fault, deferring on EAGAIN with bounded backoff,
//! the stall watchdog.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Counters;
use crate::background::Background;
use crate::fault::report::{fail_closed, report};
use crate::fault::resolve::{resolve, Access, Origin, Resolution};
use crate::fault::table::enter;
use crate::page::PageSize;
use crate::residency::PageState;
use faultline_sys::rdtsc;
use faultline_sys::uffd::{pagefault_flag, Msg, Uffd, UffdMsg};

/// First and maximum delay before retrying a deferred fault.
const BACKOFF_MIN: Duration = Duration::from_micros(50);
const BACKOFF_MAX: Duration = Duration::from_millis(20);

/// A fault put aside after EAGAIN.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deferred {
    pub addr: u64,
    pub flags: u64,
    due: Instant,
    delay: Duration,
}

/// Which fault a handler thread is busy with, for the watchdog.
#[derive(Debug, Default)]
pub(crate) struct BusySlot {
    /// Nanoseconds since the engine's epoch when the current resolution
    /// started; 0 when idle.
    since: AtomicU64,
    addr: AtomicU64,
}

/// One handler thread's state.
pub(crate) struct Handler {
    pub uffd: Arc<Uffd>,
    pub counters: Arc<Counters>,
    pub slot: Arc<BusySlot>,
    pub epoch: Instant,
    scratch: Vec<u8>,
    msgs: Vec<UffdMsg>,
    deferred: VecDeque<Deferred>,
}

impl Handler {
    pub fn new(
        uffd: Arc<Uffd>,
        counters: Arc<Counters>,
        slot: Arc<BusySlot>,
        epoch: Instant,
        scratch_bytes: usize,
        batch: usize,
    ) -> Self {
        Handler {
            uffd,
            counters,
            slot,
            epoch,
            scratch: vec![0u8; scratch_bytes],
            msgs: vec![UffdMsg::ZERO; batch.max(1)],
            deferred: VecDeque::new(),
        }
    }

    /// Reads one batch; calls `each` for every decoded message. Returns
    /// the number read (0: nothing pending).
    pub fn read_batch(&mut self, mut each: impl FnMut(&mut Self, Msg)) -> usize {
        let n = match self.uffd.read_msgs(&mut self.msgs) {
            Ok(n) => n,
            Err(e) => fail_closed(|w| {
                let _ = write!(w, "reading the userfaultfd failed: {e}");
            }),
        };
        if n > 0 {
            self.counters.reads.fetch_add(1, Relaxed);
        }
        // Events first. The kernel returns a batch's faults before its
        // events, but the thread that caused an event (madvise, the
        // evictor's zap) is released as soon as the event is *read*: had we
        // resolved the batch's faults first, one of them could re-install a
        // page that the event then marks absent after the fact.
        for faults in [false, true] {
            for i in 0..n {
                let m = self.msgs[i].decode();
                if matches!(m, Msg::PageFault { .. }) == faults {
                    each(self, m);
                }
            }
        }
        n
    }

    /// Handles a message that belongs to this handler.
    pub fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::PageFault { addr, flags, .. } => self.on_fault(addr, flags, rdtsc()),
            Msg::Remove { start, end } => {
                self.counters.events.fetch_add(1, Relaxed);
                on_remove(start, end);
            }
            _ => {
                self.counters.events.fetch_add(1, Relaxed);
            }
        }
    }

    /// Resolves one fault; defers it on EAGAIN.
    pub fn on_fault(&mut self, addr: u64, flags: u64, t0: u64) {
        self.counters.faults.fetch_add(1, Relaxed);
        let Some(r) = enter(addr) else {
            // Not (or no longer) ours: the region is being torn down. Wake
            // the thread; it retries into its poison marker.
            let base = PageSize::BASE.bytes() as u64;
            let _ = self.uffd.wake(addr & !(base - 1), base);
            return;
        };
        let page = r.pages.index(addr);
        let (page_addr, ps) = (r.pages.addr(page), r.pages.size().bytes() as u64);
        r.fault_seen(page, t0);
        self.slot.addr.store(addr, Relaxed);
        self.slot
            .since
            .store(self.epoch.elapsed().as_nanos() as u64 + 1, SeqCst);
        let access = Access {
            write: flags & pagefault_flag::WRITE != 0,
            wp: flags & pagefault_flag::WP != 0,
        };
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            resolve(&r, page, access, &Origin::Fault, &mut self.scratch)
        }));
        self.slot.since.store(0, SeqCst);
        let dt = rdtsc().wrapping_sub(t0);
        r.add_cycles(dt);
        self.counters.handler_cycles.fetch_add(dt, Relaxed);
        let res = match res {
            Ok(res) => res,
            Err(_) => fail_closed(|w| {
                let _ = w.write_str("a fault handler panicked while resolving ");
                r.describe_page(page, w);
            }),
        };
        match res {
            Resolution::Resolved | Resolution::Gone => {}
            Resolution::Busy | Resolution::Poisoned => {
                // Another resolver owns it, or it is poisoned: let the thread
                // retry (it re-faults or gets SIGBUS).
                let _ = self.uffd.wake(page_addr, ps);
                if matches!(res, Resolution::Busy) {
                    r.stats.busy.fetch_add(1, Relaxed);
                }
            }
            Resolution::Retry => {
                self.counters.deferred.fetch_add(1, Relaxed);
                self.deferred.push_back(Deferred {
                    addr,
                    flags,
                    due: Instant::now() + BACKOFF_MIN,
                    delay: BACKOFF_MIN,
                });
            }
            Resolution::StoreFailed(e) => {
                report(|w| {
                    let _ = w.write_str("store error at ");
                    r.describe_page(page, w);
                    let _ = write!(
                        w,
                        ": {e}; the page is poisoned and the faulting thread gets SIGBUS"
                    );
                });
                // Only now let the thread run into the poison marker.
                let _ = self.uffd.wake(page_addr, ps);
            }
            Resolution::Failed(e) => fail_closed(|w| {
                let _ = write!(w, "resolving a fault failed ({e}) at ");
                r.describe_page(page, w);
            }),
        }
    }

    /// Retries due deferred faults; returns how long until the next one
    /// is due (None when none are left).
    pub fn retry_deferred(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let n = self.deferred.len();
        for _ in 0..n {
            let d = self.deferred.pop_front().expect("len checked");
            if d.due > now {
                self.deferred.push_back(d);
                continue;
            }
            let before = self.deferred.len();
            self.on_fault(d.addr, d.flags, rdtsc());
            // Re-deferred: grow its backoff (bounded).
            if self.deferred.len() > before {
                let mut again = self.deferred.pop_back().expect("just pushed");
                again.delay = (d.delay * 2).min(BACKOFF_MAX);
                again.due = Instant::now() + again.delay;
                self.deferred.push_back(again);
            }
        }
        self.deferred
            .iter()
            .map(|d| d.due.saturating_duration_since(now))
            .min()
    }

    /// Poll timeout in ms given the deferred queue.
    pub fn timeout_ms(&mut self, idle_ms: i32) -> i32 {
        match self.retry_deferred() {
            Some(d) => (d.as_millis() as i32).max(1).min(idle_ms),
            None => idle_ms,
        }
    }
}

/// `MADV_DONTNEED`/`MADV_REMOVE` dropped `[start, end)`: those pages are
/// absent again.
fn on_remove(start: u64, end: u64) {
    let mut a = start;
    while a < end {
        let Some(r) = enter(a) else {
            a += PageSize::BASE.bytes() as u64;
            continue;
        };
        // Only whole region pages are known to be gone.
        let stop = end.min(r.pages.end());
        let pages = r.pages.within(a, stop);
        r.residency.set_range(pages.clone(), PageState::Absent);
        if let Some(budget) = r.budget.as_ref() {
            budget.removed(pages);
        }
        a = stop;
    }
}

/// The watchdog: aborts with a message when a handler is stuck in one
/// resolution for longer than `timeout`.
pub(crate) fn watchdog(
    name: &'static str,
    slots: Vec<Arc<BusySlot>>,
    epoch: Instant,
    timeout: Duration,
) -> std::io::Result<Background> {
    let tick = (timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    Background::spawn(format!("faultline-{name}-watchdog"), move |stop| {
        while !stop.is_set() {
            std::thread::park_timeout(tick);
            let now = epoch.elapsed().as_nanos() as u64;
            for slot in &slots {
                let since = slot.since.load(SeqCst);
                if since != 0 && now.saturating_sub(since) > timeout.as_nanos() as u64 {
                    let addr = slot.addr.load(Relaxed);
                    fail_closed(|w| {
                        let _ = write!(
                            w,
                            "{name} engine: resolving the fault at {addr:#x} has taken more than {timeout:?} (stalled store?)"
                        );
                        if let Some(r) = enter(addr) {
                            let _ = w.write_str(" in ");
                            r.describe_page(r.pages.index(addr), w);
                        }
                    });
                }
            }
        }
    })
}
