//! The engine benches: `latency` (per-fault latency and phase breakdown),
//! `seq` (sequential first touch with fault-around) and `scale` (faults per
//! second over faulting threads), each side by side with the kernel's own
//! fault path measured in the same run.
//!
//! Every access is timed with the TSC around the one instruction that
//! faults. The runtime stamps the TSC when its handler starts and when the
//! resolve ioctl returns ([`faultline::Region::last_fault_tsc`]), which
//! splits each fault into seed 000's three phases:
//!
//! ```text
//!  t0 ──trigger──► handler start ──resolve──► ioctl returned ──return──► t1
//!  (access)        (signal delivered /        (page installed)           (access
//!                   message read)                                         retired)
//! ```
//!
//! The TSC is invariant and synchronised across the vCPUs here, so the
//! stamps of a handler thread and of the faulting thread compare directly.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use faultline::{
    engine, EngineConfig, EngineKind, MemoryKind, MemoryStore, PageStore, Region, ResolveOp,
    ZeroStore,
};

use super::kernel::{self, Access, KernelPath, PAGE};
use crate::harness::parallel;
use crate::harness::report::{
    fmt_count, fmt_ns, fmt_ratio, print_latency_table, print_table, Record, SpeedupBase,
};
use crate::harness::stats::{cycles_to_ns_vec, Summary};
use crate::harness::tsc::{rdtsc, tsc};
use crate::harness::BenchCtx;

/// Seed 000's phase averages in cycles (Figure 6.1).
const THESIS_STOCK: (f64, f64, f64) = (11_846.0, 11_538.0, 6_781.0);
const THESIS_UINTR: (f64, f64, f64) = (117.0, 1_710.0, 73.0);

fn parse_engines(names: &[String]) -> anyhow::Result<Vec<EngineKind>> {
    if names.is_empty() {
        return Ok(vec![
            EngineKind::Signal,
            EngineKind::Spin,
            EngineKind::Poll,
            EngineKind::Workers,
            EngineKind::PerCpu,
        ]);
    }
    names
        .iter()
        .map(|n| {
            EngineKind::from_name(n).with_context(|| {
                format!("unknown engine {n:?} (poll, spin, signal, workers, per-cpu)")
            })
        })
        .collect()
}

/// `--engines` checked before any bench runs: every name known, none
/// named twice (as `bench restore` refuses its configurations).
fn check_engines(names: &[String]) -> anyhow::Result<()> {
    let kinds: Vec<&str> = parse_engines(names)?.iter().map(|k| k.name()).collect();
    super::named_once("--engines", &kinds)
}

fn make_engine(kind: EngineKind) -> anyhow::Result<Arc<dyn faultline::Engine>> {
    // One worker per CPU but never more than 2 here; pinning on.
    let cfg = EngineConfig::default();
    engine::create(kind, cfg).with_context(|| format!("creating the {} engine", kind.name()))
}

/// A store of `pages` pages of non-zero data, shared by the configurations.
fn data_store(pages: usize) -> Arc<dyn PageStore> {
    let data: Vec<u8> = (0..pages * PAGE)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 | 1)
        .collect();
    Arc::new(MemoryStore::new(data))
}

/// One latency configuration.
#[derive(Clone, Copy, Debug)]
struct Config {
    op: &'static str,
    kind: MemoryKind,
    resolve: ResolveOp,
    zero: bool,
    access: Access,
}

const CONFIGS: [Config; 8] = [
    Config {
        op: "COPY",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Copy,
        zero: false,
        access: Access::Write,
    },
    Config {
        op: "COPY",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Copy,
        zero: false,
        access: Access::Read,
    },
    Config {
        op: "ZEROPAGE",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Auto,
        zero: true,
        access: Access::Read,
    },
    Config {
        op: "COPY-zero",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Auto,
        zero: true,
        access: Access::Write,
    },
    Config {
        op: "MOVE",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Move,
        zero: false,
        access: Access::Write,
    },
    Config {
        op: "MOVE",
        kind: MemoryKind::PrivateAnon,
        resolve: ResolveOp::Move,
        zero: false,
        access: Access::Read,
    },
    Config {
        op: "CONTINUE",
        kind: MemoryKind::Shmem,
        resolve: ResolveOp::Continue,
        zero: false,
        access: Access::Write,
    },
    Config {
        op: "CONTINUE",
        kind: MemoryKind::Shmem,
        resolve: ResolveOp::Continue,
        zero: false,
        access: Access::Read,
    },
];

