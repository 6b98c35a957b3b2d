//! B7 (Figs 9-11): the traces analysed as the paper analyses its own:
//! over 30 simulated minutes per device, the footprint, how often each
//! unit is accessed, the I/O faults a 300 s reclaim horizon would cause
//! ("simulated IOPFs": gaps > 300 s) and simple LRU's (10%) RPR, next to
//! the paper's figures (the block generator was calibrated to them).

use std::collections::HashMap;

use faultline_io::adp::{LruPin, PinPolicy};

use super::trace::{Class, Trace};
use crate::harness::paper::line;
use crate::harness::report::print_table;
use crate::harness::BenchCtx;

/// B7's statistics of one class's traces over 30 simulated minutes
/// (averages over the class's devices, except the fault counts).
#[derive(Debug, Clone, Copy)]
struct TraceStats {
    /// Footprint, % of the VM.
    fp: f64,
    /// Units accessed < 10 times, %.
    lt10: f64,
    /// Units accessed > 2 times, %.
    gt2: f64,
    /// Simulated I/O faults (gaps > 300 s), all devices.
    sim: u64,
    /// Of them, from units accessed < 10 times.
    sim_lt10: u64,
    /// Simple LRU (10%)'s reduction of them, %.
    lru_red: f64,
    /// Simple LRU's pinned share of the VM, % (time average: at most its
    /// 10% cap, less while the footprint is smaller).
    lru_pinned: f64,
}

fn trace_stats(sizes: &[(Class, usize)], class: Class) -> TraceStats {
    let (mut fp, mut lt10, mut gt2, mut sim, mut sim_lt10, mut sim_lru, mut n) =
        (0.0, 0.0, 0.0, 0u64, 0u64, 0u64, 0.0);
    let mut lru_pinned = 0.0;
    for (i, &(c, units)) in sizes.iter().enumerate() {
        if c != class {
            continue;
        }
        let mut t = Trace::new(c, units, 100 + i as u64);
        let mut last: HashMap<usize, u64> = HashMap::new();
        let mut count: HashMap<usize, u32> = HashMap::new();
        let mut gaps: Vec<usize> = Vec::new();
        let mut lru = LruPin::new(units / 10);
        let (mut ev, mut cpu) = (Vec::new(), Vec::new());
        for step in 0..1800u64 {
            t.step(&mut ev, &mut cpu);
            for &u in &ev {
                if let Some(&l) = last.get(&u) {
                    if step - l > 300 {
                        gaps.push(u);
                        if !lru.is_pinned(u) {
                            sim_lru += 1;
                        }
                    }
                }
                last.insert(u, step);
                *count.entry(u).or_default() += 1;
                lru.on_access(u, step);
            }
            lru_pinned += lru.pinned() as f64 / units as f64 * 100.0 / 1800.0;
        }
        fp += last.len() as f64 / units as f64 * 100.0;
        let k = count.len().max(1) as f64;
        lt10 += count.values().filter(|&&c| c < 10).count() as f64 / k * 100.0;
        gt2 += count.values().filter(|&&c| c > 2).count() as f64 / k * 100.0;
        sim += gaps.len() as u64;
        sim_lt10 += gaps.iter().filter(|u| count[u] < 10).count() as u64;
        n += 1.0;
    }
    let n = f64::max(n, 1.0);
    TraceStats {
        fp: fp / n,
        lt10: lt10 / n,
        gt2: gt2 / n,
        sim,
        sim_lt10,
        lru_pinned: lru_pinned / n,
        lru_red: if sim > 0 {
            (1.0 - sim_lru as f64 / sim as f64) * 100.0
        } else {
            0.0
        },
    }
}

/// B7 over the devices of `sizes`: the table and the lines beside the
/// paper.
pub(crate) fn run(ctx: &mut BenchCtx, sizes: &[(Class, usize)]) {
    println!("\n== B7: trace analysis (Figs 9-11), 30 simulated minutes per device ==");
    let mut rows = Vec::new();
    for (name, class) in [("nic", Class::Nic), ("block", Class::Block)] {
        let TraceStats {
            fp,
            lt10,
            gt2,
            sim,
            sim_lt10,
            lru_red: red,
            lru_pinned,
        } = trace_stats(sizes, class);
        // RPR (Eq. 2): reduction % over pinned %.
        let rpr = red / lru_pinned.max(1e-9);
        rows.push(vec![
            name.into(),
            format!("{:.1}", fp),
            format!("{:.1}", lt10),
            format!("{:.1}", gt2),
            sim.to_string(),
            format!("{:.1}", sim_lt10 as f64 / sim.max(1) as f64 * 100.0),
            format!("{lru_pinned:.1}"),
            format!("{rpr:.2}"),
        ]);
        let (fig, fpp) = if class == Class::Nic {
            ("fig11", "~3 (2-5)")
        } else {
            ("fig10", "~28 at 30 min")
        };
        line(ctx, &format!("{fig}.{name}.footprint_pct"), fp, "%", fpp);
        if class == Class::Block {
            line(
                ctx,
                "fig10.block.units_lt10_accesses_pct",
                lt10,
                "%",
                "87.3",
            );
            line(ctx, "fig10.block.units_gt2_accesses_pct", gt2, "%", "70.3");
            line(
                ctx,
                "fig10.block.sim_iopf_from_lt10_pct",
                sim_lt10 as f64 / sim.max(1) as f64 * 100.0,
                "%",
                "94.3",
            );
            line(ctx, "fig10.lru_rpr.block", rpr, "", "1.2-1.5");
        } else {
            line(ctx, "fig11.lru_rpr.nic", rpr, "", "20-50 (est.)");
        }
    }
    print_table(
        &[
            "class",
            "footprint %",
            "units <10 acc %",
            "units >2 acc %",
            "sim. IOPF (gap>300s)",
            "from <10-acc units %",
            "LRU10% pinned %",
            "LRU10% RPR",
        ],
        &rows,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::round::fleet;

    /// The block generator stays calibrated to the paper's trace
    /// statistics (Fig 10) on B5's fleet: within 3 points of each.
    #[test]
    fn block_traces_match_the_papers_statistics() {
        let s = trace_stats(&fleet(14), Class::Block);
        let sim_lt10 = s.sim_lt10 as f64 / s.sim as f64 * 100.0;
        for (what, got, paper) in [
            ("footprint", s.fp, 28.0),
            ("< 10 accesses", s.lt10, 87.3),
            ("> 2 accesses", s.gt2, 70.3),
            ("simulated faults from < 10", sim_lt10, 94.3),
        ] {
            assert!((got - paper).abs() <= 3.0, "{what}: {got:.1} vs {paper}");
        }
        let nic = trace_stats(&fleet(14), Class::Nic);
        assert!((2.0..=5.0).contains(&nic.fp), "NIC footprint {}", nic.fp);
    }
}
