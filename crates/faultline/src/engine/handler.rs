//! The one handler loop: what a thread that reads a userfaultfd does with
//! what it reads. The thread engines' handlers (poll, spin, workers, per-cpu:
//! `threaded.rs`) and the foreign engine's peer workers
//! (`foreign/engine.rs`) all run this code; they differ only in a
//! [`Serve`]: who owns a fault, how it is looked up and resolved, and how
//! what cannot be resolved is reported.
//!
//! ```text
//!   Handler::read ─► read(2) one batch of messages (under the serve's gate)
//!     1. events first ──────────────► Serve::event   (REMOVE: pages absent)
//!     2. then faults ───────────────► Serve::fault ─► resolve ─► settle ─► Action
//!          Action::Done   installed, gone, or its thread woken to retry
//!          Action::Defer  EAGAIN (an event is pending): into the deferred
//!                         queue, due in 50 us
//!          Action::Stop   the owner cannot be served: the serve decides
//!                         (a thread engine fails closed, a peer is dropped)
//!   Handler::retry_deferred ─► each due fault again (Attempt::Retry); one
//!          deferred again waits twice as long (at most 20 ms); returns when
//!          the next one is due, which bounds the caller's poll timeout
//! ```
//!
//! 1. **Events first.** The kernel returns a batch's faults before its
//!    events, but the thread that caused an event (`madvise`, the
//!    evictor's zap, a peer's balloon) is released as soon as the event is
//!    *read*: had the batch's faults been resolved first, one of them
//!    could re-install a page that the event then marks absent after the
//!    fact. A serve that installs pages from other threads too (a peer's
//!    prefetch helpers) passes a gate that [`Handler::read`] holds across
//!    the read and the events, so no such install is in flight meanwhile.
//! 2. **One `Resolution` → action.** [`settle`] is the only place that
//!    turns what the resolve path answered into what the handler does:
//!    nothing (resolved, gone), wake the thread so it retries (another
//!    resolver is busy on the page, or it is poisoned), defer (EAGAIN),
//!    report a store failure and wake the thread into its poison marker,
//!    or stop (an ioctl failed in a way the runtime does not understand).
//!    How a store failure and a stop are reported is the serve's: two
//!    closures.
//! 3. **One deferred queue.** [`DeferredFaults`] holds the faults put aside
//!    after EAGAIN, keyed by the fault's owner (nothing for a thread
//!    engine, whose faults are found in the region table; the peer for a
//!    peer worker), with a bounded exponential backoff.
//!
//! The serve is a type parameter: no dynamic dispatch, no allocation and
//! no atomic beyond the serve's own counters per fault. (The signal engine
//! resolves on the faulting thread, inside its SIGBUS handler, and reads no
//! messages: it does not run this loop.)

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::fault::resolve::Resolution;
use crate::fault::RegionState;
use crate::store::StoreError;
use faultline_sys::rdtsc;
use faultline_sys::uffd::{Msg, Uffd, UffdError, UffdMsg};

/// First delay before a deferred fault is retried.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_micros(50);
/// Longest delay between two retries of a deferred fault.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_millis(20);

/// How a fault reached [`Serve::fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Read from the userfaultfd by this handler.
    Read,
    /// Read by another handler and handed to this one (workers).
    Handed,
    /// Deferred earlier after EAGAIN, tried again (not a new fault).
    Retry,
}

/// What is left to do with a fault after the resolve path.
#[derive(Debug)]
pub(crate) enum Action<S> {
    /// Nothing: installed, gone, or its thread woken to retry.
    Done,
    /// An event is pending (EAGAIN): retry later.
    Defer,
    /// The fault's owner cannot be served any more, and why.
    Stop(S),
}