/// Options of `faultline bench latency`.
#[derive(clap::Args, Clone, Debug)]
pub struct LatencyArgs {
    /// Pages touched (one fault each) per configuration (100, for the
    /// percentiles, to what MemAvailable holds: the region, its source
    /// pages and a MOVE pool take 3 pages each).
    #[arg(short = 'n', long, default_value_t = 100_000, value_parser = faultline_cli_support::flags::fits_memory(100, 3 * PAGE as u64, "pages of 4 KiB, 3 copies each"))]
    pub pages: usize,
    /// Engines to measure (default: all five, signal, spin, poll, workers,
    /// per-cpu).
    #[arg(long, value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Only the headline configurations (COPY write/read, ZEROPAGE read).
    #[arg(long)]
    pub headline: bool,
}

impl LatencyArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> LatencyArgs {
        LatencyArgs {
            pages: 20_000,
            engines: Vec::new(),
            headline: true,
        }
    }
}

/// Per-fault samples of one configuration.
struct Run {
    cycles: Vec<u64>,
    /// (trigger, resolve, return) cycles of faults whose stamps were valid.
    phases: Vec<(u64, u64, u64)>,
    faults: u64,
}

fn measure(
    engine: &Arc<dyn faultline::Engine>,
    cfg: Config,
    n: usize,
    data: &Arc<dyn PageStore>,
) -> anyhow::Result<Run> {
    // One fault per page: the latency of a single fault is the subject.
    let mut b = Region::builder(n * PAGE)
        .kind(cfg.kind)
        .resolve_op(cfg.resolve)
        .fault_around(1);
    b = if cfg.zero {
        b.store(ZeroStore)
    } else {
        b.shared_store(data.clone())
    };
    if cfg.resolve == ResolveOp::Move {
        // Every page of the run comes from the pre-touched pool.
        b = b.move_pool(n);
    }
    let region = b
        .build_dyn(engine.clone())
        .with_context(|| format!("{} {} {}", engine.kind().name(), cfg.op, cfg.access.name()))?;
    let p = region.as_ptr();
    let mut cycles = vec![0u64; n];
    let mut phases = Vec::with_capacity(n);
    let mut sink = 0u8;
    for (i, slot) in cycles.iter_mut().enumerate() {
        // SAFETY: page `i` lies inside the live region.
        let addr = unsafe { p.add(i * PAGE) };
        let t0 = rdtsc();
        // SAFETY: as above; the region is readable and writable.
        sink ^= unsafe { cfg.access.touch(addr) };
        let t1 = rdtsc();
        *slot = t1 - t0;
        let (hs, he) = region.last_fault_tsc();
        if hs > t0 && he >= hs && t1 >= he {
            phases.push((hs - t0, he - hs, t1 - he));
        }
    }
    std::hint::black_box(sink);
    let faults = region.stats().faults;
    Ok(Run {
        cycles,
        phases,
        faults,
    })
}

/// What `bench latency` needs, checked before any bench runs: its engines
/// known and each named once, and memory for a region, its source pages
/// and a MOVE pool of `-n` pages each.
pub fn check_latency(args: &LatencyArgs) -> anyhow::Result<()> {
    check_engines(&args.engines)?;
    let n = args.pages;
    faultline_cli_support::flags::check_memory(
        (n as u64).saturating_mul(3 * PAGE as u64 + 32),
        format_args!(
            "bench latency -n {n}: a region, its source pages and a MOVE pool of {n} pages"
        ),
    )
}

