//! What `bench restore` reports of its configurations: one record and one
//! table row per (working set, cache state, configuration), the hand-off
//! timeline, the one-time population of the shared copies, the floors,
//! and a figure of every configuration's time beside the floors.
//!
//! [`Results::add`] takes one (working set, cache state)'s medians as they
//! are measured (the records go onto the report in that order);
//! [`Results::print`] prints everything once the runs are done.

use crate::harness::plot;
use crate::harness::report::{fmt_ratio, print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

use super::args::{uses_huge_snapshot, uses_snapshot, ws_label, RestoreArgs};
use super::floor::{self, Floor};
use super::phases;
use super::runs::Run;
use super::takeover::{self, Gap};
use super::tracked;

/// The main table's columns.
const COLUMNS: [&str; 20] = [
    "ws",
    "cache",
    "config",
    "ms",
    "vCPU med us",
    "p99 us",
    "faults",
    "faults/page",
    "faults/read",
    "handler CPU ms",
    "helpers CPU ms",
    "wasted pages",
    "run ahead",
    "window",
    "MiB read",
    "peer anon MiB",
    "vs baseline",
    "vs kernel",
    "vs kernel-tmpfs",
    "vs on-demand",
];

/// The record's summary of a configuration's medians `m`: the vCPUs'
/// first-touch latency as the peer measured it, over the working set's
/// touches of a run (`n`), the median and the p99 (medians of the reps).
/// The peer reports no other figure (mean, p99.9, extremes, deviation):
/// those are NaN (`null` in the JSON), and so are the median and the p99
/// where no touch was timed (`--kvm`: 0 in [`Run`]).
fn vcpu_summary(m: &Run) -> Summary {
    let measured = |ns: f64| if ns > 0.0 { ns } else { f64::NAN };
    let median = measured(m.median_ns);
    Summary {
        n: if median.is_finite() {
            m.pages as usize
        } else {
            0
        },
        median,
        p99: measured(m.p99_ns),
        ..Summary::NONE
    }
}

/// Demand faults per working-set page.
fn per_page(m: &Run) -> f64 {
    m.faults as f64 / m.pages.max(1) as f64
}
use super::timeline;

/// The tables and the figure, filled in as the medians come.
#[derive(Default)]
pub struct Results {
    /// The main table.
    rows: Vec<Vec<String>>,
    /// The hand-off timeline.
    handoff: Vec<Vec<String>>,
    /// Where a demand fault's time goes (served configurations).
    phases: Vec<Vec<String>>,
    /// ... as the figure's bars (label, trigger, resolve, return cycles).
    phase_bars: Vec<(String, f64, f64, f64)>,
    /// Per (working set, cache): prefetch's preparation of the record, ms.
    prepared: Vec<(String, f64)>,
    /// Per (working set, cache): each configuration's median ms and the
    /// floors (the figure's bar groups).
    groups: Vec<(String, Vec<(String, f64)>)>,
    /// `--takeover`'s table and figure.
    takeover: takeover::Table,
    /// First writes (`--write-set`, the tracked configurations).
    writes: tracked::Table,
}

impl Results {
    /// Records and tabulates the medians of working set `ws` (percent) in
    /// cache state `cache`, with the working set's `floor`.
    pub fn add(
        &mut self,
        ctx: &mut BenchCtx,
        a: &RestoreArgs,
        (set, cache): ((f64, &str), &str),
        medians: &[(String, Run)],
        floor: &Floor,
    ) {
        let (ws, pattern) = set;
        let label = ws_label(set);
        let cold = cache == "cold";
        let mut bars: Vec<(String, f64)> = medians
            .iter()
            .map(|(c, m)| (c.clone(), m.seconds * 1e3))
            .collect();
        if cold {
            for (what, secs) in [
                ("floor: the recorded set read cold", floor.cold_set_s),
                ("floor: the whole file read cold", floor.cold_file_s),
            ] {
                if secs > 0.0 {
                    bars.push((what.into(), secs * 1e3));
                }
            }
        } else {
            bars.push((
                "floor: UFFDIO_COPY of the set, 1 thread".into(),
                floor.bytes as f64 / floor.copy_populated_bps * 1e3,
            ));
            if floor.copy_populated_2t_bps > 0.0 {
                bars.push((
                    "floor: UFFDIO_COPY of the set, 2 threads".into(),
                    floor.bytes as f64 / floor.copy_populated_2t_bps * 1e3,
                ));
            }
            if floor.continue_set_s > 0.0 {
                bars.push((
                    "floor: UFFDIO_CONTINUE of the recorded set's runs, 1 thread".into(),
                    floor.continue_set_s * 1e3,
                ));
            }
            if floor.continue_huge_set_s > 0.0 {
                bars.push((
                    "floor: UFFDIO_CONTINUE of its 2 MiB pages (hugetlbfs)".into(),
                    floor.continue_huge_set_s * 1e3,
                ));
            }
        }
        self.groups.push((format!("{label} {cache}"), bars));
        if let Some(m) = medians.iter().find(|m| m.0 == "prefetch") {
            self.prepared
                .push((format!("{label} {cache} prefetch"), m.1.prepare_ms));
        }
        let get = |n: &str| medians.iter().find(|m| m.0 == n).map(|m| &m.1);
        let ratio = |x: Option<&Run>, m: &Run| x.map(|x| x.seconds / m.seconds);
        let show = |r: Option<f64>| r.map_or("-".to_string(), fmt_ratio);
        let (base, kern, dem) = (get("baseline"), get("kernel"), get("on-demand"));
        let ktmp = get("kernel-tmpfs");
        for (cfg, m) in medians {
            let s = vcpu_summary(m);
            let op = if cfg.starts_with("hand-back") {
                "kernel (handed back)"
            } else if cfg.contains("-shared") {
                "CONTINUE"
            } else if cfg.starts_with("kernel") {
                "kernel"
            } else {
                "COPY"
            };
            let mut rec = Record::new("restore", cfg, op, "read", &s)
                .with("working_set_pct", ws)
                .with("pattern", pattern)
                .with("cache", cache)
                .with(
                    "store",
                    match (cfg.as_str(), &a.store) {
                        (c, _) if uses_snapshot(c) => "tmpfs copy",
                        (c, _) if uses_huge_snapshot(c) => "hugetlbfs copy",
                        ("kernel" | "baseline", _) | (_, None) => "file",
                        (_, Some(url)) => url.as_str(),
                    },
                )
                .with("reps", a.reps as u64)
                .with("serve_lead_ms", a.serve_lead_ms)
                .with("seconds", m.seconds)
                .with("demand_faults", m.faults)
                .with("working_set_pages", m.pages)
                .with("faults_per_page", per_page(m))
                .with("bytes_read", m.bytes_read);
            // No touch timed (a KVM guest's, --kvm): no latency, as the
            // table's "-".
            if s.median.is_finite() {
                rec = rec.with("vcpu_median_ns", s.median);
            }
            if s.p99.is_finite() {
                rec = rec.with("vcpu_p99_ns", s.p99);
            }
            if m.reads > 0 {
                rec = rec.with("faults_per_read", m.faults as f64 / m.reads as f64);
            }
            if m.handler_cpu_ms.is_finite() {
                rec = rec.with("handler_cpu_ms", m.handler_cpu_ms);
            }
            if m.helpers_cpu_ms.is_finite() {
                rec = rec.with("helpers_cpu_ms", m.helpers_cpu_ms);
            }
            if m.wasted.is_finite() {
                rec = rec.with("wasted_pages", m.wasted);
            }
            if m.run_ahead.is_finite() {
                rec = rec.with("run_ahead_pages", m.run_ahead);
            }
            if m.window.is_finite() {
                rec = rec.with("isolated_window_final", m.window);
            }
            if !uses_huge_snapshot(cfg) {
                rec = rec.with("peer_anon_kib", m.peer_anon_kib);
            }
            if m.prepare_ms.is_finite() {
                rec = rec.with("prepare_ms", m.prepare_ms);
            }
            rec = phases::record(rec, &m.phases);
            if m.phases.any() {
                let lead = [label.clone(), cache.to_string(), cfg.clone()];
                self.phases.push(phases::row(lead, &m.phases));
                // Short labels: the figure's bars stand side by side.
                let short = cfg.strip_prefix("on-demand-").unwrap_or(cfg);
                let cold = if cold { " cold" } else { "" };
                self.phase_bars
                    .push(phases::bars(format!("{label}{cold} {short}"), &m.phases));
            }
            rec = timeline::record(rec, &m.steps)
                .with("vcpu_preempted", m.preempted)
                .with("vcpu_slept", m.slept);
            self.handoff.push(timeline::row(
                [label.clone(), cache.to_string(), cfg.clone()],
                &m.steps,
                m.preempted,
                m.slept,
            ));
            if let Some(r) = ratio(base, m) {
                rec = rec.with("speedup_vs_baseline", r);
            }
            if let Some(r) = ratio(kern, m) {
                rec = rec.with("speedup_vs_kernel", r);
            }
            if let Some(r) = ratio(dem, m) {
                rec = rec.with("speedup_vs_on_demand", r);
            }
            if let Some(r) = ratio(ktmp, m) {
                rec = rec.with("speedup_vs_kernel_tmpfs", r);
            }
            ctx.report.push(rec);
            let finite = |v: f64, f: &dyn Fn(f64) -> String| {
                if v.is_finite() {
                    f(v)
                } else {
                    "-".to_string()
                }
            };
            // No touch timed (a KVM guest's, --kvm): no latency.
            let us = |ns: f64| {
                if ns > 0.0 {
                    format!("{:.1}", ns / 1e3)
                } else {
                    "-".to_string()
                }
            };
            self.rows.push(vec![
                label.clone(),
                cache.to_string(),
                cfg.clone(),
                format!("{:.1}", m.seconds * 1e3),
                us(m.median_ns),
                us(m.p99_ns),
                m.faults.to_string(),
                format!("{:.3}", per_page(m)),
                if m.reads > 0 {
                    format!("{:.1}", m.faults as f64 / m.reads as f64)
                } else {
                    "-".to_string()
                },
                finite(m.handler_cpu_ms, &|v| format!("{v:.1}")),
                finite(m.helpers_cpu_ms, &|v| format!("{v:.1}")),
                finite(m.wasted, &|v| format!("{v:.0}")),
                finite(m.run_ahead, &|v| format!("{v:.0}")),
                finite(m.window, &|v| format!("{v:.0}")),
                format!("{}", m.bytes_read >> 20),
                // A hugetlbfs page-cache page mapped by one process
                // counts as Private_Hugetlb: no private figure there.
                if uses_huge_snapshot(cfg) {
                    "-".to_string()
                } else {
                    format!("{}", m.peer_anon_kib >> 10)
                },
                show(ratio(base, m)),
                show(ratio(kern, m)),
                show(ratio(ktmp, m)),
                show(ratio(dem, m)),
            ]);
        }
        self.writes.add(ctx, (set, cache), medians);
        if let (Some(pre), Some(dem)) = (get("prefetch"), dem) {
            // REAP's two figures under the faults and vs-on-demand columns.
            let col = |name: &str| COLUMNS.iter().position(|c| *c == name).expect("a column");
            let mut row = vec!["-".to_string(); COLUMNS.len()];
            row[..3].clone_from_slice(&[label.clone(), cache.to_string(), "REAP (paper)".into()]);
            row[col("faults")] = format!(
                "ours: -{:.0}% (REAP -97%)",
                100.0 * (1.0 - pre.faults as f64 / dem.faults.max(1) as f64)
            );
            row[col("vs on-demand")] =
                format!("ours {} (REAP 3.70x)", fmt_ratio(dem.seconds / pre.seconds));
            self.rows.push(row);
        }
    }

    /// Records and tabulates `--takeover`'s `gaps` of working set `set` in
    /// cache state `cache` beside its `medians`.
    pub fn add_takeover(
        &mut self,
        ctx: &mut BenchCtx,
        a: &RestoreArgs,
        at: ((f64, &str), &str),
        medians: &[(String, Run)],
        gaps: &[Gap],
    ) {
        self.takeover.add((ctx, a), gaps, medians, at);
    }

    /// Prints the tables, records the shared copies' population
    /// (`populated`: written from what, ms) and the `floors`, draws the
    /// figure.
    pub fn print(
        &self,
        ctx: &mut BenchCtx,
        a: &RestoreArgs,
        populated: &[(&str, f64)],
        floors: &[(f64, String, Floor)],
    ) -> anyhow::Result<()> {
        print_table(&COLUMNS, &self.rows);
        println!(
            "(ms: handshake to last working-set page; vs X: X's time / this time, higher is faster; faults: demand faults the handler read (kernel rows: the peer's minor faults, each mapping one or more pages), per working-set page, and per read(2) of the userfaultfd; handler CPU: serve's handler threads (their wait: --engine); helpers CPU: serve's prefetch helpers (prefetch, and the pieces of long fault windows they copy beside the handler thread); wasted: pages installed that no vCPU touched (copy mode: the peer's resident pages beyond its set; shared mode: the pages serve installed beyond it); run ahead: pages serve's run-ahead populators installed (--run-ahead, the on-demand-run-ahead rows); window: --adaptive-window's isolated window when the VM ended, pages (median of the runs); peer anon: the VM's private memory after the restore (RssAnon + private hugetlb), shared mode maps the one shared page cache instead)"
        );
        timeline::print(&self.handoff);
        phases::print(&self.phases);
        self.writes.print();
        for (label, ms) in &self.prepared {
            println!(
                "{label}: serve asked for the recorded set's reads and mapped it until the peer was served in {ms:.1} ms from its own start (the peer starts with it; not a pause before the handshake)"
            );
        }
        if !populated.is_empty() {
            println!(
                "shared tmpfs copy ({} MiB), the one-time population of the shared page cache (not in the restore times above; cold rows drop the memory file's cache, the tmpfs copy stays):",
                a.size >> 20
            );
            for (cache, ms) in populated {
                println!("  written from a {cache}: {ms:.1} ms");
                let s = Summary::from_ns(&mut [ms * 1e6]);
                ctx.report.push(
                    Record::new("restore-populate", "shared tmpfs copy", "write", "read", &s)
                        .with("cache", *cache)
                        .with("bytes", a.size as u64)
                        .with("ms", *ms),
                );
            }
        }
        floor::print(ctx, floors);
        if !self.phase_bars.is_empty() {
            ctx.figure("restore_phases", |dir, name| {
                plot::phase_bars(dir, name, &self.phase_bars)
            })?;
        }
        self.takeover.print(ctx, a)?;
        self.figure(ctx, a)
    }

    /// The figure: per (working set, cache) a group of bars, one per
    /// configuration and floor, ms on a log scale.
    fn figure(&self, ctx: &mut BenchCtx, a: &RestoreArgs) -> anyhow::Result<()> {
        let title = format!(
            "restore: handshake to last working-set page, {} MiB, median of {}",
            a.size >> 20,
            a.reps
        );
        ctx.ms_bars("restore_ms", &title, &self.groups)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::bench::restore::phases::Phases;
    use crate::bench::restore::timeline::STEPS;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        a: RestoreArgs,
    }

    /// A run's medians as the peer reports them: `median_ns` and `p99_ns`
    /// of its vCPUs' touches (0: none timed, a KVM guest).
    fn run(median_ns: f64, p99_ns: f64) -> Run {
        Run {
            seconds: 0.004,
            median_ns,
            p99_ns,
            faults: 204,
            bytes_read: 0,
            pages: 204,
            reads: 0,
            handler_cpu_ms: f64::NAN,
            helpers_cpu_ms: f64::NAN,
            wasted: f64::NAN,
            run_ahead: f64::NAN,
            prepare_ms: f64::NAN,
            peer_anon_kib: 1024,
            steps: vec![f64::NAN; STEPS.len()],
            preempted: 0,
            slept: 0,
            phases: Phases::default(),
            write_ns: (f64::NAN, f64::NAN),
            dirty_pages: f64::NAN,
            window: f64::NAN,
        }
    }

    /// The record's summary says what the table says: the p99 is the
    /// vCPUs' p99 (it was their median, from a summary of one value, as
    /// were the maximum and the minimum); what the peer does not report
    /// is null, and with no touch timed (--kvm) so are the median and the
    /// p99, never 0.
    #[test]
    fn records_say_what_the_table_says() {
        let a = Cmd::try_parse_from(["restore", "--configs", "kernel,baseline"])
            .unwrap()
            .a;
        let mut ctx = BenchCtx::new(None, None);
        let mut results = Results::default();
        let medians = vec![
            ("kernel".to_string(), run(78.0, 385_702.0)),
            ("baseline".to_string(), run(0.0, 0.0)),
        ];
        results.add(
            &mut ctx,
            &a,
            ((10.0, "clustered"), "warm"),
            &medians,
            &Floor::default(),
        );
        let json = serde_json::to_value(&ctx.report.records).unwrap();
        let (timed, kvm) = (&json[0], &json[1]);
        assert_eq!(timed["median_ns"], 78.0, "{timed}");
        assert_eq!(timed["p99_ns"], 385_702.0, "{timed}");
        assert_eq!(timed["vcpu_median_ns"], 78.0, "{timed}");
        assert_eq!(timed["vcpu_p99_ns"], 385_702.0, "{timed}");
        assert_eq!(timed["n"], 204, "{timed}");
        for f in ["mean_ns", "p999_ns", "max_ns", "min_ns", "std_ns"] {
            assert!(timed[f].is_null(), "{f}: {timed}");
        }
        for f in ["median_ns", "p99_ns", "max_ns"] {
            assert!(kvm[f].is_null(), "{f}: {kvm}");
        }
        assert_eq!(kvm["n"], 0, "{kvm}");
        for f in ["vcpu_median_ns", "vcpu_p99_ns"] {
            assert!(kvm.get(f).is_none(), "{f}: {kvm}");
        }
        // The table: the same figures, "-" where none.
        let us = |row: &[String], col: &str| {
            row[COLUMNS.iter().position(|c| *c == col).unwrap()].clone()
        };
        assert_eq!(us(&results.rows[0], "p99 us"), "385.7");
        assert_eq!(us(&results.rows[1], "vCPU med us"), "-");
    }
}
