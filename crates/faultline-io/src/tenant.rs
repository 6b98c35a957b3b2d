//! Tenants and their fault workers: the side-band fault queue (VPRI's PFQ,
//! seed 003 §4.1, §5.2) and vCPU-affined fault scheduling (§6.1).
//!
//! A [`Tenant`] is a group of devices (and so of regions) with its own CPU
//! set. Its devices post the pages their I/Os missed to the tenant's fault
//! queue, **deduplicated** by `(region, page, direction)`: a page already
//! queued or being resolved gains one more responder instead of a second
//! request. The tenant's fault workers, pinned to the tenant's CPUs
//! ([`WorkerMode::Affined`], one per CPU) or a single one
//! ([`WorkerMode::Serialized`], the paper's single IOPF worker), resolve
//! each page through the region's resolve path
//! ([`faultline::Region::resolve_pages`]: no kernel fault, no uffd
//! message) and send a *page response* to every queue waiting on it (its
//! inbox plus an eventfd wake). A device with a home CPU
//! ([`crate::DeviceConfig::home_cpu`]) has its requests served by the
//! worker pinned to that CPU first; another worker takes one only after
//! it waited 1 ms (its home worker busy), so the queue stays work
//! conserving ([`TenantStats::served_at_home`], [`TenantStats::stolen`]).
//!
//! An unpinned worker (a tenant without a CPU set) serves each request
//! of an unordered queue **off the CPU of the thread that posted it**,
//! when the process may run on another: before resolving, it narrows its own affinity to the CPUs
//! it started with (those of the thread that created the tenant) minus
//! the poster's ([`TenantStats::off_poster_cpu`]). The
//! submitting thread is the latency-critical one, and it sleeps between
//! I/Os, so its CPU often looks idle when a worker wakes, and the kernel
//! keeps a waking thread on its previous CPU when that one is idle: the
//! worker then ran there (on the post, and again when the store's wait
//! ended) and the submitter, woken by its next I/O, waited behind the
//! page's fill and copy (B2's trace: 20-50 µs each, twice a fault). A
//! request of an ordered queue is served wherever the kernel puts the
//! worker: the queue is paused behind that very page, so its thread has
//! nothing to do but wait, and its idle CPU is the best place to serve
//! it (kept off, B3's paused receives waited for a CPU shared with the
//! sender, and 12,000-16,000 of 40,000 datagrams were lost instead of 0).
//! Idle workers sleep until a request comes (no periodic wake-ups
//! either).
//!
//! A fault worker never issues I/O into a region and is never a uffd
//! handler thread, so it cannot deadlock on the faults it serves.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use faultline::Region;
use faultline_sys::thread::{pin_to_cpu, EventFd};

use crate::error::{Error, Result};

/// How a tenant serves its fault queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerMode {
    /// One worker per CPU of the tenant's set, pinned to it (the paper's
    /// vCPU-affined scheduling: faults are served inside the tenant's CPUs,
    /// by whichever of its workers is free).
    Affined,
    /// One worker for everything (the paper's serialized baseline).
    Serialized,
}

/// A tenant's settings.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    /// Name, for thread names and reports.
    pub name: String,
    /// The tenant's CPUs (empty: the CPUs the process may use, workers not
    /// pinned).
    pub cpus: Vec<usize>,
    /// Affined or serialized workers.
    pub mode: WorkerMode,
    /// How long a worker waits for a page other resolvers hold before the
    /// request fails (default 30 s).
    pub resolve_timeout: Duration,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            name: "tenant".into(),
            cpus: Vec::new(),
            mode: WorkerMode::Affined,
            resolve_timeout: Duration::from_secs(30),
        }
    }
}

/// A page response: the page a queue waited on is resolved (or failed).
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub region: u64,
    pub page: usize,
    /// The resolve error, if any (the I/O then completes with it).
    pub error: Option<String>,
}

/// Where a queue receives page responses.
#[derive(Debug)]
pub(crate) struct Responder {
    pub inbox: Mutex<Vec<Response>>,
    pub wake: EventFd,
}

