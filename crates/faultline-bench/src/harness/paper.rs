//! A figure measured next to the paper's: printed as one line
//! (`label measured=... paper=...`) and recorded (bench `vpri`, mechanism
//! `label`, with `measured`, `unit` and `paper_value`), so a reproduction's
//! every number is both read beside its source and kept in `--json`.

use super::report::Record;
use super::stats::Summary;
use super::BenchCtx;

/// Prints `label measured=... paper=...` and records it.
pub fn line(ctx: &mut BenchCtx, label: &str, measured: f64, unit: &str, paper: &str) {
    println!("{label:<44} measured={measured:>10.2} {unit:<4} paper={paper}");
    record(ctx, label, measured, unit, paper);
}

/// Records a figure for `--json` only (it is printed in a table).
pub fn line_quiet(ctx: &mut BenchCtx, label: &str, measured: f64, unit: &str) {
    record(ctx, label, measured, unit, "-");
}

fn record(ctx: &mut BenchCtx, label: &str, measured: f64, unit: &str, paper: &str) {
    let s = Summary {
        n: 1,
        mean: measured,
        median: measured,
        p99: measured,
        p999: measured,
        max: measured,
        min: measured,
        std: 0.0,
    };
    ctx.report.push(
        Record::new("vpri", label, "-", "-", &s)
            .with("label", label)
            .with("measured", measured)
            .with("unit", unit)
            .with("paper_value", paper),
    );
}
