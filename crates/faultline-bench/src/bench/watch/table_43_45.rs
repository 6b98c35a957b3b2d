//! Tables 4.3-4.5 (seed 002): 256 consecutive pages, one-byte
//! watchpoints placed sparsely (uniform random, the addresses `gdbtarget.c`
//! draws), densely (every 256 bytes), one per page, or over the whole
//! block; a loop writes every byte; the slowdown against the same loop on
//! unwatched memory in the same run, with and without the watch-list
//! lookup (`classify`), medians over `--reps`.

use std::time::Instant;

use super::args::WatchArgs;
use super::block::{block, watcher, write_all, PAGE};
use super::gdb;
use crate::harness::plot;
use crate::harness::report::{print_table, Record};
use crate::harness::stats::{median, Summary};
use crate::harness::BenchCtx;

/// Thesis Table 4.3 (sparse): (WPs, pages spanned, FPs, slowdown lookup, no lookup).
const T43: [(usize, usize, u64, f64, f64); 10] = [
    (1, 1, 4095, 1.05, 1.01),
    (2, 2, 8190, 1.11, 1.02),
    (3, 3, 12285, 1.17, 1.02),
    (4, 4, 16380, 1.22, 1.03),
    (8, 8, 32760, 1.45, 1.06),
    (16, 16, 65520, 1.91, 1.13),
    (32, 32, 131040, 2.84, 1.26),
    (64, 55, 225216, 4.16, 1.45),
    (128, 101, 413568, 6.81, 1.83),
    (256, 156, 638720, 9.97, 2.29),
];
/// Thesis Table 4.4 (dense): (WPs, pages spanned, slowdown lookup, no lookup).
const T44: [(usize, usize, f64, f64); 6] = [
    (8, 1, 1.05, 1.01),
    (16, 1, 1.05, 1.01),
    (24, 2, 1.11, 1.01),
    (32, 2, 1.11, 1.01),
    (40, 3, 1.16, 1.02),
    (48, 3, 1.16, 1.02),
];
/// Thesis Table 4.5 (extreme): (config, WPs, pages, FPs, lookup, no lookup).
const T45: [(&str, usize, usize, u64, f64, f64); 2] = [
    ("one-per-page", 256, 256, 1_048_320, 15.8, 3.2),
    ("whole-block", 1_048_576, 256, 0, 14.5, 3.2),
];
/// One row of Tables 4.3-4.5.
struct Row {
    table: &'static str,
    faults: u64,
    config: String,
    watchpoints: usize,
    pages: usize,
    false_positives: u64,
    hits: u64,
    lookup: f64,
    no_lookup: f64,
    base_ns: f64,
    lookup_ns: f64,
}

/// base, lookup, no-lookup times (ns), false positives, hits, pages
/// spanned, signals.
type Measured = (f64, f64, f64, u64, u64, usize, u64);

/// Runs the write-every-byte loop over `pages` pages with `ranges` watched
/// (offsets into the block), with and without lookup, against the same
/// loop unwatched.
fn measure_block(
    a: &WatchArgs,
    pages: usize,
    ranges: &[(usize, usize)],
) -> anyhow::Result<Measured> {
    let len = pages * PAGE;
    let mut out = [0f64; 3];
    let mut fps = 0;
    let mut hits = 0;
    let mut spanned = 0;
    let mut faults = 0;
    for (k, classify) in [(1usize, true), (2, false)] {
        let w = watcher(&a.memory, classify, false, false, !a.no_interpret)?;
        let b = block(&w, &a.memory, len)?;
        let mut base = Vec::new();
        let mut watched = Vec::new();
        for _ in 0..a.reps.max(1) {
            let t = Instant::now();
            write_all(b.ptr(), len);
            base.push(t.elapsed().as_nanos() as f64);
            for &(off, l) in ranges {
                w.watch(b.ptr() as u64 + off as u64, l)?;
            }
            let s0 = w.stats();
            let t = Instant::now();
            write_all(b.ptr(), len);
            watched.push(t.elapsed().as_nanos() as f64);
            let s1 = w.stats();
            if classify {
                fps = s1.false_positives - s0.false_positives;
                hits = s1.hits - s0.hits;
                spanned = s1.pages_armed as usize;
                faults = s1.faults - s0.faults;
            }
            for &(off, l) in ranges {
                w.unwatch(b.ptr() as u64 + off as u64, l)?;
            }
        }
        out[0] = median(&mut base);
        out[k] = median(&mut watched);
        drop(b);
    }
    Ok((out[0], out[1], out[2], fps, hits, spanned, faults))
}

/// One row: the loop's slowdowns with `ranges` watched.
fn block_row(
    a: &WatchArgs,
    table: &'static str,
    config: String,
    watchpoints: usize,
    pages: usize,
    ranges: &[(usize, usize)],
) -> anyhow::Result<Row> {
    let (base, lk, nolk, fps, hits, spanned, faults) = measure_block(a, pages, ranges)?;
    Ok(Row {
        table,
        faults,
        config,
        watchpoints,
        pages: spanned,
        false_positives: fps,
        hits,
        lookup: lk / base,
        no_lookup: nolk / base,
        base_ns: base,
        lookup_ns: lk,
    })
}

/// One row of the thesis's Tables 4.3-4.5.
struct Thesis {
    wps: usize,
    pages: usize,
    fps: Option<u64>,
    lookup: f64,
    no_lookup: f64,
}

