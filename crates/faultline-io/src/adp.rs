//! Adaptive pinning (VPRI's Adaptive DMA Protector, seed 003 §6.2) and
//! its baselines, as pure state machines: no syscalls, no clocks (time is
//! passed in, in ns), property-tested.
//!
//! A [`PinPolicy`] sees the I/O accesses of one device (its *protection
//! domain*) as units (an ADP unit is a run of region pages: 2 MiB in the
//! paper) and decides which units are pinned. The runtime applies the
//! decisions ([`PinPolicy::drain_changes`]) as pins the evictor honours.
//!
//! [`Adp`] (the paper's rules, Fig 14):
//!
//! * two LRU blocks per domain, ordered by last access: **active**
//!   (short recency, *not* pinned) and **inactive** (long recency, pinned);
//! * first access → active head, unpinned; an active block past its cap
//!   (30% of the domain's memory) promotes its tail to inactive (pinned);
//! * every `scan_period` the tail run of active units older than
//!   `threshold` is promoted, stopping at the first younger unit;
//! * an access to an inactive unit schedules its demotion (unpin, back to
//!   active) `demote_delay` later; it stays pinned until then;
//! * the threshold is fixed (the paper's 180 s), or derived from the
//!   reclaimer ([`Adp::with_derived_threshold`]: a quantile of the ages at
//!   which the reclaimer takes this device's units, fed through
//!   [`PinPolicy::on_reclaim`]; the paper: "the threshold reflects the
//!   reclaim policy in the memory subsystem"). A runtime device gets the
//!   derived one with [`crate::PinMode::AdpDerived`]: it watches the
//!   region's evictions ([`faultline::Region::watch_reclaims`]) and turns
//!   each into an age since its own last access to the unit;
//!   `faultline bench vpri` (B5) runs both in the model.
//!
//! Choices where the paper is silent (digest §1.8), tested below:
//!
//! * an inactive block past its cap (5%) unpins and forgets its oldest
//!   unit (a later access starts it over in active);
//! * an inactive unit accessed again moves to the inactive head (both
//!   blocks are ordered by last access) and keeps its pin until demoted;
//! * the caps are per domain (per device), in units;
//! * a unit never accessed again stays pinned until the inactive cap
//!   pushes it out.
//!
//! Baselines: [`LruPin`] (pin on access, keep the `cap` most recent units:
//! the paper's "simple LRU, static 10%"), [`PinAll`] (static pinning),
//! [`PinNothing`].

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A pinning policy for one protection domain. See the module docs.
pub trait PinPolicy: Send {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// An I/O touched `unit` at `now` (ns).
    fn on_access(&mut self, unit: usize, now: u64);
    /// Time passes: run whatever is due at `now`.
    fn tick(&mut self, now: u64);
    /// Hands every pin (`true`) and unpin (`false`) decided since the last
    /// call to `f`, in order.
    fn drain_changes(&mut self, f: &mut dyn FnMut(usize, bool));
    /// Whether `unit` is pinned.
    fn is_pinned(&self, unit: usize) -> bool;
    /// Number of units pinned.
    fn pinned(&self) -> usize;
    /// Units in the active (unpinned, tracked) and inactive (pinned)
    /// blocks; policies without blocks report `(0, pinned)`.
    fn sizes(&self) -> (usize, usize) {
        (0, self.pinned())
    }
    /// The reclaimer took `unit`, which this device last touched `age_ns`
    /// ago (policies that follow the reclaimer's horizon use it; default:
    /// ignored).
    fn on_reclaim(&mut self, unit: usize, age_ns: u64) {
        let _ = (unit, age_ns);
    }
    /// The age threshold in force (ns), for policies that have one.
    fn threshold_ns(&self) -> Option<u64> {
        None
    }
    /// Why `unit` is pinned (`None`: it is not). Policies that pin on
    /// access (the default) say [`PinCause::Access`].
    fn pin_cause(&self, unit: usize) -> Option<PinCause> {
        self.is_pinned(unit).then_some(PinCause::Access)
    }
}

/// Why a unit is pinned (for accounting: `faultline bench vpri` B5 splits
/// the pinned memory by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinCause {
    /// Pinned when accessed (simple LRU, pin-all).
    Access,
    /// ADP: promoted by the scan, idle past the threshold.
    Age,
    /// ADP: promoted from the tail of an overflowing active block.
    Overflow,
}

