//! B1 (Table 2): the cost of the presence check and of its update.
//!
//! 1. The check (`Residency::io_ready`) on a 4 KiB and a 64 KiB range of a
//!    4 GiB region's map, timed with `rdtscp` (the timer's own cost
//!    subtracted): hot (the same words every time) and cold (random pages,
//!    their words `clflush`ed first: the paper's "caching disabled").
//! 2. The floor under any cold check: one `clflush`ed load of a word of
//!    the same map; and cold checks batched as `IoQueue::submit_batch`
//!    makes them (the next pages' words prefetched ahead), per check.
//! 3. The evictor-side update: claim, set absent, release; and with the
//!    `MADV_DONTNEED` zap of a resident page (our "PCIe").

use faultline::residency::{PageState, Residency};
use faultline_sys::BASE_PAGE as PS;
use rand::{Rng, SeedableRng};

use crate::harness::paper::line;
use crate::harness::report::print_table;
use crate::harness::stats::Summary;
use crate::harness::tsc::tsc;
use crate::harness::BenchCtx;

fn summary_ns(cycles: &mut [u64], overhead: u64) -> Summary {
    for c in cycles.iter_mut() {
        *c = c.saturating_sub(overhead);
    }
    Summary::from_cycles(cycles, tsc())
}

#[inline(always)]
fn rdtscp() -> u64 {
    let mut aux = 0u32;
    // SAFETY: rdtscp has no preconditions on x86_64.
    unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
}

fn flush(addrs: &[*const u8]) {
    for &a in addrs {
        // SAFETY: clflush of a mapped address (words of a live Residency).
        unsafe { core::arch::x86_64::_mm_clflush(a) };
    }
    // SAFETY: a fence has no preconditions.
    unsafe { core::arch::x86_64::_mm_mfence() };
}

