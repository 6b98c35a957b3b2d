//! The synthetic device traces: what each VM's device touches, second by
//! second (NIC: a ring over 3% of the VM, bursty; block: page-cache-like
//! lives), and the guest CPU touches that go with them. Seeded: the same
//! VM number gives the same trace.

use rand::{Rng, SeedableRng};

/// A device's kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    /// NIC-like: a receive ring.
    Nic,
    /// Block-like: page-cache pages.
    Block,
}

/// The block trace's parameters, calibrated to the paper's published
/// trace statistics (Fig 10, §1.7 of the digest), not to any pinning
/// result. A page-cache page's *life*: the guest allocates it (a CPU
/// touch), the device writes it, then re-reads it as a Poisson process
/// until the life ends. Allocations arrive at a constant rate and take an
/// untouched unit with probability 1 - F/F_MAX (F: the footprint so far),
/// else a unit whose life has ended, so the footprint grows as F_MAX (1 -
/// e^(-t/tau)): F_30MIN at 30 min, F_MAX in the long run.
pub(crate) mod block {
    /// Footprint after 30 min (Fig 10: ~28%).
    pub const F_30MIN: f64 = 0.28;
    /// Long-run footprint (§4.2: block footprints grow to 53% over weeks).
    pub const F_MAX: f64 = 0.53;
    /// Share of lives that are hot (re-read every 20-30 s).
    pub const HOT: f64 = 0.09;
    /// Re-reads per second of a hot life, log-uniform in this range.
    pub const HOT_RATE: (f64, f64) = (1.0 / 30.0, 1.0 / 20.0);
    /// Re-reads per second of the other lives (every 5-10 min).
    pub const COLD_RATE: (f64, f64) = (1.0 / 600.0, 1.0 / 300.0);
    /// Mean life, s (exponential).
    pub const LIFE_S: f64 = 3600.0;
}

/// The NIC trace's footprint growth, from the paper (§4.2): "over the
/// course of weeks, the average footprint grows to 17% for NICs", from the
/// ring's ~3% (Fig 11). Read as two weeks (the shortest "weeks"): a ring
/// buffer moves to a new unit at 14% of the VM per 14 days, i.e. 0.2-1.7
/// moves an hour on B5's VMs (round 3's model moved one every 2 minutes,
/// 30 an hour, which would cover a VM in a day).
pub(crate) mod nic {
    /// Ring share of the VM (Fig 11: 2-5%).
    pub const RING: f64 = 0.03;
    /// Long-run footprint (§4.2).
    pub const F_WEEKS: f64 = 0.17;
    /// "Weeks", s.
    pub const WEEKS_S: f64 = 14.0 * 86_400.0;
    /// Ring buffer moves per second on a VM of `units` units.
    pub fn moves_per_s(units: usize) -> f64 {
        (F_WEEKS - RING) * units as f64 / WEEKS_S
    }
}

/// A min-heap entry: (next access, ms; unit).
type Due = std::cmp::Reverse<(u64, usize)>;

/// One device's trace generator.
pub(crate) struct Trace {
    class: Class,
    units: usize,
    rng: rand::rngs::SmallRng,
    ring: Vec<usize>,
    on: bool,
    /// Block: seconds stepped so far.
    t: u64,
    /// Block: allocations owed (fractional).
    carry: f64,
    /// Block: units ever touched.
    touched: usize,
    seen: Vec<bool>,
    /// Block: units whose life has ended (reusable by an allocation).
    dead: Vec<usize>,
    /// Block: each live unit's re-read rate (/s) and end of life (ms).
    rate: Vec<f64>,
    end_ms: Vec<u64>,
    due: std::collections::BinaryHeap<Due>,
}