/// ADP parameters (per domain, in units and ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdpConfig {
    /// Most units in the active block.
    pub active_cap: usize,
    /// Most units in the inactive (pinned) block.
    pub inactive_cap: usize,
    /// Period of the promotion scan.
    pub scan_period_ns: u64,
    /// Age past which an active unit is promoted (pinned).
    pub threshold_ns: u64,
    /// Delay between a re-access of an inactive unit and its demotion.
    pub demote_delay_ns: u64,
}

impl AdpConfig {
    /// The paper's settings for a domain over `units` units of memory:
    /// active 30%, inactive 5%, scan 20 s, threshold 180 s, demotion 30 s,
    /// every time multiplied by `time_scale` (the benchmarks run at 1/100).
    pub fn paper(units: usize, time_scale: f64) -> AdpConfig {
        let ns = |s: f64| (s * 1e9 * time_scale) as u64;
        AdpConfig {
            active_cap: (units * 30 / 100).max(1),
            inactive_cap: (units * 5 / 100).max(1),
            scan_period_ns: ns(20.0).max(1),
            threshold_ns: ns(180.0),
            demote_delay_ns: ns(30.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Active,
    Inactive,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    block: Block,
    last: u64,
    key: (u64, u64),
    demote_at: Option<u64>,
    /// Why it was promoted (inactive units only).
    cause: Option<PinCause>,
}

/// The Adaptive DMA Protector for one domain. See the module docs.
#[derive(Debug)]
pub struct Adp {
    cfg: AdpConfig,
    meta: HashMap<usize, Meta>,
    active: BTreeMap<(u64, u64), usize>,
    inactive: BTreeMap<(u64, u64), usize>,
    demotions: VecDeque<(u64, usize)>,
    seq: u64,
    next_scan: Option<u64>,
    changes: Vec<(usize, bool)>,
    /// Units the last scan visited and promoted (for the scan's bound).
    pub last_scan: (usize, usize),
    /// Promotions by age threshold and by active overflow; demotions;
    /// units dropped by the inactive cap.
    pub counts: AdpCounts,
    /// Derived threshold: the quantile of recent reclaim ages it follows.
    derive: Option<f64>,
    /// Recent reclaim ages (ns) of units this device had touched.
    ages: VecDeque<u64>,
    ages_dirty: bool,
}

/// Reclaim ages a derived threshold looks at (the most recent ones).
const AGE_WINDOW: usize = 256;
/// Reclaim ages needed before a derived threshold replaces the configured
/// one.
const AGE_MIN: usize = 16;

/// What ADP has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdpCounts {
    /// Promotions by the age scan.
    pub promoted_by_age: u64,
    /// Promotions because the active block overflowed.
    pub promoted_by_overflow: u64,
    /// Demotions after a re-access.
    pub demoted: u64,
    /// Inactive units unpinned and forgotten by the inactive cap.
    pub dropped_by_cap: u64,
}

impl Adp {
    /// An empty domain.
    pub fn new(cfg: AdpConfig) -> Adp {
        Adp {
            cfg,
            meta: HashMap::new(),
            active: BTreeMap::new(),
            inactive: BTreeMap::new(),
            demotions: VecDeque::new(),
            seq: 0,
            next_scan: None,
            changes: Vec::new(),
            last_scan: (0, 0),
            counts: AdpCounts::default(),
            derive: None,
            ages: VecDeque::new(),
            ages_dirty: false,
        }
    }

    /// Derives the age threshold from the reclaimer instead of fixing it
    /// (digest §5; the paper: "the threshold reflects the reclaim policy
    /// in the memory subsystem"): the `quantile` (e.g. 0.1) of the ages
    /// since their last access of this device's units the reclaimer took
    /// recently ([`PinPolicy::on_reclaim`]), so a unit is pinned before
    /// most units that old get reclaimed. The configured threshold holds
    /// until enough reclaims were seen.
    pub fn with_derived_threshold(mut self, quantile: f64) -> Adp {
        self.derive = Some(quantile.clamp(0.0, 1.0));
        self
    }

    fn update_threshold(&mut self) {
        let Some(q) = self.derive else { return };
        if !self.ages_dirty || self.ages.len() < AGE_MIN {
            return;
        }
        self.ages_dirty = false;
        let mut a: Vec<u64> = self.ages.iter().copied().collect();
        a.sort_unstable();
        let i = ((a.len() - 1) as f64 * q).round() as usize;
        self.cfg.threshold_ns = a[i];
    }

    /// The configuration.
    pub fn config(&self) -> AdpConfig {
        self.cfg
    }

    /// Whether `unit` is in the active block.
    pub fn is_active(&self, unit: usize) -> bool {
        self.meta
            .get(&unit)
            .is_some_and(|m| m.block == Block::Active)
    }

    fn key(&mut self, t: u64) -> (u64, u64) {
        self.seq += 1;
        (t, self.seq)
    }

    fn insert(&mut self, unit: usize, block: Block, last: u64) {
        let key = self.key(last);
        match block {
            Block::Active => self.active.insert(key, unit),
            Block::Inactive => self.inactive.insert(key, unit),
        };
        self.meta.insert(
            unit,
            Meta {
                block,
                last,
                key,
                demote_at: None,
                cause: None,
            },
        );
    }

    fn remove(&mut self, unit: usize) -> Option<Meta> {
        let m = self.meta.remove(&unit)?;
        match m.block {
            Block::Active => self.active.remove(&m.key),
            Block::Inactive => self.inactive.remove(&m.key),
        };
        Some(m)
    }

    fn promote(&mut self, unit: usize, cause: PinCause) {
        let m = self.remove(unit).expect("promoted unit is tracked");
        self.insert(unit, Block::Inactive, m.last);
        self.meta.get_mut(&unit).expect("just inserted").cause = Some(cause);
        self.changes.push((unit, true));
        self.enforce_inactive_cap();
    }

    fn enforce_inactive_cap(&mut self) {
        while self.inactive.len() > self.cfg.inactive_cap {
            let (_, &u) = self.inactive.first_key_value().expect("non-empty");
            self.remove(u);
            self.changes.push((u, false));
            self.counts.dropped_by_cap += 1;
        }
    }

    fn enforce_active_cap(&mut self) {
        while self.active.len() > self.cfg.active_cap {
            let (_, &u) = self.active.first_key_value().expect("non-empty");
            self.promote(u, PinCause::Overflow);
            self.counts.promoted_by_overflow += 1;
        }
    }
}

impl PinPolicy for Adp {
    fn name(&self) -> &'static str {
        "adp"
    }

    fn on_access(&mut self, unit: usize, now: u64) {
        self.next_scan.get_or_insert(now + self.cfg.scan_period_ns);
        match self.meta.get(&unit).copied() {
            None => {
                self.insert(unit, Block::Active, now);
                self.enforce_active_cap();
            }
            Some(m) if m.block == Block::Active => {
                self.remove(unit);
                self.insert(unit, Block::Active, now);
            }
            Some(m) => {
                // Cold → hot: stays pinned until the demotion is due.
                self.remove(unit);
                self.insert(unit, Block::Inactive, now);
                let due = m.demote_at.unwrap_or(now + self.cfg.demote_delay_ns);
                let meta = self.meta.get_mut(&unit).expect("just inserted");
                meta.demote_at = Some(due);
                meta.cause = m.cause;
                if m.demote_at.is_none() {
                    self.demotions.push_back((due, unit));
                }
            }
        }
    }

    fn tick(&mut self, now: u64) {
        self.update_threshold();
        while let Some(&(due, unit)) = self.demotions.front() {
            if due > now {
                break;
            }
            self.demotions.pop_front();
            let Some(m) = self.meta.get(&unit).copied() else {
                continue;
            };
            if m.block != Block::Inactive || m.demote_at != Some(due) {
                continue;
            }
            self.remove(unit);
            self.changes.push((unit, false));
            self.insert(unit, Block::Active, m.last);
            self.counts.demoted += 1;
            self.enforce_active_cap();
        }
        while let Some(at) = self.next_scan.filter(|&t| t <= now) {
            let (mut visited, mut promoted) = (0, 0);
            while let Some((_, &u)) = self.active.first_key_value() {
                visited += 1;
                let m = self.meta[&u];
                if now.saturating_sub(m.last) <= self.cfg.threshold_ns {
                    break;
                }
                self.promote(u, PinCause::Age);
                self.counts.promoted_by_age += 1;
                promoted += 1;
            }
            self.last_scan = (visited, promoted);
            self.next_scan = Some(at + self.cfg.scan_period_ns);
        }
    }

    fn drain_changes(&mut self, f: &mut dyn FnMut(usize, bool)) {
        for (u, p) in self.changes.drain(..) {
            f(u, p);
        }
    }

    fn is_pinned(&self, unit: usize) -> bool {
        self.meta
            .get(&unit)
            .is_some_and(|m| m.block == Block::Inactive)
    }

    fn pinned(&self) -> usize {
        self.inactive.len()
    }

    fn sizes(&self) -> (usize, usize) {
        (self.active.len(), self.inactive.len())
    }

    fn threshold_ns(&self) -> Option<u64> {
        Some(self.cfg.threshold_ns)
    }

    fn pin_cause(&self, unit: usize) -> Option<PinCause> {
        self.meta.get(&unit).and_then(|m| m.cause)
    }

    fn on_reclaim(&mut self, _unit: usize, age_ns: u64) {
        if self.derive.is_none() {
            return;
        }
        if self.ages.len() == AGE_WINDOW {
            self.ages.pop_front();
        }
        self.ages.push_back(age_ns);
        self.ages_dirty = true;
    }
}

/// Simple LRU pinning: every accessed unit is pinned at once; the `cap`
/// most recently accessed units stay pinned (the paper's baseline with a
/// static pin ratio).
#[derive(Debug)]
pub struct LruPin {
    cap: usize,
    order: BTreeMap<u64, usize>,
    at: HashMap<usize, u64>,
    seq: u64,
    changes: Vec<(usize, bool)>,
}

impl LruPin {
    /// At most `cap` units pinned.
    pub fn new(cap: usize) -> LruPin {
        LruPin {
            cap: cap.max(1),
            order: BTreeMap::new(),
            at: HashMap::new(),
            seq: 0,
            changes: Vec::new(),
        }
    }
}

impl PinPolicy for LruPin {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_access(&mut self, unit: usize, _now: u64) {
        self.seq += 1;
        match self.at.insert(unit, self.seq) {
            Some(old) => {
                self.order.remove(&old);
            }
            None => self.changes.push((unit, true)),
        }
        self.order.insert(self.seq, unit);
        while self.order.len() > self.cap {
            let (_, u) = self.order.pop_first().expect("non-empty");
            self.at.remove(&u);
            self.changes.push((u, false));
        }
    }
    fn tick(&mut self, _now: u64) {}
    fn drain_changes(&mut self, f: &mut dyn FnMut(usize, bool)) {
        for (u, p) in self.changes.drain(..) {
            f(u, p);
        }
    }
    fn is_pinned(&self, unit: usize) -> bool {
        self.at.contains_key(&unit)
    }
    fn pinned(&self) -> usize {
        self.at.len()
    }
}

/// Static pinning of every unit of the domain.
#[derive(Debug)]
pub struct PinAll {
    units: usize,
    announced: bool,
}

impl PinAll {
    /// Pins units `0..units`.
    pub fn new(units: usize) -> PinAll {
        PinAll {
            units,
            announced: false,
        }
    }
}

impl PinPolicy for PinAll {
    fn name(&self) -> &'static str {
        "pin-all"
    }
    fn on_access(&mut self, _unit: usize, _now: u64) {}
    fn tick(&mut self, _now: u64) {}
    fn drain_changes(&mut self, f: &mut dyn FnMut(usize, bool)) {
        if !self.announced {
            self.announced = true;
            (0..self.units).for_each(|u| f(u, true));
        }
    }
    fn is_pinned(&self, unit: usize) -> bool {
        unit < self.units
    }
    fn pinned(&self) -> usize {
        self.units
    }
}

