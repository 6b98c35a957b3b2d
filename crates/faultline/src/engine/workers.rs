//! N handler threads, pinned to CPUs, all polling one userfaultfd: the
//! `workers` and `per-cpu` engines.
//!
//! `workers`: a fault belongs to the worker that owns its fault-around
//! window (the aligned block of the region's initial read-ahead window:
//! `hash(region, block) % N`), so one page is only ever resolved by one
//! worker and concurrent faults on a window never race (seed 000's
//! "forwarding to other cores", seed 003 §6.1's affinity-aware fault
//! scheduling). A worker that reads a message for another worker's window
//! hands it over through that worker's inbox and eventfd.
//!
//! `per-cpu`: one thread pinned on each CPU the creating thread may use,
//! each resolving what it reads, one message a `read(2)`. The kernel wakes
//! every thread asleep on the userfaultfd at a fault; the one on the
//! faulting thread's CPU runs as soon as that thread sleeps, with no wake-up
//! across CPUs (tens of microseconds on a VM without IPI virtualization:
//! RESULTS.md, "A handler on the faulting CPU"). Concurrent resolutions of
//! one window are settled by the residency map's claims, as the signal
//! engine's are. Every fault wakes every thread: on many CPUs, a herd.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use super::handler::{poll_timeout, Action, Attempt, Handler, Serve};
use super::threaded::Local;
use super::{EngineConfig, EngineKind, HandlerBody, ThreadCore, Threaded};
use crate::background::StopFlag;
use crate::error::{Error, Result};
use crate::fault::report::fail_closed;
use crate::fault::table::enter;
use faultline_sys::poll::poll_in;
use faultline_sys::thread::{pin_within, EventFd};
use faultline_sys::uffd::{Msg, Uffd, UffdError};

/// Faults handed to a worker by the others: (address, flags, TSC read).
struct Inbox {
    queue: Mutex<VecDeque<(u64, u64, u64)>>,
    bell: EventFd,
}

/// One worker's faults: its own are resolved as every thread engine's
/// ([`Local`]); with `shard`, a fault of another worker's window, read
/// here, goes to that worker's inbox.
struct Sharded {
    local: Local,
    me: usize,
    shard: bool,
    inboxes: Arc<Vec<Arc<Inbox>>>,
}

impl Serve for Sharded {
    type Owner = ();
    type Stop = Infallible;

    fn uffd<'a>(&'a self, owner: &'a ()) -> &'a Uffd {
        self.local.uffd(owner)
    }

    fn batch_read(&self, owner: &(), n: usize) {
        self.local.batch_read(owner, n)
    }

    fn event(&mut self, owner: &(), m: Msg) {
        self.local.event(owner, m)
    }

