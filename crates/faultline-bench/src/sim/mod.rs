//! B5 (Fig 16, 17) and B7 (Figs 9-11): the pinning policies driven by
//! synthetic device traces against a host reclaimer, simulated in the
//! paper's own time (an hour per round, 1 s steps).
//!
//! What is real: the pinning policies (`faultline_io::adp`: ADP, simple
//! LRU, pin-all, none) and the reclaimer (`faultline::policy::Clock`, the
//! evictor's CLOCK, with the pin predicate and access hints the runtime
//! gives it). What is modelled: the VMs. 14 VMs of U[8, 64] "GB" (64 units
//! of 2 MiB per GB... scaled down: 64 units per GB), 4 NIC-like and 10
//! block-like, one device each; a guest CPU touching its memory with a
//! skewed working set; a host reclaimer that holds each VM to a budget,
//! with the server overcommitted by r in {10, 20, 30}%. An I/O page fault
//! is a device access to a unit the reclaimer has taken. A pin makes its unit present (a reclaimed unit is
//! fetched back by the host, as a hypervisor's pin does; counted as a pin
//! fetch, not an I/O fault).
//!
//! From the paper: 14 VMs, 4 NIC + 10 block, U[8, 64] sizes, r in {10,
//! 20, 30}%, one hour per round, ADP's 30% / 5% / 20 s / 180 s / 30 s,
//! LRU's static 10%, NIC footprint ~3% (Fig 11), and the block trace's
//! statistics the generator is calibrated to (Fig 10, measured by B7):
//! footprint ~28% at 30 min (and 53% in the long run, §4.2), 87.3% of
//! units accessed < 10 times, 70.3% > 2 times, 94.3% of simulated I/O
//! faults (gaps > 300 s) from units accessed < 10 times. Ours (not the
//! paper's): the traces' shapes (on/off NIC traffic; block = page-cache
//! lives, see [`block`](trace::block), whose rates were fitted to those statistics and
//! nothing else), the guest CPU (16 touches a second, 80% in a hot 20%),
//! and CLOCK as each VM's reclaimer. How each VM's budget is set is a
//! [`B5Model`](b5::B5Model): by default the paper's own mechanism ([`psi`]:
//! the server's memory fixed at (1 - r), each VM's reclaim ratio moved
//! within 0-50% by its pressure, Senpai's rule, as §3.4 and §7.3 say);
//! for comparison every VM at r all hour (`static`, round 4's default) or
//! random redraws within 0-50% (`redraw`, a period the paper does not
//! give). `adp-derived` replaces the fixed 180 s threshold by the P10 of
//! the ages (since the device's last access) of the units the reclaimer
//! takes (digest §5).
//!
//! Before the calibration (round 2's block trace: 20% new units, 48%
//! among the last 64, 32% uniform over the footprint, a whole number of
//! accesses per second) B7 measured footprint 41.9%, 92.9% < 10, 82.7% >
//! 2 and 82.6% of simulated faults from units < 10.
//!
//! B5 also accounts for every pinned unit-second ([`PinLedger`](ledger::PinLedger)): why the
//! unit was pinned ([`PinCause`](faultline_io::adp::PinCause): ADP's age scan or active overflow, or
//! on access) and what the pin's time went to ([`PinUse`](ledger::PinUse): waiting for
//! the device's next access, ADP's delayed demotion, unpinned unused by a
//! cap, or still waiting when the hour ends), and the reclaimer's horizon
//! (P10/P50 of the ages at which it takes device units) that the fixed
//! 180 s threshold is meant to reflect, and the VMs' reclaim ratios
//! (their time averages: mean, min, max). `--b5-reclaim MODEL` picks the
//! model printed in full, `--b5-compare` the models printed beside it.
//!
//! The same model serves B8 ([`LogModel`](round::LogModel): the device's accesses reach the
//! pin policy and the reclaimer's hints only through the runtime's lossy
//! access log, drained every D s; static budgets) and B9 (simulated days
//! under [`Reclaim::Psi`](round::Reclaim::Psi), or [`Reclaim::Drift`](round::Reclaim::Drift): each VM's reclaim ratio
//! redrawn hourly; [`FaultRate`](rate::FaultRate) folds the I/O faults per second into
//! days). Everything is seeded: the same command prints the same numbers.
//!
//! Traces (digest §1.7): NIC = a ring over 3% of the VM, bursty (on/off
//! traffic, idle gaps of minutes), a ring buffer moving to a new unit at
//! the paper's footprint growth (3% → 17% over weeks: [`nic`](trace::nic); round 3
//! moved one every 2 minutes, 18-140x faster than "weeks" allow, and those
//! abandoned buffers were half of ADP's NIC pins);
//! block = page-cache-like lives (allocation, the device's write, Poisson
//! re-reads, hot or cold, until the life ends; see [`block`](trace::block)).
//!
//! | module | what |
//! |---|---|
//! | [`trace`] | the synthetic NIC and block traces |
//! | [`psi`] | the host's PSI-balanced reclaimer (Senpai's rule) |
//! | [`ledger`] | where pinned unit-seconds go |
//! | [`rate`] | I/O faults per second folded into days |
//! | [`round`] | one simulated round of a fleet: the VMs stepped second by second |
//! | [`b5`] | B5 (Fig 16, 17) under each reclaim model, and B7's entry |
//! | [`b7`] | B7 (Figs 9-11): the traces' statistics next to the paper's |
//! | [`day`] | B9 (Figs 7, 18): whole simulated days |
//!
//! B8's simulated half (ADP behind a lossy access log) runs [`round`] from
//! `bench/vpri/b8.rs`.
//!
//! A figure whose denominator is 0 (a reduction of no I/O faults, a ratio
//! to an empty run) has no value: [`ratio`] gives `None`, printed `-` and
//! recorded as `measured: null` ([`line_opt`]), never a number.

