//! What the thread engines (poll, spin, workers, per-cpu) share: their [`Serve`]
//! of the one handler loop (`handler.rs`), which looks a fault up in the
//! region table and resolves it under the stall watchdog's eye, and the
//! watchdog itself.
//!
//! A handler thread runs [`Handler::read`] over the engine's userfaultfd
//! (events first, then faults), retries its deferred faults between polls
//! ([`Handler::retry_deferred`]), and never stops serving: what it cannot
//! handle (a read or an ioctl failing in a way the runtime does not
//! understand, a panicking store) fails closed with a message.

use std::convert::Infallible;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handler::{settle, Action, Attempt, Handler, Serve};
use super::Counters;
use crate::background::Background;
use crate::fault::report::{fail_closed, report};
use crate::fault::resolve::{resolve, Access, Origin};
use crate::fault::table::enter;
use crate::page::PageSize;
use crate::residency::PageState;
use faultline_sys::rdtsc;
use faultline_sys::uffd::{Msg, Uffd, UffdError};

/// Which fault a handler thread is busy with, for the watchdog.
#[derive(Debug, Default)]
pub(crate) struct BusySlot {
    /// Nanoseconds since the engine's epoch when the current resolution
    /// started; 0 when idle.
    since: AtomicU64,
    addr: AtomicU64,
}

/// A thread engine's faults: found in the region table (no owner to
/// keep), resolved with the thread's scratch buffer.
pub(crate) struct Local {
    pub uffd: Arc<Uffd>,
    pub counters: Arc<Counters>,
    pub slot: Arc<BusySlot>,
    pub epoch: Instant,
    scratch: Vec<u8>,
}

/// A thread engine's handler.
pub(crate) type LocalHandler = Handler<Local>;

impl Local {
    pub fn new(
        uffd: Arc<Uffd>,
        counters: Arc<Counters>,
        slot: Arc<BusySlot>,
        epoch: Instant,
        scratch_bytes: usize,
    ) -> Self {
        Local {
            uffd,
            counters,
            slot,
            epoch,
            scratch: vec![0u8; scratch_bytes],
        }
    }
}

impl Serve for Local {
    type Owner = ();
    type Stop = Infallible;

    fn uffd<'a>(&'a self, _: &'a ()) -> &'a Uffd {
        &self.uffd
    }

    fn batch_read(&self, _: &(), _: usize) {
        self.counters.reads.fetch_add(1, Relaxed);
    }

    fn event(&mut self, _: &(), m: Msg) {
        self.counters.events.fetch_add(1, Relaxed);
        if let Msg::Remove { start, end } = m {
            on_remove(start, end);
        }
    }

    fn fault(
        &mut self,
        _: &(),
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Action<Infallible> {
        if attempt != Attempt::Retry {
            self.counters.faults.fetch_add(1, Relaxed);
        }
        let Some(r) = enter(addr) else {
            // Not (or no longer) ours: the region is being torn down. Wake
            // the thread; it retries into its poison marker.
            let base = PageSize::BASE;
            let _ = self.uffd.wake(base.align_down(addr), base.bytes() as u64);
            return Action::Done;
        };
        let page = r.pages.index(addr);
        r.fault_seen(page, t0);
        self.slot.addr.store(addr, Relaxed);
        self.slot
            .since
            .store(self.epoch.elapsed().as_nanos() as u64 + 1, SeqCst);
        let access = Access::of_message(flags);
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
        settle(
            &r,
            page,
            res,
            |e| {
                report(|w| {
                    let _ = w.write_str("store error at ");
                    r.describe_page(page, w);
                    let _ = write!(
                        w,
                        ": {e}; the page is poisoned and the faulting thread gets SIGBUS"
                    );
                })
            },
            |e| {
                fail_closed(|w| {
                    let _ = write!(w, "resolving a fault failed ({e}) at ");
                    r.describe_page(page, w);
                })
            },
        )
    }

    fn deferred(&self, _: &()) {
        self.counters.deferred.fetch_add(1, Relaxed);
    }

    fn read_failed(&mut self, _: &(), e: UffdError) -> Infallible {
        fail_closed(|w| {
            let _ = write!(w, "reading the userfaultfd failed: {e}");
        })
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
    Background::spawn(format!("fl-wd-{name}"), move |stop| {
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
