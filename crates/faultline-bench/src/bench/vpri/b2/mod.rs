//! B2 (Fig 6): random 4 KiB reads arriving at a fixed rate (open loop,
//! latency from arrival), io_uring QD 32, from a page-cached file into a
//! region, with I/O faults injected at R/s (the next I/O's buffer is a page
//! never touched, whose store fill takes 5 ms), poll engine. Five modes:
//! plain io_uring fault-free, the API fault-free, plain io_uring with
//! faults (blocking: the kernel takes the fault on the submitter), the API
//! ordered, the API unordered ([`load`]).
//!
//! Method: rounds; each runs every mode once, in a shuffled order (seeded),
//! each after a random 0-50 ms pause, at the same priority. A mode's ratio
//! in a round is its p99.9 over that round's plain fault-free p99.9; the
//! headline is the median over the rounds, beside the floor the parked
//! I/Os alone give. Each round's steal time and other processes' CPU
//! ([`CpuSnap`], from `/proc/stat`) show a noisy one.

mod load;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::testing::{Action, Fault, FaultyStore};
use faultline::{MemoryStore, PollEngine, Region};
use faultline_io::Ordering;
use faultline_sys::BASE_PAGE as PS;
use rand::{Rng, SeedableRng};

use crate::harness::plot;
use crate::harness::progress::Progress;
use crate::harness::report::{print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;
use crate::sim::{fmt_opt, line_opt, ratio};
use load::{Fifo, Load};

/// B2's modes, in the order of the tables: name, injected faults/s
/// (0 or `--b2-rate`), and the API queue's ordering (`None`: plain
/// io_uring).
fn b2_modes(rate: f64) -> [(&'static str, f64, Option<Ordering>); 5] {
    [
        ("fault-free", 0.0, None),
        ("fault-free, API unordered", 0.0, Some(Ordering::Unordered)),
        ("blocking (plain io_uring)", rate, None),
        ("VPRI ordered", rate, Some(Ordering::Ordered)),
        ("VPRI unordered", rate, Some(Ordering::Unordered)),
    ]
}

/// CPU time of the whole machine and of this process, from `/proc`.
#[derive(Clone, Copy, Default)]
struct CpuSnap {
    /// Non-idle time of all CPUs (user, nice, system, irq, softirq), ticks.
    busy: u64,
    /// Time the hypervisor ran something else on our vCPUs, ticks.
    steal: u64,
    /// This process's user + system time, ticks.
    own: u64,
    at: Option<Instant>,
}

impl CpuSnap {
    fn now() -> CpuSnap {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        let own_stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name's closing parenthesis: utime and
        // stime are fields 14 and 15 of the line (11 and 12 after it).
        let rest = own_stat.rsplit_once(')').map_or("", |(_, r)| r);
        let g: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        CpuSnap {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            own: g.get(11).copied().unwrap_or(0) + g.get(12).copied().unwrap_or(0),
            at: Some(Instant::now()),
        }
    }

    /// Since `before`: steal in ms, and the other processes' CPU time as a
    /// share of one CPU (the machine's busy time minus ours).
    fn since(&self, before: &CpuSnap) -> (f64, f64) {
        let hz = faultline_sys::thread::clock_ticks_per_sec() as f64;
        let secs = match (self.at, before.at) {
            (Some(a), Some(b)) => a.duration_since(b).as_secs_f64().max(1e-9),
            _ => 1.0,
        };
        let steal_ms = self.steal.saturating_sub(before.steal) as f64 / hz * 1e3;
        let others = (self.busy.saturating_sub(before.busy) as f64
            - self.own.saturating_sub(before.own) as f64)
            .max(0.0)
            / hz;
        (steal_ms, others / secs * 100.0)
    }
}

/// B2's settings (from `bench vpri`'s arguments).
pub(super) struct B2 {
    /// Seconds per mode per round.
    pub secs: f64,
    /// I/Os arriving per second.
    pub iops: f64,
    /// Rounds.
    pub reps: usize,
    /// The submitting thread at the caller's priority.
    pub normal_priority: bool,
    /// Injected I/O faults per second.
    pub rate: f64,
    /// Store latency of an injected fault, ms.
    pub store_ms: f64,
}

/// Runs B2.
pub(super) fn run(ctx: &mut BenchCtx, a: &B2) -> anyhow::Result<()> {
    let modes = b2_modes(a.rate);
    let reps = a.reps.max(1);
    println!(
        "\n== B2: random 4 KiB reads arriving at {} IOPS (open loop, latency from arrival), io_uring QD <= 32, {} injected I/O faults/s, {} ms store (Fig 6), poll engine ==",
        a.iops, a.rate, a.store_ms
    );
    println!(
        "method: {reps} rounds; each round runs all {} modes for {} s each, in a shuffled order (seeded), each after \
         a random 0-50 ms pause; a ratio is a mode's p99.9 over the plain fault-free p99.9 of the same round, and \
         the headline is the median over the rounds (range and all rounds pooled printed too); steal and the other \
         processes' CPU (% of one CPU, /proc/stat, the round's busiest segment) per round show a noisy one. Same method, priority (the \
         next line) and CPUs (wherever the scheduler puts them) for every mode.",
        modes.len(),
        a.secs
    );
    let fifo = !a.normal_priority && Fifo::enter(true).0;
    println!(
        "priority of the submitting thread: {}",
        match (a.normal_priority, fifo) {
            (true, _) => "the caller's (--b2-normal-priority)",
            (false, true) =>
                "SCHED_FIFO 10 in every mode (library threads and the poll engine: normal)",
            (false, false) => "the caller's (SCHED_FIFO not permitted)",
        }
    );
    let hot = 1024usize; // buffer pages in the hot set
    let fresh = ((a.rate * a.secs * 2.0) as usize + 64).max(64);
    let pages = hot + fresh;
    // Its file (64 MiB) goes with the guard, on a signal, or with the
    // next run if this one is killed.
    let (dir, _dir) = super::temp_dir("b2")?;
    let file_blocks = 16384usize;
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0x42u8; file_blocks * PS])?;
    let file = Arc::new(File::open(&path)?);
    // Warm the page cache.
    let mut tmp = vec![0u8; PS];
    for b in 0..file_blocks {
        file.read_at(&mut tmp, (b * PS) as u64)?;
    }
    let engine = PollEngine::new()?;
    // Per mode and round: the latencies (ns) and the injected faults.
    let mut lat_by: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); reps]; modes.len()];
    let mut faults_by = vec![vec![0u64; reps]; modes.len()];
    let mut order_rng = rand::rngs::SmallRng::seed_from_u64(13);
    let mut rows = Vec::new();
    let mut timelines: Vec<(String, Vec<(f64, f64)>)> = modes
        .iter()
        .map(|(mode, _, _)| (mode.to_string(), Vec::new()))
        .collect();
    // A mode's p99.9, None without an I/O (--b2-secs too short to issue one).
    let p999 = |v: &[f64]| (!v.is_empty()).then(|| Summary::from_ns(&mut v.to_vec()).p999);
    let mut progress = Progress::new((reps * modes.len()) as u64, "B2");
    for round in 0..reps {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        rand::seq::SliceRandom::shuffle(&mut order[..], &mut order_rng);
        let (mut round_steal, mut round_others, mut round_iops) = (0.0, 0.0f64, f64::MAX);
        // None: the mode issued no I/O this round (no p99.9 to show).
        let mut p999_row: Vec<Option<f64>> = vec![None; modes.len()];
        for &m in &order {
            let (mode, rate, ordering) = modes[m];
            // A random pause, so that no periodic noise of the machine
            // (a kernel thread every 512 ms, an agent every second) keeps
            // falling into the same mode.
            std::thread::sleep(Duration::from_millis(order_rng.gen_range(0..50)));
            progress.step(&format!("round {}: {mode}", round + 1));
            let region = Arc::new(
                Region::builder(pages * PS)
                    // Fills past the hot buffer pages are injected faults.
                    .store(
                        FaultyStore::builder(MemoryStore::new(vec![0u8; pages * PS]))
                            .rule(
                                Fault::fill(Action::Slow(Duration::from_secs_f64(
                                    a.store_ms / 1000.0,
                                )))
                                .pages(hot as u64..),
                            )
                            .build(),
                    )
                    .fault_around(1)
                    .build(&engine)?,
            );
            region.populate(0, hot * PS)?;
            let before = CpuSnap::now();
            let l = Load {
                iops: a.iops,
                secs: a.secs,
                normal_priority: a.normal_priority,
                rate,
                hot,
                blocks: file_blocks,
            };
            let (lat, timeline, faults) = match ordering {
                Some(o) => load::api(&region, &file, &l, o)?,
                None => load::plain(&region, &file, &l)?,
            };
            let (steal_ms, others) = CpuSnap::now().since(&before);
            round_steal += steal_ms;
            round_others = round_others.max(others);
            round_iops = round_iops.min(lat.len() as f64 / a.secs);
            p999_row[m] = p999(&lat);
            lat_by[m][round] = lat;
            faults_by[m][round] = faults;
            // A mode's rounds end to end.
            let t_off = round as f64 * a.secs * 1e3;
            timelines[m]
                .1
                .extend(timeline.into_iter().map(|(t, p)| (t + t_off, p)));
        }
        let mut row = vec![
            (round + 1).to_string(),
            order
                .iter()
                .map(|m| (m + 1).to_string())
                .collect::<String>(),
            format!("{round_iops:.0}"),
        ];
        row.extend(p999_row.iter().map(|p| fmt_opt(p.map(|p| p / 1e3), 1)));
        row.extend([
            fmt_opt(
                p999_row[4].zip(p999_row[0]).and_then(|(u, f)| ratio(u, f)),
                2,
            ),
            format!("{round_steal:.0}"),
            format!("{round_others:.1}"),
        ]);
        rows.push(row);
    }
    progress.finish();
    print_table(
        &[
            "round",
            "order",
            "min IOPS",
            "p99.9 us: 1 fault-free",
            "2 API fault-free",
            "3 blocking",
            "4 ordered",
            "5 unordered",
            "5/1",
            "steal ms",
            "others %CPU (max)",
        ],
        &rows,
    );
    // What the unordered queue's p99.9 would be if a fault delayed only
    // the I/O into its page: the fault-free I/Os plus as many parked ones
    // per I/O as the unordered run had, each slower than all. None
    // without fault-free or unordered I/Os to take it from.
    let floor_of = |ff: &[f64], faults: u64, n_un: usize| {
        if ff.is_empty() || n_un == 0 {
            return None;
        }
        let parked = (faults as f64 * ff.len() as f64 / n_un as f64).round() as usize;
        let mut v = ff.to_vec();
        v.extend(std::iter::repeat_n(f64::MAX, parked));
        p999(&v)
    };
    let pooled: Vec<Vec<f64>> = lat_by.iter().map(|r| r.concat()).collect();
    let base = p999(&pooled[0]);
    let pooled_floor = floor_of(&pooled[0], faults_by[4].iter().sum(), pooled[4].len());
    // Each round's ratios to the same round's plain fault-free p99.9; the
    // last row is the floor. None: a round without the I/Os of either.
    let ff_round: Vec<Option<f64>> = lat_by[0].iter().map(|v| p999(v)).collect();
    let mut ratios: Vec<Vec<Option<f64>>> = lat_by
        .iter()
        .map(|r| {
            r.iter()
                .zip(&ff_round)
                .map(|(v, b)| ratio(p999(v)?, (*b)?))
                .collect()
        })
        .collect();
    ratios.push(
        (0..reps)
            .map(|i| {
                let floor = floor_of(&lat_by[0][i], faults_by[4][i], lat_by[4][i].len());
                ratio(floor?, ff_round[i]?)
            })
            .collect(),
    );
    // The median, least and most of the rounds with a ratio (None: none had).
    let spread = |r: &[Option<f64>]| {
        let mut r: Vec<f64> = r.iter().flatten().copied().collect();
        let med = crate::harness::stats::median(&mut r);
        (!r.is_empty()).then(|| (med, r[0], r[r.len() - 1]))
    };
    let names = modes
        .iter()
        .map(|(m, _, _)| *m)
        .chain(["floor: fault-free + the parked I/Os only"]);
    let mut summary = Vec::new();
    for (m, name) in names.enumerate() {
        let (p50, p99, p999_ns) = match pooled.get(m) {
            Some(v) if v.is_empty() => ("-".into(), "-".into(), None),
            Some(v) => {
                let s = Summary::from_ns(&mut v.clone());
                (
                    format!("{:.1}", s.median / 1e3),
                    format!("{:.1}", s.p99 / 1e3),
                    Some(s.p999),
                )
            }
            None => ("-".into(), "-".into(), pooled_floor),
        };
        let pooled_ratio = p999_ns.zip(base).and_then(|(p, b)| ratio(p, b));
        // A round without data meets no target.
        let met = ratios[m].iter().flatten().filter(|&&x| x < 1.5).count();
        let no_data = ratios[m].iter().filter(|x| x.is_none()).count();
        summary.push(vec![
            name.to_string(),
            p50,
            p99,
            fmt_opt(p999_ns.map(|p| p / 1e3), 1),
            fmt_opt(pooled_ratio, 2),
            spread(&ratios[m]).map_or("-".into(), |(med, lo, hi)| {
                format!("{med:.2} [{lo:.2}-{hi:.2}]")
            }),
            match no_data {
                0 => format!("{met}/{reps}"),
                k => format!("{met}/{reps} ({k} without data)"),
            },
        ]);
        if m > 0 {
            let key = [
                "",
                "api_fault_free",
                "blocking",
                "vpri_ordered",
                "vpri_unordered",
                "vpri_unordered_floor",
            ][m];
            let label = format!("fig6.{key}.p999_ratio_pooled");
            let s = Summary {
                n: usize::from(pooled_ratio.is_some()),
                median: pooled_ratio.unwrap_or(f64::NAN),
                ..Summary::default()
            };
            ctx.report.push(
                Record::new("vpri", &label, "-", "-", &s)
                    .with("label", label.as_str())
                    .with("measured", pooled_ratio)
                    .with("unit", "x")
                    .with("round_ratios", serde_json::json!(ratios[m])),
            );
        }
    }
    println!(
        "the {reps} rounds (each ratio: a mode's p99.9 / the same round's plain fault-free p99.9; \
         the headline is their median), and all rounds pooled:"
    );
    print_table(
        &[
            "mode",
            "pooled p50 us",
            "p99 us",
            "p99.9 us",
            "pooled ratio",
            "round ratio median [min-max]",
            "rounds < 1.5x",
        ],
        &summary,
    );
    let median_ratio = |m: usize| spread(&ratios[m]).map(|s| s.0);
    for (label, m, paper) in [
        (
            "fig6.api_fault_free.p999_ratio_vs_no_iopf",
            1,
            "(the API's own tail, no faults)",
        ),
        (
            "fig6.blocking.p999_ratio_vs_no_iopf",
            2,
            "2-11x at 10/s (target > 2)",
        ),
        (
            "fig6.vpri_ordered.p999_ratio_vs_no_iopf",
            3,
            "(paper: the paused queue = blocking)",
        ),
        (
            "fig6.vpri_unordered.p999_ratio_vs_no_iopf",
            4,
            "(target < 1.5; §8 future work)",
        ),
        (
            "fig6.vpri_unordered.p999_ratio_floor",
            5,
            "(the parked I/Os alone, nothing else delayed)",
        ),
    ] {
        line_opt(ctx, label, median_ratio(m), "x", paper);
    }
    ctx.figure("vpri_b2_p99", |d, nm| {
        plot::line_chart(
            d,
            nm,
            "B2: p99 latency of the I/Os arriving in each 100 ms (a mode's rounds end to end)",
            "ms",
            "p99 us",
            &timelines,
            false,
        )
    })?;
    Ok(())
}