/// No pinning at all (the baseline IOPF count).
#[derive(Debug, Default)]
pub struct PinNothing;

impl PinPolicy for PinNothing {
    fn name(&self) -> &'static str {
        "none"
    }
    fn on_access(&mut self, _unit: usize, _now: u64) {}
    fn tick(&mut self, _now: u64) {}
    fn drain_changes(&mut self, _f: &mut dyn FnMut(usize, bool)) {}
    fn is_pinned(&self, _unit: usize) -> bool {
        false
    }
    fn pinned(&self) -> usize {
        0
    }
}

/// One protection domain per device, routed by device id (the paper's
/// BDF): churn in one domain never touches another's state.
pub struct Domains<P> {
    domains: HashMap<u64, P>,
}

impl<P: PinPolicy> Domains<P> {
    /// No domains yet.
    pub fn new() -> Domains<P> {
        Domains {
            domains: HashMap::new(),
        }
    }
    /// Adds device `dev`'s domain.
    pub fn add(&mut self, dev: u64, policy: P) {
        self.domains.insert(dev, policy);
    }
    /// Routes an access to `dev`'s domain (ignored for unknown devices).
    pub fn on_access(&mut self, dev: u64, unit: usize, now: u64) {
        if let Some(d) = self.domains.get_mut(&dev) {
            d.on_access(unit, now);
        }
    }
    /// Ticks every domain.
    pub fn tick(&mut self, now: u64) {
        self.domains.values_mut().for_each(|d| d.tick(now));
    }
    /// Device `dev`'s domain.
    pub fn get(&self, dev: u64) -> Option<&P> {
        self.domains.get(&dev)
    }
}

