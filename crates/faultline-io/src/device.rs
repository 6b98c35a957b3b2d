//! Devices: one protection domain each (VPRI's per-device BDF), with an
//! access log, a pinning policy and the counters of its queues.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use faultline::Region;

use crate::adp::{Adp, AdpConfig, LruPin, PinAll, PinNothing, PinPolicy};
use crate::log::{AccessEvent, AccessLog};
use crate::queue::{Backend, IoQueue};
use crate::tenant::{Tenant, TenantInner};
use crate::Result;

/// Queue discipline on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// The paper's paused queue: an I/O that misses parks, and every later
    /// I/O of the queue waits behind it; I/Os issue and complete in
    /// submission order.
    Ordered,
    /// Only the I/O that missed parks; later I/Os go on (the paper's §8
    /// future work).
    Unordered,
}

/// Which units of the device's memory are pinned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PinMode {
    /// None (faults are served by the fault queue only).
    None,
    /// Every page of the region (static pinning; allows fixed buffers).
    All,
    /// Simple LRU: the most recent `ratio` of the region's units.
    Lru {
        /// Fraction of the region's units pinned (0..=1).
        ratio: f64,
    },
    /// Adaptive pinning; `None` = the paper's settings at `time_scale`.
    Adp(Option<AdpConfig>),
}

/// A device's settings.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Name, for reports.
    pub name: String,
    /// Queue discipline.
    pub ordering: Ordering,
    /// Pinning policy.
    pub pin: PinMode,
    /// Region pages per pinning unit (the paper tracks 2 MiB units).
    pub unit_pages: usize,
    /// Access-log slots (lossy beyond this many undrained events).
    pub log_slots: usize,
    /// How often the log is drained into the pinning policy and the
    /// region's eviction policy (access hints), and the policy ticked.
    pub drain_period: Duration,
    /// Time scale of the paper's constants for `PinMode::Adp(None)`.
    pub time_scale: f64,
    /// Whether the device's own thread drains the log (`false`: the user
    /// drains [`IoDevice::access_log`] and nothing is pinned adaptively).
    pub drain_log: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: "dev".into(),
            ordering: Ordering::Unordered,
            pin: PinMode::None,
            unit_pages: 512,
            log_slots: 4096,
            drain_period: Duration::from_millis(10),
            time_scale: 0.01,
            drain_log: true,
        }
    }
}

/// Counters of a device (all its queues).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// I/Os submitted.
    pub submitted: u64,
    /// I/Os completed (delivered).
    pub completed: u64,
    /// I/O page faults: submissions or reissues that found a page not
    /// ready (each parks the I/O).
    pub iopfs: u64,
    /// Pages posted to the fault queue (after deduplication).
    pub posted: u64,
    /// Parked I/Os reissued after a page response.
    pub reissued: u64,
    /// EFAULTs the kernel returned anyway (a race the check lost); the
    /// I/O was parked and reissued, never returned to the user.
    pub efault_caught: u64,
    /// EFAULTs on a datagram receive (the datagram is gone): should be 0.
    pub efault_lost: u64,
    /// I/Os parked now.
    pub parked: u64,
    /// Units pinned now.
    pub pinned_units: u64,
    /// Access-log events logged and dropped.
    pub log_logged: u64,
    /// Access-log events dropped (ring full).
    pub log_dropped: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
    pub iopfs: AtomicU64,
    pub posted: AtomicU64,
    pub reissued: AtomicU64,
    pub efault_caught: AtomicU64,
    pub efault_lost: AtomicU64,
    pub parked: AtomicU64,
    pub pinned_units: AtomicUsize,
}

pub(crate) struct DeviceInner {
    pub name: String,
    pub id: u64,
    pub region: Arc<Region>,
    pub tenant: Arc<TenantInner>,
    pub ordering: Ordering,
    pub log: AccessLog,
    pub born: Instant,
    pub counters: Counters,
    pub unit_pages: usize,
    /// Whether every page is pinned ([`PinMode::All`]).
    pub pin_all: bool,
    /// The pin policy (the drain thread's; `PinMode::All` pins at once).
    pub policy: Mutex<Box<dyn PinPolicy>>,
    stop: AtomicBool,
}

static NEXT_DEV: AtomicU64 = AtomicU64::new(1);

impl DeviceInner {
    pub fn now_ns(&self) -> u64 {
        self.born.elapsed().as_nanos() as u64
    }

    /// Drains the access log into the pinning policy and the region's
    /// eviction policy, ticks the policy, applies its pin changes.
    fn drain(&self) {
        let mut p = self.policy.lock().expect("pin policy lock");
        let now = self.now_ns();
        let mut last = usize::MAX;
        self.log.drain(usize::MAX, |ev: AccessEvent| {
            let unit = ev.page / self.unit_pages;
            if unit != last {
                p.on_access(unit, ev.ts_ns);
                last = unit;
            }
            for pg in ev.page..ev.page + ev.pages as usize {
                self.region.access_hint(pg);
            }
        });
        p.tick(now);
        self.apply(&mut **p);
    }