impl Trace {
    /// The trace of a `class` device on a VM of `units` units.
    pub(crate) fn new(class: Class, units: usize, seed: u64) -> Trace {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let ring_len = ((units as f64 * nic::RING) as usize).max(2);
        let base = rng.gen_range(0..units - ring_len);
        Trace {
            class,
            units,
            ring: (base..base + ring_len).collect(),
            on: true,
            t: 0,
            carry: 0.0,
            touched: 0,
            seen: vec![false; units],
            dead: Vec::new(),
            rate: vec![0.0; units],
            end_ms: vec![0; units],
            due: std::collections::BinaryHeap::new(),
            rng,
        }
    }

    fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.rng.gen::<f64>()).ln() / rate
    }

    fn log_uniform(&mut self, (lo, hi): (f64, f64)) -> f64 {
        (self.rng.gen_range(lo.ln()..=hi.ln())).exp()
    }

    /// The device accesses of one step (and the guest CPU touches that
    /// go with them, in `cpu`).
    pub(crate) fn step(&mut self, out: &mut Vec<usize>, cpu: &mut Vec<usize>) {
        out.clear();
        cpu.clear();
        match self.class {
            Class::Nic => {
                // On/off traffic: idle gaps of a few minutes.
                if self
                    .rng
                    .gen_bool(if self.on { 1.0 / 120.0 } else { 1.0 / 240.0 })
                {
                    self.on = !self.on;
                }
                if self.on {
                    for _ in 0..8 {
                        out.push(self.ring[self.rng.gen_range(0..self.ring.len())]);
                    }
                }
                // Now and then a ring buffer moves (the footprint grows
                // slowly): the guest allocates and clears the new buffer
                // (a CPU touch) before the device uses it.
                if self.rng.gen_bool(nic::moves_per_s(self.units).min(1.0)) {
                    let i = self.rng.gen_range(0..self.ring.len());
                    self.ring[i] = self.rng.gen_range(0..self.units);
                    cpu.push(self.ring[i]);
                }
            }
            Class::Block => self.block_step(out, cpu),
        }
    }

    /// See [`block`].
    fn block_step(&mut self, out: &mut Vec<usize>, cpu: &mut Vec<usize>) {
        use block::*;
        let now_ms = self.t * 1000;
        // Allocations per second that give F_30MIN at 30 min.
        let per_s = -(1.0 - F_30MIN / F_MAX).ln() * F_MAX / 1800.0 * self.units as f64;
        self.carry += per_s;
        while self.carry >= 1.0 {
            self.carry -= 1.0;
            let f = self.touched as f64 / self.units as f64;
            let fresh =
                self.dead.is_empty() || self.rng.gen_bool((1.0 - f / F_MAX).clamp(0.0, 1.0));
            let u = if fresh && self.touched < self.units {
                loop {
                    let u = self.rng.gen_range(0..self.units);
                    if !self.seen[u] {
                        self.seen[u] = true;
                        self.touched += 1;
                        break u;
                    }
                }
            } else if let Some(i) =
                (!self.dead.is_empty()).then(|| self.rng.gen_range(0..self.dead.len()))
            {
                self.dead.swap_remove(i)
            } else {
                continue;
            };
            let range = if self.rng.gen_bool(HOT) {
                HOT_RATE
            } else {
                COLD_RATE
            };
            self.rate[u] = self.log_uniform(range);
            let life = self.exp(1.0 / LIFE_S);
            self.end_ms[u] = now_ms + (life * 1000.0) as u64;
            // A new page-cache page: the guest allocated it (its CPU
            // touched it) just before the DMA.
            cpu.push(u);
            self.due.push(std::cmp::Reverse((now_ms, u)));
        }
        while let Some(&std::cmp::Reverse((at, u))) = self.due.peek() {
            if at > now_ms {
                break;
            }
            self.due.pop();
            out.push(u);
            let gap = self.exp(self.rate[u]);
            let next = (at + (gap * 1000.0) as u64).max(now_ms + 1000);
            if next < self.end_ms[u] {
                self.due.push(std::cmp::Reverse((next, u)));
            } else {
                self.dead.push(u);
            }
        }
        self.t += 1;
    }
}