impl Responder {
    pub fn new() -> Result<Arc<Responder>> {
        Ok(Arc::new(Responder {
            inbox: Mutex::new(Vec::new()),
            wake: EventFd::new().map_err(|e| Error::Io {
                op: "eventfd",
                source: e,
            })?,
        }))
    }

    fn deliver(&self, r: Response) {
        self.inbox.lock().expect("inbox lock").push(r);
        self.wake.notify();
    }
}

type Key = (u64, usize, bool);

struct Pending {
    region: Arc<Region>,
    responders: Vec<Arc<Responder>>,
    posted: Instant,
    /// The posting device's home CPU, if it has one.
    home: Option<usize>,
    /// The CPU to serve it off (see [`TenantInner::post`]).
    keep_off: Option<usize>,
}

/// How long a request whose device has a home CPU waits for the worker
/// pinned there before any other worker of the tenant takes it (work
/// conserving: a busy home worker delays it by at most this).
const STEAL_AFTER: Duration = Duration::from_millis(1);

/// Which of `len` queued requests (oldest first; `item(i)` = its device's
/// home CPU and when it was posted) the worker on `cpu` takes at `now`:
/// the oldest whose home is `cpu`; else the oldest that has no home here
/// (none, or a CPU none of `worker_cpus` is pinned to) or has waited
/// [`STEAL_AFTER`]. `Err(when)`: nothing yet, look again at `when` (or
/// when woken); `Err(None)`: nothing queued for it at all.
fn pick(
    len: usize,
    item: impl Fn(usize) -> (Option<usize>, Instant),
    cpu: Option<usize>,
    worker_cpus: &[Option<usize>],
    now: Instant,
) -> Result<usize, Option<Instant>> {
    if cpu.is_some() {
        if let Some(i) = (0..len).find(|&i| item(i).0 == cpu) {
            return Ok(i);
        }
    }
    let mut next: Option<Instant> = None;
    for i in 0..len {
        let (home, posted) = item(i);
        match home {
            Some(h) if worker_cpus.contains(&Some(h)) => {
                let due = posted + STEAL_AFTER;
                if due <= now {
                    return Ok(i);
                }
                next = Some(next.map_or(due, |n| n.min(due)));
            }
            _ => return Ok(i),
        }
    }
    Err(next)
}

#[derive(Default)]
struct Queue {
    fifo: VecDeque<Key>,
    pending: HashMap<Key, Pending>,
}

/// Counters of a tenant's fault queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Page requests queued (after deduplication).
    pub posts: u64,
    /// Requests folded into one already queued or being resolved.
    pub deduplicated: u64,
    /// Pages resolved.
    pub resolved: u64,
    /// Requests whose resolution failed.
    pub failed: u64,
    /// Total post-to-response time, ns.
    pub service_ns_total: u64,
    /// Longest post-to-response time, ns.
    pub service_ns_max: u64,
    /// Requests with a home CPU served by the worker pinned there.
    pub served_at_home: u64,
    /// Requests with a home CPU another worker took (after
    /// `STEAL_AFTER`, 1 ms, while the home worker was busy).
    pub stolen: u64,
    /// Requests an unpinned worker served off the posting thread's CPU
    /// (its affinity narrowed to the other allowed CPUs; see the module
    /// docs).
    pub off_poster_cpu: u64,
}

pub(crate) struct TenantInner {
    name: String,
    q: Mutex<Queue>,
    cv: Condvar,
    stop: AtomicBool,
    timeout: Duration,
    posts: AtomicU64,
    dedup: AtomicU64,
    resolved: AtomicU64,
    failed: AtomicU64,
    service_total: AtomicU64,
    service_max: AtomicU64,
    served_at_home: AtomicU64,
    stolen: AtomicU64,
    off_poster: AtomicU64,
    /// The CPU each worker is pinned to (`None`: not pinned).
    worker_cpus: Vec<Option<usize>>,
}