    fn apply(&self, p: &mut dyn PinPolicy) {
        let n = self.region.pages();
        p.drain_changes(&mut |unit, pin| {
            let start = unit * self.unit_pages;
            let range = start.min(n)..((unit + 1) * self.unit_pages).min(n);
            if range.is_empty() {
                return;
            }
            if pin {
                self.region.pin(range);
                self.counters.pinned_units.fetch_add(1, Relaxed);
            } else {
                self.region.unpin(range);
                self.counters.pinned_units.fetch_sub(1, Relaxed);
            }
        });
    }

    fn unpin_all(&self) {
        let n = self.region.pages();
        let p = self.policy.lock().expect("pin policy lock");
        for unit in 0..n.div_ceil(self.unit_pages) {
            if p.is_pinned(unit) {
                let range = unit * self.unit_pages..((unit + 1) * self.unit_pages).min(n);
                self.region.unpin(range);
            }
        }
    }
}

/// A device over one region: its queues issue I/O into the region's
/// memory. See the [crate docs](crate).
pub struct IoDevice {
    inner: Arc<DeviceInner>,
    _tenant: Arc<Tenant>,
    drainer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for IoDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoDevice")
            .field("name", &self.inner.name)
            .field("region", &self.inner.region.id())
            .finish()
    }
}

impl IoDevice {
    /// A device over `region`, whose faults `tenant`'s workers serve.
    pub fn new(region: Arc<Region>, tenant: &Arc<Tenant>, cfg: DeviceConfig) -> Result<IoDevice> {
        let units = region.pages().div_ceil(cfg.unit_pages.max(1));
        let policy: Box<dyn PinPolicy> = match cfg.pin {
            PinMode::None => Box::new(PinNothing),
            PinMode::All => Box::new(PinAll::new(units)),
            PinMode::Lru { ratio } => {
                Box::new(LruPin::new(((units as f64) * ratio).ceil() as usize))
            }
            PinMode::Adp(c) => Box::new(Adp::new(
                c.unwrap_or_else(|| AdpConfig::paper(units, cfg.time_scale)),
            )),
        };
        let inner = Arc::new(DeviceInner {
            name: cfg.name.clone(),
            id: NEXT_DEV.fetch_add(1, Relaxed),
            region,
            tenant: tenant.inner().clone(),
            ordering: cfg.ordering,
            log: AccessLog::new(cfg.log_slots),
            born: Instant::now(),
            counters: Counters::default(),
            unit_pages: cfg.unit_pages.max(1),
            pin_all: cfg.pin == PinMode::All,
            policy: Mutex::new(policy),
            stop: AtomicBool::new(false),
        });
        {
            let mut p = inner.policy.lock().expect("pin policy lock");
            inner.apply(&mut **p);
        }
        let drainer = if cfg.drain_log {
            let i = inner.clone();
            let period = cfg.drain_period;
            Some(
                std::thread::Builder::new()
                    .name(format!("fl-io-pal-{}", cfg.name))
                    .spawn(move || {
                        while !i.stop.load(SeqCst) {
                            i.drain();
                            std::thread::park_timeout(period);
                        }
                    })
                    .map_err(|e| crate::Error::Io {
                        op: "spawn access-log drainer",
                        source: e,
                    })?,
            )
        } else {
            None
        };
        Ok(IoDevice {
            inner,
            _tenant: tenant.clone(),
            drainer,
        })
    }

    /// A new queue of this device.
    pub fn queue(&self, backend: Backend) -> Result<IoQueue> {
        IoQueue::new(self.inner.clone(), backend)
    }

    /// The device's region.
    pub fn region(&self) -> &Arc<Region> {
        &self.inner.region
    }

    /// Device id (the paper's BDF).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The device's access log (drained by the device unless
    /// `drain_log` is off).
    pub fn access_log(&self) -> &AccessLog {
        &self.inner.log
    }

    /// Runs one drain of the access log now (what the drain thread does
    /// every `drain_period`).
    pub fn drain_now(&self) {
        self.inner.drain();
    }

    /// Units in the ADP active and inactive blocks, if the policy is ADP
    /// (else `(0, pinned)`).
    pub fn pin_sizes(&self) -> (usize, usize) {
        self.inner.policy.lock().expect("pin policy lock").sizes()
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        let c = &self.inner.counters;
        DeviceStats {
            submitted: c.submitted.load(Relaxed),
            completed: c.completed.load(Relaxed),
            iopfs: c.iopfs.load(Relaxed),
            posted: c.posted.load(Relaxed),
            reissued: c.reissued.load(Relaxed),
            efault_caught: c.efault_caught.load(Relaxed),
            efault_lost: c.efault_lost.load(Relaxed),
            parked: c.parked.load(Relaxed),
            pinned_units: c.pinned_units.load(Relaxed) as u64,
            log_logged: self.inner.log.logged(),
            log_dropped: self.inner.log.dropped(),
        }
    }
}

impl Drop for IoDevice {
    fn drop(&mut self) {
        self.inner.stop.store(true, SeqCst);
        if let Some(h) = self.drainer.take() {
            h.thread().unpark();
            let _ = h.join();
        }
        self.inner.unpin_all();
    }
}
