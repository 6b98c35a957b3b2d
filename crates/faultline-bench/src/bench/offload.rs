//! `faultline bench offload`: seed 004 (MFOE) in software. Page frames
//! prepared by a background thread (the frame pool) and pages installed
//! ahead of a predicted stream (run-ahead), against the plain fault path and
//! the kernel's own anonymous first touch, on four workloads.
//!
//! The critical-path latency is measured per access of the workload (per
//! insert for the hash map) with the TSC: an access that no longer faults
//! because its page was prepared counts at its real, small cost, so the
//! distribution shows both how many faults were avoided and what the
//! remaining ones cost. With `--plot`: its mean and p99 per workload and
//! configuration, the kernel's beside them (`offload_mean`,
//! `offload_p99`).

use std::time::Instant;

use anyhow::Context;
use faultline::{
    engine, EngineConfig, EngineKind, FramePoolConfig, Region, ResolveOp, RunAheadConfig, ZeroStore,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::kernel::{minor_faults, PAGE};
use crate::harness::plot;
use crate::harness::report::{fmt_count, fmt_ns, fmt_ratio, print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::tsc::{rdtsc, tsc};
use crate::harness::BenchCtx;

/// Seed 004's reported gains, for the table.
const SEED_MEAN_X: f64 = 33.0;
const SEED_TAIL_X: f64 = 51.0;

/// Options of `faultline bench offload`.
#[derive(clap::Args, Clone, Debug)]
pub struct OffloadArgs {
    /// MiB per workload region (1 to what MemAvailable holds; a whole
    /// number of fault-around windows, checked before the run).
    #[arg(long, default_value_t = 128, value_parser = faultline_cli_support::flags::mib())]
    pub mib: usize,
    /// Engine delivering the faults.
    #[arg(long, default_value = "signal")]
    pub engine: String,
    /// Fault-around (pages per fault) of every faultline configuration.
    /// 64 by default: with 16, about 2% of sequential accesses still fault
    /// under run-ahead (the thread outruns a populator bound by page
    /// allocation), so p99 lands on a fault; with 64 under 1% do.
    /// 1 to 512, and --mib a multiple of its window (pages x 4 KiB).
    #[arg(long, default_value_t = 64, value_parser = faultline_cli_support::flags::fault_around())]
    pub fault_around: usize,
    /// Run-ahead budget: most pages populated ahead of the last fault
    /// (1 to what MemAvailable holds).
    #[arg(long, default_value_t = 2048, value_parser = faultline_cli_support::flags::pages())]
    pub budget: usize,
    /// Frame pool capacity in pages (1 to what MemAvailable holds).
    #[arg(long, default_value_t = 8192, value_parser = faultline_cli_support::flags::pages())]
    pub pool: usize,
    /// Stride of the strided workload, in pages (1 to the region's pages).
    #[arg(long, default_value_t = 64, value_parser = faultline_cli_support::flags::pages())]
    pub stride: usize,
}

impl OffloadArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> OffloadArgs {
        OffloadArgs {
            mib: 32,
            engine: "signal".into(),
            fault_around: 64,
            budget: 2048,
            pool: 4096,
            stride: 64,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Seq,
    Strided,
    Random,
    HashMap,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::Seq,
        Workload::Strided,
        Workload::Random,
        Workload::HashMap,
    ];
    fn name(self) -> &'static str {
        match self {
            Workload::Seq => "seq (heap growth)",
            Workload::Strided => "strided",
            Workload::Random => "random",
            Workload::HashMap => "hash-map build",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Workload::Seq => "seq",
            Workload::Strided => "strided",
            Workload::Random => "random",
            Workload::HashMap => "hashmap",
        }
    }
}

/// Per-operation cycles and which 4 KiB pages were touched.
struct Trace {
    cycles: Vec<u64>,
    touched: Vec<bool>,
    seconds: f64,
}

/// Runs `w` over `len` bytes at `base` (zeroed memory, pages may fault).
fn run_workload(w: Workload, base: *mut u8, len: usize, stride: usize) -> Trace {
    let pages = len / PAGE;
    let mut touched = vec![false; pages];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
    let order: Vec<usize> = match w {
        Workload::Seq => (0..pages).collect(),
        Workload::Strided => (0..pages).step_by(stride.max(1)).collect(),
        Workload::Random => {
            let mut v: Vec<usize> = (0..pages).collect();
            v.shuffle(&mut rng);
            v
        }
        Workload::HashMap => Vec::new(),
    };
    let t = Instant::now();
    let cycles = if w == Workload::HashMap {
        // Open addressing, linear probing, 16-byte slots, half full.
        let slots = len / 16;
        let n = slots / 2;
        let table = base as *mut [u64; 2];
        let mut cycles = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let key = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut h = (key.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 7) as usize % slots;
            let t0 = rdtsc();
            loop {
                // SAFETY: `h < slots`, inside the live region or mapping.
                let slot = unsafe { &mut *table.add(h) };
                if slot[0] == 0 {
                    slot[0] = key;
                    slot[1] = i;
                    break;
                }
                h = (h + 1) % slots;
            }
            cycles.push(rdtsc() - t0);
            touched[h * 16 / PAGE] = true;
        }
        cycles
    } else {
        let mut cycles = Vec::with_capacity(order.len());
        for &p in &order {
            let t0 = rdtsc();
            // SAFETY: page `p` is inside the live region or mapping.
            unsafe { std::ptr::write_volatile(base.add(p * PAGE), 1) };
            cycles.push(rdtsc() - t0);
            touched[p] = true;
        }
        cycles
    };
    Trace {
        cycles,
        touched,
        seconds: t.elapsed().as_secs_f64(),
    }
}

