//! One simulated round: every VM of a fleet stepped through the paper's
//! own time, one second per step.
//!
//! Per step and VM:
//! 1. the guest CPU touches 16 units (80% in a hot 20% of the memory);
//! 2. the device's trace ([`Trace`]) makes its accesses (a unit the
//!    reclaimer has taken is an I/O fault) and the CPU touches that go
//!    with them;
//! 3. the pin policy hears of the accesses (at once, or through the lossy
//!    access log drained every D s: [`LogModel`]) and is ticked; its pins
//!    fetch their units back (a host fetch, not a fault);
//! 4. the reclaimer (CLOCK, the runtime's own) trims the VM to its budget,
//!    which [`Reclaim`] sets: fixed, redrawn, or a PSI-balanced server
//!    ([`PsiHost`]) moving every VM's budget each Senpai interval.
//!
//! A round's outcome per device class ([`ClassResult`]): I/O faults, pin
//! fetches, pinned memory and where it went ([`PinLedger`]), the
//! reclaimer's horizon, the VMs' reclaim ratios and pressure.

use std::collections::HashMap;

use faultline::policy::{Clock, EvictionPolicy};
use faultline_io::adp::{Adp, AdpConfig, LruPin, PinAll, PinCause, PinNothing, PinPolicy};
use faultline_io::{AccessEvent, AccessLog};
use rand::{Rng, SeedableRng};

use super::ledger::{PinLedger, PinState, PinUse};
use super::psi::{self, PsiCfg, PsiHost};
use super::rate::FaultRate;
use super::trace::{Class, Trace};

/// Simulated seconds per step.
const STEP_S: u64 = 1;
/// Steps of one simulated hour.
const HOUR_STEPS: u64 = 3600;
/// Nanoseconds per second (the policies' clock).
const NS: u64 = 1_000_000_000;
/// ADP with a derived threshold: the P10 of the reclaimer's ages (digest
/// §5's suggestion).
const DERIVE_Q: f64 = 0.1;

/// The device's access log in the model (B8): the runtime's own lossy
/// ring ([`AccessLog`]), drained by its consumer every `drain_every_s`
/// simulated seconds. Without it (B5) every device access reaches the
/// pin policy and the reclaimer at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogModel {
    /// Ring slots.
    pub slots: usize,
    /// The consumer drains (and ticks the pin policy) every this many
    /// simulated seconds.
    pub drain_every_s: u64,
}

/// The host's reclaim ratio per VM.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reclaim {
    /// The same r for every VM, all the time (B5).
    Fixed(f64),
    /// Each VM's r drawn as `hi * U^skew` (U uniform in [0, 1)) at the
    /// start and redrawn every
    /// `every_s` seconds: within [0, hi], mean `hi / (skew + 1)` (B9: the
    /// paper's production moves each VM's r within 0-50% at a fleet
    /// overcommit of 10-15%: hi 0.5, skew 3, mean 12.5%).
    Drift { hi: f64, skew: f64, every_s: u64 },
    /// The server's memory fixed at (1 - r) of the VMs', each VM's ratio
    /// moved within 0-50% by its pressure ([`psi`]).
    Psi(PsiCfg),
}

/// One simulated run: a policy, the reclaim ratio, how long, and whether
/// the device accesses go through a lossy log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoundCfg<'a> {
    pub kind: &'a str,
    pub reclaim: Reclaim,
    pub steps: u64,
    pub log: Option<LogModel>,
    pub keep_sizes: bool,
}