    fn fault(
        &mut self,
        owner: &(),
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Action<Infallible> {
        if self.shard && attempt == Attempt::Read {
            let to = shard_of(addr, self.inboxes.len());
            if to != self.me {
                self.local.counters.forwarded.fetch_add(1, Relaxed);
                let ib = &self.inboxes[to];
                ib.queue
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back((addr, flags, t0));
                ib.bell.notify();
                return Action::Done;
            }
        }
        self.local.fault(owner, addr, flags, t0, attempt)
    }

    fn deferred(&self, owner: &()) {
        self.local.deferred(owner)
    }

    fn read_failed(&mut self, owner: &(), e: UffdError) -> Infallible {
        self.local.read_failed(owner, e)
    }
}

/// Pinned, sharded worker threads. See the module docs.
pub struct WorkersEngine {
    core: ThreadCore,
    workers: usize,
}

fn shard_of(addr: u64, n: usize) -> usize {
    match enter(addr) {
        Some(r) => {
            let page = r.pages.index(addr);
            let window = (page / r.readahead.config().initial) as u64;
            let h = (r.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ window)
                .wrapping_mul(0xff51_afd7_ed55_8ccd);
            ((h >> 32) % n as u64) as usize
        }
        None => 0,
    }
}

impl WorkersEngine {
    /// With the default [`EngineConfig`] (one worker per CPU).
    pub fn new() -> Result<Arc<WorkersEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config` (`config.workers` threads).
    pub fn with_config(config: EngineConfig) -> Result<Arc<WorkersEngine>> {
        let n = config.workers.max(1);
        let core = ThreadCore::new(config)?;
        start(&core, n, true, |me, cpus| {
            cpus.get(me % cpus.len().max(1)).copied()
        })?;
        Ok(Arc::new(WorkersEngine { core, workers: n }))
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }
}

/// One handler thread pinned on each CPU, each resolving the faults it
/// reads. See the module docs.
pub struct PerCpuEngine {
    core: ThreadCore,
    threads: usize,
}

impl PerCpuEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> Result<Arc<PerCpuEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config`, but one message a `read(2)` (`config.batch` is
    /// ignored: a batch would take the other CPUs' faults) and one thread
    /// per CPU the calling thread may use (`config.workers` is ignored),
    /// pinned there unless `config.pin` is false.
    pub fn with_config(config: EngineConfig) -> Result<Arc<PerCpuEngine>> {
        let n = faultline_sys::thread::allowed_cpus()
            .map(|c| c.len())
            .unwrap_or_else(|_| faultline_sys::thread::online_cpus())
            .max(1);
        let core = ThreadCore::new(EngineConfig { batch: 1, ..config })?;
        start(&core, n, false, |me, cpus| cpus.get(me).copied())?;
        Ok(Arc::new(PerCpuEngine { core, threads: n }))
    }

    /// Number of handler threads (the CPUs it was created on).
    pub fn threads(&self) -> usize {
        self.threads
    }
}

impl Threaded for PerCpuEngine {
    const KIND: EngineKind = EngineKind::PerCpu;
    fn core(&self) -> &ThreadCore {
        &self.core
    }
}

/// Starts `n` handler threads over `core`'s userfaultfd, thread `me`
/// pinned (with `config.pin`) to the CPU `cpu(me, allowed CPUs)` picks;
/// `shard`: a fault of another thread's window is handed to it.
fn start(
    core: &ThreadCore,
    n: usize,
    shard: bool,
    cpu: fn(usize, &[usize]) -> Option<usize>,
) -> Result<()> {
    // Only sharded threads hand faults over (per-cpu threads resolve what
    // they read): no inbox, no eventfd, for them.
    let mut inboxes = Vec::new();
    for _ in 0..if shard { n } else { 0 } {
        inboxes.push(Arc::new(Inbox {
            queue: Mutex::new(VecDeque::new()),
            bell: EventFd::new().map_err(|e| Error::Io {
                op: "eventfd",
                source: e,
            })?,
        }));
    }
    let inboxes = Arc::new(inboxes);
    let mut slots = Vec::new();
    let mut bodies: Vec<HandlerBody> = Vec::new();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&*core.uffd);
    for me in 0..n {
        let sharded = Sharded {
            local: core.local(&mut slots),
            me,
            shard,
            inboxes: inboxes.clone(),
        };
        let mut h = Handler::new(sharded, core.config.batch);
        let wake = core.wake.clone();
        let pin = core.config.pin;
        bodies.push(Box::new(move |stop: &StopFlag| {
            if pin {
                let _ = pin_within(|cpus| cpu(me, cpus));
            }
            let mine = h.serve.inboxes.get(me).cloned();
            // Without an inbox, its slot polls nothing (a negative fd).
            let bell = mine.as_ref().map_or(-1, |ib| ib.bell.raw());
            let mut rev = [0i16; 3];
            let mut handed = VecDeque::new();
            while !stop.is_set() {
                let Ok(next_due) = h.retry_deferred();
                let timeout = poll_timeout(next_due, 1000);
                if let Err(e) = poll_in(&[fd, bell, wake.raw()], timeout, &mut rev) {
                    fail_closed(|w| {
                        use std::fmt::Write;
                        let _ = write!(w, "poll on the userfaultfd failed: {e}");
                    });
                }
                while let Ok(1..) = h.read(&(), || ()) {}
                let Some(mine) = &mine else { continue };
                mine.bell.drain();
                std::mem::swap(
                    &mut handed,
                    &mut *mine.queue.lock().unwrap_or_else(|p| p.into_inner()),
                );
                while let Some((addr, flags, t0)) = handed.pop_front() {
                    let Ok(()) = h.fault(&(), addr, flags, t0, Attempt::Handed);
                }
            }
        }));
    }
    let name = if shard { "workers" } else { "per-cpu" };
    core.start(name, bodies, slots)
}

impl Threaded for WorkersEngine {
    const KIND: EngineKind = EngineKind::Workers;
    fn core(&self) -> &ThreadCore {
        &self.core
    }
}