/// What `bench offload` needs, checked before any bench runs: a region
/// that is a whole number of fault-around windows (it is not rounded up
/// to one: a window past the region would fault more than --mib says; at
/// --fault-around 1e9, a 4 TB region and the OOM killer), a stride within
/// it, and memory for the kernel's row, a faultline region and the pool.
pub fn check(args: &OffloadArgs) -> anyhow::Result<()> {
    let len = args.mib.max(1) << 20;
    let window = PAGE * args.fault_around.max(1);
    if !len.is_multiple_of(window) {
        anyhow::bail!(
            "--mib {} is not a whole number of fault-around windows (--fault-around {} x 4 KiB = {} KiB)",
            args.mib,
            args.fault_around,
            window >> 10
        );
    }
    if args.stride * PAGE > len {
        anyhow::bail!(
            "--stride {} pages is longer than the region (--mib {})",
            args.stride,
            args.mib
        );
    }
    // The kernel's row, a faultline region, and the frame pool.
    let need = (2 * len + args.pool * PAGE) as u64;
    faultline_cli_support::flags::check_memory(
        need,
        format_args!(
            "bench offload --mib {} --pool {}: two regions and the frame pool",
            args.mib, args.pool
        ),
    )
}

/// A configuration's latency per access: (config, mean ns, p99 ns).
type ConfigLatency = (String, f64, f64);