/// `faultline bench latency`.
pub fn run_latency(ctx: &mut BenchCtx, args: &LatencyArgs) -> anyhow::Result<()> {
    let engines = parse_engines(&args.engines)?;
    if args.pages < 100 {
        anyhow::bail!(
            "-n {}: the latency bench needs at least 100 pages (its percentiles go to p99)",
            args.pages
        );
    }
    let n = args.pages;
    let configs: Vec<Config> = CONFIGS
        .iter()
        .copied()
        .filter(|c| !args.headline || matches!(c.op, "COPY" | "ZEROPAGE"))
        .filter(|c| faultline::capabilities().kind(c.kind).ioctls.is_ok())
        .collect();
    let kernel_paths = [
        KernelPath::AnonWrite,
        KernelPath::AnonRead,
        KernelPath::ShmemWrite,
        KernelPath::FileWarm,
        KernelPath::PopulateAhead,
    ];
    let mut progress = ctx.progress(
        (kernel_paths.len() + engines.len() * configs.len()) as u64,
        "latency",
    );
    let t = tsc();
    let data = data_store(n);
    let mut records = Vec::new();
    let mut hist = Vec::new();
    let mut phase_rows = Vec::new();
    let mut phase_bars = Vec::new();

    // The kernel first, so every engine row has its reference.
    for path in kernel_paths {
        progress.step(path.mechanism());
        let mut run = path.measure(n)?;
        hist.push((
            format!("{} {}", path.mechanism(), path.access().name()),
            cycles_to_ns_vec(&run.cycles, t),
        ));
        let ppf = run.pages_per_fault();
        let s = Summary::from_cycles(&mut run.cycles, t);
        records.push(
            Record::new("latency", path.mechanism(), "-", path.access().name(), &s)
                .with("pages_per_fault", ppf)
                .with("wall_ns_per_page", run.wall_ns_per_page),
        );
    }
    for &e in &engines {
        let engine = make_engine(e)?;
        for &cfg in &configs {
            progress.step(&format!("{} {} {}", e.name(), cfg.op, cfg.access.name()));
            let mut run = progress.suspend(|| measure(&engine, cfg, n, &data))?;
            let label = format!("{} {} {}", e.name(), cfg.op, cfg.access.name());
            if cfg.op == "COPY" && cfg.access == Access::Write {
                hist.push((label.clone(), cycles_to_ns_vec(&run.cycles, t)));
            }
            let s = Summary::from_cycles(&mut run.cycles, t);
            let mut rec = Record::new("latency", e.name(), cfg.op, cfg.access.name(), &s)
                .with("memory", cfg.kind.name())
                .with("faults", run.faults);
            if !run.phases.is_empty() {
                let k = run.phases.len() as f64;
                let mean = |f: fn(&(u64, u64, u64)) -> u64| {
                    run.phases.iter().map(f).sum::<u64>() as f64 / k
                };
                let (tr, rs, rt) = (mean(|p| p.0), mean(|p| p.1), mean(|p| p.2));
                let med = |f: fn(&(u64, u64, u64)) -> u64| {
                    let mut v: Vec<f64> = run.phases.iter().map(|p| f(p) as f64).collect();
                    crate::harness::stats::median(&mut v)
                };
                rec = rec
                    .with("trigger_cycles_mean", tr)
                    .with("resolve_cycles_mean", rs)
                    .with("return_cycles_mean", rt)
                    .with("trigger_cycles_median", med(|p| p.0))
                    .with("resolve_cycles_median", med(|p| p.1))
                    .with("return_cycles_median", med(|p| p.2));
                if cfg.op == "COPY" && cfg.access == Access::Write || cfg.op == "ZEROPAGE" {
                    phase_rows.push((
                        label.clone(),
                        tr,
                        rs,
                        rt,
                        med(|p| p.0),
                        med(|p| p.1),
                        med(|p| p.2),
                    ));
                    if cfg.op == "ZEROPAGE" {
                        phase_bars.push((e.name().to_string(), tr, rs, rt));
                    }
                }
            }
            records.push(rec);
        }
    }
    progress.finish();

    // Ratios to the kernel's anonymous write fault of this run.
    let kmed = records
        .iter()
        .find(|r| r.mechanism == "kernel-anon-write")
        .map(|r| r.median_ns)
        .unwrap_or(f64::NAN);
    for r in &mut records {
        r.ratio_to_kernel = Some(r.median_ns / kmed);
    }
    println!(
        "\n== fault latency: {n} faults per row, one per 4 KiB page (TSC around the access) =="
    );
    print_latency_table(&records);

    println!("\n== phase breakdown (cycles; seed 000 Figure 6.1 measured ZEROPAGE on gem5) ==");
    let mut rows = Vec::new();
    let share = |a: f64, b: f64, c: f64| {
        let t = a + b + c;
        format!(
            "{:.0}% / {:.0}% / {:.0}%",
            100.0 * a / t,
            100.0 * b / t,
            100.0 * c / t
        )
    };
    for (l, tr, rs, rt, mtr, mrs, mrt) in &phase_rows {
        rows.push(vec![
            l.clone(),
            format!("{tr:.0}"),
            format!("{rs:.0}"),
            format!("{rt:.0}"),
            format!("{:.0}", tr + rs + rt),
            share(*tr, *rs, *rt),
            format!("{mtr:.0} / {mrs:.0} / {mrt:.0}"),
        ]);
    }
    for (l, (a, b, c)) in [
        ("seed 000: stock userfaultfd", THESIS_STOCK),
        ("seed 000: UINTR forwarding", THESIS_UINTR),
    ] {
        rows.push(vec![
            l.into(),
            format!("{a:.0}"),
            format!("{b:.0}"),
            format!("{c:.0}"),
            format!("{:.0}", a + b + c),
            share(a, b, c),
            "-".into(),
        ]);
        phase_bars.push((
            if a > 5000.0 { "stock*" } else { "UINTR*" }.to_string(),
            a,
            b,
            c,
        ));
    }
    print_table(
        &[
            "config",
            "trigger",
            "resolve",
            "return",
            "total",
            "shares",
            "medians t/r/r",
        ],
        &rows,
    );
    println!("(figure: ZEROPAGE read per engine; stock* and UINTR* are seed 000's gem5 numbers)");
    headline(&records);
    ctx.figure("latency_hist", |d, n| {
        crate::harness::plot::latency_histograms(d, n, &hist)
    })?;
    ctx.figure("phases", |d, n| {
        crate::harness::plot::phase_bars(d, n, &phase_bars)
    })?;
    for r in records {
        ctx.report.push(r);
    }
    Ok(())
}