impl<'a> RoundCfg<'a> {
    /// B5's round: one hour at a fixed r, no log.
    pub fn hour(kind: &'a str, r: f64) -> RoundCfg<'a> {
        RoundCfg {
            kind,
            reclaim: Reclaim::Fixed(r),
            steps: HOUR_STEPS,
            log: None,
            keep_sizes: false,
        }
    }
}

/// One VM of the model: its memory (resident units within a budget), its
/// reclaimer (CLOCK), its device's pin policy and trace.
struct Vm {
    units: usize,
    /// Ages (s since the device's last access) of the device's units the
    /// reclaimer took.
    reclaim_ages: Vec<u64>,
    pin_state: Vec<PinState>,
    ledger: PinLedger,
    class: Class,
    /// When the device last touched each unit, as far as the device's
    /// consumer knows (`u64::MAX`: never).
    last_dev: Vec<u64>,
    now: u64,
    budget: usize,
    resident: Vec<bool>,
    count: usize,
    reclaim: Clock,
    policy: Box<dyn PinPolicy>,
    trace: Trace,
    rng: rand::rngs::SmallRng,
    /// Draws this VM's reclaim ratio under [`Reclaim::Drift`].
    ratio_rng: rand::rngs::SmallRng,
    log: Option<AccessLog>,
    iopfs: u64,
    rate: FaultRate,
    /// Pinned units fetched back by the pin.
    pin_fetches: u64,
    /// Faults the VM's work stalled on this second (guest CPU and device;
    /// not the host's pin fetches): its pressure.
    stall_faults: u64,
    /// All of them, the whole run.
    stalls: u64,
    /// Sum over steps of the reclaim ratio in force.
    ratio_sum: f64,
    /// Sum over steps of the age threshold in force (s).
    threshold_sum: f64,
    pinned_sum: f64,
    sizes: Vec<(f64, f64, f64)>,
    /// (minute, reclaim ratio %) every simulated minute (with `keep_sizes`).
    ratios: Vec<(f64, f64)>,
}

impl Vm {
    /// A unit is touched: by the device (`device`, an I/O fault if the unit
    /// is not resident) or the guest CPU; `hint`: the reclaimer hears of a
    /// hit now (else only through the access log's consumer).
    fn access(&mut self, u: usize, device: bool, hint: bool) {
        if device {
            let now = self.now / NS;
            match self.pin_state[u] {
                PinState::Idle { since, cause } => {
                    self.ledger.add(cause, PinUse::Protected, now - since);
                    self.ledger.protected += 1;
                    // ADP keeps an accessed inactive unit pinned until its
                    // delayed demotion; an access-pinning policy's next
                    // wait for an access starts now.
                    self.pin_state[u] = match cause {
                        PinCause::Access => PinState::Idle { since: now, cause },
                        _ => PinState::Hot { since: now, cause },
                    };
                }
                PinState::Hot { .. } | PinState::Not => {}
            }
        }
        if self.resident[u] {
            if hint {
                self.reclaim.on_access_hint(u);
            }
        } else {
            if device {
                self.iopfs += 1;
            }
            self.stall_faults += 1;
            self.stalls += 1;
            self.resident[u] = true;
            self.count += 1;
            self.reclaim.on_fault(u);
        }
        self.trim();
    }

    /// The reclaimer takes unpinned units until the VM is within budget.
    fn trim(&mut self) {
        // Everything resident is pinned (pin-all): nothing to take, and no
        // need to scan the whole CLOCK for it on every access.
        if self.policy.pinned() >= self.count {
            return;
        }
        while self.count > self.budget {
            let p = &self.policy;
            match self.reclaim.pick_victim(&|x| p.is_pinned(x)) {
                Some(v) => {
                    self.resident[v] = false;
                    self.count -= 1;
                    if self.last_dev[v] != u64::MAX {
                        let age = self.now - self.last_dev[v];
                        self.reclaim_ages.push(age / NS);
                        self.policy.on_reclaim(v, age);
                    }
                }
                None => break,
            }
        }
    }

    /// What the device's consumer does with one access: the pin policy and
    /// the reclaimer (as a hint) learn of it.
    fn consume(&mut self, u: usize, ts: u64, hint: bool) {
        if hint && self.resident[u] {
            self.reclaim.on_access_hint(u);
        }
        self.last_dev[u] = ts;
        self.policy.on_access(u, ts);
    }