/// Turns a [`Resolution`] of `page` of `r` into what the handler still
/// has to do (see the module docs). Wakes the faulting thread where it
/// must retry the access; `store_failed` reports a store error (the page
/// is poisoned; its thread is woken into the marker after the report),
/// `failed` turns an ioctl failure into the serve's stop.
#[inline]
pub(crate) fn settle<S>(
    r: &RegionState,
    page: usize,
    res: Resolution,
    store_failed: impl FnOnce(StoreError),
    failed: impl FnOnce(UffdError) -> S,
) -> Action<S> {
    let wake = || {
        let _ = r
            .uffd
            .wake(r.pages.addr(page), r.pages.size().bytes() as u64);
    };
    match res {
        Resolution::Resolved | Resolution::Gone => Action::Done,
        Resolution::Busy | Resolution::Poisoned => {
            // Another resolver owns it, or it is poisoned: let the thread
            // retry (it re-faults or gets SIGBUS).
            wake();
            if matches!(res, Resolution::Busy) {
                r.stats
                    .busy
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Action::Done
        }
        Resolution::Retry => Action::Defer,
        Resolution::StoreFailed(e) => {
            store_failed(e);
            // Only now let the thread run into the poison marker.
            wake();
            Action::Done
        }
        Resolution::Failed(e) => Action::Stop(failed(e)),
    }
}

/// What differs between the handlers that run the loop.
pub(crate) trait Serve {
    /// Who a fault belongs to, kept with a deferred fault.
    type Owner: Clone;
    /// Why an owner can no longer be served.
    type Stop;
    /// The userfaultfd of `owner`'s faults.
    fn uffd<'a>(&'a self, owner: &'a Self::Owner) -> &'a Uffd;
    /// One `read(2)` of `owner`'s userfaultfd returned `n` messages
    /// (called before any of them is handled).
    fn batch_read(&self, owner: &Self::Owner, n: usize) {
        let _ = (owner, n);
    }
    /// A message other than a fault.
    fn event(&mut self, owner: &Self::Owner, m: Msg);
    /// Resolves the fault at `addr` (message flags `flags`, read at TSC
    /// `t0`) and [`settle`]s its resolution.
    fn fault(
        &mut self,
        owner: &Self::Owner,
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Action<Self::Stop>;
    /// A fault of `owner` was deferred (counted at every deferral).
    fn deferred(&self, owner: &Self::Owner);
    /// Reading `owner`'s userfaultfd failed.
    fn read_failed(&mut self, owner: &Self::Owner, e: UffdError) -> Self::Stop;
}

/// A fault put aside after EAGAIN.
#[derive(Debug)]
struct Deferred<K> {
    owner: K,
    addr: u64,
    flags: u64,
    due: Instant,
    delay: Duration,
}

/// The faults put aside after EAGAIN, each due after its backoff: 50 us
/// the first time, doubling at every deferral up to 20 ms.
#[derive(Debug)]
pub(crate) struct DeferredFaults<K> {
    queue: VecDeque<Deferred<K>>,
}

impl<K> Default for DeferredFaults<K> {
    fn default() -> Self {
        DeferredFaults {
            queue: VecDeque::new(),
        }
    }
}

impl<K> DeferredFaults<K> {
    /// Puts a fault aside for the first time.
    fn defer(&mut self, owner: K, addr: u64, flags: u64) {
        self.queue.push_back(Deferred {
            owner,
            addr,
            flags,
            due: Instant::now() + BACKOFF_MIN,
            delay: BACKOFF_MIN,
        });
    }

    /// Puts a retried fault aside again, twice as long (bounded).
    fn again(&mut self, mut d: Deferred<K>) {
        d.delay = (d.delay * 2).min(BACKOFF_MAX);
        d.due = Instant::now() + d.delay;
        self.queue.push_back(d);
    }

    /// Forgets the faults of the owners `keep` refuses.
    fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.queue.retain(|d| keep(&d.owner));
    }

    /// How long from `now` until the next fault is due.
    fn next_due(&self, now: Instant) -> Option<Duration> {
        self.queue
            .iter()
            .map(|d| d.due.saturating_duration_since(now))
            .min()
    }
}

/// One handler's loop state: its serve, its message buffer and its
/// deferred faults. See the module docs.
pub(crate) struct Handler<S: Serve> {
    /// What this handler serves.
    pub serve: S,
    msgs: Vec<UffdMsg>,
    deferred: DeferredFaults<S::Owner>,
}

impl<S: Serve> Handler<S> {
    /// A handler reading up to `batch` messages per `read(2)`.
    pub fn new(serve: S, batch: usize) -> Self {
        Handler {
            serve,
            msgs: vec![UffdMsg::ZERO; batch.max(1)],
            deferred: DeferredFaults::default(),
        }
    }

    /// Messages one read takes at most: a read that returns fewer
    /// emptied the queue.
    pub fn batch(&self) -> usize {
        self.msgs.len()
    }

    /// Reads one batch of `owner`'s userfaultfd and hands its events, then
    /// its faults, to the serve; `gate` is held across the read and the
    /// events (see the module docs). Returns the number of messages read
    /// (0: nothing pending), or why `owner` cannot be served.
    pub fn read<G>(
        &mut self,
        owner: &S::Owner,
        gate: impl FnOnce() -> G,
    ) -> Result<usize, S::Stop> {
        let held = gate();
        let n = match self.serve.uffd(owner).read_msgs(&mut self.msgs) {
            Ok(n) => n,
            Err(e) => return Err(self.serve.read_failed(owner, e)),
        };
        if n > 0 {
            self.serve.batch_read(owner, n);
        }
        for m in self.msgs[..n].iter().map(UffdMsg::decode) {
            if !matches!(m, Msg::PageFault { .. }) {
                self.serve.event(owner, m);
            }
        }
        drop(held);
        for i in 0..n {
            if let Msg::PageFault { addr, flags, .. } = self.msgs[i].decode() {
                self.fault(owner, addr, flags, rdtsc(), Attempt::Read)?;
            }
        }
        Ok(n)
    }

    /// Serves one fault; defers it on EAGAIN.
    #[inline]
    pub fn fault(
        &mut self,
        owner: &S::Owner,
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Result<(), S::Stop> {
        match self.serve.fault(owner, addr, flags, t0, attempt) {
            Action::Done => Ok(()),
            Action::Defer => {
                self.serve.deferred(owner);
                self.deferred.defer(owner.clone(), addr, flags);
                Ok(())
            }
            Action::Stop(s) => Err(s),
        }
    }

    /// Retries the deferred faults that are due; returns how long until
    /// the next one is (`None`: none left), or the owner that cannot be
    /// served and why (its other deferred faults stay queued until
    /// [`Handler::forget`]).
    pub fn retry_deferred(&mut self) -> Result<Option<Duration>, (S::Owner, S::Stop)> {
        let now = Instant::now();
        for _ in 0..self.deferred.queue.len() {
            let d = self.deferred.queue.pop_front().expect("len checked");
            if d.due > now {
                self.deferred.queue.push_back(d);
                continue;
            }
            match self
                .serve
                .fault(&d.owner, d.addr, d.flags, rdtsc(), Attempt::Retry)
            {
                Action::Done => {}
                Action::Defer => {
                    self.serve.deferred(&d.owner);
                    self.deferred.again(d);
                }
                Action::Stop(s) => return Err((d.owner, s)),
            }
        }
        Ok(self.next_due())
    }

    /// How long until the next deferred fault is due.
    pub fn next_due(&self) -> Option<Duration> {
        self.deferred.next_due(Instant::now())
    }

    /// Forgets the deferred faults of the owners `keep` refuses (owners no
    /// longer served).
    pub fn forget(&mut self, keep: impl FnMut(&S::Owner) -> bool) {
        self.deferred.retain(keep);
    }
}

/// A `poll(2)` timeout in ms: until the next deferred fault is due (at
/// least 1 ms), at most `idle_ms`.
pub(crate) fn poll_timeout(next_due: Option<Duration>, idle_ms: i32) -> i32 {
    next_due.map_or(idle_ms, |d| (d.as_millis() as i32).clamp(1, idle_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_deferred_again_waits_twice_as_long_up_to_the_bound() {
        let mut q = DeferredFaults::default();
        q.defer(7u32, 0x1000, 0);
        let mut d = q.queue.pop_front().unwrap();
        assert_eq!(d.delay, BACKOFF_MIN);
        let mut delays = Vec::new();
        for _ in 0..12 {
            q.again(d);
            d = q.queue.pop_front().unwrap();
            delays.push(d.delay);
        }
        assert_eq!(delays[0], BACKOFF_MIN * 2);
        assert_eq!(delays[1], BACKOFF_MIN * 4);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*delays.last().unwrap(), BACKOFF_MAX);
        assert_eq!((d.owner, d.addr), (7, 0x1000));
    }

    #[test]
    fn forgetting_an_owner_drops_only_its_faults() {
        let mut q = DeferredFaults::default();
        for (owner, addr) in [(1u32, 0x1000), (2, 0x2000), (1, 0x3000)] {
            q.defer(owner, addr, 0);
        }
        q.retain(|&o| o != 1);
        let left: Vec<u64> = q.queue.iter().map(|d| d.addr).collect();
        assert_eq!(left, vec![0x2000]);
        assert!(q.next_due(Instant::now()).unwrap() <= BACKOFF_MIN);
    }

    #[test]
    fn poll_timeouts_follow_the_next_due_fault() {
        assert_eq!(poll_timeout(None, 200), 200);
        assert_eq!(poll_timeout(Some(Duration::ZERO), 200), 1);
        assert_eq!(poll_timeout(Some(Duration::from_millis(15)), 200), 15);
        assert_eq!(poll_timeout(Some(Duration::from_secs(5)), 200), 200);
    }
}