impl TenantInner {
    /// Posts a page request; true if it was queued, false if folded into
    /// one already pending (the responder is added to it). `keep_off`:
    /// the CPU of a poster that goes on submitting while it waits (an
    /// unordered queue), which an unpinned worker keeps off.
    pub fn post(
        &self,
        region: &Arc<Region>,
        page: usize,
        write: bool,
        responder: &Arc<Responder>,
        home: Option<usize>,
        keep_off: Option<usize>,
    ) -> bool {
        let key = (region.id(), page, write);
        let mut q = self.q.lock().expect("fault queue lock");
        if let Some(p) = q.pending.get_mut(&key) {
            if !p.responders.iter().any(|r| Arc::ptr_eq(r, responder)) {
                p.responders.push(responder.clone());
            }
            self.dedup.fetch_add(1, Relaxed);
            return false;
        }
        q.pending.insert(
            key,
            Pending {
                region: region.clone(),
                responders: vec![responder.clone()],
                posted: Instant::now(),
                home,
                keep_off,
            },
        );
        q.fifo.push_back(key);
        drop(q);
        self.posts.fetch_add(1, Relaxed);
        if home.is_some() && self.worker_cpus.len() > 1 {
            // The home worker must hear of it, not just any one.
            self.cv.notify_all();
        } else {
            self.cv.notify_one();
        }
        true
    }

    fn worker(&self, cpu: Option<usize>) {
        // An unpinned worker keeps off the poster's CPU.
        let mut placement = cpu.is_none().then(crate::placement::KeepOff::new);
        loop {
            let (key, region, keep_off) = {
                let mut q = self.q.lock().expect("fault queue lock");
                loop {
                    if self.stop.load(SeqCst) {
                        return;
                    }
                    let now = Instant::now();
                    let item = |i: usize| {
                        let p = &q.pending[&q.fifo[i]];
                        (p.home, p.posted)
                    };
                    let wait = match pick(q.fifo.len(), item, cpu, &self.worker_cpus, now) {
                        Ok(i) => {
                            let k = q.fifo.remove(i).expect("a picked request is queued");
                            let p = &q.pending[&k];
                            if p.home.is_some() {
                                if p.home == cpu {
                                    self.served_at_home.fetch_add(1, Relaxed);
                                } else if self.worker_cpus.contains(&p.home) {
                                    self.stolen.fetch_add(1, Relaxed);
                                }
                            }
                            break (k, p.region.clone(), p.keep_off);
                        }
                        Err(Some(when)) => when.saturating_duration_since(now),
                        Err(None) => {
                            // Nothing queued: sleep until a post (or stop).
                            q = self.cv.wait(q).expect("fault queue lock");
                            continue;
                        }
                    };
                    q = self
                        .cv
                        .wait_timeout(q, wait.max(Duration::from_micros(50)))
                        .expect("fault queue lock")
                        .0;
                }
            };
            if let Some(p) = placement.as_mut() {
                if p.keep_off(keep_off) {
                    self.off_poster.fetch_add(1, Relaxed);
                }
            }
            let (_, page, write) = key;
            let res = region.resolve_pages(page..page + 1, write, self.timeout);
            let pending = self
                .q
                .lock()
                .expect("fault queue lock")
                .pending
                .remove(&key)
                .expect("a popped request stays pending until answered");
            let ns = pending.posted.elapsed().as_nanos() as u64;
            self.service_total.fetch_add(ns, Relaxed);
            self.service_max.fetch_max(ns, Relaxed);
            let error = match res {
                Ok(()) => {
                    self.resolved.fetch_add(1, Relaxed);
                    None
                }
                Err(e) => {
                    self.failed.fetch_add(1, Relaxed);
                    Some(e.to_string())
                }
            };
            for r in pending.responders {
                r.deliver(Response {
                    region: key.0,
                    page,
                    error: error.clone(),
                });
            }
        }
    }
}