    /// Ticks the pin policy and applies its pins (a pin makes its unit
    /// present: a host fetch, not a device fault).
    fn tick(&mut self, now: u64) {
        self.policy.tick(now);
        let mut changes = Vec::new();
        self.policy
            .drain_changes(&mut |u, pin| changes.push((u, pin)));
        let mut pins = Vec::new();
        let s = now / NS;
        for (u, pin) in changes {
            if pin {
                // No cause: pinned and unpinned again within this tick
                // (ADP: promoted, then dropped by the inactive cap): no
                // pinned time, only counted.
                let Some(cause) = self.policy.pin_cause(u) else {
                    self.ledger.transient += 1;
                    continue;
                };
                *self.ledger.pins.entry(cause).or_default() += 1;
                self.pin_state[u] = PinState::Idle { since: s, cause };
                pins.push(u);
                continue;
            }
            match std::mem::replace(&mut self.pin_state[u], PinState::Not) {
                PinState::Idle { since, cause } => {
                    self.ledger.add(cause, PinUse::Unused, s - since);
                    self.ledger.unpinned_idle += 1;
                }
                PinState::Hot { since, cause } => {
                    self.ledger.add(cause, PinUse::Demotion, s - since);
                    self.ledger.unpinned_hot += 1;
                }
                PinState::Not => {}
            }
        }
        for u in pins {
            if !self.resident[u] {
                self.pin_fetches += 1;
                // The host's fetch, not a stall of the VM's work.
                let stalls = (self.stall_faults, self.stalls);
                self.access(u, false, true);
                (self.stall_faults, self.stalls) = stalls;
            }
        }
    }
}

/// The pin policy named `kind` (`none`, `pin-all`, `lru10`, `adp`,
/// `adp-derived`) for a VM of `units` units.
fn policy_for(kind: &str, units: usize) -> Box<dyn PinPolicy> {
    match kind {
        "none" => Box::new(PinNothing),
        "pin-all" => Box::new(PinAll::new(units)),
        "lru10" => Box::new(LruPin::new(units / 10)),
        "adp-derived" => {
            Box::new(Adp::new(AdpConfig::paper(units, 1.0)).with_derived_threshold(DERIVE_Q))
        }
        _ => Box::new(Adp::new(AdpConfig::paper(units, 1.0))),
    }
}

/// One device class's outcome of a round.
pub(crate) struct ClassResult {
    /// I/O faults.
    pub iopfs: u64,
    /// Pinned memory, % of the VM (time average, averaged over VMs).
    pub pinned_pct: f64,
    /// Units fetched back by pins.
    pub pin_fetches: u64,
    /// Mean age threshold in force (s), for policies that have one.
    pub threshold_s: f64,
    /// The reclaimer's horizon on the class's device units: P10 and P50
    /// of their ages (s since the device's last access) when taken.
    pub reclaim_age_s: (u64, u64),
    /// Pinned time by cause and use, % of the VM (averaged over VMs like
    /// `pinned_pct`, which it adds up to); event counts summed.
    pub ledger: PinLedger,
    /// The VMs' reclaim ratios, % (each VM's time average): mean, min, max.
    pub ratio_pct: (f64, f64, f64),
    /// The VMs' mean pressure, PSI "some" % (stalled faults x 5 ms over
    /// the run), averaged over VMs.
    pub psi_pct: f64,
    /// Access-log events logged (with a [`LogModel`]).
    pub logged: u64,
    /// ... and dropped.
    pub dropped: u64,
}

/// One VM's outcome.
pub(crate) struct VmOut {
    pub class: Class,
    pub rate: FaultRate,
    pub pinned_pct: f64,
    pub units: usize,
    /// (minute, reclaim ratio %), with `keep_sizes`.
    pub ratios: Vec<(f64, f64)>,
}

/// Per class results, one NIC domain's (minute, active %, pinned %), and
/// every VM's.
pub(crate) struct RoundOut {
    pub classes: HashMap<&'static str, ClassResult>,
    /// With [`Reclaim::Psi`]: the server's memory and the most the VMs held
    /// at the end of any second (units).
    pub server: Option<(usize, usize)>,
    pub nic_sizes: Vec<(f64, f64, f64)>,
    pub vms: Vec<VmOut>,
}

/// The VMs of B5 (the first 14: 4 NIC + 10 block of U[8, 64] "GB") and,
/// for larger fleets (B9), more of the same mix.
pub(crate) fn fleet(n: usize) -> Vec<(Class, usize)> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(42);
    (0..n)
        .map(|i| {
            (
                if i % 14 < 4 { Class::Nic } else { Class::Block },
                rng.gen_range(8..=64) * 64,
            )
        })
        .collect()
}