pub mod b5;
pub mod b7;
pub mod day;
pub mod ledger;
pub mod psi;
pub mod rate;
pub mod round;
pub mod trace;

use crate::harness::paper::{line, line_quiet};
use crate::harness::report::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// `num / den`, or `None` when `den` is 0 (or not a number): a ratio of
/// nothing is no result.
pub(crate) fn ratio(num: f64, den: f64) -> Option<f64> {
    (den != 0.0 && den.is_finite() && num.is_finite()).then(|| num / den)
}

/// The reduction from `before` to `after`, %: `None` when there was
/// nothing to reduce.
pub(crate) fn reduction_pct(after: f64, before: f64) -> Option<f64> {
    ratio(after, before).map(|x| (1.0 - x) * 100.0)
}

/// `v` with `decimals`, or `-` without a value.
pub(crate) fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// [`line`] for a figure that may have no value: `None` is printed as
/// `measured=-` and recorded with `measured: null`.
pub(crate) fn line_opt(
    ctx: &mut BenchCtx,
    label: &str,
    measured: Option<f64>,
    unit: &str,
    paper: &str,
) {
    match measured {
        Some(v) => line(ctx, label, v, unit, paper),
        None => {
            println!("{label:<44} measured={:>10} {unit:<4} paper={paper}", "-");
            push_none(ctx, label, unit, paper);
        }
    }
}

/// [`line_quiet`] for a figure that may have no value (see [`line_opt`]).
pub(crate) fn line_quiet_opt(ctx: &mut BenchCtx, label: &str, measured: Option<f64>, unit: &str) {
    match measured {
        Some(v) => line_quiet(ctx, label, v, unit),
        None => push_none(ctx, label, unit, "-"),
    }
}

/// The record of a figure without a value: no samples, every number null.
fn push_none(ctx: &mut BenchCtx, label: &str, unit: &str, paper: &str) {
    ctx.report.push(
        Record::new("vpri", label, "-", "-", &Summary::NONE)
            .with("label", label)
            .with("measured", serde_json::Value::Null)
            .with("unit", unit)
            .with("paper_value", paper),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_of_nothing_have_no_value() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(0.0, 0.0), None);
        assert_eq!(ratio(1.0, f64::NAN), None);
        assert_eq!(reduction_pct(0.0, 0.0), None);
        assert_eq!(reduction_pct(1.0, 4.0), Some(75.0));
        assert_eq!(fmt_opt(None, 2), "-");
        assert_eq!(fmt_opt(Some(1.0), 2), "1.00");
    }

    /// A figure without a value is written to JSON as null, not as 0.
    #[test]
    fn a_figure_without_a_value_is_null_in_the_json() {
        let mut ctx = BenchCtx::new(None, None);
        line_opt(&mut ctx, "x.none", None, "%", "51");
        line_quiet_opt(&mut ctx, "x.quiet", None, "x");
        line_opt(&mut ctx, "x.some", Some(2.0), "x", "-");
        let j = serde_json::to_value(&ctx.report.records).unwrap();
        assert!(
            j[0]["measured"].is_null() && j[0]["median_ns"].is_null(),
            "{j}"
        );
        assert!(j[1]["measured"].is_null(), "{j}");
        assert_eq!(j[2]["measured"], 2.0);
    }
}