/// The issue's targets, computed from this run's medians.
fn headline(records: &[Record]) {
    let med = |mech: &str, op: &str, acc: &str| {
        records
            .iter()
            .find(|r| r.mechanism == mech && r.op == op && r.access == acc)
            .map(|r| r.median_ns)
    };
    let Some(k) = med("kernel-anon-write", "-", "write") else {
        return;
    };
    println!("\n== targets (medians of this run) ==");
    let best = ["signal", "spin", "poll", "workers", "per-cpu"]
        .iter()
        .filter_map(|e| med(e, "COPY", "write").map(|m| (*e, m)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((e, m)) = best {
        println!(
            "best engine, 4 KiB write fault resolved with data: {e} {} = {} the kernel anon write ({}) [target <= 1.8x]",
            fmt_ns(m),
            fmt_ratio(m / k),
            fmt_ns(k)
        );
    }
    if let (Some(s), Some(p)) = (med("signal", "COPY", "write"), med("poll", "COPY", "write")) {
        println!(
            "signal vs poll (COPY write): {:.1}x faster [target >= 15x]",
            p / s
        );
    }
}

/// Options of `faultline bench seq`.
#[derive(clap::Args, Clone, Debug)]
pub struct SeqArgs {
    /// MiB touched per pass (1 to what MemAvailable holds).
    #[arg(long, default_value_t = 256, value_parser = faultline_cli_support::flags::mib())]
    pub mib: usize,
    /// Engines (default: all five, signal, spin, poll, workers, per-cpu).
    #[arg(long, value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Fault-around depths (region pages per fault, each 1 to 512 and at
    /// most the pages of --mib).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64], value_parser = faultline_cli_support::flags::fault_around())]
    pub depths: Vec<usize>,
    /// Repetitions of every pass; the median is reported (1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
}

impl SeqArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> SeqArgs {
        SeqArgs {
            mib: 128,
            engines: vec!["signal".into(), "poll".into()],
            depths: vec![1, 4, 16, 64],
            reps: 1,
        }
    }
}

/// The median of `reps` runs of `f`.
fn median_of<T>(
    reps: usize,
    mut f: impl FnMut() -> anyhow::Result<(f64, T)>,
) -> anyhow::Result<(f64, T)> {
    let mut runs = Vec::new();
    for _ in 0..reps.max(1) {
        runs.push(f()?);
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mid = runs.len() / 2;
    Ok(runs.swap_remove(mid))
}

/// Touches one byte per 4 KiB page of `region` in order; ns per page.
fn seq_touch(region: &Region, access: Access) -> f64 {
    let p = region.as_ptr();
    let pages = region.len() / PAGE;
    let t = Instant::now();
    let mut sink = 0u8;
    for i in 0..pages {
        // SAFETY: inside the live region.
        sink ^= unsafe { access.touch(p.add(i * PAGE)) };
    }
    std::hint::black_box(sink);
    t.elapsed().as_nanos() as f64 / pages as f64
}

/// Kernel first touch with transparent huge pages (`MADV_HUGEPAGE`), the
/// kernel's own way of taking one fault per 2 MiB; ns per 4 KiB page.
fn kernel_seq_thp(bytes: usize) -> anyhow::Result<f64> {
    let m = faultline_sys::mem::Mapping::anon_aligned(bytes, 2 << 20)?;
    m.advise(0, bytes, faultline_sys::mem::Advice::HugePage)?;
    let t = Instant::now();
    for i in 0..bytes / PAGE {
        // SAFETY: inside the live read-write mapping.
        unsafe { std::ptr::write_volatile(m.as_ptr().add(i * PAGE), 1) };
    }
    Ok(t.elapsed().as_nanos() as f64 / (bytes / PAGE) as f64)
}

/// Pages of the frame pool of the `MOVE-huge` rows (32 MiB).
const SEQ_POOL_PAGES: usize = 8192;

/// What `bench seq` needs, checked before any bench runs: its engines
/// known, engines and depths each named once, every window
/// within the region (a larger one would fault a region rounded up to it:
/// more memory than --mib says, a table about another size), and memory
/// for the region and the kernel's mapping.
pub fn check_seq(args: &SeqArgs) -> anyhow::Result<()> {
    check_engines(&args.engines)?;
    super::named_once("--depths", &args.depths)?;
    let bytes = args.mib.max(1) << 20;
    if let Some(&d) = args.depths.iter().find(|&&d| d * PAGE > bytes) {
        anyhow::bail!(
            "--depths {d}: a window of {d} pages ({} KiB) is larger than the region (--mib {})",
            (d * PAGE) >> 10,
            args.mib
        );
    }
    faultline_cli_support::flags::check_memory(
        2 * bytes as u64,
        format_args!(
            "bench seq --mib {}: a region and the kernel's mapping",
            args.mib
        ),
    )
}

/// `faultline bench seq`.
pub fn run_seq(ctx: &mut BenchCtx, args: &SeqArgs) -> anyhow::Result<()> {
    let engines = parse_engines(&args.engines)?;
    let bytes = args.mib.max(1) << 20;
    let mut progress = ctx.progress(
        (3 + engines.len() * (args.depths.len() * 2 + 2)) as u64,
        "seq",
    );
    // Back the guest memory once so no mechanism pays the first-use cost.
    let _ = kernel::seq_first_touch_anon_run(bytes)?;
    let reps = args.reps.max(1);
    progress.step("kernel anon first touch");
    let (_, k_anon) = median_of(reps, || {
        kernel::seq_first_touch_anon_run(bytes).map(|r| (r.ns_per_page, r))
    })?;
    progress.step("kernel warm file scan");
    let (_, k_file) = median_of(reps, || {
        kernel::seq_scan_file_warm_run(bytes).map(|r| (r.ns_per_page, r))
    })?;
    progress.step("kernel THP first touch");
    let (k_thp, ()) = median_of(reps, || kernel_seq_thp(bytes).map(|v| (v, ())))?;
    let file = super::kernel::TempFile::warm(bytes / PAGE)?;
    let mut rows = Vec::new();
    let mut series = vec![
        ("kernel anon first touch".to_string(), Vec::new()),
        ("kernel warm file scan".to_string(), Vec::new()),
    ];
    for &d in &args.depths {
        series[0].1.push((d as f64, k_anon.ns_per_page));
        series[1].1.push((d as f64, k_file.ns_per_page));
    }
    let mut push = |ctx: &mut BenchCtx,
                    mech: &str,
                    store: &str,
                    access: Access,
                    depth: usize,
                    ns: f64,
                    faults: u64,
                    kernel_ns: f64| {
        rows.push(vec![
            mech.to_string(),
            store.to_string(),
            depth.to_string(),
            fmt_ns(ns),
            fmt_count(faults),
            fmt_ratio(ns / kernel_ns),
        ]);
        let s = Summary::from_ns(&mut [ns]);
        ctx.report.push(
            Record::new(
                "seq",
                mech,
                if store == "zero" { "COPY-zero" } else { "COPY" },
                access.name(),
                &s,
            )
            .with("store", store)
            .with("pages_per_fault", depth)
            .with("ns_per_page", ns)
            .with("faults", faults)
            .with("ratio_to_kernel_path", ns / kernel_ns),
        );
    };
    push(
        ctx,
        "kernel-anon-write",
        "-",
        Access::Write,
        1,
        k_anon.ns_per_page,
        k_anon.pages as u64,
        k_anon.ns_per_page,
    );
    push(
        ctx,
        "kernel-file-warm",
        "-",
        Access::Read,
        1,
        k_file.ns_per_page,
        k_file.pages as u64,
        k_file.ns_per_page,
    );
    push(
        ctx,
        "kernel-anon-write-thp",
        "-",
        Access::Write,
        512,
        k_thp,
        (bytes / (2 << 20)) as u64,
        k_anon.ns_per_page,
    );
    for &e in &engines {
        let engine = make_engine(e)?;
        let mut zs = Vec::new();
        let mut fs = Vec::new();
        for &d in &args.depths {
            for (store, access, kernel_ns, series) in [
                ("zero", Access::Write, k_anon.ns_per_page, &mut zs),
                ("file", Access::Read, k_file.ns_per_page, &mut fs),
            ] {
                progress.step(&format!("{} {store} K={d}", e.name()));
                let (ns, faults) = median_of(reps, || {
                    let b = Region::builder(bytes).fault_around(d);
                    let b = if store == "zero" {
                        b.store(ZeroStore)
                    } else {
                        // The COPY path from a file is measured: no
                        // zero-copy mapping even if TMPDIR is tmpfs.
                        b.store(faultline::FileStore::open(&file.path)?)
                            .zero_copy(false)
                    };
                    let r = b.build_dyn(engine.clone())?;
                    Ok((seq_touch(&r, access), r.stats().faults))
                })?;
                push(ctx, e.name(), store, access, d, ns, faults, kernel_ns);
                series.push((d as f64, ns));
            }
        }
        // Frames prepared off the fault path (seed 004): a pool refilled by
        // a background thread; 4 KiB frames moved 64 per fault, or 2 MiB
        // huge frames moved in whole.
        for (label, huge, fa) in [
            ("zero/MOVE-4k", false, 64usize),
            ("zero/MOVE-huge", true, 512),
        ] {
            progress.step(&format!("{} {label}", e.name()));
            let r = Region::builder(bytes)
                .store(ZeroStore)
                .resolve_op(ResolveOp::Move)
                .fault_around(fa)
                .frame_pool(faultline::FramePoolConfig {
                    pages: SEQ_POOL_PAGES,
                    huge,
                    background: true,
                })
                .build_dyn(engine.clone())?;
            let ns = seq_touch(&r, Access::Write);
            let pool = r.frame_pool_stats().unwrap_or_default();
            push(
                ctx,
                e.name(),
                label,
                Access::Write,
                fa,
                ns,
                r.stats().faults,
                k_anon.ns_per_page,
            );
            ctx.report.records.last_mut().expect("just pushed").extra.insert(
                "frame_pool".into(),
                serde_json::json!({"pages": SEQ_POOL_PAGES, "huge": huge, "hits": pool.hits, "misses": pool.misses, "frames_prepared": pool.frames_prepared}),
            );
        }
        series.push((format!("{} zero-store write", e.name()), zs));
        series.push((format!("{} file-store read", e.name()), fs));
    }
    progress.finish();
    println!(
        "\n== sequential first touch, {} MiB, one access per 4 KiB page, median of {reps} (ratio: zero rows vs kernel anon first touch, file rows vs kernel warm file scan) ==",
        args.mib
    );
    print_table(
        &[
            "mechanism",
            "store",
            "pages/fault",
            "ns/page",
            "faults",
            "ratio",
        ],
        &rows,
    );
    ctx.figure("seq", |d, n| {
        crate::harness::plot::line_chart(
            d,
            n,
            "sequential first touch",
            "pages per fault",
            "ns per page",
            &series,
            true,
        )
    })?;
    Ok(())
}

/// Options of `faultline bench scale`.
#[derive(clap::Args, Clone, Debug)]
pub struct ScaleArgs {
    /// Pages each thread first-touches (1 to what MemAvailable holds;
    /// times the most threads, checked before the run).
    #[arg(long, default_value_t = 16_384, value_parser = faultline_cli_support::flags::pages())]
    pub pages: usize,
    /// Thread counts (each 1 to the threads this machine can still start).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8], value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: Vec<usize>,
    /// Engines (default: all five, signal, spin, poll, workers, per-cpu).
    #[arg(long, value_delimiter = ',')]
    pub engines: Vec<String>,
}

impl ScaleArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> ScaleArgs {
        ScaleArgs {
            pages: 4096,
            threads: vec![1, 2, 4, 8],
            engines: vec!["signal".into(), "poll".into()],
        }
    }
}

/// Faults per second of `threads` threads first-writing their own
/// `pages` pages each of one region served by `engine`, over the time
/// from the first thread's first write to the last one's last
/// ([`parallel::timed`]: each thread stamps its own).
fn scale_engine(
    engine: &Arc<dyn faultline::Engine>,
    threads: usize,
    pages: usize,
) -> anyhow::Result<f64> {
    let r = Region::builder(threads * pages * PAGE)
        .shared_store(data_store_small())
        .fault_around(1)
        .build_dyn(engine.clone())?;
    let base = r.as_ptr() as usize;
    let secs = parallel::timed(threads, |t| {
        for i in 0..pages {
            // SAFETY: thread `t`'s slice of the live region.
            unsafe { std::ptr::write_volatile((base as *mut u8).add((t * pages + i) * PAGE), 1) };
        }
    })
    .as_secs_f64();
    Ok((threads * pages) as f64 / secs.max(1e-9))
}

/// A zero store: the scale bench measures fault delivery, not copying.
fn data_store_small() -> Arc<dyn PageStore> {
    Arc::new(ZeroStore)
}

/// What `bench scale` needs, checked before any bench runs: its engines
/// known, engines and thread counts each named once, and its most
/// threads, each with its pages.
pub fn check_scale(args: &ScaleArgs) -> anyhow::Result<()> {
    check_engines(&args.engines)?;
    super::named_once("--threads", &args.threads)?;
    let most = faultline_cli_support::flags::most_threads(&args.threads, "bench scale")?;
    faultline_cli_support::flags::check_memory(
        (most as u64).saturating_mul(args.pages as u64 * PAGE as u64),
        format_args!("bench scale: {most} threads x {} pages", args.pages),
    )
}

/// `faultline bench scale`.
pub fn run_scale(ctx: &mut BenchCtx, args: &ScaleArgs) -> anyhow::Result<()> {
    let engines = parse_engines(&args.engines)?;
    let mut progress = ctx.progress(((engines.len() + 1) * args.threads.len()) as u64, "scale");
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut kernel_pts = Vec::new();
    let mut kernel_at = std::collections::HashMap::new();
    for &t in &args.threads {
        progress.step(&format!("kernel {t} threads"));
        let fps = kernel::scale_anon(t, args.pages)?;
        kernel_pts.push((t as f64, fps));
        kernel_at.insert(t, fps);
    }
    series.push(("kernel anon write".to_string(), kernel_pts.clone()));
    // Speedups against one thread (or the fewest measured), wherever it
    // stands in --threads.
    let base = SpeedupBase::of(&args.threads).context("no thread counts")?;
    let at = |pts: &[(f64, f64)]| {
        let pts: Vec<(usize, f64)> = pts.iter().map(|p| (p.0 as usize, p.1)).collect();
        base.rate(&pts).unwrap_or(f64::NAN)
    };
    let kernel_base = at(&kernel_pts);
    for (t, fps) in &kernel_pts {
        rows.push(vec![
            "kernel-anon-write".into(),
            format!("{t}"),
            fmt_count(*fps as u64),
            "1.00x".into(),
            format!("{:.2}x", fps / kernel_base),
        ]);
        ctx.report.push(
            Record::new(
                "scale",
                "kernel-anon-write",
                "-",
                "write",
                &Summary::from_ns(&mut [1e9 / fps]),
            )
            .with("threads", *t as u64)
            .with("faults_per_sec", *fps)
            .with(&base.json_key(), fps / kernel_base),
        );
    }
    for &e in &engines {
        let engine = make_engine(e)?;
        let mut pts = Vec::new();
        for &t in &args.threads {
            progress.step(&format!("{} {t} threads", e.name()));
            pts.push((t as f64, scale_engine(&engine, t, args.pages)?));
        }
        let one = at(&pts);
        for &(t, fps) in &pts {
            rows.push(vec![
                e.name().into(),
                t.to_string(),
                fmt_count(fps as u64),
                fmt_ratio(fps / kernel_at[&(t as usize)]),
                format!("{:.2}x", fps / one),
            ]);
            ctx.report.push(
                Record::new(
                    "scale",
                    e.name(),
                    "COPY-zero",
                    "write",
                    &Summary::from_ns(&mut [1e9 / fps]),
                )
                .with("threads", t as u64)
                .with("faults_per_sec", fps)
                .with(&base.json_key(), fps / one),
            );
        }
        series.push((e.name().to_string(), pts));
    }
    progress.finish();
    println!(
        "\n== first-touch throughput: {} pages per thread, {} CPUs ==",
        args.pages,
        faultline_sys::thread::online_cpus()
    );
    let vs = base.column();
    print_table(
        &["mechanism", "threads", "faults/s", "vs kernel", &vs],
        &rows,
    );
    ctx.figure("scale", |d, n| {
        crate::harness::plot::line_chart(
            d,
            n,
            "first-touch throughput",
            "faulting threads",
            "faults per second",
            &series,
            true,
        )
    })?;
    Ok(())
}