impl<P: PinPolicy> Default for Domains<P> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn cfg() -> AdpConfig {
        AdpConfig {
            active_cap: 30,
            inactive_cap: 5,
            scan_period_ns: 20,
            threshold_ns: 180,
            demote_delay_ns: 30,
        }
    }

    /// Checks the invariants (digest check 14) and that the change stream
    /// reproduces exactly the pinned set.
    fn check(a: &mut Adp, applied: &mut HashSet<usize>) -> Result<(), TestCaseError> {
        let (act, inact) = a.sizes();
        prop_assert!(act <= a.cfg.active_cap);
        prop_assert!(inact <= a.cfg.inactive_cap);
        prop_assert_eq!(a.meta.len(), act + inact);
        let mut seen = HashSet::new();
        for &u in a.active.values().chain(a.inactive.values()) {
            prop_assert!(seen.insert(u), "unit {} in two places", u);
        }
        let mut err = None;
        a.drain_changes(&mut |u, p| {
            let ok = if p {
                applied.insert(u)
            } else {
                applied.remove(&u)
            };
            if !ok {
                err = Some((u, p));
            }
        });
        prop_assert!(err.is_none(), "inconsistent change {:?}", err);
        let pinned: HashSet<usize> = a.inactive.values().copied().collect();
        prop_assert_eq!(&pinned, applied);
        // Every pinned unit says why, and only pinned units do.
        for &u in a.active.values() {
            prop_assert_eq!(a.pin_cause(u), None);
        }
        for &u in a.inactive.values() {
            prop_assert!(matches!(
                a.pin_cause(u),
                Some(PinCause::Age | PinCause::Overflow)
            ));
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn invariants_hold(ops in prop::collection::vec((0usize..80, 0u64..40), 1..400)) {
            let mut a = Adp::new(cfg());
            let mut applied = HashSet::new();
            let mut now = 0;
            for (unit, dt) in ops {
                now += dt;
                if dt % 3 == 0 { a.tick(now); } else { a.on_access(unit, now); }
                check(&mut a, &mut applied)?;
            }
        }

        #[test]
        fn scan_promotes_exactly_the_old_tail_run(ages in prop::collection::vec(0u64..400, 1..25)) {
            // Units accessed at distinct times, one scan at t = 1000.
            let mut c = cfg();
            c.scan_period_ns = 1000;
            c.inactive_cap = 100;
            let mut a = Adp::new(c);
            let mut ts: Vec<u64> = ages.iter().map(|&g| 1000 - g).collect();
            ts.sort();
            ts.dedup();
            for (u, &t) in ts.iter().enumerate() { a.on_access(u, t); }
            a.next_scan = Some(1000);
            a.tick(1000);
            let old = ts.iter().filter(|&&t| 1000 - t > c.threshold_ns).count();
            prop_assert_eq!(a.last_scan.1, old);
            prop_assert!(a.last_scan.0 <= old + 1);
            for (u, &t) in ts.iter().enumerate() {
                prop_assert_eq!(a.is_pinned(u), 1000 - t > c.threshold_ns);
            }
        }

        #[test]
        fn demotion_waits_for_the_delay(extra in 0u64..29, late in 30u64..60) {
            let mut c = cfg();
            c.scan_period_ns = 1_000_000;
            let mut a = Adp::new(c);
            for u in 0..31 { a.on_access(u, u as u64); }
            // Unit 0 overflowed into inactive (pinned).
            prop_assert!(a.is_pinned(0));
            a.on_access(0, 100);
            a.tick(100 + extra);
            prop_assert!(a.is_pinned(0), "demoted before the delay");
            a.tick(100 + late);
            prop_assert!(!a.is_pinned(0) && a.is_active(0));
        }

        #[test]
        fn derived_threshold_follows_reclaim_ages(ages in prop::collection::vec(1u64..10_000, 0..600)) {
            let mut a = Adp::new(cfg()).with_derived_threshold(0.1);
            for (i, &g) in ages.iter().enumerate() {
                a.on_reclaim(i, g);
            }
            a.tick(1);
            let t = a.threshold_ns().unwrap();
            if ages.len() < AGE_MIN {
                prop_assert_eq!(t, cfg().threshold_ns, "configured until enough reclaims");
            } else {
                // The P10 of the most recent AGE_WINDOW ages.
                let mut w: Vec<u64> = ages[ages.len().saturating_sub(AGE_WINDOW)..].to_vec();
                w.sort_unstable();
                let below = w.iter().filter(|&&x| x < t).count();
                let at_most = w.iter().filter(|&&x| x <= t).count();
                let want = ((w.len() - 1) as f64 * 0.1).round() as usize;
                prop_assert!(below <= want && want < at_most, "{t} is not the P10 of {w:?}");
            }
            // A fixed-threshold ADP ignores reclaims.
            let mut f = Adp::new(cfg());
            for (i, &g) in ages.iter().enumerate() {
                f.on_reclaim(i, g);
            }
            f.tick(1);
            prop_assert_eq!(f.threshold_ns(), Some(cfg().threshold_ns));
        }

        #[test]
        fn domains_are_isolated(a_ops in prop::collection::vec((0usize..50, 1u64..30), 1..200), b_ops in prop::collection::vec((0usize..50, 1u64..30), 1..50)) {
            let run = |with_a: bool| {
                let mut d = Domains::new();
                d.add(1, Adp::new(cfg()));
                d.add(2, Adp::new(cfg()));
                let mut now = 0;
                let mut ai = a_ops.iter();
                for &(u, dt) in &b_ops {
                    now += dt;
                    d.on_access(2, u, now);
                    if with_a {
                        for &(au, adt) in ai.by_ref().take(4) { d.on_access(1, au, now + adt); }
                    }
                    d.tick(now);
                }
                let b = d.get(2).unwrap();
                let mut pinned: Vec<usize> = (0..50).filter(|&u| b.is_pinned(u)).collect();
                pinned.sort();
                pinned
            };
            prop_assert_eq!(run(true), run(false));
        }

        #[test]
        fn lru_pins_the_cap_most_recent(ops in prop::collection::vec(0usize..40, 1..200), cap in 1usize..10) {
            let mut l = LruPin::new(cap);
            let mut applied = HashSet::new();
            for (i, &u) in ops.iter().enumerate() {
                l.on_access(u, i as u64);
                l.drain_changes(&mut |u, p| { if p { applied.insert(u); } else { applied.remove(&u); } });
                let mut recent = Vec::new();
                for &v in ops[..=i].iter().rev() {
                    if !recent.contains(&v) {
                        recent.push(v);
                    }
                    if recent.len() == cap {
                        break;
                    }
                }
                let want: HashSet<usize> = recent.into_iter().collect();
                prop_assert_eq!(&applied, &want);
            }
        }
    }

    #[test]
    fn first_access_is_active_and_overflow_pins_the_tail() {
        let mut a = Adp::new(cfg());
        a.on_access(7, 0);
        assert!(a.is_active(7) && !a.is_pinned(7));
        for u in 100..130 {
            a.on_access(u, 1 + u as u64);
        }
        // 31 units, cap 30: the oldest (7) was promoted and pinned.
        assert!(a.is_pinned(7));
        assert_eq!(a.pin_cause(7), Some(PinCause::Overflow));
        assert_eq!(a.counts.promoted_by_overflow, 1);
        assert_eq!(a.sizes(), (30, 1));
    }
}
