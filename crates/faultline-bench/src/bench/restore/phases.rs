//! Where the time of a demand fault goes, as the vCPU sees it: the peer's
//! TSC stamps around each slow touch (`faultline peer --stamps`) joined by
//! page with serve's stamps along the handler's path (`faultline serve
//! --phase-samples`, the last N faults of the peer), like `bench
//! latency`'s trigger / resolve / return for local faults.
//!
//! ```text
//!  touch ─read─► read(2) returned ─batch─► its turn ─store─► bytes ready
//!        ─copy─► ioctl returned ─return──────────────────────► touch retired
//!                               └wake─► UFFDIO_WAKE returned
//! ```
//!
//! `return` runs from the install ioctl's end to the touch retiring: the
//! handler's `UFFDIO_WAKE` and the vCPU's wake-up, which overlap (a woken
//! vCPU often retires its touch before the handler's wake call returns);
//! `wake` runs from the same ioctl's end to that call's, as the handler
//! sees it: the call alone, or, for a window serve copies in pieces (a
//! peer's, over 256 KiB), the other pieces and then the call.
//!
//! 1. [`of_run`] keys the peer's stamps by page, and keeps each serve
//!    sample whose page the peer stamped and whose stamps are in order
//!    (a fault whose page was already there, installed by another fault's
//!    window, has no copy: left out).
//! 2. Per run: each phase's median and 99th percentile, in ns (the TSC
//!    is invariant and shared by the CPUs here: one calibration converts
//!    both processes' stamps); then [`Phases::median`] over the reps.
//! 3. [`print`] tabulates the medians; [`record`] adds them and the p99s
//!    to the `--json` record; [`bars`] gives the phase-bar figure's
//!    trigger (read + batch), resolve (store + copy) and return (wake +
//!    return) in cycles, as `bench latency` draws local faults.

use std::collections::HashMap;

use faultline::FaultPhases;

use crate::harness::report::{print_table, Record};
use crate::harness::tsc::tsc;

use super::timeline::median_finite;

/// The phases, in the order a fault goes through them.
pub const PHASES: [&str; 6] = ["read", "batch", "store", "copy", "wake", "return"];

/// Samples each side keeps: serve's last faults, each vCPU's last slow
/// touches.
pub const SAMPLES: usize = 4096;

/// One configuration's phases (medians over the reps of each run's
/// figures); NaN: no sample.
#[derive(Debug, Clone)]
pub struct Phases {
    /// Samples joined (per run).
    pub samples: f64,
    /// Each phase's median, ns.
    pub median: [f64; 6],
    /// Each phase's 99th percentile, ns.
    pub p99: [f64; 6],
    /// The whole touch (touch to retired): median, ns.
    pub total_median: f64,
    /// ... and 99th percentile.
    pub total_p99: f64,
    /// Pages the fault's install ioctl installed (its window): median.
    pub window: f64,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            samples: 0.0,
            median: [f64::NAN; 6],
            p99: [f64::NAN; 6],
            total_median: f64::NAN,
            total_p99: f64::NAN,
            window: f64::NAN,
        }
    }
}

/// The `q` quantile of sorted `v` (NaN: empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

/// One run's phases: the peer's `touches` (page address, TSC before,
/// after) joined with serve's `samples`; `page` the peer's page size.
pub fn of_run(touches: &[(u64, u64, u64)], samples: &[[u64; 8]], page: u64) -> Phases {
    let mask = !(page - 1);
    let by_page: HashMap<u64, (u64, u64)> = touches
        .iter()
        .map(|&(a, c0, c1)| (a & mask, (c0, c1)))
        .collect();
    let mut cols: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    let (mut totals, mut windows) = (Vec::new(), Vec::new());
    let ns = |c: u64| tsc().cycles_to_ns(c);
    for s in samples.iter().map(|&f| FaultPhases::from_fields(f)) {
        let Some(&(c0, c1)) = by_page.get(&(s.addr & mask)) else {
            continue;
        };
        let t = [c0, s.read, s.start, s.filled, s.resolved, c1];
        if t.contains(&0) || t.windows(2).any(|w| w[1] < w[0]) {
            continue;
        }
        for (k, col) in cols.iter_mut().enumerate().take(4) {
            col.push(ns(t[k + 1] - t[k]));
        }
        if s.woken >= s.resolved {
            cols[4].push(ns(s.woken - s.resolved));
        }
        cols[5].push(ns(c1 - s.resolved));
        totals.push(ns(c1 - c0));
        windows.push(s.pages as f64);
    }
    for c in cols.iter_mut().chain([&mut totals, &mut windows]) {
        c.sort_by(f64::total_cmp);
    }
    let each = |q: f64| -> [f64; 6] { std::array::from_fn(|k| quantile(&cols[k], q)) };
    Phases {
        samples: totals.len() as f64,
        median: each(0.5),
        p99: each(0.99),
        total_median: quantile(&totals, 0.5),
        total_p99: quantile(&totals, 0.99),
        window: quantile(&windows, 0.5),
    }
}

impl Phases {
    /// Each figure's median over `runs`.
    pub fn median(runs: &[&Phases]) -> Phases {
        let of = |f: &dyn Fn(&Phases) -> f64| median_finite(runs.iter().map(|p| f(p)).collect());
        Phases {
            samples: of(&|p| p.samples),
            median: std::array::from_fn(|k| of(&|p| p.median[k])),
            p99: std::array::from_fn(|k| of(&|p| p.p99[k])),
            total_median: of(&|p| p.total_median),
            total_p99: of(&|p| p.total_p99),
            window: of(&|p| p.window),
        }
    }