/// Prints measured rows next to the thesis's (in brackets).
fn print_block_table(title: &str, rows: &[Row], thesis: &[Thesis]) {
    println!("\n{title}");
    let t: Vec<Vec<String>> = rows
        .iter()
        .zip(thesis)
        .map(|(r, t)| {
            vec![
                r.config.clone(),
                format!("{} [{}]", r.watchpoints, t.wps),
                format!("{} [{}]", r.pages, t.pages),
                format!(
                    "{} [{}]",
                    r.false_positives,
                    t.fps.map_or("-".to_string(), |f| f.to_string())
                ),
                format!("{:.1} [{}]", r.lookup, t.lookup),
                format!("{:.1} [{}]", r.no_lookup, t.no_lookup),
                r.hits.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "config",
            "WPs",
            "pages spanned",
            "false positives",
            "slowdown (lookup)",
            "slowdown (no lookup)",
            "hits",
        ],
        &t,
    );
}

/// Records the rows.
fn push_rows(ctx: &mut BenchCtx, a: &WatchArgs, rows: &[Row]) {
    for r in rows {
        let s = Summary {
            n: 1,
            mean: r.lookup_ns,
            median: r.lookup_ns,
            ..Summary::default()
        };
        ctx.report.push(
            Record::new(
                "watch",
                &format!("table-{}", r.table),
                &a.memory,
                &r.config,
                &s,
            )
            .with("table", r.table)
            .with("config", r.config.clone())
            .with("memory", a.memory.clone())
            .with("watchpoints", r.watchpoints as u64)
            .with("pages_spanned", r.pages as u64)
            .with("false_positives", r.false_positives)
            .with("hits", r.hits)
            .with("slowdown_lookup", r.lookup)
            .with("slowdown_no_lookup", r.no_lookup)
            .with("baseline_ns", r.base_ns)
            .with("reps", a.reps as u64),
        );
    }
}

/// `n` one-byte watches at the offsets `gdbtarget.c` draws.
fn sparse_offsets(n: usize, len: usize, seed: u64) -> Vec<(usize, usize)> {
    gdb::random_offsets(n, len, seed)
        .into_iter()
        .map(|o| (o, 1))
        .collect()
}

/// Tables 4.3-4.5: measured, printed beside the thesis's, recorded, drawn.
pub fn run(ctx: &mut BenchCtx, a: &WatchArgs) -> anyhow::Result<()> {
    let pages = 256;
    let len = pages * PAGE;
    let steps = (T43.len() + T44.len() + T45.len()) as u64;
    let mut prog = ctx.progress(steps, "watch 4.3-4.5");
    let mut rows43 = Vec::new();
    for &(n, ..) in &T43 {
        prog.step(&format!("sparse {n}"));
        rows43.push(block_row(
            a,
            "4.3",
            "sparse".into(),
            n,
            pages,
            &sparse_offsets(n, len, a.seed),
        )?);
    }
    let mut rows44 = Vec::new();
    for &(n, ..) in &T44 {
        let ranges: Vec<_> = (0..n).map(|i| (i * 256, 1)).collect();
        prog.step(&format!("dense {n}"));
        rows44.push(block_row(a, "4.4", "dense".into(), n, pages, &ranges)?);
    }
    let per_page: Vec<_> = (0..pages).map(|p| (p * PAGE, 1)).collect();
    let rows45 = vec![
        block_row(a, "4.5", "one-per-page".into(), pages, pages, &per_page)?,
        block_row(a, "4.5", "whole-block".into(), len, pages, &[(0, len)])?,
    ];
    prog.finish();

    print_block_table(
        &format!("Table 4.3: sparsely distributed one-byte watchpoints, 256 pages, every byte written ({} memory; thesis numbers in brackets)", a.memory),
        &rows43,
        &T43.map(|t| Thesis { wps: t.0, pages: t.1, fps: Some(t.2), lookup: t.3, no_lookup: t.4 }),
    );
    print_block_table(
        "Table 4.4: densely distributed watchpoints (every 256 bytes)",
        &rows44,
        &T44.map(|t| Thesis {
            wps: t.0,
            pages: t.1,
            fps: None,
            lookup: t.2,
            no_lookup: t.3,
        }),
    );
    print_block_table(
        "Table 4.5: extreme distributions (WPs in bytes)",
        &rows45,
        &T45.map(|t| Thesis {
            wps: t.1,
            pages: t.2,
            fps: Some(t.3),
            lookup: t.4,
            no_lookup: t.5,
        }),
    );
    if let Some(r) = rows45.first() {
        let writes = (r.pages * PAGE) as f64;
        println!(
            "  {:.0} ns per write to a watched page with lookup ({} writes, {} signals with continued interpretation); the thesis's hardware fault costs ~400 cycles, one signal here ~3 us",
            (r.lookup_ns - r.base_ns) / writes,
            writes as u64,
            r.faults
        );
    }
    let mut all = rows43;
    all.extend(rows44);
    all.extend(rows45);
    push_rows(ctx, a, &all);
    let pts = |f: fn(&Row) -> f64| -> Vec<(f64, f64)> {
        all.iter()
            .filter(|r| r.table == "4.3")
            .map(|r| (r.pages.max(1) as f64, f(r)))
            .collect()
    };
    let series = vec![
        ("lookup".to_string(), pts(|r| r.lookup)),
        ("no lookup".to_string(), pts(|r| r.no_lookup)),
    ];
    ctx.figure("watch_slowdown_vs_pages", |dir, name| {
        plot::line_chart(
            dir,
            name,
            "Slowdown vs pages spanned (Fig. 4.2)",
            "pages spanned",
            "slowdown (x)",
            &series,
            true,
        )
    })?;
    Ok(())
}