/// Runs B1 with `samples` samples per hot measurement (a tenth of it cold).
pub(super) fn run(ctx: &mut BenchCtx, samples: usize) -> anyhow::Result<()> {
    println!("\n== B1: presence check and update (Table 2) ==");
    let pages = 1 << 20; // a 4 GiB region's map
    let r = Residency::new(pages);
    r.set_range(0..pages, PageState::Writable);
    // Timer overhead: an empty measured section.
    let mut empty: Vec<u64> = (0..10_000)
        .map(|_| {
            let t = rdtscp();
            rdtscp() - t
        })
        .collect();
    empty.sort_unstable();
    let overhead = empty[empty.len() / 2];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut rows = Vec::new();
    for (name, span) in [("4KiB", 1usize), ("64KiB", 16)] {
        // Hot: the same words every time.
        let n = samples;
        let mut hot = Vec::with_capacity(n);
        let p0 = 1000;
        for _ in 0..n {
            let t = rdtscp();
            let ok = r.io_ready(p0..p0 + span, true, true).is_ok();
            hot.push(rdtscp() - t);
            std::hint::black_box(ok);
        }
        let hs = summary_ns(&mut hot, overhead);
        // Cold: random pages, their words flushed first.
        let mut cold = Vec::with_capacity(n / 10);
        for _ in 0..n / 10 {
            let p = rng.gen_range(0..pages - span);
            let mut w: Vec<*const u8> = r.words_of(p).to_vec();
            w.extend(r.words_of(p + span - 1));
            flush(&w);
            let t = rdtscp();
            let ok = r.io_ready(p..p + span, true, true).is_ok();
            cold.push(rdtscp() - t);
            std::hint::black_box(ok);
        }
        let cs = summary_ns(&mut cold, overhead);
        rows.push(vec![
            format!("lookup {name} hot"),
            format!("{:.1}", hs.mean),
            format!("{:.1}", hs.p99),
        ]);
        rows.push(vec![
            format!("lookup {name} cold (clflush)"),
            format!("{:.1}", cs.mean),
            format!("{:.1}", cs.p99),
        ]);
        line(
            ctx,
            &format!("table2.lookup_{name}.hot.avg_ns"),
            hs.mean,
            "ns",
            "69 (DPU DRAM; target < 10 hot)",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.hot.p99_ns"),
            hs.p99,
            "ns",
            "92",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.cold.avg_ns"),
            cs.mean,
            "ns",
            "69 (target < 200 cold)",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.cold.p99_ns"),
            cs.p99,
            "ns",
            "92",
        );
    }
    // The floor: one plain cache-missing load of a random word of the same
    // bitmap (flushed, same timer), what any cold check costs at least.
    let mut floor = Vec::with_capacity(samples / 10);
    for _ in 0..samples / 10 {
        let p = rng.gen_range(0..pages);
        let w = r.words_of(p)[0];
        flush(&[w]);
        let t = rdtscp();
        // SAFETY: `w` points into the live bitmap (an aligned u64 word).
        let v = unsafe { std::ptr::read_volatile(w.cast::<u64>()) };
        floor.push(rdtscp() - t);
        std::hint::black_box(v);
    }
    let fs = summary_ns(&mut floor, overhead);
    // Batched cold checks, as `IoQueue::submit_batch` does them: B random
    // pages, every word flushed, then each page checked while the words
    // of the next PREFETCH_AHEAD are already being loaded. The cost per
    // check is the batch's time over B (a pipeline's checks overlap, so
    // one check alone has no time of its own): its mean, and its p99 over
    // batches.
    const BATCH: usize = 64;
    let ahead = faultline_io::PREFETCH_AHEAD;
    let mut batched = Vec::with_capacity(samples / 10 / BATCH);
    let mut ps = vec![0usize; BATCH];
    for _ in 0..(samples / 10 / BATCH).max(1) {
        for p in ps.iter_mut() {
            *p = rng.gen_range(0..pages);
            flush(&r.words_of(*p));
        }
        let t = rdtscp();
        for &p in &ps[..ahead] {
            r.prefetch_io(p..p + 1);
        }
        let mut ok = 0;
        for i in 0..BATCH {
            if let Some(&q) = ps.get(i + ahead) {
                r.prefetch_io(q..q + 1);
            }
            ok += usize::from(r.io_ready(ps[i]..ps[i] + 1, true, true).is_ok());
        }
        let dt = rdtscp() - t;
        std::hint::black_box(ok);
        batched.push(dt.saturating_sub(overhead) / BATCH as u64);
    }
    let bs = summary_ns(&mut batched, 0);
    rows.push(vec![
        format!("lookup 4KiB cold, batched ({BATCH}, prefetch {ahead} ahead), per check"),
        format!("{:.1}", bs.mean),
        format!("{:.1}", bs.p99),
    ]);
    line(
        ctx,
        "table2.lookup_4KiB.cold_batched.avg_ns",
        bs.mean,
        "ns",
        "69 (target < 200 cold; per check of a pipelined batch)",
    );
    line(
        ctx,
        "table2.lookup_4KiB.cold_batched.p99_ns",
        bs.p99,
        "ns",
        "92 (p99 over batches of the per-check cost)",
    );
    rows.push(vec![
        "floor: one clflushed load".into(),
        format!("{:.1}", fs.mean),
        format!("{:.1}", fs.p99),
    ]);
    line(
        ctx,
        "table2.cold_floor.one_missing_load.avg_ns",
        fs.mean,
        "ns",
        "(this machine's floor for a cold check)",
    );
    line(
        ctx,
        "table2.cold_floor.one_missing_load.p99_ns",
        fs.p99,
        "ns",
        "(a cold p99 below it is impossible here)",
    );
    // Update: the evictor's invalidation (claim, set absent, release).
    let n = samples / 10;
    let mut upd = Vec::with_capacity(n);
    for i in 0..n {
        let p = (i * 7919) % pages;
        r.set(p, PageState::Writable);
        let t = rdtscp();
        if r.try_claim(p) {
            r.set(p, PageState::Absent);
            r.release(p..p + 1);
        }
        upd.push(rdtscp() - t);
    }
    let us = summary_ns(&mut upd, overhead);
    // With the zap: MADV_DONTNEED of a resident page.
    let m = faultline_sys::mem::Mapping::anon(256 * PS)?;
    let mut zap = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        let off = (i % 256) * PS;
        // SAFETY: inside the mapping; touch it resident.
        unsafe { std::ptr::write_volatile(m.as_ptr().add(off), 1u8) };
        let t = rdtscp();
        let _ = faultline_sys::mem::madvise(
            m.addr() + off as u64,
            PS,
            faultline_sys::mem::Advice::DontNeed,
        );
        zap.push(rdtscp() - t);
    }
    let zs = summary_ns(&mut zap, overhead);
    rows.push(vec![
        "update (claim+invalidate+release)".into(),
        format!("{:.1}", us.mean),
        format!("{:.1}", us.p99),
    ]);
    rows.push(vec![
        "update + MADV_DONTNEED zap".into(),
        format!("{:.1}", us.mean + zs.mean),
        format!("{:.1}", us.p99 + zs.p99),
    ]);
    print_table(&["Table 2", "avg ns", "p99 ns"], &rows);
    line(
        ctx,
        "table2.update.avg_ns",
        us.mean,
        "ns",
        "1742 (host update incl. PCIe)",
    );
    line(ctx, "table2.update.p99_ns", us.p99, "ns", "2341");
    line(
        ctx,
        "table2.update_with_zap.avg_ns",
        us.mean + zs.mean,
        "ns",
        "1742",
    );
    line(
        ctx,
        "table2.update_with_zap.p99_ns",
        us.p99 + zs.p99,
        "ns",
        "2341",
    );
    Ok(())
}