/// `faultline bench offload`.
pub fn run(ctx: &mut BenchCtx, args: &OffloadArgs) -> anyhow::Result<()> {
    let kind = EngineKind::from_name(&args.engine)
        .with_context(|| format!("unknown engine {:?}", args.engine))?;
    let len = args.mib.max(1) << 20;
    let engine = engine::create(kind, EngineConfig::default())?;
    let configs = ["none", "frame-pool", "run-ahead", "both"];
    let mut progress = ctx.progress(
        (Workload::ALL.len() * (configs.len() + 1)) as u64,
        "offload",
    );
    let t = tsc();
    let mut rows = Vec::new();
    let mut gains = Vec::new();
    // Per workload: (config, mean ns, p99 ns), for the figures.
    let mut bars: Vec<(String, Vec<ConfigLatency>)> = Vec::new();
    // Back guest memory once so no configuration pays its first use.
    {
        let m = faultline_sys::mem::Mapping::anon(len)?;
        m.advise(0, len, faultline_sys::mem::Advice::PopulateWrite)?;
    }
    for w in Workload::ALL {
        progress.step(&format!("{} kernel", w.key()));
        let m = faultline_sys::mem::Mapping::anon(len)?;
        m.advise(0, len, faultline_sys::mem::Advice::NoHugePage)?;
        let f0 = minor_faults();
        let mut tr = run_workload(w, m.as_ptr(), len, args.stride);
        let kfaults = minor_faults() - f0;
        drop(m);
        let ks = Summary::from_cycles(&mut tr.cycles, t);
        let kernel_secs = tr.seconds;
        let mut group = Vec::new();
        let mut add = |ctx: &mut BenchCtx,
                       config: &str,
                       s: &Summary,
                       faults: u64,
                       secs: f64,
                       wasted: u64,
                       avoided: u64| {
            group.push((config.to_string(), s.mean, s.p99));
            rows.push(vec![
                w.name().to_string(),
                config.to_string(),
                fmt_ns(s.mean),
                fmt_ns(s.p99),
                fmt_ns(s.p999),
                fmt_count(faults),
                format!("{:.3}", secs),
                fmt_ratio(secs / kernel_secs),
                fmt_count(wasted),
                fmt_count(avoided),
            ]);
            ctx.report.push(
                Record::new("offload", config, "-", "write", s)
                    .with("workload", w.key())
                    .with("config", config)
                    .with("faults", faults)
                    .with("seconds", secs)
                    .with("wasted_pages", wasted)
                    .with("faults_avoided_pages", avoided)
                    .with("time_vs_kernel", secs / kernel_secs),
            );
        };
        add(ctx, "kernel", &ks, kfaults, kernel_secs, 0, 0);
        let mut base_summary = None;
        for config in configs {
            progress.step(&format!("{} {config}", w.key()));
            let mut b = Region::builder(len)
                .store(ZeroStore)
                .fault_around(args.fault_around);
            if config == "frame-pool" || config == "both" {
                b = b.resolve_op(ResolveOp::Move).frame_pool(FramePoolConfig {
                    pages: args.pool,
                    huge: false,
                    background: true,
                });
            }
            if config == "run-ahead" || config == "both" {
                b = b.run_ahead(RunAheadConfig {
                    budget_pages: args.budget,
                });
            }
            let r = b.build_dyn(engine.clone())?;
            let mut tr = progress.suspend(|| run_workload(w, r.as_ptr(), len, args.stride));
            let faults = r.stats().faults;
            let (mut wasted, mut avoided) = (0u64, 0u64);
            for p in 0..r.pages() {
                if r.populated_ahead(p) {
                    if tr.touched[p] {
                        avoided += 1;
                    } else {
                        wasted += 1;
                    }
                }
            }
            drop(r);
            let s = Summary::from_cycles(&mut tr.cycles, t);
            if config == "none" {
                base_summary = Some(s);
            } else if let Some(b) = &base_summary {
                gains.push(vec![
                    w.name().to_string(),
                    config.to_string(),
                    format!("{:.1}x", b.mean / s.mean),
                    format!("{:.1}x", b.p99 / s.p99),
                    format!("{:.1}x", b.p999 / s.p999),
                ]);
            }
            add(ctx, config, &s, faults, tr.seconds, wasted, avoided);
        }
        bars.push((w.name().to_string(), group));
    }
    progress.finish();
    println!(
        "\n== offload: {} MiB per workload, {} engine, fault-around {}, run-ahead budget {} pages, frame pool {} pages ==",
        args.mib, args.engine, args.fault_around, args.budget, args.pool
    );
    print_table(
        &[
            "workload",
            "config",
            "mean",
            "p99",
            "p99.9",
            "faults",
            "seconds",
            "vs kernel",
            "wasted pg",
            "avoided pg",
        ],
        &rows,
    );
    println!("(latency per access, per insert for the hash map; wasted = pages populated ahead and never touched)");
    println!("\n== critical-path gain over no offload (seed 004 reports {SEED_MEAN_X}x mean, {SEED_TAIL_X}x tail with hardware) ==");
    print_table(&["workload", "config", "mean", "p99", "p99.9"], &gains);
    // The critical-path latency per access of each workload, per
    // configuration (the kernel's first touch beside them): mean and p99.
    for (name, what, pick) in [("offload_mean", "mean", 0usize), ("offload_p99", "p99", 1)] {
        let groups: Vec<(String, Vec<(String, f64)>)> = bars
            .iter()
            .map(|(w, g)| {
                let vals = g
                    .iter()
                    .map(|(c, mean, p99)| (c.clone(), [*mean, *p99][pick]))
                    .collect();
                (w.clone(), vals)
            })
            .collect();
        let title = format!(
            "offload: {what} latency per access, {} MiB, {} engine, fault-around {}",
            args.mib, args.engine, args.fault_around
        );
        ctx.figure(name, |dir, name| {
            let (names, series) = plot::bar_groups(&groups);
            plot::group_bars(
                dir,
                name,
                &title,
                &format!("{what} ns per access (log scale)"),
                &names,
                &series,
            )
        })?;
    }
    Ok(())
}