/// A group of devices with its own CPU set and fault workers. See the
/// [module docs](self).
pub struct Tenant {
    inner: Arc<TenantInner>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.inner.name)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Tenant {
    /// Starts the tenant's fault workers.
    pub fn new(cfg: TenantConfig) -> Result<Tenant> {
        let pins: Vec<Option<usize>> = match (cfg.mode, cfg.cpus.is_empty()) {
            (WorkerMode::Serialized, true) => vec![None],
            (WorkerMode::Serialized, false) => vec![Some(cfg.cpus[0])],
            (WorkerMode::Affined, true) => {
                let n = faultline_sys::thread::online_cpus().max(1);
                vec![None; n]
            }
            (WorkerMode::Affined, false) => cfg.cpus.iter().map(|&c| Some(c)).collect(),
        };
        let inner = Arc::new(TenantInner {
            name: cfg.name.clone(),
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            timeout: cfg.resolve_timeout,
            posts: AtomicU64::new(0),
            dedup: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            service_total: AtomicU64::new(0),
            service_max: AtomicU64::new(0),
            served_at_home: AtomicU64::new(0),
            stolen: AtomicU64::new(0),
            off_poster: AtomicU64::new(0),
            worker_cpus: pins.clone(),
        });
        let mut tenant = Tenant {
            inner: inner.clone(),
            workers: Vec::new(),
        };
        for (i, cpu) in pins.into_iter().enumerate() {
            let inner = inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("fl-io-fault-{i}"))
                .spawn(move || {
                    if let Some(c) = cpu {
                        // Best effort: a CPU outside our affinity mask
                        // leaves the worker unpinned.
                        let _ = pin_to_cpu(c);
                    }
                    inner.worker(cpu);
                })
                .map_err(|e| Error::Io {
                    op: "spawn fault worker",
                    source: e,
                })?;
            tenant.workers.push(h);
        }
        Ok(tenant)
    }

    /// Number of fault workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Counters.
    pub fn stats(&self) -> TenantStats {
        let i = &self.inner;
        TenantStats {
            posts: i.posts.load(Relaxed),
            deduplicated: i.dedup.load(Relaxed),
            resolved: i.resolved.load(Relaxed),
            failed: i.failed.load(Relaxed),
            service_ns_total: i.service_total.load(Relaxed),
            service_ns_max: i.service_max.load(Relaxed),
            served_at_home: i.served_at_home.load(Relaxed),
            stolen: i.stolen.load(Relaxed),
            off_poster_cpu: i.off_poster.load(Relaxed),
        }
    }

    pub(crate) fn inner(&self) -> &Arc<TenantInner> {
        &self.inner
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.inner.stop.store(true, SeqCst);
        // Workers check `stop` under the queue lock and wait without a
        // timeout when idle: taking the lock once orders this store before
        // any such check, so none can miss the notification.
        drop(self.inner.q.lock());
        self.inner.cv.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        // Nobody serves the queue any more: fail what is still pending.
        let pending: Vec<_> = {
            let mut q = self.inner.q.lock().expect("fault queue lock");
            q.fifo.clear();
            q.pending.drain().collect()
        };
        for ((region, page, _), p) in pending {
            for r in p.responders {
                r.deliver(Response {
                    region,
                    page,
                    error: Some("the tenant's fault workers stopped".into()),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_takes_its_own_first_then_what_no_one_else_owns() {
        let t0 = Instant::now();
        let cpus = [Some(0), Some(1)];
        // Oldest first: home 1, no home, home 0, home 7 (no worker there).
        let q = [(Some(1), t0), (None, t0), (Some(0), t0), (Some(7), t0)];
        let item = |i: usize| q[i];
        assert_eq!(
            pick(4, item, Some(0), &cpus, t0),
            Ok(2),
            "its own, though not the oldest"
        );
        assert_eq!(pick(4, item, Some(1), &cpus, t0), Ok(0));
        // Worker 0 with only others' requests: the homeless one, not 1's.
        let q2 = [(Some(1), t0), (None, t0), (Some(7), t0)];
        let item2 = |i: usize| q2[i];
        assert_eq!(pick(3, item2, Some(0), &cpus, t0), Ok(1));
        // Only worker 1's, young: wait until it may be stolen; then steal.
        let q3 = [(Some(1), t0)];
        let item3 = |i: usize| q3[i];
        assert_eq!(
            pick(1, item3, Some(0), &cpus, t0),
            Err(Some(t0 + STEAL_AFTER))
        );
        assert_eq!(pick(1, item3, Some(0), &cpus, t0 + STEAL_AFTER), Ok(0));
        // Unpinned workers take anything, oldest first.
        assert_eq!(pick(4, item, None, &[None, None], t0), Ok(0));
        assert_eq!(pick(0, item, Some(0), &cpus, t0), Err(None));
    }
}
