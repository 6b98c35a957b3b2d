//! Devices: one protection domain each (VPRI's per-device BDF), with an
//! access log, a pinning policy and the counters of its queues.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use faultline::Region;

use crate::adp::{Adp, AdpConfig, LruPin, PinAll, PinNothing, PinPolicy};
use crate::error::Result;
use crate::log::AccessLog;
use crate::queue::{Backend, IoQueue};
pub use crate::shared::Ordering;
use crate::shared::{Counters, DeviceInner, Reclaims};
use crate::tenant::Tenant;

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
    /// Adaptive pinning whose age threshold follows the region's evictor
    /// ([`Adp::with_derived_threshold`]): the `quantile` of the ages (since
    /// this device last touched them) of the units the evictor takes. The
    /// device watches the region's reclaims ([`Region::watch_reclaims`]);
    /// until it has seen enough, the configured threshold holds.
    AdpDerived {
        /// ADP's settings; `None` = the paper's at `time_scale`.
        config: Option<AdpConfig>,
        /// Which quantile of the reclaim ages (0..=1; B5 uses 0.1).
        quantile: f64,
    },
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
    /// Access-log slots (lossy beyond this many undrained events; rounded
    /// up to a power of two). 0 turns the log off: nothing is logged or
    /// dropped, and the pin policy and the eviction policy see no device
    /// accesses (B8's "IO-PAL off").
    pub log_slots: usize,
    /// How often the log is drained into the pinning policy and the
    /// region's eviction policy (access hints), and the policy ticked.
    /// Each drain is coalesced: the policy sees each unit once, at its
    /// last access in the drain, and the eviction policy each page once.
    /// The drain thread keeps off the CPU the device's queues last waited
    /// on (when the process may use another), so it never makes a
    /// submitter wait for its CPU.
    pub drain_period: Duration,
    /// Time scale of the paper's constants for `PinMode::Adp(None)`.
    pub time_scale: f64,
    /// Whether the device's own thread drains the log (`false`: the user
    /// drains [`IoDevice::access_log`] and nothing is pinned adaptively).
    pub drain_log: bool,
    /// The device's home CPU (where its queues are driven): its page
    /// requests go first to the tenant's fault worker pinned to that CPU;
    /// another worker takes one only after it waited 1 ms (the home worker
    /// busy). `None` (default): whichever worker is free.
    pub home_cpu: Option<usize>,
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
            home_cpu: None,
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
    /// I/O page faults: I/Os that found a page not ready and parked
    /// (each counted once, however often it is reissued).
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
    /// Reclaims of units this device had touched, reported to the pin
    /// policy with their ages ([`PinMode::AdpDerived`]).
    pub reclaim_ages: u64,
}

static NEXT_DEV: AtomicU64 = AtomicU64::new(1);

/// Evictions a device's reclaim watch holds between drains (lossy beyond).
const RECLAIM_SLOTS: usize = 4096;

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
            PinMode::AdpDerived { config, quantile } => Box::new(
                Adp::new(config.unwrap_or_else(|| AdpConfig::paper(units, cfg.time_scale)))
                    .with_derived_threshold(quantile),
            ),
        };
        let reclaims = match cfg.pin {
            PinMode::AdpDerived { .. } => region.watch_reclaims(RECLAIM_SLOTS).map(|watch| {
                Mutex::new(Reclaims {
                    watch,
                    last_ns: vec![u64::MAX; units],
                })
            }),
            _ => None,
        };
        let inner = Arc::new(DeviceInner {
            name: cfg.name.clone(),
            id: NEXT_DEV.fetch_add(1, Relaxed),
            region,
            tenant: tenant.inner().clone(),
            ordering: cfg.ordering,
            home_cpu: cfg.home_cpu,
            log: AccessLog::new(cfg.log_slots),
            log_on: cfg.log_slots > 0,
            born: std::time::Instant::now(),
            batch: Default::default(),
            counters: Counters::default(),
            unit_pages: cfg.unit_pages.max(1),
            pin_all: cfg.pin == PinMode::All,
            policy: Mutex::new(policy),
            reclaims,
            stop: AtomicBool::new(false),
            queue_cpu: AtomicUsize::new(crate::shared::NO_CPU),
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
                        // Off the CPU the device's queues wait on: a queue's
                        // thread sleeps between I/Os, and a drain woken onto
                        // its idle CPU would make it wait when its next I/O
                        // is due.
                        let mut placement = crate::placement::KeepOff::new();
                        while !i.stop.load(SeqCst) {
                            let q = i.queue_cpu.load(Relaxed);
                            placement.keep_off((q != crate::shared::NO_CPU).then_some(q));
                            i.drain();
                            std::thread::park_timeout(period);
                        }
                    })
                    .map_err(|e| crate::error::Error::Io {
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

    /// The pin policy's age threshold in force (ns), if it has one (ADP).
    pub fn threshold_ns(&self) -> Option<u64> {
        self.inner
            .policy
            .lock()
            .expect("pin policy lock")
            .threshold_ns()
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
            reclaim_ages: c.reclaim_ages.load(Relaxed),
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
