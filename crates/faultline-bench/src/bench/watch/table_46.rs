//! Table 4.6 (seed 002): 8 pages, 1 to 64 watched addresses, every byte
//! written: the slowdown of our page tier (protection only) and automatic
//! tier (debug registers for up to 4 aligned watches), against GDB's
//! hardware and software watchpoints on the same workload compiled at
//! `-O0` ([`gdb`]) and the thesis's numbers.

use std::time::{Duration, Instant};

use super::args::WatchArgs;
use super::block::{block, watcher, write_all, PAGE};
use super::{cprog, gdb};
use crate::harness::plot;
use crate::harness::report::{fmt_ratio, print_table, Record};
use crate::harness::stats::{median, Summary};
use crate::harness::tsc::tsc;
use crate::harness::BenchCtx;

/// Thesis Table 4.6: (addresses, GDB HW, GDB SW, ULPF) slowdowns.
const T46: [(usize, Option<f64>, f64, f64); 8] = [
    (1, Some(1.05), 799_600.0, 2.5),
    (2, Some(1.05), 1_018_000.0, 4.2),
    (3, Some(1.03), 1_203_000.0, 6.0),
    (4, None, 1_446_000.0, 6.1),
    (8, None, 2_101_000.0, 8.2),
    (16, None, 3_773_000.0, 12.0),
    (32, None, 6_546_000.0, 17.1),
    (64, None, 13_520_000.0, 19.4),
];
/// Table 4.6: ours (page tier, automatic tier) beside GDB's, recorded,
/// drawn.
pub fn run(ctx: &mut BenchCtx, a: &WatchArgs) -> anyhow::Result<()> {
    let pages = 8;
    let len = pages * PAGE;
    let counts: Vec<usize> = T46.iter().map(|t| t.0).collect();
    let mut prog = ctx.progress(counts.len() as u64 * 2, "watch 4.6");
    // Ours: the same addresses, page tier and automatic tier.
    let mut ours = Vec::new();
    for &n in &counts {
        let offs = gdb::random_offsets(n, len, a.seed);
        let mut res = [0f64; 3];
        for (k, hw) in [(1usize, false), (2, true)] {
            let w = watcher(&a.memory, true, hw, false, !a.no_interpret)?;
            let b = block(&w, &a.memory, len)?;
            let mut base = Vec::new();
            let mut watched = Vec::new();
            for _ in 0..a.reps.max(1) {
                let t = Instant::now();
                write_all(b.ptr(), len);
                base.push(t.elapsed().as_nanos() as f64);
                for &o in &offs {
                    w.watch(b.ptr() as u64 + o as u64, 1)?;
                }
                let t = Instant::now();
                write_all(b.ptr(), len);
                watched.push(t.elapsed().as_nanos() as f64);
                for &o in &offs {
                    w.unwatch(b.ptr() as u64 + o as u64, 1)?;
                }
            }
            res[0] = median(&mut base);
            res[k] = median(&mut watched);
            prog.step(&format!("{n} addresses"));
        }
        ours.push((n, res[0], res[1], res[2]));
    }
    prog.finish();
    let gdb = if a.no_gdb {
        Err(anyhow::anyhow!("--no-gdb"))
    } else {
        cprog::available()
            .map_err(|e| anyhow::anyhow!(e))
            .and_then(|_| {
                gdb::gdb_table(
                    &counts,
                    pages,
                    a.gdb_bytes,
                    a.seed,
                    Duration::from_secs(300),
                )
            })
    };
    println!("\nTable 4.6: 8 pages, N watched addresses, every byte written (slowdowns; thesis in brackets)");
    let t = tsc();
    let mut rows = Vec::new();
    let mut series_ours = Vec::new();
    let mut series_gdb = Vec::new();
    for (i, &(n, base, page, auto)) in ours.iter().enumerate() {
        let g = gdb
            .as_ref()
            .ok()
            .and_then(|g| g.iter().find(|r| r.watchpoints == n));
        let th = T46[i];
        // GDB's time per byte written, against ours (auto tier).
        let gdb_ns_per_write = g.and_then(|g| {
            g.sw_cycles
                .map(|c| t.cycles_to_ns(c as u64) / g.sw_bytes.max(1) as f64)
        });
        let ours_ns_per_write = auto / len as f64;
        let x = gdb_ns_per_write.map(|gn| gn / ours_ns_per_write);
        rows.push(vec![
            n.to_string(),
            g.and_then(|g| g.hw_slowdown)
                .map_or("-".into(), |s| format!("{s:.2}"))
                + &format!(" [{}]", th.1.map_or("-".into(), |v| v.to_string())),
            g.and_then(|g| g.sw_slowdown)
                .map_or("-".into(), |s| format!("{s:.0}"))
                + &format!(" [{}]", th.2),
            format!("{:.1} [{}]", page / base, th.3),
            format!("{:.1}", auto / base),
            x.map_or("-".into(), fmt_ratio),
        ]);
        // log10: the two lines differ by 4-6 orders of magnitude.
        series_ours.push((n as f64, (auto / base).log10()));
        if let Some(s) = g.and_then(|g| g.sw_slowdown) {
            series_gdb.push((n as f64, s.log10()));
        }
        let s = Summary {
            n: 1,
            mean: auto,
            median: auto,
            ..Summary::default()
        };
        ctx.report.push(
            Record::new(
                "watch",
                "table-4.6",
                &a.memory,
                &format!("{n}-addresses"),
                &s,
            )
            .with("table", "4.6")
            .with("config", format!("{n} addresses, 8 pages"))
            .with("watchpoints", n as u64)
            .with("pages_spanned", pages as u64)
            .with("false_positives", serde_json::Value::Null)
            .with("slowdown_lookup", auto / base)
            .with("slowdown_page_tier", page / base)
            .with("slowdown_no_lookup", serde_json::Value::Null)
            .with("gdb_hw_slowdown", g.and_then(|g| g.hw_slowdown))
            .with("gdb_sw_slowdown", g.and_then(|g| g.sw_slowdown))
            .with("gdb_sw_ns_per_write", gdb_ns_per_write)
            .with("ns_per_write", ours_ns_per_write)
            .with("times_faster_than_gdb_sw", x),
        );
    }
    print_table(
        &[
            "addresses",
            "GDB HW",
            "GDB SW",
            "faultline page tier",
            "faultline auto tier",
            "GDB SW time / ours",
        ],
        &rows,
    );
    println!("  auto tier: up to 4 aligned watches use debug registers (no false positives); page tier: protection only. Target: >= 10,000x faster than GDB SW.");
    match &gdb {
        Ok(_) => println!(
            "  GDB ran the same loop compiled at -O0 (tools/watchbench/gdbtarget.c), {} bytes written under software watchpoints; its slowdown is against that program's own native run.",
            a.gdb_bytes
        ),
        Err(e) => println!("  GDB columns unavailable: {e:#}"),
    }
    let series = vec![
        ("faultline (auto)".to_string(), series_ours),
        ("GDB software".to_string(), series_gdb),
    ];
    ctx.figure("watch_vs_gdb", |dir, name| {
        plot::line_chart(
            dir,
            name,
            "Slowdown vs watched addresses (Fig. 4.3)",
            "watched addresses",
            "log10 of the slowdown",
            &series,
            true,
        )
    })?;
    Ok(())
}