    /// Whether any sample was joined.
    pub fn any(&self) -> bool {
        self.samples > 0.0
    }
}

/// `rec` with the phases' medians and p99s (ns), when there are any.
pub fn record(mut rec: Record, p: &Phases) -> Record {
    if !p.any() {
        return rec;
    }
    for (k, name) in PHASES.iter().enumerate() {
        rec = rec
            .with(&format!("phase_{name}_ns_median"), p.median[k])
            .with(&format!("phase_{name}_ns_p99"), p.p99[k]);
    }
    rec.with("phase_samples", p.samples)
        .with("phase_total_ns_median", p.total_median)
        .with("phase_total_ns_p99", p.total_p99)
        .with("phase_window_pages_median", p.window)
}

/// The table row of configuration `lead` (working set, cache, config).
pub fn row(lead: [String; 3], p: &Phases) -> Vec<String> {
    let us = |v: f64| {
        if v.is_finite() {
            format!("{:.1}", v / 1e3)
        } else {
            "-".into()
        }
    };
    let mut line = lead.to_vec();
    line.push(format!("{:.0}", p.samples));
    line.push(if p.window.is_finite() {
        format!("{:.0}", p.window)
    } else {
        "-".into()
    });
    line.extend(p.median.iter().map(|&v| us(v)));
    line.push(us(p.total_median));
    line.push(us(p.total_p99));
    line
}

/// Prints the phase table (rows of [`row`]).
pub fn print(rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    let mut headers = vec!["ws", "cache", "config", "samples", "window pages"];
    headers.extend(PHASES);
    headers.extend(["touch us", "touch p99 us"]);
    println!("\nwhere a demand fault's time goes, as the vCPU sees it (medians per phase, us; median of the reps):");
    print_table(&headers, rows);
    println!(
        "(read: touch to serve's read(2) returning its message; batch: waiting behind the batch's earlier messages; store: lookup, window, store read up to the install ioctl; copy: the ioctl (its window; of a window over 256 KiB, the piece holding the page); return: the ioctl's end to the touch retiring (the handler's UFFDIO_WAKE and the vCPU's wake-up); wake: the ioctl's end to the UFFDIO_WAKE call's (the window's other pieces, then the call; it overlaps return). Faults whose page another fault's window installed first (no copy of their own) are left out. Samples: serve's last {SAMPLES} faults joined by page with the vCPUs' last {SAMPLES} slow touches each; touch: the whole touch of those samples. Each column is its own median: they need not add up to the touch's)"
    );
}

/// The phase-bar figure's bar of `p`: (label, trigger, resolve, return)
/// in cycles, as `bench latency` splits local faults.
pub fn bars(label: String, p: &Phases) -> (String, f64, f64, f64) {
    let c = |ns: f64| tsc().ns_to_cycles(ns) as f64;
    let m = &p.median;
    (label, c(m[0] + m[1]), c(m[2] + m[3]), c(m[5]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(addr: u64, t: [u64; 5]) -> [u64; 8] {
        [addr, t[0], t[1], t[2], t[3], t[4], t[4], 16]
    }

    #[test]
    fn samples_join_the_touches_of_their_page_and_keep_only_ordered_stamps() {
        let touches = [
            (0x10_0000, 1_000, 9_000),
            (0x20_0000, 1_000, 9_000),
            (0x30_0000, 1_000, 9_000),
        ];
        let samples = [
            // The fault's address within the page still joins.
            sample(0x10_0008, [2_000, 3_000, 4_000, 6_000, 7_000]),
            // No copy (the page was there already): left out.
            sample(0x20_0000, [2_000, 3_000, 0, 6_000, 7_000]),
            // No touch stamped for it: left out.
            sample(0x40_0000, [2_000, 3_000, 4_000, 6_000, 7_000]),
        ];
        let p = of_run(&touches, &samples, 4096);
        assert_eq!(p.samples, 1.0);
        assert_eq!(p.window, 16.0);
        let ns = |c: f64| tsc().cycles_to_ns(c as u64);
        let want = [1_000.0, 1_000.0, 1_000.0, 2_000.0, 1_000.0, 3_000.0];
        for (k, w) in want.iter().enumerate() {
            assert!((p.median[k] - ns(*w)).abs() < 1e-6, "phase {k}");
        }
        assert!((p.total_median - ns(8_000.0)).abs() < 1e-6);
    }

    #[test]
    fn a_vcpu_that_retires_before_the_wake_call_returns_is_kept() {
        let touches = [(0x10_0000, 1_000, 9_000)];
        let samples = [sample(0x10_0000, [2_000, 3_000, 4_000, 6_000, 9_500])];
        let p = of_run(&touches, &samples, 4096);
        assert_eq!(p.samples, 1.0);
        let ns = |c: f64| tsc().cycles_to_ns(c as u64);
        assert!((p.median[5] - ns(3_000.0)).abs() < 1e-6);
        assert!((p.median[4] - ns(3_500.0)).abs() < 1e-6);
    }

    #[test]
    fn no_samples_no_phases() {
        let p = of_run(&[], &[], 4096);
        assert!(!p.any());
        assert!(p.median.iter().all(|v| v.is_nan()));
        let m = Phases::median(&[&p, &p]);
        assert!(!m.any());
    }
}
