//! The scale test: the cost of setting and clearing 100,000 watches, and
//! the handler's lookup among them still right.

use std::time::Instant;

use super::args::WatchArgs;
use super::block::{block, watcher, write_all, PAGE};
use crate::harness::report::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// Sets `--scale` one-byte watches 16 bytes apart, checks a hit and a
/// false positive among them, clears them; the time per call.
pub fn run(ctx: &mut BenchCtx, a: &WatchArgs) -> anyhow::Result<()> {
    let n = a.scale;
    let w = watcher(&a.memory, true, false, false, !a.no_interpret)?;
    let len = (n * 16).div_ceil(PAGE) * PAGE;
    let b = block(&w, &a.memory, len)?;
    let p = b.ptr() as u64;
    let t = Instant::now();
    for i in 0..n {
        w.watch(p + 16 * i as u64, 1)?;
    }
    let set = t.elapsed().as_nanos() as f64 / n as f64;
    let st = w.stats();
    anyhow::ensure!(
        st.ranges as usize == n,
        "{} ranges after {n} watches",
        st.ranges
    );
    // A hit and a false positive on the last page still resolve correctly.
    let s0 = w.stats();
    write_all((p + 16 * (n as u64 - 1)) as *mut u8, 2);
    let s1 = w.stats();
    anyhow::ensure!(
        s1.hits - s0.hits == 1 && s1.false_positives - s0.false_positives == 1,
        "lookup among {n} watches: {s1:?}"
    );
    let t = Instant::now();
    for i in 0..n {
        w.unwatch(p + 16 * i as u64, 1)?;
    }
    let clear = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "\nScale: {n} one-byte watches over {} pages: watch() {:.2} us each, unwatch() {:.2} us each, handler lookup unaffected (hash probe + per-page ranges)",
        len / PAGE,
        set / 1000.0,
        clear / 1000.0
    );
    let s = Summary {
        n,
        mean: set,
        median: set,
        ..Summary::default()
    };
    ctx.report.push(
        Record::new("watch", "scale", &a.memory, "watch", &s)
            .with("table", "scale")
            .with("config", format!("{n} watches"))
            .with("watchpoints", n as u64)
            .with("pages_spanned", (len / PAGE) as u64)
            .with("false_positives", 1u64)
            .with("watch_ns", set)
            .with("unwatch_ns", clear),
    );
    Ok(())
}