/// Simulates every VM of `sizes` under `cfg`. Deterministic (seeded).
pub(crate) fn round(cfg: &RoundCfg, sizes: &[(Class, usize)]) -> RoundOut {
    let ratio = |rng: &mut rand::rngs::SmallRng| match cfg.reclaim {
        Reclaim::Fixed(r) => r,
        Reclaim::Drift { hi, skew, .. } => hi * rng.gen::<f64>().powf(skew),
        Reclaim::Psi(c) => c.r,
    };
    let mut host = match cfg.reclaim {
        Reclaim::Psi(c) => Some(PsiHost::new(
            c,
            &sizes.iter().map(|s| s.1).collect::<Vec<_>>(),
        )),
        _ => None,
    };
    let mut vms: Vec<Vm> = sizes
        .iter()
        .enumerate()
        .map(|(i, &(class, units))| {
            let mut reclaim = Clock::new();
            let mut ratio_rng = rand::rngs::SmallRng::seed_from_u64(300 + i as u64);
            let budget = ((1.0 - ratio(&mut ratio_rng)) * units as f64) as usize;
            // The VM starts fully resident; the reclaimer trims it to budget.
            for u in 0..units {
                reclaim.on_fault(u);
            }
            let mut vm = Vm {
                units,
                pin_state: vec![PinState::Not; units],
                reclaim_ages: Vec::new(),
                ledger: PinLedger::default(),
                class,
                last_dev: vec![u64::MAX; units],
                now: 0,
                budget,
                resident: vec![true; units],
                count: units,
                reclaim,
                policy: policy_for(cfg.kind, units),
                trace: Trace::new(class, units, 100 + i as u64),
                rng: rand::rngs::SmallRng::seed_from_u64(200 + i as u64),
                ratio_rng,
                log: cfg.log.map(|l| AccessLog::new(l.slots)),
                iopfs: 0,
                rate: FaultRate::default(),
                pin_fetches: 0,
                stall_faults: 0,
                stalls: 0,
                ratio_sum: 0.0,
                threshold_sum: 0.0,
                pinned_sum: 0.0,
                sizes: Vec::new(),
                ratios: Vec::new(),
            };
            if let Some(h) = &host {
                vm.budget = h.budgets()[i];
            }
            vm.tick(0);
            vm
        })
        .collect();
    let mut server_max = 0usize;
    let mut faults = vec![0u64; vms.len()];
    let mut ev = Vec::new();
    let mut cpu = Vec::new();
    for step in 0..cfg.steps {
        let now = step * STEP_S * NS;
        for vm in &mut vms {
            vm.now = now;
            if let Reclaim::Drift { every_s, .. } = cfg.reclaim {
                if step > 0 && step % every_s == 0 {
                    let r = ratio(&mut vm.ratio_rng);
                    vm.budget = ((1.0 - r) * vm.units as f64) as usize;
                    vm.trim();
                }
            }
            let before = vm.iopfs;
            // Guest CPU: 80% of touches in a hot 20% of memory.
            for _ in 0..16 {
                let hot = vm.rng.gen_bool(0.8);
                let u = if hot {
                    vm.rng.gen_range(0..vm.units / 5)
                } else {
                    vm.rng.gen_range(0..vm.units)
                };
                vm.access(u, false, true);
            }
            vm.trace.step(&mut ev, &mut cpu);
            for &u in &cpu {
                vm.access(u, false, true);
            }
            match (&vm.log, cfg.log) {
                (Some(log), Some(m)) => {
                    for &u in &ev {
                        log.push(AccessEvent {
                            page: u,
                            pages: 1,
                            ts_ns: now,
                            write: true,
                        });
                    }
                    for &u in &ev {
                        vm.access(u, true, false);
                    }
                    // The consumer: drain, then tick (as the device's
                    // drainer thread does).
                    if step % m.drain_every_s.max(1) == 0 {
                        let mut got = Vec::new();
                        vm.log
                            .as_ref()
                            .expect("a log")
                            .drain(usize::MAX, |e| got.push(e));
                        for e in got {
                            vm.consume(e.page, e.ts_ns, true);
                        }
                        vm.tick(now);
                    }
                }
                _ => {
                    for &u in &ev {
                        vm.access(u, true, true);
                        vm.consume(u, now, false);
                    }
                    vm.tick(now);
                }
            }
            vm.rate.second(step, vm.iopfs - before);
            vm.ratio_sum += 1.0 - vm.budget as f64 / vm.units as f64;
            if let Some(t) = vm.policy.threshold_ns() {
                vm.threshold_sum += t as f64 / NS as f64;
            }
            vm.pinned_sum += vm.policy.pinned() as f64 / vm.units as f64;
            if cfg.keep_sizes && step % 60 == 0 {
                vm.ratios.push((
                    step as f64 / 60.0,
                    (1.0 - vm.budget as f64 / vm.units as f64) * 100.0,
                ));
                let (a, i) = vm.policy.sizes();
                vm.sizes.push((
                    step as f64 / 60.0,
                    a as f64 / vm.units as f64 * 100.0,
                    i as f64 / vm.units as f64 * 100.0,
                ));
            }
        }
        // The host: a second of each VM's stalls; its budgets move every
        // Senpai interval and the reclaimer trims to them at once.
        if let Some(h) = &mut host {
            for (f, vm) in faults.iter_mut().zip(&mut vms) {
                *f = std::mem::take(&mut vm.stall_faults);
            }
            if h.second(&faults) {
                for (vm, b) in vms.iter_mut().zip(h.budgets()) {
                    vm.budget = b;
                    vm.trim();
                }
            }
            server_max = server_max.max(vms.iter().map(|v| v.count).sum());
        }
    }
    let steps = cfg.steps.max(1) as f64;
    let end = cfg.steps * STEP_S;
    for vm in &mut vms {
        for u in 0..vm.units {
            match vm.pin_state[u] {
                PinState::Idle { since, cause } => vm.ledger.add(cause, PinUse::Open, end - since),
                PinState::Hot { since, cause } => {
                    vm.ledger.add(cause, PinUse::Demotion, end - since)
                }
                PinState::Not => {}
            }
        }
    }
    let mut classes = HashMap::new();
    for (name, class) in [("nic", Class::Nic), ("block", Class::Block)] {
        let v: Vec<&Vm> = vms.iter().filter(|v| v.class == class).collect();
        let n = v.len().max(1) as f64;
        classes.insert(
            name,
            ClassResult {
                iopfs: v.iter().map(|v| v.iopfs).sum(),
                pin_fetches: v.iter().map(|v| v.pin_fetches).sum(),
                threshold_s: v.iter().map(|v| v.threshold_sum / steps).sum::<f64>() / n,
                pinned_pct: v.iter().map(|v| v.pinned_sum / steps * 100.0).sum::<f64>() / n,
                psi_pct: v
                    .iter()
                    .map(|v| v.stalls as f64 * psi::STALL_PER_FAULT_US / 1e6 / steps * 100.0)
                    .sum::<f64>()
                    / n,
                ratio_pct: {
                    let r: Vec<f64> = v.iter().map(|v| v.ratio_sum / steps * 100.0).collect();
                    (
                        r.iter().sum::<f64>() / n,
                        r.iter().copied().fold(f64::INFINITY, f64::min),
                        r.iter().copied().fold(0.0, f64::max),
                    )
                },
                reclaim_age_s: {
                    let mut a: Vec<u64> = v
                        .iter()
                        .flat_map(|v| v.reclaim_ages.iter().copied())
                        .collect();
                    a.sort_unstable();
                    let q = |f: f64| {
                        a.get(((a.len().max(1) - 1) as f64 * f) as usize)
                            .copied()
                            .unwrap_or(0)
                    };
                    (q(0.1), q(0.5))
                },
                ledger: {
                    // Unit-seconds as % of the VM, averaged over VMs (as
                    // pinned_pct), and the event counts summed.
                    let mut l = PinLedger::default();
                    for vm in &v {
                        for (&k, &x) in &vm.ledger.secs {
                            *l.secs.entry(k).or_default() +=
                                x / (vm.units as f64 * steps) * 100.0 / n;
                        }
                        for (&k, &x) in &vm.ledger.pins {
                            *l.pins.entry(k).or_default() += x;
                        }
                        l.protected += vm.ledger.protected;
                        l.unpinned_idle += vm.ledger.unpinned_idle;
                        l.unpinned_hot += vm.ledger.unpinned_hot;
                        l.transient += vm.ledger.transient;
                    }
                    l
                },
                logged: v
                    .iter()
                    .filter_map(|v| v.log.as_ref())
                    .map(|l| l.logged())
                    .sum(),
                dropped: v
                    .iter()
                    .filter_map(|v| v.log.as_ref())
                    .map(|l| l.dropped())
                    .sum(),
            },
        );
    }
    let nic_sizes = vms
        .iter()
        .find(|v| v.class == Class::Nic)
        .map(|v| v.sizes.clone())
        .unwrap_or_default();
    RoundOut {
        classes,
        server: host.map(|h| (h.capacity(), server_max)),
        nic_sizes,
        vms: vms
            .into_iter()
            .map(|v| VmOut {
                class: v.class,
                pinned_pct: v.pinned_sum / steps * 100.0,
                units: v.units,
                ratios: v.ratios,
                rate: v.rate,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rate::DAY_S;

    /// The model's access log is the runtime's lossy ring: a consumer that
    /// keeps up loses nothing, a slow one over 64 slots drops, and either
    /// way every device access is logged or counted as dropped.
    #[test]
    fn a_slow_log_consumer_drops_a_fast_one_does_not() {
        let sizes = [(Class::Nic, 512), (Class::Block, 1024)];
        let cfg = |slots, d| RoundCfg {
            log: Some(LogModel {
                slots,
                drain_every_s: d,
            }),
            steps: 900,
            ..RoundCfg::hour("adp", 0.2)
        };
        let fast = round(&cfg(1024, 1), &sizes).classes;
        let slow = round(&cfg(64, 120), &sizes).classes;
        for c in ["nic", "block"] {
            assert!(fast[c].logged > 0, "{c}");
            assert_eq!(fast[c].dropped, 0, "{c}");
            assert!(slow[c].dropped > 0, "{c}");
            assert_eq!(
                fast[c].logged,
                slow[c].logged + slow[c].dropped,
                "{c}: the device's accesses do not depend on the consumer"
            );
        }
    }

    /// B5's per-mechanism accounting adds up: each policy's pinned time,
    /// split by cause and use, is its pinned share; ADP pins only by age
    /// or overflow, and every protected access ends an idle pin.
    #[test]
    fn pin_ledger_adds_up_to_the_pinned_share() {
        let sizes = [(Class::Nic, 512), (Class::Block, 1024)];
        for kind in ["lru10", "adp", "adp-derived"] {
            let out = round(
                &RoundCfg {
                    steps: 1200,
                    ..RoundCfg::hour(kind, 0.3)
                },
                &sizes,
            );
            for c in ["nic", "block"] {
                let r = &out.classes[c];
                let total: f64 = r.ledger.secs.values().sum();
                assert!(r.pinned_pct > 0.0, "{kind} {c}");
                assert!(
                    (total - r.pinned_pct).abs() < 1e-6 * r.pinned_pct.max(1.0),
                    "{kind} {c}: ledger {total} vs pinned {}",
                    r.pinned_pct
                );
                let adp = kind.starts_with("adp");
                for (cause, _) in r.ledger.secs.keys() {
                    assert_eq!(*cause != PinCause::Access, adp, "{kind} {c}: {cause:?}");
                }
                if adp {
                    // ADP: each protected access starts a demotion wait.
                    assert!(r.ledger.protected >= r.ledger.unpinned_hot, "{kind} {c}");
                }
            }
        }
    }

    /// The PSI-balanced server on the real model: deterministic (the same
    /// round twice gives the same numbers), the VMs never hold more than
    /// the server's memory at the end of a second, each VM's reclaim ratio
    /// stays within 0-50%, and the block VMs (whose devices also stall)
    /// end up reclaimed less than the NIC VMs.
    #[test]
    fn psi_server_is_deterministic_and_keeps_its_bounds() {
        let sizes = fleet(14);
        let cfg = |kind| RoundCfg {
            reclaim: Reclaim::Psi(PsiCfg::new(0.3)),
            steps: 1800,
            ..RoundCfg::hour(kind, 0.3)
        };
        for kind in ["none", "adp"] {
            let a = round(&cfg(kind), &sizes);
            let b = round(&cfg(kind), &sizes);
            let (cap, held) = a.server.expect("a PSI round reports its server");
            assert!(held <= cap, "{kind}: held {held} of {cap}");
            let total: usize = sizes.iter().map(|s| s.1).sum();
            assert_eq!(cap, (0.7 * total as f64) as usize);
            for c in ["nic", "block"] {
                let (x, y) = (&a.classes[c], &b.classes[c]);
                assert_eq!(
                    (x.iopfs, x.pin_fetches),
                    (y.iopfs, y.pin_fetches),
                    "{kind} {c}"
                );
                assert_eq!(x.ratio_pct, y.ratio_pct, "{kind} {c}");
                assert_eq!(x.pinned_pct, y.pinned_pct, "{kind} {c}");
                let (_, lo, hi) = x.ratio_pct;
                assert!(lo >= 0.0 && hi <= 50.0, "{kind} {c}: {lo}-{hi}");
            }
            assert!(
                a.classes["block"].ratio_pct.0 < a.classes["nic"].ratio_pct.0,
                "{kind}: block {:?} nic {:?}",
                a.classes["block"].ratio_pct,
                a.classes["nic"].ratio_pct
            );
        }
    }

    /// B9's production-like reclaim: a VM's budget moves every hour, and
    /// the per-second fault counts fold into one record per day.
    #[test]
    fn drifting_reclaim_is_recorded_per_day() {
        let sizes = [(Class::Block, 512)];
        let out = round(
            &RoundCfg {
                kind: "none",
                reclaim: Reclaim::Drift {
                    hi: 0.5,
                    skew: 1.0,
                    every_s: 600,
                },
                steps: DAY_S + 3600,
                log: None,
                keep_sizes: false,
            },
            &sizes,
        );
        let days = &out.vms[0].rate.days;
        assert_eq!(days.len(), 2);
        assert_eq!(
            days.iter().map(|d| d.iopfs).sum::<u64>(),
            out.classes["block"].iopfs
        );
        assert!(days[0].iopfs > 0);
        assert!(days.iter().all(|d| d.peak_per_s * DAY_S >= d.iopfs));
    }
}
